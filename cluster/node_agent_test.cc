// A node joining through a scheduler that answers with impossible or
// incomplete messages (a fake scheduler on a real ZeroMQ socket on
// loopback): each is refused without a crash, and the node takes the first
// assignment that can be its own.
#include "cluster/node_agent.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/version.h"
#include "gtest/gtest.h"
#include "wire/zmq_transport.h"

namespace gradsync::cluster {
namespace {

using wire::MsgType;
using wire::NodeInfo;
using wire::Role;

constexpr uint64_t kJob = 99;

class FakeScheduler {
 public:
  FakeScheduler() {
    transport_ = std::move(wire::ZmqTransport::Create({})).value();
    const std::string bound = *transport_->Listen("tcp://127.0.0.1:0");
    address_ = bound.substr(bound.find("//") + 2);
  }
  const std::string& address() const { return address_; }

  // Waits for the node's Register, then answers with every message of
  // `answers` in order.
  void AnswerWith(std::vector<wire::Message> answers) {
    thread_ = std::thread([this, answers = std::move(answers)]() mutable {
      for (;;) {
        auto in = transport_->Receive(Deadline::AfterMs(10000));
        if (!in.ok()) return;
        if (in->message.header_view()->type() != MsgType::Register) continue;
        for (wire::Message& m : answers) {
          transport_->Send(in->from, std::move(m), Deadline::AfterMs(1000)).IgnoreError();
        }
        return;
      }
    });
  }
  ~FakeScheduler() {
    if (thread_.joinable()) thread_.join();
    transport_->Shutdown();
  }

 private:
  std::unique_ptr<wire::ZmqTransport> transport_;
  std::string address_;
  std::thread thread_;
};

const wire::Sender kScheduler{Role::Scheduler, 0, kJob};

std::vector<NodeInfo> Peers(int workers, int servers) {
  std::vector<NodeInfo> peers;
  for (int r = 0; r < workers; ++r)
    peers.push_back({Role::Worker, r, "127.0.0.1", 1000, 0, "", "", ""});
  for (int r = 0; r < servers; ++r)
    peers.push_back({Role::Server, r, "127.0.0.1", 2000, 0, "", "", ""});
  return peers;
}

StatusOr<std::unique_ptr<NodeAgent>> JoinAsWorker(const FakeScheduler& s) {
  NodeOptions o;
  o.scheduler = s.address();
  o.num_workers = 2;
  o.num_servers = 1;
  o.rendezvous_timeout = Millis(5000);
  auto transport = std::move(wire::ZmqTransport::Create({})).value();
  return NodeAgent::Join(o, std::move(transport), Deadline::AfterMs(8000));
}

TEST(NodeAgentTest, ImpossibleAssignmentsAreRefusedAndAGoodOneIsTaken) {
  FakeScheduler s;
  std::vector<wire::Message> answers;
  answers.push_back(wire::MakeRankAssignment(kScheduler, 7, 2, 1, Peers(2, 1), 500, 6));
  answers.push_back(wire::MakeRankAssignment(kScheduler, 0, 0, 1, Peers(0, 1), 500, 6));
  answers.push_back(wire::MakeRankAssignment(kScheduler, 0, 3, 1, Peers(3, 1), 500, 6));
  answers.push_back(wire::MakeRankAssignment(kScheduler, 0, 2, 1, {}, 500, 6));
  answers.push_back(wire::MakeRankAssignment(kScheduler, 0, 2, 1, Peers(2, 1), 0, 6));
  std::vector<NodeInfo> twice = Peers(2, 1);
  twice[1].rank = 0;
  answers.push_back(wire::MakeRankAssignment(kScheduler, 0, 2, 1, twice, 500, 6));
  answers.push_back(wire::MakeRankAssignment(kScheduler, 1, 2, 1, Peers(2, 1), 500, 6));
  s.AnswerWith(std::move(answers));
  auto agent = JoinAsWorker(s);
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_EQ((*agent)->assignment().self.rank, 1);
  EXPECT_EQ((*agent)->assignment().num_workers, 2);
  EXPECT_EQ((*agent)->assignment().peers.size(), 3u);
}

// An Error and a JobState without their (optional) message used to be
// dereferenced.
wire::Message WithoutText(MsgType type) {
  flatbuffers::FlatBufferBuilder fbb(128);
  flatbuffers::Offset<void> body =
      type == MsgType::Error
          ? wire::CreateErrorBody(fbb, wire::ErrorCode::JobFull, 0, MsgType::Register).Union()
          : wire::CreateJobStateBody(fbb, wire::JobPhase::Failed, 0).Union();
  wire::HeaderBuilder hb(fbb);
  hb.add_job_id(kJob);
  hb.add_body(body);
  hb.add_protocol_version(kProtocolVersion);
  hb.add_type(type);
  hb.add_sender_role(Role::Scheduler);
  hb.add_body_type(wire::ExpectedBody(type));
  fbb.Finish(hb.Finish());
  wire::Message m;
  m.header.assign(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  return m;
}

TEST(NodeAgentTest, AnErrorOrJobStateWithoutTextFailsTheJoinCleanly) {
  for (MsgType type : {MsgType::Error, MsgType::JobState}) {
    FakeScheduler s;
    std::vector<wire::Message> answers;
    answers.push_back(WithoutText(type));
    s.AnswerWith(std::move(answers));
    auto agent = JoinAsWorker(s);
    ASSERT_FALSE(agent.ok());
    EXPECT_EQ(agent.status().code(), StatusCode::kFailedPrecondition) << agent.status();
  }
}

}  // namespace
}  // namespace gradsync::cluster
