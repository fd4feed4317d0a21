#include "server/ps_shard.h"

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "wire/inproc_transport.h"

namespace gradsync::server {
namespace {

using wire::MsgType;

constexpr uint64_t kJob = 77;

// A shard on an in-process transport and raw workers that talk to it.
class ShardHarness {
 public:
  ShardHarness(PsMode mode, OptimizerKind opt, int workers, uint64_t staleness = 0) {
    PsShardOptions o;
    o.rules.mode = mode;
    o.rules.staleness = staleness;
    o.rules.num_workers = workers;
    o.optimizer.kind = opt;
    o.optimizer.lr = 0.5f;
    o.optimizer.momentum = 0.5f;
    server_ = net_.NewTransport("shard");
    EXPECT_TRUE(server_->Listen("inproc://shard").ok());
    auto shard = PsShard::Start(server_.get(), o, wire::Sender{wire::Role::Server, 0, kJob});
    EXPECT_TRUE(shard.ok()) << shard.status();
    shard_ = std::move(*shard);
    for (int w = 0; w < workers; ++w) {
      workers_.push_back(net_.NewTransport("worker" + std::to_string(w)));
      conns_.push_back(*workers_.back()->Connect("inproc://shard"));
    }
  }
  ~ShardHarness() { shard_->Shutdown(); }

  void Send(int w, wire::Message msg) {
    ASSERT_TRUE(workers_[w]->Send(wire::Route::Connection(conns_[w]), std::move(msg),
                                  Deadline::AfterMs(1000)).ok());
  }
  void Push(int w, uint64_t round, uint64_t version, const std::vector<float>& v,
            uint32_t partition = 0, int as_rank = -2) {
    wire::DataFields f;
    f.partition = partition;
    f.num_elements = v.size();
    f.round = round;
    f.version = version;
    Send(w, wire::MakeData(Sender(as_rank == -2 ? w : as_rank), MsgType::Push, f,
                           {wire::Payload::Copy(v.data(), v.size() * 4)}, 0, round));
  }
  void Pull(int w, uint64_t round, size_t n, uint32_t partition = 0) {
    wire::DataFields f;
    f.partition = partition;
    f.num_elements = n;
    f.round = round;
    Send(w, wire::MakeData(Sender(w), MsgType::Pull, f, {}, 0, round));
  }
  // The next message worker w receives, or nullopt after `ms`.
  std::optional<wire::Message> Next(int w, int ms = 3000) {
    auto in = workers_[w]->Receive(Deadline::AfterMs(ms));
    if (!in.ok()) return std::nullopt;
    return std::move(in->message);
  }
  MsgType NextType(int w) {
    auto m = Next(w);
    EXPECT_TRUE(m.has_value());
    return m ? m->header_view()->type() : MsgType::Layout;
  }
  // The next Reply's values (skipping Acks); its version in *version.
  std::vector<float> Reply(int w, uint64_t* version = nullptr) {
    for (;;) {
      auto m = Next(w);
      EXPECT_TRUE(m.has_value()) << "no reply";
      if (!m) return {};
      const wire::Header* h = m->header_view();
      if (h->type() == MsgType::Ack) continue;
      EXPECT_EQ(h->type(), MsgType::Reply) << ErrorText(*m);
      if (h->type() != MsgType::Reply) return {};
      if (version) *version = h->body_as_DataBody()->version();
      std::vector<float> out(m->PayloadBytes() / 4);
      std::memcpy(out.data(), m->payloads[0].data, out.size() * 4);
      return out;
    }
  }
  std::string NextError(int w) {
    auto m = Next(w);
    if (!m) return "nothing";
    return m->header_view()->type() == MsgType::Error ? ErrorText(*m) : "not an error";
  }
  static std::string ErrorText(const wire::Message& m) {
    const auto* e = m.header_view()->body_as_ErrorBody();
    return e && e->message() ? e->message()->str() : "";
  }
  PsShard& shard() { return *shard_; }

 private:
  static wire::Sender Sender(int rank) { return wire::Sender{wire::Role::Worker, rank, kJob}; }

