// The PS client against real shards (ps/ps_shard.h) in one process:
// workers are threads, every node has an in-process transport.
#include "client/ps_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/placement.h"
#include "compression/registry.h"
#include "compression/wire_codec.h"
#include "gtest/gtest.h"
#include "ps/ps_shard.h"
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
  StatusOr<wire::ConnId> ConnectLane(const std::string& e, int lane) override {
    return inner_->ConnectLane(e, lane);
  }
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
  std::string reply_codec;
  size_t shard_bytes_per_peer = 0;  // 0: the shard's default
  Millis shard_handle_delay{0};     // each key thread message waits this long first
  int lanes = 1;                    // PsClientOptions::lanes
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
    if (spec.shard_bytes_per_peer > 0) so.max_queued_bytes_per_peer = spec.shard_bytes_per_peer;
    if (spec.shard_handle_delay.count() > 0) {
      so.before_handle = [d = spec.shard_handle_delay] { std::this_thread::sleep_for(d); };
    }
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
    co.reply_codec = spec.reply_codec;
    co.lanes = spec.lanes;
    for (int w = 0; w < spec.workers; ++w) {
      peers.rank = w;
      peers.sender = wire::Sender{wire::Role::Worker, w, kJob};
      std::unique_ptr<wire::Transport> t = net_.NewTransport("worker" + std::to_string(w));
      if (spec.make_hook) t = std::make_unique<HookTransport>(std::move(t), spec.make_hook());
      auto c = PsClient::Create(std::move(t), peers, co, nullptr);
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
      sum.early_pulls += st.early_pulls;
      sum.unplanned += st.unplanned;
      sum.rejected += st.rejected;
      sum.rounds_closed += st.rounds_closed;
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
        ASSERT_TRUE(
            c.PushPull(data.data(), data.size(), DType::kF32, tag, Deadline::AfterMs(10000)).ok());
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

// With three lanes to each shard (the setting ps_lanes), a shard's
// partitions take them in turn: each worker sends over all six connections
// (two shards, three lanes), the shards answer each on its own, and the
// averages are the same exact ones.
TEST(PsClientTest, InThreeLanesEveryLaneCarriesAndTheAveragesAreExact) {
  JobSpec spec = Spec(3, 2);
  spec.lanes = 3;
  std::mutex mu;
  std::vector<std::shared_ptr<std::set<wire::ConnId>>> used;
  spec.make_hook = [&] {
    auto conns = std::make_shared<std::set<wire::ConnId>>();
    used.push_back(conns);
    return [&mu, conns](wire::Transport& inner, const wire::Route& to, wire::Message msg,
                        Deadline deadline) {
      {
        std::lock_guard<std::mutex> lock(mu);
        conns->insert(to.conn);
      }
      return inner.Send(to, std::move(msg), deadline);
    };
  };
  PsJob job(spec);
  ExpectExactAverages(job, 3, 3);
  EXPECT_EQ(job.ShardStats().rejected, 0u);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(used.size(), 3u);
  for (const auto& conns : used) EXPECT_EQ(conns->size(), 6u);
}

TEST(PsClientTest, DuplicatedAndReorderedPushesAreAppliedOnce) {
  JobSpec spec = Spec(3, 2);
  spec.make_hook = DuplicateAndReorder;
  PsJob job(spec);
  ExpectExactAverages(job, 3, 3);
  // 3 workers x 3 rounds x (7 + 3 partitions), each sent twice.
  EXPECT_EQ(job.ShardStats().pushes_applied, 3u * 3 * 10);
  // A loaded machine may also resend a push whose Ack was slow: that is a
  // duplicate too, and still applied once. In the first round a copy from
  // worker 1 or 2 that comes before worker 0's push made the key is
  // answered Busy (counted unplanned) instead: its twin, once the key
  // exists, is the copy applied.
  // The last twins may still be on their way to the shards when every
  // client has its replies: wait for them to be counted.
  server::PsShardStats stats = job.ShardStats();
  for (Deadline d = Deadline::AfterMs(20000);
       stats.duplicates + stats.unplanned < 3u * 3 * 10 && !d.Expired(); stats = job.ShardStats()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  uint64_t resent = 0;
  for (int w = 0; w < 3; ++w) resent += job.client(w).stats().resent;
  EXPECT_GE(stats.duplicates + stats.unplanned, 3u * 3 * 10)
      << "duplicates " << stats.duplicates << ", unplanned " << stats.unplanned << ", rejected "
      << stats.rejected << ", early pulls " << stats.early_pulls << ", replies " << stats.replies
      << ", resent " << resent;
  EXPECT_LE(stats.duplicates, 3u * 3 * 10 + resent);
}

TEST(PsClientTest, LostMessagesAreResent) {
  JobSpec spec = Spec(2, 2);
  spec.make_hook = [] { return DropFirst(5); };
  PsJob job(spec);
  ExpectExactAverages(job, 2, 2);
  EXPECT_GT(job.client(0).stats().resent + job.client(1).stats().resent, 0u);
}

TEST(PsClientTest, WhatABusyShardDidNotTakeIsSentAgain) {
  // A shard that takes one message of each worker at a time, and slowly:
  // most of each call's pushes and pulls are answered Busy at first.
  JobSpec spec = Spec(2, 2);
  spec.shard_bytes_per_peer = 1;
  spec.shard_handle_delay = Millis(2);
  PsJob job(spec);
  ExpectExactAverages(job, 2, 2);
  EXPECT_GT(job.client(0).stats().busy + job.client(1).stats().busy, 0u);
  EXPECT_GT(job.ShardStats().rejected, 0u);
}

TEST(PsClientTest, WithAServerOptimizerTheFirstCallSharesWorkerZerosParameters) {
  PsJob job(Spec(2, 3, PsMode::kSync, 0, OptimizerKind::kSgd));
  job.Run([&](int rank, PsClient& c) {
    std::vector<float> p(50);
    for (size_t i = 0; i < p.size(); ++i) p[i] = rank == 0 ? static_cast<float>(i) : -99.0f;
    ASSERT_TRUE(
        c.PushPull(p.data(), p.size(), DType::kF32, {0, 4, 0, 0}, Deadline::AfterMs(10000)).ok());
    for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], static_cast<float>(i));
    std::vector<float> g(50, static_cast<float>(rank * 2 + 1));  // average 2
    ASSERT_TRUE(
        c.PushPull(g.data(), g.size(), DType::kF32, {1, 4, 1, 0}, Deadline::AfterMs(10000)).ok());
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], static_cast<float>(i) - 0.5f);
  });
}

