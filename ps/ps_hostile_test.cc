// A shard against messages a hostile or broken peer sends: each is refused
// with an Error before anything is allocated for it, counted, and leaves the
// shard serving the job as before.
#include <cstdint>
#include <string>
#include <vector>

#include "common/placement.h"
#include "gtest/gtest.h"
#include "ps/ps_shard.h"
#include "ps/ps_shard_harness.h"

namespace gradsync::server {
namespace {

using testing::ShardHarness;
using wire::MsgType;

wire::Message RawPush(const wire::Sender& from, uint32_t partition, uint64_t elements,
                      const std::string& codec, size_t bytes) {
  std::vector<uint8_t> junk(bytes, 0);
  wire::DataFields f;
  f.partition = partition;
  f.num_elements = elements;
  f.round = 1;
  f.codec = codec;
  return wire::MakeData(from, MsgType::Push, f, {wire::Payload::Copy(junk.data(), junk.size())}, 1,
                        1);
}

// Seen live: this push ended a shard with std::bad_alloc.
TEST(PsHostileTest, AHugeElementCountIsRefusedBeforeAnythingIsAllocated) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  h.Send(1, RawPush(h.Sender(1), 0, uint64_t{1} << 40, "topk:ratio=0.01", 64));
  EXPECT_NE(h.NextError(1).find("a partition holds at most 1048576"), std::string::npos);
  // Within the partition limit, the bytes must be what the codec writes.
  h.Send(0, RawPush(h.Sender(0), 0, 1 << 20, "topk:ratio=0.01", 64));
  EXPECT_NE(h.NextError(0).find("holds 64 bytes"), std::string::npos);
  EXPECT_EQ(h.shard().stats().rejected, 2u);
  h.Push(0, 1, 0, {1, 2});
  h.Push(1, 1, 0, {3, 4});
  h.Pull(1, 1, 2);
  EXPECT_EQ(h.Reply(1), (std::vector<float>{2, 3}));
}

// A push for a round that closed without its sender (declared dead) used to
// open that round again, and no round of the key ever closed after it.
TEST(PsHostileTest, APushForARoundClosedWithoutItIsRefusedAndTheKeyGoesOn) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  h.shard().WorkerDied(1);
  h.Push(0, 1, 0, {2, 4});
  h.Pull(0, 1, 2);
  EXPECT_EQ(h.Reply(0), (std::vector<float>{2, 4}));
  h.Push(1, 1, 0, {8, 8});
  EXPECT_NE(h.NextError(1).find("closed without it"), std::string::npos);
  h.Push(0, 2, 0, {6, 6});
  h.Pull(0, 2, 2);
  EXPECT_EQ(h.Reply(0), (std::vector<float>{6, 6}));
  auto keys = h.shard().Keys();
  ASSERT_TRUE(keys.ok()) << keys.status();
  for (const auto& [key, k] : *keys) {
    EXPECT_TRUE(k.open.empty()) << "an open round left behind on bucket " << key.first;
  }
}

uint32_t PartitionOnShard(int32_t shard, int32_t shards) {
  uint32_t p = 0;
  while (ShardOf(0, p, shards) != shard) ++p;
  return p;
}

TEST(PsHostileTest, KeysOfAnotherShardAndKeysPastTheLimitAreRefused) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 1);
  h.options().rules.num_shards = 2;
  h.options().rules.shard = 0;
  h.options().rules.max_keys = 2;
  h.options().threads = 1;
  h.Restart();
  const uint32_t theirs = PartitionOnShard(1, 2);
  h.Push(0, 1, 0, {1}, theirs);
  EXPECT_NE(h.NextError(0).find("placed on shard 1, this is shard 0"), std::string::npos);
  h.Pull(0, 1, 1, theirs);
  EXPECT_NE(h.NextError(0).find("placed on shard 1"), std::string::npos);
  std::vector<uint32_t> ours;
  for (uint32_t p = 0; ours.size() < 3; ++p) {
    if (ShardOf(0, p, 2) == 0) ours.push_back(p);
  }
  h.Push(0, 1, 0, {1}, ours[0]);
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  h.Push(0, 1, 0, {1}, ours[1]);
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  h.Push(0, 1, 0, {1}, ours[2]);
  EXPECT_NE(h.NextError(0).find("holds at most 2"), std::string::npos);
  EXPECT_EQ(h.shard().Keys()->size(), 2u);
  EXPECT_EQ(h.shard().stats().rejected, 3u);
}

// A pull claiming to be worker 0 from another connection used to replace
// worker 0's held pull, so worker 0 never got its Reply.
TEST(PsHostileTest, AWorkerIsBoundToItsConnection) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  h.Push(0, 1, 0, {2, 2});
  h.Pull(0, 1, 2);
  EXPECT_EQ(h.NextType(0), MsgType::Ack);
  wire::DataFields f;
  f.num_elements = 2;
  f.round = 1;
  h.Send(1, wire::MakeData(h.Sender(0), MsgType::Pull, f, {}, 0, 1));  // forged
  EXPECT_NE(h.NextError(1).find("another connection than worker 0's own"), std::string::npos);
  h.Push(1, 1, 0, {4, 4});
  EXPECT_EQ(h.NextType(1), MsgType::Ack);
  EXPECT_EQ(h.Reply(0), (std::vector<float>{3, 3}));
  EXPECT_EQ(h.shard().stats().rejected, 1u);
}

// Errors tell the job id to the job's workers only: a peer outside the job
// is refused without learning it.
TEST(PsHostileTest, APeerOutsideTheJobIsNotToldTheJobId) {
  ShardHarness h(PsMode::kSync, OptimizerKind::kNone, 2);
  const int outsider = h.AddPeer("intruder");
  wire::DataFields f;
  f.num_elements = 2;
  f.round = 1;
  for (uint64_t job : {testing::kJob, uint64_t{5}}) {
    h.Send(outsider, wire::MakeData({wire::Role::Worker, 0, job}, MsgType::Pull, f, {}, 0, 1));
    auto answer = h.Next(outsider);
    ASSERT_TRUE(answer.has_value());
    EXPECT_EQ(answer->header_view()->type(), MsgType::Error);
    EXPECT_EQ(answer->header_view()->job_id(), 0u) << ShardHarness::ErrorText(*answer);
    EXPECT_EQ(ShardHarness::ErrorText(*answer).find(std::to_string(testing::kJob)),
              std::string::npos);
  }
  h.Send(1, wire::MakeData(h.Sender(0), MsgType::Pull, f, {}, 0, 1));  // a worker's mistake
  auto answer = h.Next(1);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->header_view()->job_id(), testing::kJob) << "a worker lost the job id";
}

}  // namespace
}  // namespace gradsync::server