  wire::InProcNetwork net_;
  std::unique_ptr<wire::InProcTransport> server_;
  std::unique_ptr<PsShard> shard_;
  std::vector<std::unique_ptr<wire::InProcTransport>> workers_;
  std::vector<wire::ConnId> conns_;
};

TEST(PsShardTest, SyncAnswersTheAverageOnceEveryWorkerPushed) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 3);
  h.Push(0, 1, 0, {1, 2, 3});
  h.Pull(0, 1, 3);
  h.Push(1, 1, 0, {4, 5, 6});
  h.Pull(1, 1, 3);
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  EXPECT_EQ(h.NextType(1), MsgType::Ack);
  EXPECT_FALSE(h.Next(0, 200).has_value()) << "round closed without worker 2";
  h.Push(2, 1, 0, {7, 8, 9});
  h.Pull(2, 1, 3);
  uint64_t version = 0;
  for (int w = 0; w < 3; ++w) EXPECT_EQ(h.Reply(w, &version), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(h.shard().stats().rounds_closed, 1u);
  EXPECT_EQ(h.shard().stats().max_staleness, 0u);
}

TEST(PsShardTest, ADeadWorkerNoLongerHoldsTheRoundBack) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  h.Push(0, 1, 0, {2, 4});
  h.Pull(0, 1, 2);
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  EXPECT_FALSE(h.Next(0, 200).has_value());
  h.shard().WorkerDied(1);
  EXPECT_EQ(h.Reply(0), (std::vector<float>{2, 4}));
}

TEST(PsShardTest, DuplicatedAndReorderedPushesAreAppliedOnce) {
  ShardHarness h(PsMode::kAsync, OptimizerKind::kSgd, 1);
  h.Push(0, 0, 0, {10, 10});
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  h.Push(0, 2, 0, {1, 1});  // round 2 before round 1
  h.Push(0, 1, 0, {2, 2});
  h.Push(0, 2, 0, {1, 1});  // resent
  h.Push(0, 1, 0, {2, 2});  // resent
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h.NextType(0), MsgType::Ack);
  h.Pull(0, 2, 2);
  uint64_t version = 0;
  // lr 0.5: 10 - 0.5 * 1 - 0.5 * 2.
  EXPECT_EQ(h.Reply(0, &version), (std::vector<float>{8.5f, 8.5f}));
  EXPECT_EQ(version, 2u);
  EXPECT_EQ(h.shard().stats().pushes_applied, 2u);
  EXPECT_EQ(h.shard().stats().duplicates, 2u);
}

TEST(PsShardTest, SyncDuplicatesAreAcknowledgedAndNotCountedTwice) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  h.Push(0, 1, 0, {2});
  h.Push(0, 1, 0, {2});
  h.Push(1, 1, 0, {4});
  h.Pull(0, 1, 1);
  EXPECT_EQ(h.Reply(0), (std::vector<float>{3}));
  h.Push(0, 1, 0, {2});  // after the round closed
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  EXPECT_EQ(h.shard().stats().duplicates, 2u);
  EXPECT_EQ(h.shard().stats().pushes_applied, 2u);
}

TEST(PsShardTest, InitialParametersComeFromWorkerZeroBeforeAnyGradient) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kSgd, 2);
  h.Pull(1, 0, 2);
  h.Push(1, 1, 0, {1, 1});
  EXPECT_NE(h.NextError(1).find("no parameters yet"), std::string::npos);
  h.Push(1, 0, 0, {1, 1});
  EXPECT_NE(h.NextError(1).find("only worker 0"), std::string::npos);
  h.Push(0, 0, 0, {4, 8});
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{4, 8}));
  h.Push(0, 1, 0, {2, 2});
  h.Push(1, 1, 0, {4, 6});
  h.Pull(1, 1, 2);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{2.5f, 6}));  // p - 0.5 * avg
}