TEST(PsClientTest, AShardErrorFailsTheCallWithTheShardsMessageAndStaysFailed) {
  JobSpec spec;
  spec.client_thinks_optimizer = true;
  PsJob job(spec);
  std::vector<float> p(10, 1.0f);
  Status s = job.client(0).PushPull(p.data(), p.size(), DType::kF32, {0, 0, 0, 0},
                                    Deadline::AfterMs(5000));
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("server 0 refused"), std::string::npos) << s;
  EXPECT_NE(s.message().find("takes no initial parameters"), std::string::npos) << s;
  Status again = job.client(0).PushPull(p.data(), p.size(), DType::kF32, {1, 0, 1, 0},
                                        Deadline::AfterMs(5000));
  EXPECT_EQ(again.message(), s.message());
}

TEST(PsClientTest, RefusesOtherDtypesAndChangedSizes) {
  PsJob job(Spec(1, 1));
  std::vector<uint16_t> half(8);
  EXPECT_EQ(job.client(0)
                .PushPull(half.data(), 8, DType::kF16, {0, 0, 0, 0}, Deadline::AfterMs(1000))
                .code(),
            StatusCode::kInvalidArgument);
  std::vector<float> f(8, 1.0f);
  ASSERT_TRUE(
      job.client(0).PushPull(f.data(), 8, DType::kF32, {0, 1, 0, 0}, Deadline::AfterMs(5000)).ok());
  EXPECT_EQ(job.client(0)
                .PushPull(f.data(), 7, DType::kF32, {1, 1, 1, 0}, Deadline::AfterMs(5000))
                .code(),
            StatusCode::kInvalidArgument);
}

