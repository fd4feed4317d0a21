// The scheduler and its nodes in one process: nodes are threads, the network
// is an InProcNetwork.
#include "scheduler/scheduler.h"

#include <atomic>
#include <functional>
#include <mutex>
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
  void StartScheduler(int workers, int servers, Millis server_grace = Millis(0)) {
    SchedulerOptions o;
    o.server_grace = server_grace;
    o.listen = std::string("tcp://") + kScheduler;
    o.num_workers = workers;
    o.num_servers = servers;
    o.heartbeat_interval = Millis(50);
    o.missed_heartbeats = 4;
    o.rendezvous_timeout = Millis(5000);
    o.elastic = elastic_;
    scheduler_ =
        std::make_unique<Scheduler>(o, network_.NewTransport("scheduler"), &metrics_, &clock_);
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
  std::unique_ptr<wire::Transport> NewTransport() { return network_.NewTransport(); }

  void ListenData(const cluster::NodeOptions& o) {
    data_.push_back(network_.NewTransport());
    ASSERT_TRUE(data_.back()->Listen("tcp://" + o.host + ":" + std::to_string(o.data_port)).ok());
  }

  static Status UnknownError() { return InternalError("not joined"); }

  // Starts a job of `workers` workers and one server, all through
  // reachability; raw_[i] is node i's transport to the scheduler (the server
  // is the last node).
  std::vector<std::unique_ptr<cluster::NodeAgent>> RunningJob(int workers, Millis grace) {
    StartScheduler(workers, 1, grace);
    for (int r = 0; r < workers; ++r) options_.push_back(Options(wire::Role::Worker, r));
    options_.push_back(Options(wire::Role::Server, -1));
    std::vector<std::unique_ptr<cluster::NodeAgent>> agents(options_.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < options_.size(); ++i) {
      ListenData(options_[i]);
      auto t = NewTransport();
      raw_.push_back(t.get());
      threads.emplace_back([&, i, t = std::move(t)]() mutable {
        auto a = cluster::NodeAgent::Join(options_[i], std::move(t), Deadline::AfterMs(5000));
        ASSERT_TRUE(a.ok()) << a.status();
        agents[i] = std::move(*a);
        const auto& self = agents[i]->assignment().self;
        std::vector<wire::NodeInfo> others;
        for (const auto& p : agents[i]->assignment().peers) {
          if (p.role != self.role || p.rank != self.rank) others.push_back(p);
        }
        EXPECT_TRUE(agents[i]->CheckReachability(others, Deadline::AfterMs(5000)).ok());
      });
    }
    for (auto& t : threads) t.join();
    return agents;
  }

  // Waits until `done` holds (true) or 5 s pass (false).
  static bool WaitUntil(const std::function<bool()>& done) {
    for (Deadline d = Deadline::AfterMs(5000); !d.Expired();) {
      if (done()) return true;
      std::this_thread::sleep_for(Millis(10));
    }
    return done();
  }

  ElasticOptions elastic_;
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
  std::vector<cluster::NodeOptions> options_;  // RunningJob's nodes
  std::vector<wire::Transport*> raw_;
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
  // The first worker holds rank 0 before the others ask: it waits for a
  // second worker that never comes, so its Join ends at the deadline.
  // Options and the transport are made here: the fixture is not thread-safe.
  std::thread first([options = Options(wire::Role::Worker, 0), t = NewTransport()]() mutable {
    (void)cluster::NodeAgent::Join(options, std::move(t), Deadline::AfterMs(5000));
  });
  const Deadline registered = Deadline::AfterMs(5000);
  while (metrics_.registrations->Value() < 1 && !registered.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (metrics_.registrations->Value() < 1) {
    first.join();
    FAIL() << "the first worker did not register";
  }
  auto taken = Options(wire::Role::Worker, 0);
  auto too_big = Options(wire::Role::Worker, 7);
  auto server = Options(wire::Role::Server, -1);
  auto a = JoinAll({taken, too_big, server});
  first.join();
  std::vector<std::string> errors;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_FALSE(a[i].ok());
    errors.push_back(a[i].status().message());
  }
  EXPECT_NE(errors[0].find("worker rank 0 is already taken by pid"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("worker rank 7 is out of range (the job has 2)"), std::string::npos)
      << errors[1];
  EXPECT_NE(errors[2].find("the job already has all 0 servers"), std::string::npos) << errors[2];
  EXPECT_EQ(metrics_.rejected.counter(wire::ErrorCode::RankTaken).Value(), 1);
  EXPECT_EQ(metrics_.rejected.counter(wire::ErrorCode::JobFull).Value(), 1);
}

// A plan binds each endpoint to one node's key: a second node at a live
// node's data or stream port is refused, naming it.
TEST_F(SchedulerTest, ANodeAtAnotherLiveNodesEndpointIsRefused) {
  elastic_ = ElasticOptions{1, Millis(5000), 4};
  auto agents = RunningJob(2, Millis(0));
  ASSERT_EQ(agents.size(), 3u);
  const wire::NodeInfo first = agents[0]->assignment().self;
  cluster::NodeOptions same_data = Options(wire::Role::Worker, -1);
  same_data.num_workers = 2;
  same_data.data_port = first.data_port;
  auto refused = cluster::NodeAgent::Join(same_data, NewTransport(), Deadline::AfterMs(5000));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(":" + std::to_string(first.data_port) +
                                            " is already an endpoint of worker 0"),
            std::string::npos)
      << refused.status();
  cluster::NodeOptions stream_there = Options(wire::Role::Worker, -1);
  stream_there.num_workers = 2;
  stream_there.stream_port = first.data_port;
  refused = cluster::NodeAgent::Join(stream_there, NewTransport(), Deadline::AfterMs(5000));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("is already an endpoint of worker 0"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(agents[0]->latest().epoch, 0u);
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
      EXPECT_TRUE(agents[r]->Barrier(wire::Group::Workers, 0, Deadline::AfterMs(5000)).ok());
      ++passed;
    });
  }
  std::this_thread::sleep_for(Millis(200));
  EXPECT_EQ(passed.load(), 0);  // worker 2 has not arrived
  EXPECT_TRUE(agents[2]->Barrier(wire::Group::Workers, 0, Deadline::AfterMs(5000)).ok());
  for (auto& t : threads) t.join();
  EXPECT_EQ(passed.load(), 2);
  // Worker 2 dies silently (its transport goes away without a Leave).
  raw[2]->Shutdown();
  Status s = agents[0]->Barrier(wire::Group::Workers, 0, Deadline::AfterMs(5000));
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
  const Status death = agents[1]->PeerDeathStatus(wire::Role::Worker);
  EXPECT_EQ(death.code(), StatusCode::kUnavailable) << death;
  EXPECT_NE(death.message().find("worker 2 died (declared dead by the scheduler: "),
            std::string::npos)
      << death;
  EXPECT_TRUE(agents[1]->PeerDeathStatus(wire::Role::Server).ok());
  EXPECT_EQ(metrics_.heartbeat_timeouts[static_cast<int>(wire::Role::Worker)]->Value(), 1);
}