TEST(PsShardTest, BadMessagesAreAnsweredNamingTheProblemAndTheShardKeepsServing) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  wire::Message junk;
  junk.header = {1, 2, 3, 4, 5, 6, 7, 8};
  h.Send(0, std::move(junk));
  EXPECT_NE(h.NextError(0).find("not a valid gradsync header"), std::string::npos);
  h.Push(0, 1, 0, {1, 2, 3});
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  h.Push(1, 1, 0, {1, 2});
  EXPECT_NE(h.NextError(1).find("the key holds 3"), std::string::npos);
  h.Push(1, 5, 0, {1, 2, 3});
  EXPECT_NE(h.NextError(1).find("ahead of the rounds"), std::string::npos);
  h.Push(1, 1, 0, {1, 2, 3}, 0, /*as_rank=*/9);
  EXPECT_NE(h.NextError(1).find("not a worker of this job"), std::string::npos);
  h.Push(1, 0, 0, {1, 2, 3});
  EXPECT_NE(h.NextError(1).find("only aggregates"), std::string::npos);
  EXPECT_EQ(h.shard().stats().rejected, 5u);
  h.Push(1, 1, 0, {3, 4, 5});
  h.Pull(1, 1, 3);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{2, 3, 4}));
}

TEST(PsShardTest, SspLetsAWorkerRunAtMostSRoundsAhead) {
  const uint64_t s = 2;
  ShardHarness h(PsMode::kSsp, OptimizerKind::kSgd, 2, s);
  h.Push(0, 0, 0, {0});
  h.Pull(0, 0, 1);
  uint64_t version = 0;
  h.Reply(0, &version);
  // Worker 0 runs ahead while worker 1 does nothing.
  for (uint64_t r = 1; r <= s; ++r) {
    h.Push(0, r, version, {1});
    h.Pull(0, r, 1);
    h.Reply(0, &version);
  }
  h.Push(0, s + 1, version, {1});
  h.Pull(0, s + 1, 1);
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  EXPECT_FALSE(h.Next(0, 200).has_value()) << "ran more than s rounds ahead";
  // Worker 1 catches up one round: worker 0 may go on.
  h.Pull(1, 0, 1);
  uint64_t v1 = 0;
  h.Reply(1, &v1);
  h.Push(1, 1, v1, {3});
  EXPECT_EQ(h.Reply(0), (std::vector<float>{-1.0f}));  // 0 - 0.5 * (1 + 3) / 2
  EXPECT_LE(h.shard().stats().max_staleness, s);
}

// The replies of rounds 1..n to worker 0 for a fixed gradient sequence.
std::vector<std::vector<float>> Trajectory(PsMode mode, int rounds) {
  ShardHarness h(mode, OptimizerKind::kMomentum, 3, 0);
  h.Push(0, 0, 0, {0.1f, -0.7f});
  std::vector<std::vector<float>> replies;
  for (int w = 0; w < 3; ++w) h.Pull(w, 0, 2);
  std::vector<uint64_t> version(3);
  for (int w = 0; w < 3; ++w) h.Reply(w, &version[w]);
  for (int r = 1; r <= rounds; ++r) {
    for (int w = 2; w >= 0; --w) {
      h.Push(w, r, version[w], {0.3f * r + 0.1f * w, 1.0f / (r + w)});
      h.Pull(w, r, 2);
    }
    for (int w = 0; w < 3; ++w) {
      auto v = h.Reply(w, &version[w]);
      if (w == 0) replies.push_back(v);
    }
  }
  return replies;
}

TEST(PsShardTest, SspWithZeroStalenessIsSyncBitForBit) {
  auto sync = Trajectory(PsMode::kSync, 20);
  auto ssp = Trajectory(PsMode::kSsp, 20);
  ASSERT_EQ(sync.size(), 20u);
  ASSERT_EQ(ssp.size(), 20u);
  for (size_t r = 0; r < sync.size(); ++r) {
    ASSERT_EQ(std::memcmp(sync[r].data(), ssp[r].data(), 8), 0) << "round " << r + 1;
  }
}

TEST(PsShardOptionsTest, ReadsTheModeAndRefusesAsyncWithoutOptimizer) {
  auto o = PsShardOptions::FromConfig(Config::FromMap(
      {{"ps_mode", "ssp"}, {"staleness", "3"}, {"optimizer", "adam"}, {"ps_threads", "4"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rules.mode, PsMode::kSsp);
  EXPECT_EQ(o->rules.staleness, 3u);
  EXPECT_EQ(o->threads, 4);
  auto bad = PsShardOptions::FromConfig(Config::FromMap({{"ps_mode", "async"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("needs a server-side optimizer"), std::string::npos);
  EXPECT_FALSE(PsShardOptions::FromConfig(Config::FromMap({{"ps_mode", "bsp"}})).ok());
}

}  // namespace
}  // namespace gradsync::server
