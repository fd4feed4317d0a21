// Multi-process tests of rendezvous, barriers, heartbeats and refusals: a real
// scheduler process, real server and worker processes, TCP on loopback.
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cluster/node_agent.h"
#include "common/subprocess.h"
#include "common/version.h"
#include "gtest/gtest.h"
#include "tests/local_job.h"
#include "wire/message.h"
#include "wire/transport.h"
#include "wire/validate.h"
#include "wire/zmq_transport.h"

namespace gradsync {
namespace {

using std::chrono::steady_clock;

constexpr int kHeartbeatMs = LocalJob::kHeartbeatMs;
constexpr int kMissed = LocalJob::kMissed;

class ClusterTest : public ::testing::Test, public LocalJob {
 protected:
  Subprocess& StartServer() {
    return Start({Runfile("server/gradsync_server"), "--role=server"}, "server");
  }

  Subprocess& StartWorker(int rank, std::vector<std::string> extra) {
    std::vector<std::string> argv = {Runfile("tests/rendezvous_worker"),
                                     "--rank=" + std::to_string(rank)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return Start(argv, "worker" + std::to_string(rank));
  }

  // A node in this test process, speaking as a worker.
  cluster::NodeOptions AgentOptions(int workers, int servers) {
    cluster::NodeOptions o;
    o.scheduler = address_;
    o.num_workers = workers;
    o.num_servers = servers;
    o.connect_timeout = Millis(3000);
    o.rendezvous_timeout = Millis(10000);
    o.heartbeat_interval = Millis(kHeartbeatMs);
    return o;
  }
};

TEST_F(ClusterTest, RendezvousBarrierAndDeadWorkerReportedByRank) {
  StartScheduler(4, 2);
  SetJob(4, 2);
  StartServer();
  StartServer();
  std::vector<Subprocess*> workers;
  for (int r = 0; r < 4; ++r) {
    workers.push_back(&StartWorker(r, {"--barriers=2", "--nccl_id", "--hold_ms=30000"}));
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(workers[r]->WaitForOutput("worker " + std::to_string(r) + " has the NCCL id",
                                          Deadline::AfterMs(20000)))
        << workers[r]->Output();
    EXPECT_NE(workers[r]->Output().find("passed barrier 2"), std::string::npos);
  }
  ASSERT_TRUE(scheduler_->WaitForOutput("ready: every node reaches", Deadline::AfterMs(1000)));

  const auto killed_at = steady_clock::now();
  workers[2]->Signal(SIGKILL);
  const int limit_ms = kHeartbeatMs * kMissed;
  ASSERT_TRUE(scheduler_->WaitForOutput("worker 2 (pid", Deadline::AfterMs(limit_ms + 2000)))
      << scheduler_->Output();
  const auto reported_ms = std::chrono::duration_cast<Millis>(steady_clock::now() - killed_at);
  std::printf("worker 2 reported dead %lld ms after SIGKILL (limit %d ms)\n",
              static_cast<long long>(reported_ms.count()), limit_ms);
  EXPECT_LE(reported_ms.count(), limit_ms + 1000);
  EXPECT_NE(scheduler_->Output().find("worker 2 (pid " + std::to_string(workers[2]->pid())),
            std::string::npos);
  for (int r : {0, 1, 3}) {
    ASSERT_EQ(workers[r]->Wait(Deadline::AfterMs(10000)), 0) << workers[r]->Output();
    EXPECT_NE(workers[r]->Output().find("saw worker 2 dead"), std::string::npos);
  }
  // The survivors left; the servers are released; the job ends as failed.
  EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(10000)), 1);
  EXPECT_NE(scheduler_->Output().find("job ended after node failures: worker 2 dead"),
            std::string::npos);
}

TEST_F(ClusterTest, OtherProtocolVersionAndBuildAreRefusedNamingBoth) {
  StartScheduler(1, 0);
  cluster::NodeOptions o = AgentOptions(1, 0);
  o.protocol_version = kProtocolVersion + 1;
  auto t = wire::ZmqTransport::Create({});
  ASSERT_TRUE(t.ok());
  auto agent = cluster::NodeAgent::Join(o, std::move(*t), Deadline::AfterMs(10000));
  ASSERT_FALSE(agent.ok());
  EXPECT_NE(
      agent.status().message().find("protocol version " + std::to_string(kProtocolVersion + 1) +
                                    ", this node speaks " + std::to_string(kProtocolVersion)),
      std::string::npos)
      << agent.status();

  o = AgentOptions(1, 0);
  o.build_id = "gradsync-9.9.9";
  t = wire::ZmqTransport::Create({});
  agent = cluster::NodeAgent::Join(o, std::move(*t), Deadline::AfterMs(10000));
  ASSERT_FALSE(agent.ok());
  EXPECT_NE(
      agent.status().message().find("peer is 'gradsync-9.9.9', scheduler is 'gradsync-0.1.0'"),
      std::string::npos)
      << agent.status();

  o = AgentOptions(3, 0);
  t = wire::ZmqTransport::Create({});
  agent = cluster::NodeAgent::Join(o, std::move(*t), Deadline::AfterMs(10000));
  ASSERT_FALSE(agent.ok());
  EXPECT_NE(agent.status().message().find("expects 3 workers and 0 servers, the scheduler "
                                          "expects 1 and 0"),
            std::string::npos)
      << agent.status();
  // The scheduler keeps serving: a good worker still joins.
  SetJob(1, 0);
  Subprocess& w = StartWorker(0, {});
  EXPECT_EQ(w.Wait(Deadline::AfterMs(15000)), 0) << w.Output();
  EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(5000)), 0) << scheduler_->Output();
}