// Lane and pair ports travel through the scheduler, not through the
// members: every worker gets every part, under the rank the scheduler bound
// to its sender, and a port another node listens at on that host is refused.
TEST_F(SchedulerTest, AGatherGivesEveryPartUnderItsSendersRankAndRefusesTakenPorts) {
  auto agents = RunningJob(3, Millis(5000));
  ASSERT_EQ(agents.size(), 4u);  // three workers and a server
  std::vector<StatusOr<std::vector<wire::GatherPartFields>>> got(3, InternalError("none"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      wire::GatherPartFields mine;
      mine.rank = 7;  // the sender's word on its rank is not taken
      mine.ports = {static_cast<uint16_t>(3000 + 2 * r), static_cast<uint16_t>(3001 + 2 * r)};
      mine.data = {static_cast<uint8_t>(10 + r)};
      got[static_cast<size_t>(r)] =
          agents[static_cast<size_t>(r)]->Gather(0, mine, Deadline::AfterMs(5000));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(got[static_cast<size_t>(r)].ok()) << got[static_cast<size_t>(r)].status();
    const auto& parts = *got[static_cast<size_t>(r)];
    ASSERT_EQ(parts.size(), 3u);
    for (int q = 0; q < 3; ++q) {
      EXPECT_EQ(parts[static_cast<size_t>(q)].rank, q);
      EXPECT_EQ(parts[static_cast<size_t>(q)].ports,
                (std::vector<uint16_t>{static_cast<uint16_t>(3000 + 2 * q),
                                       static_cast<uint16_t>(3001 + 2 * q)}));
      EXPECT_EQ(parts[static_cast<size_t>(q)].data,
                std::vector<uint8_t>{static_cast<uint8_t>(10 + q)});
    }
  }
  // Worker 0 announces the shard's data port: refused at once, naming it.
  wire::GatherPartFields taken;
  taken.ports = {options_.back().data_port};
  const auto refused = agents[0]->Gather(0, taken, Deadline::AfterMs(5000));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("which is server 0's"), std::string::npos)
      << refused.status();
}

