#include "ps/ps_shard.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/half.h"
#include "compression/wire_codec.h"
#include "gtest/gtest.h"
#include "ps/ps_shard_harness.h"
#include "wire/inproc_transport.h"
#include "wire/same_host_transport.h"
#include "wire/shm_link.h"

namespace gradsync::server {
namespace {

using testing::kJob;
using testing::ShardHarness;
using wire::MsgType;

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

// The shard reuses a closed round's buffer once no answer holds it: answers
// a worker still holds keep their values while later rounds close and
// buffers are taken back.
TEST(PsShardTest, AnswersStillHeldKeepTheirValuesWhileLaterRoundsReuseBuffers) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 1);
  constexpr size_t kN = 4096;
  constexpr uint64_t kRounds = 12;  // three times kept_results
  auto values = [](uint64_t round) {
    std::vector<float> v(kN);
    for (size_t i = 0; i < kN; ++i) v[i] = static_cast<float>(round * kN + i);
    return v;
  };
  std::vector<wire::Message> held;  // every other round's answer, kept
  for (uint64_t round = 1; round <= kRounds; ++round) {
    h.Push(0, round, round - 1, values(round));
    h.Pull(0, round, kN);
    std::optional<wire::Message> reply;
    while ((reply = h.Next(0)).has_value() && reply->header_view()->type() == MsgType::Ack) {
    }
    ASSERT_TRUE(reply.has_value()) << "no answer to round " << round;
    ASSERT_EQ(reply->header_view()->type(), MsgType::Reply) << ShardHarness::ErrorText(*reply);
    ASSERT_EQ(reply->payloads.size(), 1u);
    ASSERT_EQ(reply->payloads[0].size, kN * sizeof(float));
    std::vector<float> got(kN);
    std::memcpy(got.data(), reply->payloads[0].data, kN * sizeof(float));
    EXPECT_EQ(got, values(round)) << "round " << round;
    if (round % 2 == 1) held.push_back(std::move(*reply));
  }
  for (size_t j = 0; j < held.size(); ++j) {
    const uint64_t round = 2 * j + 1;
    std::vector<float> got(kN);
    std::memcpy(got.data(), held[j].payloads[0].data, kN * sizeof(float));
    EXPECT_EQ(got, values(round)) << "the held answer to round " << round << " changed";
  }
}

// A worker of this host whose same-host link breaks its framing loses the
// link (the transport gives it up); the shard counts the refusal and keeps
// serving every worker.
TEST(PsShardTest, ABrokenSameHostLinkIsCountedAndTheShardKeepsServing) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  h.ListenOnSameHostLinkFrom("forger");
  auto link = wire::ShmLink::Open(wire::SameHostTransport::LinkName(kJob, "forger", "shard"));
  ASSERT_TRUE(link.ok()) << link.status();
  const uint32_t bad[2] = {0xdeadbeef, 1};  // no frame table of ours
  ASSERT_EQ((*link)->Write(bad, sizeof(bad)), sizeof(bad));
  for (int i = 0; i < 300 && h.shard().stats().rejected == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(h.shard().stats().rejected, 1u);
  EXPECT_TRUE((*link)->PeerClosed()) << "the link is given up";
  h.Push(0, 1, 0, {1, 2});
  h.Pull(0, 1, 2);
  h.Push(1, 1, 0, {3, 4});
  h.Pull(1, 1, 2);
  for (int w = 0; w < 2; ++w) EXPECT_EQ(h.Reply(w), (std::vector<float>{2, 3}));
}

uint64_t Count(prometheus::Histogram& h) { return h.Collect().histogram.sample_count; }