TEST_F(ClusterTest, MalformedMessagesGetErrorRepliesAndTheSchedulerKeepsServing) {
  StartScheduler(1, 0);
  auto t = wire::ZmqTransport::Create({});
  ASSERT_TRUE(t.ok());
  auto conn = (*t)->Connect("tcp://" + address_);
  ASSERT_TRUE(conn.ok());
  wire::Message garbage;
  garbage.header = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE((*t)->Send(wire::Route::Connection(*conn), garbage, Deadline::AfterMs(2000)).ok());
  auto reply = (*t)->Receive(Deadline::AfterMs(5000));
  ASSERT_TRUE(reply.ok()) << reply.status();
  wire::Verdict v = wire::Validate(reply->message, wire::Policy::Accepting({wire::MsgType::Error}));
  ASSERT_TRUE(v.ok()) << v.detail;
  EXPECT_EQ(v.header->body_as_ErrorBody()->code(), wire::ErrorCode::Malformed);
  EXPECT_NE(v.header->body_as_ErrorBody()->message()->str().find("not a valid gradsync header"),
            std::string::npos);
  // A heartbeat from a node that never registered.
  ASSERT_TRUE(
      (*t)->Send(wire::Route::Connection(*conn), wire::MakeHeartbeat({}), Deadline::AfterMs(2000))
          .ok());
  reply = (*t)->Receive(Deadline::AfterMs(5000));
  ASSERT_TRUE(reply.ok());
  v = wire::Validate(reply->message, wire::Policy::Accepting({wire::MsgType::Error}));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.header->body_as_ErrorBody()->code(), wire::ErrorCode::NotRegistered);
  SetJob(1, 0);
  Subprocess& w = StartWorker(0, {"--barriers=3"});
  EXPECT_EQ(w.Wait(Deadline::AfterMs(15000)), 0) << w.Output();
  EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(5000)), 0);
}

TEST_F(ClusterTest, UnreachableSchedulerFailsWithinTheDeadlineNamingTheAddress) {
  address_ = "127.0.0.1:1";  // nothing listens on port 1
  cluster::NodeOptions o = AgentOptions(1, 0);
  o.connect_timeout = Millis(1500);
  auto t = wire::ZmqTransport::Create({});
  ASSERT_TRUE(t.ok());
  const auto start = steady_clock::now();
  auto agent = cluster::NodeAgent::Join(o, std::move(*t), Deadline::AfterMs(60000));
  const auto took = std::chrono::duration_cast<Millis>(steady_clock::now() - start);
  ASSERT_FALSE(agent.ok());
  EXPECT_NE(agent.status().message().find("cannot reach the scheduler at 127.0.0.1:1"),
            std::string::npos)
      << agent.status();
  EXPECT_LT(took.count(), 3000);
}

TEST_F(ClusterTest, UnreachablePeerFailsTheJobNamingBothAddresses) {
  StartScheduler(2, 0);
  SetJob(2, 0);
  // Rank 1 lives in this process and advertises a data port nobody listens on.
  cluster::NodeOptions o = AgentOptions(2, 0);
  o.rank = 1;
  o.data_port = 1;
  Subprocess& w0 = StartWorker(0, {});
  auto t = wire::ZmqTransport::Create({});
  ASSERT_TRUE(t.ok());
  auto agent = cluster::NodeAgent::Join(o, std::move(*t), Deadline::AfterMs(15000));
  ASSERT_TRUE(agent.ok()) << agent.status();
  Status reach = (*agent)->CheckReachability({}, Deadline::AfterMs(20000));
  ASSERT_FALSE(reach.ok());
  EXPECT_NE(reach.message().find("worker 0 (127.0.0.1) cannot reach worker 1 at tcp://127.0.0.1:1"),
            std::string::npos)
      << reach;
  EXPECT_EQ(w0.Wait(Deadline::AfterMs(10000)), 1);
  EXPECT_NE(w0.Output().find("cannot reach worker 1 at tcp://127.0.0.1:1"), std::string::npos);
  EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(5000)), 1);
}

TEST_F(ClusterTest, RendezvousTimeoutNamesWhoIsMissing) {
  StartScheduler(2, 1, {"--rendezvous_timeout_ms=1500"});
  SetJob(2, 1);
  Subprocess& w = StartWorker(0, {});
  EXPECT_EQ(w.Wait(Deadline::AfterMs(10000)), 1);
  EXPECT_NE(w.Output().find("1 of 2 workers and 0 of 1 servers registered"), std::string::npos)
      << w.Output();
  EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(5000)), 1);
}

TEST_F(ClusterTest, SigtermShutsTheJobDownCleanly) {
  StartScheduler(1, 1);
  SetJob(1, 1);
  Subprocess& server = StartServer();
  Subprocess& w = StartWorker(0, {"--hold_ms=30000"});
  ASSERT_TRUE(w.WaitForOutput("passed barrier 1", Deadline::AfterMs(15000))) << w.Output();
  scheduler_->Signal(SIGTERM);
  EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(5000)), 0);
  EXPECT_EQ(w.Wait(Deadline::AfterMs(5000)), 0) << w.Output();
  EXPECT_EQ(server.Wait(Deadline::AfterMs(5000)), 0) << server.Output();
  EXPECT_NE(server.Output().find("job shut down: the scheduler was stopped"), std::string::npos)
      << server.Output() << scheduler_->Output();
}

}  // namespace
}  // namespace gradsync