TEST_F(SchedulerTest, APortAnotherWorkerAnnouncedInTheGatherIsRefused) {
  auto agents = RunningJob(2, Millis(5000));
  ASSERT_EQ(agents.size(), 3u);
  // Both announce port 4100: whichever comes second is refused naming the
  // first, and the first waits for a part that never comes.
  wire::GatherPartFields same;
  same.ports = {4100};
  std::vector<Status> out(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      out[static_cast<size_t>(r)] =
          agents[static_cast<size_t>(r)]->Gather(0, same, Deadline::AfterMs(3000)).status();
    });
  }
  for (auto& t : threads) t.join();
  int refused = 0;
  for (int r = 0; r < 2; ++r) {
    const std::string& m = out[static_cast<size_t>(r)].message();
    EXPECT_FALSE(out[static_cast<size_t>(r)].ok());
    const std::string other = "which worker " + std::to_string(1 - r) + " announced";
    if (m.find("announced port 4100 on 127.0.0.1, " + other) != std::string::npos) ++refused;
  }
  EXPECT_EQ(refused, 1) << out[0] << " / " << out[1];
}

// A worker whose process ends normally without entering a barrier the
// others wait in never will: the barrier fails naming it, for those
// waiting and for those that enter it later, instead of letting them pass.
TEST_F(SchedulerTest, ABarrierFailsNamingAWorkerThatLeftWithoutEnteringIt) {
  auto agents = RunningJob(3, Millis(5000));
  ASSERT_EQ(agents.size(), 4u);  // three workers and a server
  Status waiting;
  std::thread t(
      [&] { waiting = agents[0]->Barrier(wire::Group::Workers, 0, Deadline::AfterMs(10000)); });
  agents[2]->Leave("finished");
  t.join();
  EXPECT_FALSE(waiting.ok());
  EXPECT_NE(waiting.message().find("cannot complete: worker 2 left the job without entering it"),
            std::string::npos)
      << waiting;
  // Worker 0 leaves after its barrier failed; worker 1, entering it later,
  // hears of worker 2, which never entered it.
  agents[0]->Leave("failed");
  const Status later = agents[1]->Barrier(wire::Group::Workers, 0, Deadline::AfterMs(10000));
  EXPECT_NE(later.message().find("worker 2 left the job without entering it"), std::string::npos)
      << later;
}

// A worker that departs on a failure of its own says what kind: the others
// read its death as that kind (a deadline as DeadlineExceeded), with why.
TEST_F(SchedulerTest, AWorkerThatDepartsOnItsFailureIsDeadWithItsFailuresKind) {
  auto agents = RunningJob(3, Millis(5000));
  ASSERT_EQ(agents.size(), 4u);
  EXPECT_TRUE(agents[0]->PeerDeathStatus(wire::Role::Worker).ok());
  agents[1]->Leave("its communicator failed: deadline_exceeded: rank 2 stopped contributing",
                   /*departing=*/true, wire::ErrorCode::Timeout);
  Status death;
  for (Deadline d = Deadline::AfterMs(5000); death.ok() && !d.Expired();) {
    std::this_thread::sleep_for(Millis(10));
    death = agents[0]->PeerDeathStatus(wire::Role::Worker);
  }
  EXPECT_EQ(death.code(), StatusCode::kDeadlineExceeded) << death;
  EXPECT_NE(
      death.message().find("worker 1 died (declared dead by the scheduler: it left the job (its "
                           "communicator failed: deadline_exceeded: rank 2 stopped contributing))"),
      std::string::npos)
      << death;
}