TEST(PsShardTest, ExportsRoundsStragglersStalenessRefusalsAndMembership) {
  prometheus::Registry registry;
  ShardMetrics m(registry);
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2, 0, "", kJob, &m);
  EXPECT_EQ(m.expected_workers->Value(), 2);
  EXPECT_EQ(m.connected_workers->Value(), 2);
  EXPECT_EQ(m.missing_workers->Value(), 0);
  h.Push(0, 1, 0, {1, 2});
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  h.Push(1, 1, 0, {3, 4});
  h.Pull(1, 1, 2);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{2, 3}));
  h.Push(0, 1, 0, {1, 2});  // again
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  h.Push(0, 2, 1, {1, 2, 3});  // the key has 2 elements
  EXPECT_NE(h.NextError(0).find("2"), std::string::npos);

  EXPECT_EQ(m.pushes->Value(), 4);
  EXPECT_EQ(m.pulls->Value(), 1);
  EXPECT_EQ(m.duplicates->Value(), 1);
  EXPECT_EQ(m.rounds_completed->Value(), 1);
  EXPECT_EQ(m.rejected.counter(wire::ErrorCode::SizeMismatch).Value(), 1);
  EXPECT_EQ(m.queue_depth->Value(), 0);
  // Worker 1 pushed 30 ms after worker 0: the straggler wait, and the round
  // lasted at least that long.
  const auto wait = m.straggler_wait->Collect().histogram;
  ASSERT_EQ(wait.sample_count, 1u);
  EXPECT_GE(wait.sample_sum, 0.03);
  EXPECT_LT(wait.sample_sum, 5.0);
  EXPECT_GE(m.round_duration->Collect().histogram.sample_sum, wait.sample_sum);
  // The shard's own stats (its closing log line) sum the same observations.
  EXPECT_NEAR(h.shard().stats().straggler_wait_s, wait.sample_sum, 1e-6);
  EXPECT_EQ(Count(*m.staleness), 2u);  // both gradients, staleness 0
  EXPECT_EQ(m.staleness->Collect().histogram.bucket[0].cumulative_count, 2u);

  h.shard().WorkerDied(1);
  EXPECT_EQ(m.connected_workers->Value(), 1);
  EXPECT_EQ(m.missing_workers->Value(), 1);
  EXPECT_EQ(Count(*m.checkpoint_duration), 0u);
  EXPECT_EQ(m.last_checkpoint->Value(), 0);
}

TEST(PsShardCheckpointTest, ACheckpointIsExported) {
  char dir[] = "/tmp/gradsync_shard_metrics_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  prometheus::Registry registry;
  ShardMetrics m(registry);
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 1, 0, dir, kJob, &m);
  h.Push(0, 1, 0, {5});
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  ASSERT_TRUE(h.shard().Checkpoint().ok());
  EXPECT_GE(Count(*m.checkpoint_duration), 1u);
  EXPECT_GE(m.last_checkpoint->Value(), before - 1);
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

// Elastic jobs: worker 0 is lost after round 1 closed on partition 0 but
// not on partition 1. Worker 1, rank 0 of epoch 1, redoes round 1: partition
// 0's push is acknowledged and not applied again (its pull gets the round's
// result), partition 1's closes with it alone.
TEST(PsShardTest, ANewMembershipEpochRedoesOnlyTheRoundsThatDidNotClose) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  h.Push(0, 1, 0, {2}, 0);
  h.Push(1, 1, 0, {4}, 0);
  h.Push(0, 1, 0, {6}, 1);
  EXPECT_EQ(h.NextType(1), MsgType::Ack);
  h.shard().StartEpoch(1, 1, {"worker1"});
  h.Push(1, 1, 0, {40}, 0, 0, 1);
  h.Push(1, 1, 0, {8}, 1, 0, 1);
  h.Pull(1, 1, 1, 0, "", 0, 1);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{3}));
  h.Pull(1, 1, 1, 1, "", 0, 1);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{8}));
  const PsShardStats stats = h.shard().stats();
  EXPECT_EQ(stats.rounds_closed, 2u);
  EXPECT_EQ(stats.duplicates, 1u);
  EXPECT_EQ(stats.rejected, 0u);
  // Round 2 goes on with the one worker.
  h.Push(1, 2, 1, {5}, 0, 0, 1);
  h.Pull(1, 2, 1, 0, "", 0, 1);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{5}));
}

TEST(PsShardTest, MessagesOfAnotherMembershipEpochAreAnsweredNotTaken) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  h.shard().StartEpoch(1, 1, {"worker1"});
  h.Push(0, 1, 0, {2});  // the lost worker, late
  EXPECT_NE(h.NextError(0).find("is of membership epoch 0 (this shard is in epoch 1), which ended"),
            std::string::npos);
  h.Push(1, 1, 0, {2}, 0, 0, 2);  // a worker that heard of epoch 2 before the shard
  EXPECT_NE(h.NextError(1).find("is of membership epoch 2 (this shard is in epoch 1): send it "
                                "again"),
            std::string::npos);
  h.Push(0, 1, 0, {2}, 0, 0, 1);  // another connection than rank 0's of epoch 1
  EXPECT_NE(h.NextError(0).find("comes over another connection than worker 0's own"),
            std::string::npos);
  EXPECT_EQ(h.shard().stats().rejected, 1u);
  EXPECT_EQ(h.shard().stats().other_epoch, 2u);  // counted apart from rejected
  EXPECT_EQ(h.shard().stats().pushes_applied, 0u);
}

