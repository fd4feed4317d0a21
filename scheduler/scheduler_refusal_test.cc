// What the scheduler tells a peer that is not in the job, over real
// ZeroMQ sockets on loopback: an Error without the job id (header job id 0,
// and no text naming it), while the job's own node still runs.
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "cluster/node_agent.h"
#include "common/version.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "wire/message.h"
#include "wire/validate.h"
#include "wire/zmq_transport.h"

namespace gradsync::server {
namespace {

std::unique_ptr<wire::ZmqTransport> NewTransport() {
  return std::move(wire::ZmqTransport::Create(wire::ZmqOptions{})).value();
}

class SchedulerRefusalTest : public ::testing::Test {
 protected:
  void StartScheduler() {
    SchedulerOptions o;
    o.listen = "tcp://127.0.0.1:0";
    o.num_workers = 1;
    o.heartbeat_interval = Millis(50);
    o.rendezvous_timeout = Millis(20000);
    scheduler_ = std::make_unique<Scheduler>(o, NewTransport(), nullptr, &clock_);
    auto bound = scheduler_->Start();
    ASSERT_TRUE(bound.ok()) << bound.status();
    endpoint_ = *bound;
    thread_ = std::thread([this] { scheduler_->Run(stop_).IgnoreError(); });
  }

  void StartJob() {
    StartScheduler();
    cluster::NodeOptions node;
    node.scheduler = endpoint_.substr(std::string("tcp://").size());
    node.role = wire::Role::Worker;
    node.data_port = 1;
    node.heartbeat_interval = Millis(50);
    auto agent = cluster::NodeAgent::Join(node, NewTransport(), Deadline::AfterMs(10000));
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = std::move(*agent);
    job_id_ = agent_->assignment().job_id;
    ASSERT_NE(job_id_, 0u);
  }

  void TearDown() override {
    agent_.reset();
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  // Sends `msg` from a new peer that never registered; returns the answer.
  wire::Message AnswerTo(wire::Message msg) {
    outsiders_.push_back(NewTransport());
    wire::Transport& t = *outsiders_.back();
    auto conn = t.Connect(endpoint_);
    EXPECT_TRUE(conn.ok()) << conn.status();
    EXPECT_TRUE(
        t.Send(wire::Route::Connection(*conn), std::move(msg), Deadline::AfterMs(5000)).ok());
    auto in = t.Receive(Deadline::AfterMs(10000));
    EXPECT_TRUE(in.ok()) << in.status();
    return in.ok() ? std::move(in->message) : wire::Message{};
  }

  // Checks that `answer` is an Error of `code` that does not tell the job id.
  void ExpectErrorWithoutJobId(const wire::Message& answer, wire::ErrorCode code) {
    const wire::Verdict v = wire::Validate(answer, wire::Policy::Accepting({wire::MsgType::Error}));
    ASSERT_TRUE(v.ok()) << v.detail;
    EXPECT_EQ(v.header->body_as_ErrorBody()->code(), code);
    EXPECT_EQ(v.header->job_id(), 0u) << "an outsider was told the job id";
    const std::string text = v.header->body_as_ErrorBody()->message()->str();
    EXPECT_EQ(text.find(std::to_string(job_id_)), std::string::npos) << text;
  }

  RealClock clock_;
  std::unique_ptr<Scheduler> scheduler_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::unique_ptr<cluster::NodeAgent> agent_;
  uint64_t job_id_ = 0;
  std::vector<std::unique_ptr<wire::Transport>> outsiders_;
};

TEST_F(SchedulerRefusalTest, AnUnregisteredPeerIsNotToldTheJobId) {
  StartJob();
  ExpectErrorWithoutJobId(AnswerTo(wire::MakeHeartbeat({wire::Role::Worker, 0, 0})),
                          wire::ErrorCode::NotRegistered);
  ExpectErrorWithoutJobId(AnswerTo(wire::MakeHeartbeat({wire::Role::Worker, 0, 12345})),
                          wire::ErrorCode::WrongJob);
  ExpectErrorWithoutJobId(
      AnswerTo(wire::MakeBarrier({wire::Role::Worker, 0, 12345}, wire::MsgType::Barrier, 1,
                                 wire::Group::All, 0)),
      wire::ErrorCode::WrongJob);
  EXPECT_TRUE(agent_->job_status().ok()) << "the job's own node was disturbed";
}

// A node's own text (its host, the Errors it reports) reaches the log
// escaped and cut, and its Error reports are rate-limited.
TEST_F(SchedulerRefusalTest, ANodesTextIsLoggedEscapedCutAndRateLimited) {
  StartScheduler();
  testing::internal::CaptureStderr();
  auto node = NewTransport();
  const wire::ConnId conn = *node->Connect(endpoint_);
  auto send = [&](wire::Message m) {
    ASSERT_TRUE(
        node->Send(wire::Route::Connection(conn), std::move(m), Deadline::AfterMs(5000)).ok());
  };
  wire::NodeInfo me;
  me.host = "evil\nI forged this line\x1b[2J";
  me.data_port = 1;
  send(wire::MakeRegister({wire::Role::Worker, -1, 0}, me, kBuildId, 1, kProtocolVersion));
  auto assigned = node->Receive(Deadline::AfterMs(10000));
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  const uint64_t job = assigned->message.header_view()->job_id();
  ASSERT_NE(job, 0u);
  const std::string long_text = "line one\nline two" + std::string(2000, 'x');
  for (int i = 0; i < 10; ++i) {
    send(wire::MakeError({wire::Role::Worker, 0, job}, wire::ErrorCode::Mismatch, long_text,
                         wire::MsgType::Heartbeat));
  }
  // The scheduler handles one peer's messages in order: once this is
  // answered, every Error before it has been logged (or left out).
  send(wire::MakeHeartbeat({wire::Role::Worker, 0, job}));
  for (;;) {
    auto in = node->Receive(Deadline::AfterMs(10000));
    ASSERT_TRUE(in.ok()) << in.status();
    if (in->message.header_view()->type() == wire::MsgType::Heartbeat) break;
  }
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(log.find("\nI forged this line"), std::string::npos) << "a host forged a log line";
  EXPECT_NE(log.find("evil\\x0aI forged this line\\x1b[2J"), std::string::npos) << log;
  EXPECT_EQ(log.find("\nline two"), std::string::npos) << "a node's text broke a log line";
  EXPECT_NE(log.find("line one\\x0aline two"), std::string::npos) << log;
  EXPECT_EQ(log.find(std::string(300, 'x')), std::string::npos) << "a node's text was not cut";
  size_t reports = 0;
  for (size_t at = log.find("reports an error"); at != std::string::npos;
       at = log.find("reports an error", at + 1)) {
    ++reports;
  }
  EXPECT_LE(reports, 4u) << "ten reports within a second were all logged";
  EXPECT_GE(reports, 1u);
}

}  // namespace
}  // namespace gradsync::server
