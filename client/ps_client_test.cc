// The PS client against real shards (server/ps_shard.h) in one process:
// workers are threads, every node has an in-process transport.
#include "client/ps_client.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/ps_shard.h"
#include "wire/inproc_transport.h"

namespace gradsync::client {
namespace {

using server::OptimizerKind;
using server::PsMode;
using server::PsShard;
using wire::MsgType;

constexpr uint64_t kJob = 5;

// Forwards to an in-process transport; `on_send` may rewrite what is sent.
class HookTransport : public wire::Transport {
 public:
  using Hook = std::function<Status(wire::Transport& inner, const wire::Route& to,
                                    wire::Message msg, Deadline deadline)>;
  HookTransport(std::unique_ptr<wire::Transport> inner, Hook hook)
      : inner_(std::move(inner)), hook_(std::move(hook)) {}
  const std::string& identity() const override { return inner_->identity(); }
  StatusOr<std::string> Listen(const std::string& e) override { return inner_->Listen(e); }
  StatusOr<wire::ConnId> Connect(const std::string& e) override { return inner_->Connect(e); }
  Status Send(const wire::Route& to, wire::Message msg, Deadline deadline) override {
    return hook_(*inner_, to, std::move(msg), deadline);
  }
  StatusOr<wire::Incoming> Receive(Deadline d) override { return inner_->Receive(d); }
  Status Probe(const std::string& e, Deadline d) override { return inner_->Probe(e, d); }
  void Shutdown() override { inner_->Shutdown(); }

 private:
  std::unique_ptr<wire::Transport> inner_;
  Hook hook_;
};

wire::Message CopyOf(const wire::Message& m) {
  wire::Message c;
  c.header = m.header;
  c.payloads = m.payloads;
  return c;
}

// Every push is sent twice, and the pushes of one call go out in reverse
// order, after all of them were queued.
HookTransport::Hook DuplicateAndReorder() {
  auto stash = std::make_shared<std::vector<std::pair<wire::Route, wire::Message>>>();
  return [stash](wire::Transport& inner, const wire::Route& to, wire::Message msg,
                 Deadline deadline) -> Status {
    if (msg.header_view()->type() == MsgType::Push) {
      stash->emplace_back(to, CopyOf(msg));
      stash->emplace_back(to, std::move(msg));
      return Status();
    }
    for (auto it = stash->rbegin(); it != stash->rend(); ++it) {
      GS_RETURN_IF_ERROR(inner.Send(it->first, std::move(it->second), deadline));
    }
    stash->clear();
    return inner.Send(to, std::move(msg), deadline);
  };
}

// The first `n` messages are lost.
HookTransport::Hook DropFirst(int n) {
  auto left = std::make_shared<int>(n);
  return [left](wire::Transport& inner, const wire::Route& to, wire::Message msg,
                Deadline deadline) -> Status {
    if ((*left)-- > 0) return Status();
    return inner.Send(to, std::move(msg), deadline);
  };
}

struct JobSpec {
  int workers = 1;
  int shards = 1;
  PsMode mode = PsMode::kSync;
  uint64_t staleness = 0;
  OptimizerKind optimizer = OptimizerKind::kNone;
  std::function<HookTransport::Hook()> make_hook;  // one hook per worker
  bool client_thinks_optimizer = false;
};

JobSpec Spec(int workers, int shards, PsMode mode = PsMode::kSync, uint64_t staleness = 0,
             OptimizerKind optimizer = OptimizerKind::kNone) {
  JobSpec spec;
  spec.workers = workers;
  spec.shards = shards;
  spec.mode = mode;
  spec.staleness = staleness;
  spec.optimizer = optimizer;
  return spec;
}

class PsJob {
 public:
  explicit PsJob(const JobSpec& spec) : workers_(spec.workers) {
    server::PsShardOptions so;
    so.rules.mode = spec.mode;
    so.rules.staleness = spec.staleness;
    so.rules.num_workers = spec.workers;
    so.optimizer.kind = spec.optimizer;
    so.optimizer.lr = 0.25f;
    PsPeers peers;
    peers.world_size = spec.workers;
    for (int s = 0; s < spec.shards; ++s) {
      shard_transports_.push_back(net_.NewTransport("shard" + std::to_string(s)));
      const std::string endpoint = "inproc://shard" + std::to_string(s);
      EXPECT_TRUE(shard_transports_.back()->Listen(endpoint).ok());
      peers.server_endpoints.push_back(endpoint);
      auto shard = PsShard::Start(shard_transports_.back().get(), so,
                                  wire::Sender{wire::Role::Server, s, kJob});
      EXPECT_TRUE(shard.ok()) << shard.status();
      shards_.push_back(std::move(*shard));
    }
    PsClientOptions co;
    co.partition_bytes = 64;
    co.server_optimizer = spec.optimizer != OptimizerKind::kNone || spec.client_thinks_optimizer;
    co.resend_after = Millis(30);
    for (int w = 0; w < spec.workers; ++w) {
      peers.rank = w;
      peers.sender = wire::Sender{wire::Role::Worker, w, kJob};
      std::unique_ptr<wire::Transport> t = net_.NewTransport("worker" + std::to_string(w));
      if (spec.make_hook) t = std::make_unique<HookTransport>(std::move(t), spec.make_hook());
      auto c = PsClient::Create(std::move(t), peers, co, nullptr, nullptr);
      EXPECT_TRUE(c.ok()) << c.status();
      clients_.push_back(std::move(*c));
    }
  }
  ~PsJob() {
    clients_.clear();
    for (auto& s : shards_) s->Shutdown();
  }