// async: a worker's rounds go on from its first push of the new epoch,
// counted as fresh; round 0 of the epoch answers with the parameters as
// they were when it began.
TEST(PsShardTest, AsynchronousShardsGoOnInALaterMembershipEpoch) {
  ShardHarness h(PsMode::kAsync, OptimizerKind::kSgd, 2);
  h.Push(0, 0, 0, {10});
  h.Push(0, 1, 0, {2});
  h.Push(1, 1, 0, {2});  // lr 0.5: 10 - 1 - 1
  h.Pull(1, 1, 1);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{8}));
  h.shard().StartEpoch(1, 1, {"worker1"});
  h.Push(1, 6, 2, {4}, 0, 0, 1);  // goes on from step 5
  h.Pull(1, 6, 1, 0, "", 0, 1);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{6}));
  h.Pull(1, 0, 1, 0, "", 0, 1);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{8}));
  h.Push(1, 7, 3, {2}, 0, 0, 1);
  h.Pull(1, 7, 1, 0, "", 0, 1);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{5}));
  const PsShardStats stats = h.shard().stats();
  EXPECT_EQ(stats.pushes_applied, 4u);
  EXPECT_EQ(stats.max_staleness, 1u);  // worker 1's first push, of epoch 0
  EXPECT_EQ(stats.rejected, 0u);
}