TEST_F(SchedulerTest, ASilentServerThatRejoinsAtItsAddressKeepsItsRankAndTheJobGoesOn) {
  auto agents = RunningJob(2, Millis(5000));
  ASSERT_EQ(agents.size(), 3u);
  const uint64_t job = agents[0]->assignment().job_id;
  raw_[2]->Shutdown();                       // the server dies without a word
  std::this_thread::sleep_for(Millis(600));  // well past 4 heartbeats of 50 ms
  EXPECT_TRUE(agents[0]->dead_peers().empty());
  EXPECT_TRUE(agents[0]->job_status().ok()) << agents[0]->job_status();
  // Restarted with the same flags: the same host and data port.
  auto back = cluster::NodeAgent::Join(options_[2], NewTransport(), Deadline::AfterMs(5000));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->assignment().job_id, job);
  EXPECT_EQ((*back)->assignment().self.rank, 0);
  EXPECT_EQ((*back)->assignment().peers.size(), 3u);
  EXPECT_TRUE((*back)->CheckReachability({}, Deadline::AfterMs(5000)).ok());
  std::this_thread::sleep_for(Millis(400));
  EXPECT_TRUE(agents[0]->dead_peers().empty());
  EXPECT_TRUE((*back)->job_status().ok()) << (*back)->job_status();
  EXPECT_EQ(metrics_.heartbeat_timeouts[static_cast<int>(wire::Role::Server)]->Value(), 0);
  // Another server at that address now is refused: the rank is held.
  cluster::NodeOptions elsewhere = options_[2];
  elsewhere.data_port = 4242;
  elsewhere.rank = 0;
  auto wrong = cluster::NodeAgent::Join(elsewhere, NewTransport(), Deadline::AfterMs(5000));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("server 0 can only rejoin at 127.0.0.1:1002"),
            std::string::npos)
      << wrong.status();
}

TEST_F(SchedulerTest, AServerThatDoesNotComeBackWithinTheGraceIsDeclaredDeadNamingIt) {
  auto agents = RunningJob(1, Millis(300));
  std::mutex mu;
  std::string why;
  agents[0]->OnPeerDead([&](const wire::NodeInfo& dead, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    why = dead.Name() + ": " + reason;
  });
  raw_[1]->Shutdown();
  std::vector<wire::NodeInfo> dead;
  for (Deadline d = Deadline::AfterMs(3000); dead.empty() && !d.Expired();) {
    std::this_thread::sleep_for(Millis(10));
    dead = agents[0]->dead_peers();
  }
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].Name(), "server 0");
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_NE(why.find("server 0: no message for"), std::string::npos) << why;
    EXPECT_NE(why.find("did not rejoin within the grace of"), std::string::npos) << why;
  }
  auto late = cluster::NodeAgent::Join(options_[1], NewTransport(), Deadline::AfterMs(5000));
  ASSERT_FALSE(late.ok());
  EXPECT_NE(late.status().message().find("server 0 was declared dead"), std::string::npos)
      << late.status();
}

// A process claiming the address of a server that is alive used to take
// its place at once.
TEST_F(SchedulerTest, AClaimOnALiveServersAddressIsRefusedAndTheServerKeepsItsPlace) {
  auto agents = RunningJob(2, Millis(5000));
  ASSERT_EQ(agents.size(), 3u);
  auto impostor = cluster::NodeAgent::Join(options_[2], NewTransport(), Deadline::AfterMs(5000));
  ASSERT_FALSE(impostor.ok());
  EXPECT_EQ(impostor.status().code(), StatusCode::kFailedPrecondition) << impostor.status();
  EXPECT_NE(impostor.status().message().find("server 0 at 127.0.0.1:1002 is alive"),
            std::string::npos)
      << impostor.status();
  std::this_thread::sleep_for(Millis(300));
  EXPECT_TRUE(agents[0]->dead_peers().empty());
  EXPECT_TRUE(agents[2]->job_status().ok()) << agents[2]->job_status();
  EXPECT_EQ(metrics_.registrations->Value(), 3);
}