// What the shards must compute from compressed pushes: each worker's
// compressor mirrored here (one instance per partition, residuals included),
// decompressed, summed in rank order and divided, partition by partition.
class CompressedAverage {
 public:
  CompressedAverage(const std::string& spec, int workers, size_t count, uint32_t bucket, int shards)
      : plan_(PlanPartitions(bucket, count, sizeof(float), 64, shards)), bucket_(bucket) {
    compression::RegisterBuiltins(&registry_);
    // Top-k with error feedback shares its budget over the bucket: the
    // bucket's k = ceil(ratio * n) largest |g + residual| travel, wherever
    // they lie (fp32 values: what is kept arrives exactly).
    auto parsed = compression::ParseCompressorSpec(spec);
    if (parsed.ok() && parsed->name == "topk" && parsed->options.error_feedback) {
      topk_ratio_ = parsed->options.ratio;
      residuals_.assign(static_cast<size_t>(workers), std::vector<float>(count, 0.0f));
      return;
    }
    mirrors_.resize(static_cast<size_t>(workers));
    for (auto& per_worker : mirrors_) {
      for (size_t p = 0; p < plan_.size(); ++p) {
        per_worker.push_back(std::move(registry_.Create(spec)).value());
      }
    }
  }

  // The average of the workers' `inputs` of `step` as the shards make it.
  std::vector<float> Next(const std::vector<std::vector<float>>& inputs, uint64_t step) {
    const size_t n = inputs[0].size();
    std::vector<float> avg(n, 0.0f);
    for (size_t w = 0; w < inputs.size() && topk_ratio_ > 0; ++w) {
      std::vector<float> corrected(n);
      for (size_t i = 0; i < n; ++i) corrected[i] = inputs[w][i] + residuals_[w][i];
      std::vector<float> mags(n);
      for (size_t i = 0; i < n; ++i) mags[i] = std::fabs(corrected[i]);
      std::vector<float> sorted = mags;
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      const float kth = sorted[static_cast<size_t>(std::ceil(topk_ratio_ * n)) - 1];
      for (size_t i = 0; i < n; ++i) {
        const bool kept = mags[i] >= kth;
        avg[i] += kept ? corrected[i] : 0.0f;
        residuals_[w][i] = kept ? 0.0f : corrected[i];
        wire_bytes_ += w == 0 && kept ? 8 : 0;
      }
    }
    for (size_t w = 0; w < inputs.size() && topk_ratio_ == 0; ++w) {
      for (size_t p = 0; p < plan_.size(); ++p) {
        const PartitionSpan& span = plan_[p];
        compression::Compressor& c = *mirrors_[w][p];
        const auto ctx = compression::PartitionContext(kJob, step, bucket_, span.partition);
        std::vector<uint8_t> bytes(c.WireBytes(span.count));
        std::vector<float> d(span.count);
        EXPECT_TRUE(
            c.Compress(inputs[w].data() + span.offset, span.count, ctx, bytes.data(), bytes.size())
                .ok());
        EXPECT_TRUE(c.Decompress(bytes.data(), bytes.size(), span.count, ctx, d.data()).ok());
        for (size_t i = 0; i < span.count; ++i) avg[span.offset + i] += d[i];
        wire_bytes_ += w == 0 ? bytes.size() : 0;
      }
    }
    for (float& v : avg) v /= static_cast<float>(inputs.size());
    return avg;
  }
  size_t wire_bytes_per_round() const { return wire_bytes_; }

 private:
  std::vector<PartitionSpan> plan_;
  uint32_t bucket_;
  compression::CompressorRegistry registry_;
  std::vector<std::vector<std::unique_ptr<compression::Compressor>>> mirrors_;
  size_t wire_bytes_ = 0;
  double topk_ratio_ = 0;                      // top-k with error feedback
  std::vector<std::vector<float>> residuals_;  // its residuals, per worker
};