// ssp: the rounds between the last closed one and the epoch's first push
// are given up, at most staleness + 1 of them.
TEST(PsShardTest, SspGivesUpTheRoundsTheChangeLeftOpen) {
  ShardHarness h(PsMode::kSsp, OptimizerKind::kNone, 2, /*staleness=*/2);
  h.Push(0, 1, 0, {2});
  h.Push(1, 1, 0, {4});
  h.Push(0, 2, 1, {6});
  h.Push(0, 3, 1, {8});
  h.Pull(0, 1, 1);
  EXPECT_EQ(h.Reply(0), (std::vector<float>{3}));
  h.shard().StartEpoch(1, 1, {"worker0"});
  h.Push(0, 4, 1, {10}, 0, 0, 1);  // the survivor goes on from step 3
  h.Pull(0, 4, 1, 0, "", 0, 1);
  EXPECT_EQ(h.Reply(0), (std::vector<float>{10}));
  h.shard().StartEpoch(2, 1, {"worker0"});
  h.Push(0, 20, 2, {1}, 0, 0, 2);  // 15 rounds ahead of the 4 closed
  EXPECT_NE(h.NextError(0).find("more than staleness + 1 rounds ahead of the 4 closed"),
            std::string::npos);
  EXPECT_EQ(h.shard().stats().rounds_closed, 2u);
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
  // Before worker 0 made the key, another worker's messages for it wait.
  h.Pull(1, 0, 2);
  EXPECT_NE(h.NextError(1).find("no worker pushed yet"), std::string::npos);
  h.Push(1, 1, 0, {1, 1});
  EXPECT_NE(h.NextError(1).find("worker 0 has not pushed"), std::string::npos);
  h.Push(0, 1, 0, {1, 1});
  EXPECT_NE(h.NextError(0).find("no parameters yet"), std::string::npos);
  h.Push(1, 0, 0, {1, 1});
  EXPECT_NE(h.NextError(1).find("only worker 0"), std::string::npos);
  EXPECT_TRUE(h.shard().Keys()->empty());
  h.Push(0, 0, 0, {4, 8});
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  h.Pull(1, 0, 2);
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

// What the shard must make of a push of `v` compressed by `spec` with `ctx`.
std::vector<float> Decompressed(const std::vector<float>& v, const std::string& spec,
                                const compression::CompressContext& ctx) {
  compression::CompressorRegistry registry;
  compression::RegisterBuiltins(&registry);
  auto c = std::move(registry.Create(spec)).value();
  std::vector<uint8_t> bytes(c->WireBytes(v.size()));
  EXPECT_TRUE(c->Compress(v.data(), v.size(), ctx, bytes.data(), bytes.size()).ok());
  std::vector<float> out(v.size());
  EXPECT_TRUE(c->Decompress(bytes.data(), bytes.size(), v.size(), ctx, out.data()).ok());
  return out;
}

// Holds the shard's key threads before each message they take (Hook) until
// Open(); opens when destroyed. The hook may outlive the gate.
class Gate {
 public:
  ~Gate() { Open(); }
  std::function<void()> Hook() const {
    return [state = state_] {
      std::unique_lock<std::mutex> lock(state->mu);
      state->cv.wait(lock, [&] { return state->open; });
    };
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->open = true;
    }
    state_->cv.notify_all();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

TEST(PsShardTest, APeerPastItsShareOfTheQueueIsToldBusyAndTheOthersGoOn) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  // The key threads hold what they take until the gate opens, so what
  // arrives stays queued.
  Gate gate;
  h.options().before_handle = gate.Hook();
  const std::vector<float> v(1000, 1.0f);         // 4000 payload bytes a push
  h.options().max_queued_bytes_per_peer = 14000;  // 3 pushes and their headers
  h.Restart();
  for (int i = 0; i < 8; ++i) h.Push(0, 1, 0, v);  // the same push, 8 times
  for (int i = 0; i < 5; ++i) {
    EXPECT_NE(h.NextError(0).find("send it again later"), std::string::npos) << i;
  }
  EXPECT_FALSE(h.Next(0, 200).has_value()) << "more than 5 refused";
  // Worker 1's share is its own.
  h.Push(1, 1, 0, std::vector<float>(1000, 3.0f));
  h.Pull(1, 1, 1000);
  EXPECT_FALSE(h.Next(1, 200).has_value()) << "worker 1 was refused";
  EXPECT_EQ(h.shard().stats().rejected, 5u);
  gate.Open();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(h.NextType(0), MsgType::Ack) << i;
  EXPECT_EQ(h.Reply(1), std::vector<float>(1000, 2.0f));
  EXPECT_EQ(h.shard().stats().pushes_applied, 2u);
  EXPECT_EQ(h.shard().stats().duplicates, 2u);
}

TEST(PsShardTest, AWorkerDeathIsTakenWithoutWaitingWhenAKeyQueueIsFull) {
  prometheus::Registry registry;
  ShardMetrics m(registry);
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2, 0, "", kJob, &m);
  Gate gate;
  h.options().before_handle = gate.Hook();
  h.Restart();
  // The key thread holds the first push; the rest fill its queue (4096)
  // and the receiver waits for room.
  for (int i = 0; i < 4200; ++i) h.Push(0, 1, 0, {1, 2});
  for (Deadline d = Deadline::AfterMs(20000); !d.Expired() && m.queue_depth->Value() < 4096;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(m.queue_depth->Value(), 4096);
  // The heartbeat thread's call: it must not wait for room.
  auto died = std::async(std::launch::async, [&] { h.shard().WorkerDied(1); });
  EXPECT_EQ(died.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  gate.Open();
  died.wait();
  // The round closes without worker 1, who is dead.
  h.Pull(0, 1, 2);
  EXPECT_EQ(h.Reply(0), (std::vector<float>{1, 2}));
}

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(static_cast<float>(i) * 0.37f + scale);
  return v;
}

TEST(PsShardTest, CompressedPushesAreDecompressedAndAveragedInFp32) {
  const size_t n = 1000;
  const std::vector<std::string> specs = {"topk:ratio=0.1,ef=1", "qsgd:chunk=128",
                                          "randomk:ratio=0.3", "fp16"};
  for (const std::string& spec : specs) {
    for (uint32_t partition : {0u, 2u}) {
      ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 4);
      std::vector<std::vector<float>> got(4);
      for (uint64_t round = 1; round <= 2; ++round) {
        // The job's compressor, and worker 1 none: they mix in a round.
        std::vector<float> expect(n, 0.0f);
        for (int w = 0; w < 4; ++w) {
          const std::vector<float> g = Ramp(n, static_cast<float>(w + round));
          std::vector<float> d = g;
          if (w == 1) {
            h.Push(w, round, round - 1, g, partition);
          } else {
            h.PushCompressed(w, round, round - 1, g, spec, partition);
            d = Decompressed(g, spec, h.Context(round, partition));
          }
          for (size_t i = 0; i < n; ++i) expect[i] = w == 0 ? d[i] : expect[i] + d[i];
        }
        for (size_t i = 0; i < n; ++i) expect[i] /= 4.0f;
        for (int w = 0; w < 4; ++w) h.Pull(w, round, n, partition);
        for (int w = 0; w < 4; ++w) {
          got[w] = h.Reply(w);
          ASSERT_EQ(got[w].size(), n);
          EXPECT_EQ(std::memcmp(got[w].data(), expect.data(), n * 4), 0)
              << spec << " worker " << w << " round " << round << " partition " << partition;
        }
      }
      EXPECT_EQ(h.shard().stats().rejected, 0u);
      EXPECT_EQ(h.shard().stats().rounds_closed, 2u);
    }
  }
}