  // Runs body(rank, client) on one thread per worker.
  void Run(const std::function<void(int, PsClient&)>& body) {
    std::vector<std::thread> threads;
    for (int w = 0; w < workers_; ++w) {
      threads.emplace_back([&, w] { body(w, *clients_[static_cast<size_t>(w)]); });
    }
    for (auto& t : threads) t.join();
  }
  server::PsShardStats ShardStats() const {
    server::PsShardStats sum;
    for (const auto& s : shards_) {
      auto st = s->stats();
      sum.pushes_applied += st.pushes_applied;
      sum.duplicates += st.duplicates;
      sum.rejected += st.rejected;
      sum.max_staleness = std::max(sum.max_staleness, st.max_staleness);
    }
    return sum;
  }
  PsClient& client(int w) { return *clients_[static_cast<size_t>(w)]; }

 private:
  const int workers_;
  wire::InProcNetwork net_;
  std::vector<std::unique_ptr<wire::InProcTransport>> shard_transports_;
  std::vector<std::unique_ptr<PsShard>> shards_;
  std::vector<std::unique_ptr<PsClient>> clients_;
};

float Value(int rank, int round, uint32_t bucket, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + round * 5 + bucket) % 17) - 8);
}

// Two buckets of odd sizes, `rounds` rounds; every worker checks the exact
// average after each.
void ExpectExactAverages(PsJob& job, int workers, int rounds) {
  const std::vector<size_t> sizes = {100, 37};
  job.Run([&](int rank, PsClient& c) {
    for (int round = 0; round < rounds; ++round) {
      for (uint32_t b = 0; b < sizes.size(); ++b) {
        std::vector<float> data(sizes[b]), want(sizes[b], 0.0f);
        for (size_t i = 0; i < data.size(); ++i) {
          data[i] = Value(rank, round, b, i);
          for (int r = 0; r < workers; ++r) want[i] += Value(r, round, b, i);
          want[i] /= static_cast<float>(workers);
        }
        OpTag tag{static_cast<uint64_t>(round), b, 0, 0};
        ASSERT_TRUE(c.AllReduce(data.data(), data.size(), DType::kF32, ReduceOp::kAverage, tag,
                                Deadline::AfterMs(10000)).ok());
        ASSERT_EQ(data, want) << "rank " << rank << " round " << round << " bucket " << b;
      }
    }
  });
}

TEST(PsClientTest, SyncGivesTheExactAverageForOneToFourWorkersAndShards) {
  for (int workers = 1; workers <= 4; ++workers) {
    for (int shards = 1; shards <= 4; ++shards) {
      SCOPED_TRACE(std::to_string(workers) + " workers, " + std::to_string(shards) + " shards");
      PsJob job(Spec(workers, shards));
      ExpectExactAverages(job, workers, 3);
      EXPECT_EQ(job.ShardStats().rejected, 0u);
    }
  }
}

TEST(PsClientTest, DuplicatedAndReorderedPushesAreAppliedOnce) {
  JobSpec spec = Spec(3, 2);
  spec.make_hook = DuplicateAndReorder;
  PsJob job(spec);
  ExpectExactAverages(job, 3, 3);
  // 3 workers x 3 rounds x (7 + 3 partitions), each sent twice.
  EXPECT_EQ(job.ShardStats().pushes_applied, 3u * 3 * 10);
  // A loaded machine may also resend a push whose Ack was slow: that is a
  // duplicate too, and still applied once.
  uint64_t resent = 0;
  for (int w = 0; w < 3; ++w) resent += job.client(w).stats().resent;
  EXPECT_GE(job.ShardStats().duplicates, 3u * 3 * 10);
  EXPECT_LE(job.ShardStats().duplicates, 3u * 3 * 10 + resent);
}

