// The scheduler and its nodes in one process: nodes are threads, the network
// is an InProcNetwork.
#include "server/scheduler.h"

#include <atomic>
#include <set>
#include <thread>

#include "cluster/node_agent.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "wire/inproc_transport.h"

namespace gradsync::server {
namespace {

constexpr char kScheduler[] = "scheduler:1";

class SchedulerTest : public ::testing::Test {
 protected:
  void StartScheduler(int workers, int servers) {
    SchedulerOptions o;
    o.listen = std::string("tcp://") + kScheduler;
    o.num_workers = workers;
    o.num_servers = servers;
    o.heartbeat_interval = Millis(50);
    o.missed_heartbeats = 4;
    o.rendezvous_timeout = Millis(5000);
    scheduler_ = std::make_unique<Scheduler>(o, network_.NewTransport("scheduler"), &metrics_,
                                             &clock_);
    ASSERT_TRUE(scheduler_->Start().ok());
    thread_ = std::thread([this] { result_ = scheduler_->Run(stop_); });
  }

  void TearDown() override {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  cluster::NodeOptions Options(wire::Role role, int rank) {
    cluster::NodeOptions o;
    o.scheduler = kScheduler;
    o.data_port = static_cast<uint16_t>(next_port_++);
    o.role = role;
    o.rank = rank;
    o.heartbeat_interval = Millis(50);
    return o;
  }

  // Joins `n` workers concurrently; returns their agents (null on failure).
  std::vector<StatusOr<std::unique_ptr<cluster::NodeAgent>>> JoinAll(
      std::vector<cluster::NodeOptions> options) {
    std::vector<StatusOr<std::unique_ptr<cluster::NodeAgent>>> out;
    for (size_t i = 0; i < options.size(); ++i) out.emplace_back(UnknownError());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < options.size(); ++i) {
      threads.emplace_back([&, i] {
        out[i] = cluster::NodeAgent::Join(options[i], NewTransport(), Deadline::AfterMs(5000));
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  // A node's transport to the scheduler, plus a listener on its data
  // endpoint so that peers' reachability probes find it.
  std::unique_ptr<wire::Transport> NewTransport() {
    return network_.NewTransport();
  }

  void ListenData(const cluster::NodeOptions& o) {
    data_.push_back(network_.NewTransport());
    ASSERT_TRUE(data_.back()
                    ->Listen("tcp://" + o.host + ":" + std::to_string(o.data_port))
                    .ok());
  }

  static Status UnknownError() { return InternalError("not joined"); }

  wire::InProcNetwork network_;
  prometheus::Registry registry_;
  SchedulerMetrics metrics_{registry_};
  RealClock clock_;
  std::unique_ptr<Scheduler> scheduler_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  Status result_;
  int next_port_ = 1000;
  std::vector<std::unique_ptr<wire::Transport>> data_;
};

TEST_F(SchedulerTest, AssignsRequestedAndFreeRanksAndOnePeerList) {
  StartScheduler(3, 1);
  std::vector<cluster::NodeOptions> options = {
      Options(wire::Role::Worker, -1), Options(wire::Role::Worker, 2),
      Options(wire::Role::Worker, -1), Options(wire::Role::Server, -1)};
  for (const auto& o : options) ListenData(o);
  auto agents = JoinAll(options);
  std::set<int> worker_ranks;
  for (size_t i = 0; i < agents.size(); ++i) {
    ASSERT_TRUE(agents[i].ok()) << agents[i].status();
    const cluster::Assignment& a = (*agents[i])->assignment();
    EXPECT_EQ(a.job_id, (*agents[0])->assignment().job_id);
    EXPECT_NE(a.job_id, 0u);
    EXPECT_EQ(a.peers.size(), 4u);
    EXPECT_EQ(a.num_workers, 3);
    if (a.self.role == wire::Role::Worker) worker_ranks.insert(a.self.rank);
  }
  EXPECT_EQ((*agents[1])->assignment().self.rank, 2);
  EXPECT_EQ((*agents[3])->assignment().self.rank, 0);
  EXPECT_EQ(worker_ranks, (std::set<int>{0, 1, 2}));
  // Every node reaches its peers: the job is declared ready.
  std::vector<std::thread> threads;
  std::vector<Status> reach(agents.size());
  for (size_t i = 0; i < agents.size(); ++i) {
    threads.emplace_back([&, i] {
      const auto& a = (*agents[i])->assignment();
      std::vector<wire::NodeInfo> others;
      for (const auto& p : a.peers) {
        if (p.role != a.self.role || p.rank != a.self.rank) others.push_back(p);
      }
      reach[i] = (*agents[i])->CheckReachability(others, Deadline::AfterMs(5000));
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : reach) EXPECT_TRUE(s.ok()) << s;
}

TEST_F(SchedulerTest, TakenAndOutOfRangeRanksAreRefused) {
  StartScheduler(2, 0);
  auto first = Options(wire::Role::Worker, 0);
  auto taken = Options(wire::Role::Worker, 0);
  auto too_big = Options(wire::Role::Worker, 7);
  auto server = Options(wire::Role::Server, -1);
  auto a = JoinAll({first, taken, too_big, server});
  std::vector<std::string> errors;
  for (size_t i = 1; i < a.size(); ++i) {
    ASSERT_FALSE(a[i].ok());
    errors.push_back(a[i].status().message());
  }
  EXPECT_NE(errors[0].find("worker rank 0 is already taken by pid"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("worker rank 7 is out of range (the job has 2)"), std::string::npos)
      << errors[1];
  EXPECT_NE(errors[2].find("the job already has all 0 servers"), std::string::npos) << errors[2];
  EXPECT_EQ(metrics_.rejected[static_cast<int>(wire::ErrorCode::RankTaken)]->Value(), 1);
  EXPECT_EQ(metrics_.rejected[static_cast<int>(wire::ErrorCode::JobFull)]->Value(), 1);
}

TEST_F(SchedulerTest, BarrierWaitsForAllAndFailsNamingADeadWorker) {
  StartScheduler(3, 0);
  std::vector<cluster::NodeOptions> options;
  std::vector<wire::Transport*> raw;
  for (int r = 0; r < 3; ++r) options.push_back(Options(wire::Role::Worker, r));
  std::vector<std::unique_ptr<cluster::NodeAgent>> agents(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    auto t = NewTransport();
    raw.push_back(t.get());
    threads.emplace_back([&, r, t = std::move(t)]() mutable {
      auto a = cluster::NodeAgent::Join(options[r], std::move(t), Deadline::AfterMs(5000));
      ASSERT_TRUE(a.ok()) << a.status();
      agents[r] = std::move(*a);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  std::atomic<int> passed{0};
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      EXPECT_TRUE(agents[r]->Barrier(wire::Group::Workers, Deadline::AfterMs(5000)).ok());
      ++passed;
    });
  }
  std::this_thread::sleep_for(Millis(200));
  EXPECT_EQ(passed.load(), 0);  // worker 2 has not arrived
  EXPECT_TRUE(agents[2]->Barrier(wire::Group::Workers, Deadline::AfterMs(5000)).ok());
  for (auto& t : threads) t.join();
  EXPECT_EQ(passed.load(), 2);
  // Worker 2 dies silently (its transport goes away without a Leave).
  raw[2]->Shutdown();
  Status s = agents[0]->Barrier(wire::Group::Workers, Deadline::AfterMs(5000));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("worker 2 is dead"), std::string::npos) << s;
  // Worker 1 hears of it on its own agent thread.
  std::vector<wire::NodeInfo> dead;
  for (Deadline d = Deadline::AfterMs(2000); dead.empty() && !d.Expired();) {
    std::this_thread::sleep_for(Millis(10));
    dead = agents[1]->dead_peers();
  }
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].Name(), "worker 2");
  EXPECT_EQ(metrics_.heartbeat_timeouts[static_cast<int>(wire::Role::Worker)]->Value(), 1);
}

}  // namespace
}  // namespace gradsync::server