// A shard decodes the job's compressors only: the configured ones, or else
// the one worker 0's first push of the bucket was taken with.
TEST(PsShardTest, APushCompressedWithAnotherCompressorThanTheBucketsIsRefused) {
  const size_t n = 1000;
  const std::vector<float> g = Ramp(n, 1.0f);
  for (const std::string configured : {"topk:ratio=0.1,ef=1", ""}) {
    ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
    h.options().rules.compression = configured;
    h.Restart();
    if (configured.empty()) {
      h.PushCompressed(0, 1, 0, g, "topk:ratio=0.2,ef=1");  // fixes "topk"
    } else {
      h.Push(0, 1, 0, g);  // uncompressed pushes are always taken
    }
    EXPECT_EQ(h.NextType(0), MsgType::Ack);
    h.PushCompressed(1, 1, 0, g, "qsgd:chunk=128");
    const std::string error = h.NextError(1);
    EXPECT_NE(error.find("is compressed with \"qsgd\", this job's pushes "), std::string::npos)
        << configured << ": " << error;
    EXPECT_NE(error.find(" with \"topk\""), std::string::npos) << error;
    EXPECT_EQ(h.shard().stats().rejected, 1u);
    h.PushCompressed(1, 1, 0, g, "topk:ratio=0.05,ef=1");  // another ratio, the same codec
    EXPECT_EQ(h.NextType(1), MsgType::Ack);
    EXPECT_EQ(h.shard().stats().rejected, 1u);
    EXPECT_EQ(h.shard().stats().rounds_closed, 1u);
  }
}

// With no compressor configured, only worker 0 fixes a bucket's: another
// worker's compressed push before worker 0's is answered Busy (and taken
// when sent again), so a member cannot pick it by pushing first.
TEST(PsShardTest, OnlyWorkerZerosFirstCompressedPushFixesTheBucketsCompressor) {
  const size_t n = 1000;
  const std::vector<float> g = Ramp(n, 1.0f);
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  h.PushCompressed(1, 1, 0, g, "qsgd:chunk=128");
  EXPECT_NE(h.NextError(1).find("waits for worker 0's first compressed push of bucket 0"),
            std::string::npos);
  h.PushCompressed(0, 1, 0, g, "topk:ratio=0.2,ef=1");  // fixes "topk"
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  h.PushCompressed(1, 1, 0, g, "qsgd:chunk=128");
  EXPECT_NE(h.NextError(1).find(
                "is compressed with \"qsgd\", this job's pushes of bucket 0 with \"topk\""),
            std::string::npos);
  h.PushCompressed(1, 1, 0, g, "topk:ratio=0.2,ef=1");
  EXPECT_EQ(h.NextType(1), MsgType::Ack);
  EXPECT_EQ(h.shard().stats().rounds_closed, 1u);
}

// Buckets of one job compressed differently (compression_overrides): each
// bucket keeps its own compressor, learned from worker 0 or configured.
TEST(PsShardTest, BucketsOfOneJobMayUseDifferentCompressors) {
  const size_t n = 1000;
  const std::vector<float> g = Ramp(n, 1.0f);
  for (const bool configured : {false, true}) {
    ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
    if (configured) {
      h.options().rules.compression = "fp16:ef=1";
      h.options().rules.compression_overrides = "fc1.weight=topk:ratio=0.01,ef=1;7=sign:ef=1";
      h.Restart();
    }
    const std::vector<std::pair<uint32_t, std::string>> buckets = {
        {1, "topk:ratio=0.2,ef=1"}, {2, "sign:ef=1"}, {3, "fp16"}};
    for (const auto& [bucket, spec] : buckets) {
      for (int w = 0; w < 2; ++w) {
        h.PushCompressed(w, 1, 0, g, spec, 0, bucket);
        EXPECT_EQ(h.NextType(w), MsgType::Ack) << spec << " worker " << w;
      }
    }
    EXPECT_EQ(h.shard().stats().rounds_closed, 3u) << configured;
    EXPECT_EQ(h.shard().stats().rejected, 0u) << configured;
    // A worker may not name bucket 1's compressor for bucket 2.
    h.PushCompressed(1, 2, 1, g, "topk:ratio=0.2,ef=1", 0, 2);
    EXPECT_NE(h.NextError(1).find("this job's pushes of bucket 2 with \"sign\""), std::string::npos)
        << configured;
    // Configured: a compressor no setting names is refused for any bucket.
    if (configured) {
      h.PushCompressed(0, 1, 0, g, "qsgd:chunk=128", 0, 9);
      EXPECT_NE(h.NextError(0).find("this job's pushes with one of \"fp16\", \"sign\", \"topk\""),
                std::string::npos);
    }
  }
}