TEST_F(SchedulerTest, AnElasticJobReranksTheSurvivorsOfALossAndFailsBelowMinWorkers) {
  elastic_ = ElasticOptions{2, Millis(300)};
  auto agents = RunningJob(3, Millis(0));
  ASSERT_EQ(agents.size(), 4u);
  EXPECT_TRUE(agents[0]->latest().elastic);
  const std::string lost_identity = agents[1]->assignment().self.identity;
  {  // barrier 1 of epoch 0, by all three
    std::vector<std::thread> in;
    for (size_t r : {1, 2}) {
      in.emplace_back([&, r] {
        EXPECT_TRUE(agents[r]->Barrier(wire::Group::Workers, 0, Deadline::AfterMs(5000)).ok());
      });
    }
    EXPECT_TRUE(agents[0]->Barrier(wire::Group::Workers, 0, Deadline::AfterMs(5000)).ok());
    for (std::thread& t : in) t.join();
  }
  raw_[1]->Shutdown();  // worker 1 dies without a word
  ASSERT_TRUE(
      WaitUntil([&] { return agents[0]->latest().epoch == 1 && agents[2]->latest().epoch == 1; }));
  const cluster::Assignment a0 = agents[0]->latest(), a2 = agents[2]->latest();
  EXPECT_EQ(a0.self.rank, 0);
  EXPECT_EQ(a2.self.rank, 1);  // densely re-ranked
  EXPECT_EQ(a0.num_workers, 2);
  EXPECT_EQ(a0.peers.size(), 3u);  // the two survivors and the server
  EXPECT_NE(a0.change.find("membership changed: worker rank 1 (identity " + lost_identity +
                           ") left: no message for"),
            std::string::npos)
      << a0.change;
  // The workers go on; only the server hears of a dead node.
  EXPECT_TRUE(agents[0]->job_status().ok()) << agents[0]->job_status();
  EXPECT_TRUE(agents[0]->dead_peers().empty());
  EXPECT_TRUE(WaitUntil([&] { return agents[3]->dead_peers().size() == 1; }));
  // Both survivors pass the epoch barrier; the recovery time is observed.
  std::thread other([&] { EXPECT_TRUE(agents[2]->EpochBarrier(1, Deadline::AfterMs(5000)).ok()); });
  EXPECT_TRUE(agents[0]->EpochBarrier(1, Deadline::AfterMs(5000)).ok());
  other.join();
  // The survivors' first barrier of epoch 1 is barrier 1 of epoch 1: the
  // release of epoch 0's barrier 1 does not count for it, so worker 0 waits
  // there alone until worker 2 enters it.
  const Status alone = agents[0]->Barrier(wire::Group::Workers, 1, Deadline::AfterMs(300));
  EXPECT_EQ(alone.code(), StatusCode::kDeadlineExceeded) << alone;
  EXPECT_TRUE(agents[2]->Barrier(wire::Group::Workers, 1, Deadline::AfterMs(5000)).ok());
  EXPECT_EQ(metrics_.membership_changes[0]->Value(), 1);
  EXPECT_EQ(metrics_.world_size->Value(), 2);
  EXPECT_EQ(metrics_.epoch->Value(), 1);
  // Below min_workers the job waits elastic_timeout (300 ms), then fails.
  raw_[2]->Shutdown();
  ASSERT_TRUE(WaitUntil([&] { return !agents[0]->job_status().ok(); }));
  const Status failed = agents[0]->job_status();
  EXPECT_NE(failed.message().find("only 1 workers remain, below min_workers 2"), std::string::npos)
      << failed;
  EXPECT_NE(failed.message().find("worker 1 lost: no message for"), std::string::npos) << failed;
  EXPECT_EQ(metrics_.membership_changes[1]->Value(), 1);
}