std::vector<float> Gradient(int rank, int round, size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.3f * static_cast<float>(i) + static_cast<float>(rank * 7 + round));
  }
  return g;
}

// What `mirror` makes of every worker's Gradient in rounds 0 .. rounds - 1.
std::vector<std::vector<float>> ExpectedRounds(CompressedAverage& mirror, int workers, size_t n,
                                               int rounds) {
  std::vector<std::vector<float>> want;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::vector<float>> inputs;
    for (int w = 0; w < workers; ++w) inputs.push_back(Gradient(w, round, n));
    want.push_back(mirror.Next(inputs, static_cast<uint64_t>(round)));
  }
  return want;
}

TEST(PsClientTest, CompressedPushesAverageWhatEveryWorkersCompressorSent) {
  const int workers = 3, shards = 2, rounds = 4;
  const size_t n = 150;  // 10 partitions of 16 floats, the last short
  for (const std::string spec : {"topk:ratio=0.25,ef=1", "qsgd:chunk=8", "sign:chunk=8,ef=1",
                                 "randomk:ratio=0.5,ef=1", "fp16", "bf16:ef=1"}) {
    SCOPED_TRACE(spec);
    JobSpec js = Spec(workers, shards);
    // Lost messages are resent as the same bytes: residuals move once a round.
    js.make_hook = [] { return DropFirst(3); };
    PsJob job(js);
    CompressedAverage mirror(spec, workers, n, 2, shards);
    const std::vector<std::vector<float>> want = ExpectedRounds(mirror, workers, n, rounds);
    std::vector<PsClient::Traffic> traffic(workers);
    job.Run([&](int rank, PsClient& c) {
      ASSERT_TRUE(c.SetCompression(2, spec).ok());
      for (int round = 0; round < rounds; ++round) {
        std::vector<float> g = Gradient(rank, round, n);
        OpTag tag{static_cast<uint64_t>(round), 2, static_cast<uint64_t>(round), 0};
        ASSERT_TRUE(c.PushPull(g.data(), n, DType::kF32, tag, Deadline::AfterMs(10000)).ok());
        ASSERT_EQ(g, want[static_cast<size_t>(round)]) << "rank " << rank << " round " << round;
      }
      traffic[static_cast<size_t>(rank)] = c.last_traffic();
    });
    EXPECT_EQ(job.ShardStats().rejected, 0u);
    for (const PsClient::Traffic& t : traffic) {
      EXPECT_EQ(t.sent * rounds, mirror.wire_bytes_per_round());
      EXPECT_EQ(t.received, n * sizeof(float));
    }
  }
}

// With a partition encoder (the CUDA gradients' device compression), a
// top-k bucket of several partitions is still encoded by the client: its
// budget is shared over the whole bucket, which an encoder that sees one
// partition at a time cannot choose. So the device path selects what the
// host path selects.
TEST(PsClientTest, ASharedTopKBudgetIsChosenOnTheWholeBucketDespiteAPartitionEncoder) {
  const int workers = 2, shards = 2, rounds = 3;
  const size_t n = 150;  // 10 partitions of 16 floats
  const std::string spec = "topk:ratio=0.25,ef=1";
  PsJob job(Spec(workers, shards));
  CompressedAverage mirror(spec, workers, n, 2, shards);
  const std::vector<std::vector<float>> want = ExpectedRounds(mirror, workers, n, rounds);
  std::atomic<int> encoded{0};
  job.Run([&](int rank, PsClient& c) {
    ASSERT_TRUE(c.SetCompression(2, spec).ok());
    c.SetPartitionEncoder([&](uint32_t, uint32_t, size_t, size_t,
                              const compression::CompressContext&) -> StatusOr<wire::Payload> {
      encoded++;
      return InternalError("the partition encoder was asked for a shared-budget partition");
    });
    for (int round = 0; round < rounds; ++round) {
      EXPECT_TRUE(c.PushesRaw(2, n));  // the device hands over the bucket itself
      std::vector<float> g = Gradient(rank, round, n);
      OpTag tag{static_cast<uint64_t>(round), 2, static_cast<uint64_t>(round), 0};
      ASSERT_TRUE(c.PushPull(g.data(), n, DType::kF32, tag, Deadline::AfterMs(10000)).ok());
      ASSERT_EQ(g, want[static_cast<size_t>(round)]) << "rank " << rank << " round " << round;
    }
  });
  EXPECT_EQ(encoded.load(), 0);
}