TEST(PsShardTest, BadCompressedPushesAreRefusedCountedAndChangeNothing) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  const size_t n = 100;
  const std::vector<float> g = Ramp(n, 1.0f);
  auto push = [&](const std::string& codec, size_t bytes) {
    std::vector<uint8_t> junk(bytes, 0);
    wire::DataFields f;
    f.num_elements = n;
    f.round = 1;
    f.codec = codec;
    h.Send(0, wire::MakeData(h.Sender(0), MsgType::Push, f,
                             {wire::Payload::Copy(junk.data(), junk.size())}, 1, 1));
  };
  push("fp16", 198);
  EXPECT_NE(h.NextError(0).find("holds 198 bytes, \"fp16\" writes 200 for 100 elements"),
            std::string::npos);
  push("lz4", 200);
  EXPECT_NE(h.NextError(0).find("\"lz4\" has no wire encoding"), std::string::npos);
  push("sign:chunk=7", 200);
  EXPECT_NE(h.NextError(0).find("chunk"), std::string::npos);
  std::vector<uint8_t> bad(n * 4 / 2 * 2, 0);  // topk ratio 0.5: 50 indices + 50 values
  const int32_t far = 100;
  std::memcpy(bad.data() + 4, &far, 4);
  {
    wire::DataFields f;
    f.num_elements = n;
    f.round = 1;
    f.codec = "topk:ratio=0.5";
    h.Send(0, wire::MakeData(h.Sender(0), MsgType::Push, f,
                             {wire::Payload::Copy(bad.data(), bad.size())}, 1, 1));
  }
  EXPECT_NE(h.NextError(0).find("does not decode as \"topk:ratio=0.5\""), std::string::npos);
  h.Pull(0, 1, n, 0, "topk:ratio=0.5");
  EXPECT_NE(h.NextError(0).find("replies are fp32, fp16 or bf16"), std::string::npos);
  EXPECT_EQ(h.shard().stats().rejected, 5u);
  EXPECT_EQ(h.shard().stats().pushes_applied, 0u);
  // None of it counted as worker 0's push: the key does not exist yet, and
  // then its round waits for worker 0.
  h.Push(1, 1, 0, g);
  EXPECT_NE(h.NextError(1).find("worker 0 has not pushed"), std::string::npos);
  EXPECT_TRUE(h.shard().Keys()->empty());
  h.PushCompressed(0, 1, 0, g, "fp16");
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  h.Push(1, 1, 0, g);
  h.Pull(1, 1, n);
  h.Pull(0, 1, n);
  const std::vector<float> half = Decompressed(g, "fp16", {});
  std::vector<float> expect(n);
  for (size_t i = 0; i < n; ++i) expect[i] = (g[i] + half[i]) / 2.0f;
  EXPECT_EQ(h.Reply(1), expect);
}

TEST(PsShardTest, RepliesComeInTheEncodingEachPullAsksFor) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kMomentum, 3);
  const size_t n = 333;
  const std::vector<float> init = Ramp(n, 70000.0f);  // past fp16's range too
  h.Push(0, 0, 0, init);
  for (int w = 0; w < 3; ++w) h.Pull(w, 0, n, 0, w == 0 ? "" : w == 1 ? "fp16" : "bf16");
  const std::vector<float> exact = h.Reply(0);
  EXPECT_EQ(exact, init);
  EXPECT_EQ(h.Reply(1), Decompressed(init, "fp16", {}));
  EXPECT_EQ(h.Reply(2), Decompressed(init, "bf16", {}));
  std::vector<float> rounded;
  for (uint64_t round = 1; round <= 3; ++round) {
    for (int w = 0; w < 3; ++w) {
      h.PushCompressed(w, round, round - 1, Ramp(n, 0.1f * static_cast<float>(w + 1)), "sign");
      h.Pull(w, round, n, 0, "fp16");
    }
    rounded = h.Reply(0);
    EXPECT_EQ(h.Reply(1), rounded);
    EXPECT_EQ(h.Reply(2), rounded);
  }
  // The shard keeps fp32 parameters; the fp16 reply was their rounding.
  h.Pull(0, 3, n);
  const std::vector<float> params = h.Reply(0);
  EXPECT_NE(params, rounded);
  EXPECT_EQ(Decompressed(params, "fp16", {}), rounded);
  EXPECT_EQ(h.shard().stats().rejected, 0u);
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

// The replies of rounds 1..n to worker 0 for a fixed gradient sequence; the
// shard restarts from `checkpoint_dir` after the rounds in `restarts` and
// writes a checkpoint after those in `checkpoints`.
std::vector<std::vector<float>> Trajectory(PsMode mode, int rounds,
                                           const std::string& checkpoint_dir = "",
                                           std::set<int> checkpoints = {},
                                           std::set<int> restarts = {}) {
  ShardHarness h(mode, OptimizerKind::kMomentum, 3, 0, checkpoint_dir);
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
    if (checkpoints.count(r)) {
      EXPECT_TRUE(h.shard().Checkpoint().ok());
    }
    if (restarts.count(r)) h.Restart();
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

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base ? base : "/tmp") + "/" + name;
}