TEST(PsClientTest, LostMessagesAreResent) {
  JobSpec spec = Spec(2, 2);
  spec.make_hook = [] { return DropFirst(5); };
  PsJob job(spec);
  ExpectExactAverages(job, 2, 2);
  EXPECT_GT(job.client(0).stats().resent + job.client(1).stats().resent, 0u);
}

TEST(PsClientTest, WithAServerOptimizerTheFirstCallSharesWorkerZerosParameters) {
  PsJob job(Spec(2, 3, PsMode::kSync, 0, OptimizerKind::kSgd));
  job.Run([&](int rank, PsClient& c) {
    std::vector<float> p(50);
    for (size_t i = 0; i < p.size(); ++i) p[i] = rank == 0 ? static_cast<float>(i) : -99.0f;
    ASSERT_TRUE(c.AllReduce(p.data(), p.size(), DType::kF32, ReduceOp::kAverage, {0, 4, 0, 0},
                            Deadline::AfterMs(10000)).ok());
    for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], static_cast<float>(i));
    std::vector<float> g(50, static_cast<float>(rank * 2 + 1));  // average 2
    ASSERT_TRUE(c.AllReduce(g.data(), g.size(), DType::kF32, ReduceOp::kAverage, {1, 4, 1, 0},
                            Deadline::AfterMs(10000)).ok());
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], static_cast<float>(i) - 0.5f);
  });
}

TEST(PsClientTest, AShardErrorFailsTheCallWithTheShardsMessageAndStaysFailed) {
  JobSpec spec;
  spec.client_thinks_optimizer = true;
  PsJob job(spec);
  std::vector<float> p(10, 1.0f);
  Status s = job.client(0).AllReduce(p.data(), p.size(), DType::kF32, ReduceOp::kAverage,
                                     {0, 0, 0, 0}, Deadline::AfterMs(5000));
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("server 0 refused"), std::string::npos) << s;
  EXPECT_NE(s.message().find("takes no initial parameters"), std::string::npos) << s;
  Status again = job.client(0).AllReduce(p.data(), p.size(), DType::kF32, ReduceOp::kAverage,
                                         {1, 0, 1, 0}, Deadline::AfterMs(5000));
  EXPECT_EQ(again.message(), s.message());
}

TEST(PsClientTest, RefusesOtherDtypesAndChangedSizesAndSendsDirectOpsElsewhere) {
  PsJob job(Spec(1, 1));
  std::vector<uint16_t> half(8);
  EXPECT_EQ(job.client(0).AllReduce(half.data(), 8, DType::kF16, ReduceOp::kAverage,
                                    {0, 0, 0, 0}, Deadline::AfterMs(1000)).code(),
            StatusCode::kInvalidArgument);
  std::vector<float> f(8, 1.0f);
  ASSERT_TRUE(job.client(0).AllReduce(f.data(), 8, DType::kF32, ReduceOp::kAverage,
                                      {0, 1, 0, 0}, Deadline::AfterMs(5000)).ok());
  EXPECT_EQ(job.client(0).AllReduce(f.data(), 7, DType::kF32, ReduceOp::kAverage,
                                    {1, 1, 1, 0}, Deadline::AfterMs(5000)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(job.client(0).Broadcast(f.data(), 32, 0, {}, Deadline::AfterMs(100)).code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(job.client(0).AllReduce(f.data(), 8, DType::kF32, ReduceOp::kSum,
                                    {0, kDirectOpBucket, 2, 0}, Deadline::AfterMs(100)).code(),
            StatusCode::kUnimplemented);
}

// Workers of uneven speed train for `rounds` rounds; returns the largest
// staleness the shards applied.
uint64_t MaxStaleness(PsMode mode, uint64_t s, int rounds) {
  PsJob job(Spec(3, 2, mode, s, OptimizerKind::kSgd));
  job.Run([&](int rank, PsClient& c) {
    std::vector<float> p(40, 1.0f);
    for (int round = 0; round <= rounds; ++round) {
      if (round > 0) std::fill(p.begin(), p.end(), 0.01f * static_cast<float>(rank + 1));
      ASSERT_TRUE(c.AllReduce(p.data(), p.size(), DType::kF32, ReduceOp::kAverage,
                              {static_cast<uint64_t>(round), 0, 0, 0},
                              Deadline::AfterMs(20000)).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(1 + 4 * rank));
    }
  });
  return job.ShardStats().max_staleness;
}

TEST(PsClientTest, SspStalenessNeverExceedsTheBound) {
  for (uint64_t s : {0, 1, 3}) {
    const uint64_t seen = MaxStaleness(PsMode::kSsp, s, 15);
    EXPECT_LE(seen, s) << "s = " << s;
  }
}

TEST(PsClientTest, AsyncAppliesStaleGradients) {
  EXPECT_GT(MaxStaleness(PsMode::kAsync, 0, 15), 0u);
}

}  // namespace
}  // namespace gradsync::client