TEST_F(SchedulerTest, AJoinerIsRankedLastInANewEpochAndTheJoinIsCounted) {
  elastic_ = ElasticOptions{1, Millis(5000), 3};
  auto agents = RunningJob(2, Millis(0));
  ASSERT_EQ(agents.size(), 3u);
  cluster::NodeOptions o = Options(wire::Role::Worker, -1);
  o.num_workers = 2;  // as the job's other workers were started
  ListenData(o);
  auto joiner = cluster::NodeAgent::Join(o, NewTransport(), Deadline::AfterMs(5000));
  ASSERT_TRUE(joiner.ok()) << joiner.status();
  const cluster::Assignment j = (*joiner)->assignment();
  EXPECT_EQ(j.epoch, 1u);
  EXPECT_EQ(j.self.rank, 2);
  EXPECT_EQ(j.num_workers, 3);
  EXPECT_EQ(j.peers.size(), 4u);
  EXPECT_NE(j.change.find("joined (pid "), std::string::npos) << j.change;
  ASSERT_TRUE(WaitUntil([&] {
    return agents[0]->latest().epoch == 1 && agents[1]->latest().epoch == 1 &&
           agents[2]->latest().epoch == 1;
  }));  // the server too
  EXPECT_EQ(agents[1]->latest().self.rank, 1);
  // Every member's barrier, the joiner's included, releases the epoch.
  std::thread member(
      [&] { EXPECT_TRUE(agents[1]->EpochBarrier(1, Deadline::AfterMs(5000)).ok()); });
  std::thread joined(
      [&] { EXPECT_TRUE((*joiner)->EpochBarrier(1, Deadline::AfterMs(5000)).ok()); });
  EXPECT_TRUE(agents[0]->EpochBarrier(1, Deadline::AfterMs(5000)).ok());
  member.join();
  joined.join();
  EXPECT_EQ(metrics_.membership_changes[static_cast<int>(MembershipReason::kJoined)]->Value(), 1);
  EXPECT_EQ(metrics_.world_size->Value(), 3);
  EXPECT_EQ(metrics_.join_seconds->Collect().histogram.sample_count, 1u);
  // At max_workers (3) the next one is refused once no worker was lost
  // within the loss deadline.
  cluster::NodeOptions late = Options(wire::Role::Worker, -1);
  ListenData(late);
  auto refused = cluster::NodeAgent::Join(late, NewTransport(), Deadline::AfterMs(5000));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("the running job already has 3 workers, its "
                                            "max_workers 3"),
            std::string::npos)
      << refused.status();
}

// A joiner registered under another worker's next parameter-server
// identity would match that worker's key on the shards in the next epoch:
// derived identities are not data identities, and are refused.
TEST_F(SchedulerTest, AJoinerUnderAnotherWorkersDerivedIdentityIsRefused) {
  elastic_ = ElasticOptions{1, Millis(5000), 3};
  auto agents = RunningJob(2, Millis(0));
  ASSERT_EQ(agents.size(), 3u);
  const std::string victim = agents[0]->assignment().self.identity;
  for (const std::string& identity :
       {wire::PsClientIdentity(victim, 1), wire::LaneIdentity(victim, 1), victim + "#x"}) {
    cluster::NodeOptions o = Options(wire::Role::Worker, -1);
    o.num_workers = 2;
    ListenData(o);
    o.identity = identity;
    auto joiner = cluster::NodeAgent::Join(o, NewTransport(), Deadline::AfterMs(5000));
    ASSERT_FALSE(joiner.ok()) << identity;
    EXPECT_NE(joiner.status().message().find("a data identity is"), std::string::npos)
        << joiner.status();
  }
  EXPECT_EQ(agents[0]->latest().epoch, 0u);  // no membership change
}

// Every data identity is the scheduler's: what a node asks for is not
// taken, so no member picks its own (nor another's) and derived identities
// come from one grammar.
TEST_F(SchedulerTest, TheSchedulerMintsEveryDataIdentity) {
  StartScheduler(3, 0);
  std::vector<cluster::NodeOptions> options;
  for (int r = 0; r < 3; ++r) {
    options.push_back(Options(wire::Role::Worker, r));
    options.back().identity = "the-same-for-all";
  }
  auto agents = JoinAll(options);
  std::set<std::string> seen;
  for (auto& a : agents) {
    ASSERT_TRUE(a.ok()) << a.status();
    const std::string id = (*a)->assignment().self.identity;
    EXPECT_TRUE(wire::IsDataIdentity(id)) << id;
    EXPECT_EQ(id.rfind("worker-", 0), 0u) << id;
    seen.insert(id);
    for (const wire::NodeInfo& p : (*a)->assignment().peers) {
      if (p.rank == (*a)->assignment().self.rank) {
        EXPECT_EQ(p.identity, id);
      }
    }
  }
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen.count("the-same-for-all"), 0u);
}

TEST_F(SchedulerTest, MinWorkersOutsideOneToNumWorkersIsRefused) {
  Config config = Config::FromMap({{"num_workers", "3"}, {"min_workers", "4"}});
  auto o = SchedulerOptions::FromConfig(config);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("min_workers must be within [1, num_workers]"),
            std::string::npos)
      << o.status();
}

}  // namespace
}  // namespace gradsync::server