TEST(PsShardCheckpointTest, AnAcknowledgedPushSurvivesARestart) {
  const std::string dir = TempDir("acked");
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2, 0, dir);
  h.Push(0, 1, 0, {1, 2});
  h.Pull(0, 1, 2);
  ASSERT_EQ(h.NextType(0), MsgType::Ack);
  h.Restart();  // the held pull is gone with the old shard; the push is not
  h.Push(1, 1, 0, {3, 4});
  h.Pull(1, 1, 2);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{2, 3}));
  h.Push(0, 1, 0, {1, 2});  // worker 0 resends: a duplicate
  h.Pull(0, 1, 2);
  EXPECT_EQ(h.Reply(0), (std::vector<float>{2, 3}));
  EXPECT_EQ(h.shard().stats().rounds_closed, 1u);
}

TEST(PsShardCheckpointTest, ACompressedPushIsJournalledDecompressed) {
  const std::string dir = TempDir("compressed");
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2, 0, dir);
  const std::vector<float> g = Ramp(64, 3.0f);
  h.PushCompressed(0, 1, 0, g, "qsgd:chunk=16");
  ASSERT_EQ(h.NextType(0), MsgType::Ack);
  h.Restart();
  h.Push(1, 1, 0, std::vector<float>(64, 1.0f));
  h.Pull(1, 1, 64);
  const std::vector<float> d = Decompressed(g, "qsgd:chunk=16", h.Context(1));
  std::vector<float> expect(64);
  for (size_t i = 0; i < 64; ++i) expect[i] = (d[i] + 1.0f) / 2.0f;
  EXPECT_EQ(h.Reply(1), expect);
}

TEST(PsShardCheckpointTest, RestartsFromCheckpointAndJournalContinueBitForBit) {
  const auto clean = Trajectory(PsMode::kSync, 12);
  // Restarts right after a checkpoint, between checkpoints and with no
  // checkpoint but the initial one.
  const auto restarted = Trajectory(PsMode::kSync, 12, TempDir("bits"), {3, 6}, {2, 6, 9, 10});
  ASSERT_EQ(restarted.size(), clean.size());
  for (size_t r = 0; r < clean.size(); ++r) {
    ASSERT_EQ(std::memcmp(clean[r].data(), restarted[r].data(), 8), 0) << "round " << r + 1;
  }
  const auto ssp = Trajectory(PsMode::kSsp, 12, TempDir("bits_ssp"), {4}, {5, 11});
  for (size_t r = 0; r < clean.size(); ++r) {
    ASSERT_EQ(std::memcmp(clean[r].data(), ssp[r].data(), 8), 0) << "round " << r + 1;
  }
}

// The rows of embedding table 4 that worker 0 reads after each round of a
// 2-worker job (Adam, ids admitted on their second push); with `dir`, the
// shard checkpoints at the rounds of `checkpoint_at` and restarts at those
// of `restart_at`, both between the two workers' pushes of the round.
std::vector<std::vector<float>> EmbeddingTrajectory(PsMode mode, int rounds,
                                                    const std::string& dir = "",
                                                    std::set<int> checkpoint_at = {},
                                                    std::set<int> restart_at = {}) {
  constexpr uint32_t kTable = 4, kWidth = 8;
  ShardHarness h(mode, mode == PsMode::kSync ? OptimizerKind::kNone : OptimizerKind::kSgd, 2, 1,
                 dir);
  EmbeddingOptions& o = h.options().embeddings.table;
  o.optimizer = RowOptimizerKind::kAdam;
  o.lr = 0.01f;
  o.eps = 1e-8f;
  o.admit_after = 2;
  o.seed = 5;
  h.Restart();
  const std::vector<uint64_t> all = {0, 1, 2, 3, 7, 100, 101, 102};
  std::vector<std::vector<float>> out;
  for (int r = 0; r < rounds; ++r) {
    const uint64_t round = static_cast<uint64_t>(r);
    for (int w = 0; w < 2; ++w) {
      const std::vector<uint64_t> ids = {static_cast<uint64_t>(w), static_cast<uint64_t>(w) + 2, 7,
                                         100 + round % 3};
      std::vector<float> grads(ids.size() * kWidth);
      for (size_t i = 0; i < grads.size(); ++i) {
        grads[i] = std::sin(0.37f * static_cast<float>(i + 5 * r + 11 * w));
      }
      h.PushRows(w, kTable, kWidth, round, ids, grads, 100 + round);
      EXPECT_EQ(h.NextType(w), MsgType::EmbeddingAck) << "round " << r << " worker " << w;
      if (w == 1) continue;
      if (checkpoint_at.count(r)) {
        EXPECT_TRUE(h.shard().Checkpoint().ok());
      }
      if (restart_at.count(r)) h.Restart();
    }
    h.PullRows(0, kTable, kWidth, round + 1, all, 200 + round);
    out.push_back(h.Rows(0));
  }
  return out;
}