TEST(PsClientTest, RepliesInFp16AreTheRoundedAverage) {
  JobSpec js = Spec(2, 3);
  js.reply_codec = "fp16";
  PsJob job(js);
  const size_t n = 77;
  job.Run([&](int rank, PsClient& c) {
    for (int round = 0; round < 3; ++round) {
      std::vector<float> g = Gradient(rank, round, n), want(n);
      for (size_t i = 0; i < n; ++i) {
        want[i] = (Gradient(0, round, n)[i] + Gradient(1, round, n)[i]) / 2.0f;
      }
      compression::CompressorRegistry registry;
      compression::RegisterBuiltins(&registry);
      auto fp16 = std::move(registry.Create("fp16")).value();
      std::vector<uint8_t> bytes(2 * n);
      ASSERT_TRUE(fp16->Compress(want.data(), n, {}, bytes.data(), bytes.size()).ok());
      ASSERT_TRUE(fp16->Decompress(bytes.data(), bytes.size(), n, {}, want.data()).ok());
      OpTag tag{static_cast<uint64_t>(round), 0, static_cast<uint64_t>(round), 0};
      const uint64_t resent = c.stats().resent;
      ASSERT_TRUE(c.PushPull(g.data(), n, DType::kF32, tag, Deadline::AfterMs(10000)).ok());
      ASSERT_EQ(g, want) << "rank " << rank << " round " << round;
      EXPECT_EQ(c.last_traffic().received, 2 * n);
      // The pushes went uncompressed (a loaded machine may also resend one
      // whose Ack was slow: sent counts it again).
      if (c.stats().resent == resent) {
        EXPECT_EQ(c.last_traffic().sent, 4 * n);
      } else {
        EXPECT_GE(c.last_traffic().sent, 4 * n);
      }
    }
  });
}

TEST(PsClientTest, SetCompressionRefusesWhatTheShardsCannotDecode) {
  PsJob job(Spec(1, 1));
  EXPECT_TRUE(job.client(0).SetCompression(0, "none").ok());
  for (const char* bad : {"zip", "topk:ratio=2", "none:ef=1", "powersgd:rank=2"}) {
    Status s = job.client(0).SetCompression(0, bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("not available on the parameter-server path"), std::string::npos)
        << s;
  }
  std::vector<float> f(8, 1.0f);
  ASSERT_TRUE(
      job.client(0).PushPull(f.data(), 8, DType::kF32, {0, 1, 0, 0}, Deadline::AfterMs(5000)).ok());
  EXPECT_EQ(job.client(0).SetCompression(1, "fp16").code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(
      PsClientOptions::FromConfig(Config::FromMap({{"ps_reply_compression", "topk"}})).ok());
  auto fp16 = PsClientOptions::FromConfig(Config::FromMap({{"ps_reply_compression", "fp16"}}));
  ASSERT_TRUE(fp16.ok());
  EXPECT_EQ(fp16->reply_codec, "fp16");
}

// Workers of uneven speed train for `rounds` rounds; returns the largest
// staleness the shards applied.
uint64_t MaxStaleness(PsMode mode, uint64_t s, int rounds) {
  PsJob job(Spec(3, 2, mode, s, OptimizerKind::kSgd));
  job.Run([&](int rank, PsClient& c) {
    std::vector<float> p(40, 1.0f);
    for (int round = 0; round <= rounds; ++round) {
      if (round > 0) std::fill(p.begin(), p.end(), 0.01f * static_cast<float>(rank + 1));
      ASSERT_TRUE(c.PushPull(p.data(), p.size(), DType::kF32,
                             {static_cast<uint64_t>(round), 0, 0, 0}, Deadline::AfterMs(20000))
                      .ok());
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