TEST(PsShardCheckpointTest, EmbeddingRowsAndOpenRoundsSurviveRestartsBitForBit) {
  for (PsMode mode : {PsMode::kSync, PsMode::kAsync}) {
    SCOPED_TRACE(PsModeName(mode));
    const auto clean = EmbeddingTrajectory(mode, 12);
    // Restarts right after a checkpoint (worker 0's push of the round in
    // it, worker 1's not yet), between checkpoints (the journal alone
    // holds the round), and with no checkpoint but the initial one.
    const auto restarted = EmbeddingTrajectory(
        mode, 12, TempDir(std::string("rows_") + PsModeName(mode)), {3, 6}, {2, 6, 9, 10});
    ASSERT_EQ(restarted.size(), clean.size());
    for (size_t r = 0; r < clean.size(); ++r) {
      ASSERT_EQ(clean[r].size(), 8u * 8u);
      ASSERT_EQ(std::memcmp(clean[r].data(), restarted[r].data(), clean[r].size() * 4), 0)
          << "round " << r;
    }
  }
}

TEST(PsShardCheckpointTest, ACheckpointCountsAndIsReadableWithItsJournalStart) {
  const std::string dir = TempDir("stats");
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 1, 0, dir);
  const CheckpointStats initial = h.shard().checkpoint_stats();
  EXPECT_EQ(initial.written, 1u);  // the one Start writes
  h.Push(0, 1, 0, {5});
  h.Pull(0, 1, 1);
  EXPECT_EQ(h.Reply(0), (std::vector<float>{5}));
  ASSERT_TRUE(h.shard().Checkpoint().ok());
  const CheckpointStats s = h.shard().checkpoint_stats();
  EXPECT_EQ(s.written, 2u);
  EXPECT_EQ(s.failed, 0u);
  EXPECT_GT(s.last_success_unix_seconds, 1.6e9);
  EXPECT_GE(s.duration_sum_seconds, s.last_duration_seconds);
  EXPECT_EQ(s.last_keys, 1u);
  auto saved = ReadCheckpoint(dir, {kJob, 0, PsMode::kSync, OptimizerKind::kNone, 1});
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->keys.at({0, 0}).closed, 1u);
  auto segments = ListJournalSegments(dir, 0);
  ASSERT_TRUE(segments.ok());
  EXPECT_EQ(*segments, std::vector<uint64_t>{saved->journal_start});
}

TEST(PsShardCheckpointTest, ACheckpointOfAnotherJobIsNotLoaded) {
  const std::string dir = TempDir("other_job");
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 1, 0, dir);
  h.Push(0, 1, 0, {5});
  ASSERT_EQ(h.NextType(0), MsgType::Ack);
  h.Restart(kJob + 1);
  auto saved = ReadCheckpoint(dir, {kJob + 1, 0, PsMode::kSync, OptimizerKind::kNone, 1});
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_TRUE(saved->keys.empty());
}

TEST(PsShardCheckpointTest, ADamagedCheckpointFailsStartNamingIt) {
  const std::string dir = TempDir("damaged");
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(CheckpointPath(dir, 0)) << "GSPSCKPT and then nonsense";
  wire::InProcNetwork net;
  auto t = net.NewTransport("shard");
  ASSERT_TRUE(t->Listen("inproc://damaged").ok());
  PsShardOptions o;
  o.checkpoint_dir = dir;
  auto shard = PsShard::Start(t.get(), o, wire::Sender{wire::Role::Server, 0, kJob});
  ASSERT_FALSE(shard.ok());
  EXPECT_EQ(shard.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(shard.status().message().find(CheckpointPath(dir, 0)), std::string::npos)
      << shard.status();
}

TEST(PsShardOptionsTest, ReadsTheModeAndRefusesAsyncWithoutOptimizer) {
  auto o = PsShardOptions::FromConfig(Config::FromMap(
      {{"ps_mode", "ssp"}, {"staleness", "3"}, {"optimizer", "adam"}, {"ps_threads", "4"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rules.mode, PsMode::kSsp);
  EXPECT_EQ(o->rules.staleness, 3u);
  EXPECT_EQ(o->threads, 4);
  EXPECT_EQ(o->checkpoint_dir, "");
  auto bad = PsShardOptions::FromConfig(Config::FromMap({{"ps_mode", "async"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("needs a server-side optimizer"), std::string::npos);
  EXPECT_FALSE(PsShardOptions::FromConfig(Config::FromMap({{"ps_mode", "bsp"}})).ok());
}

}  // namespace
}  // namespace gradsync::server
