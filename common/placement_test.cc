#include "common/placement.h"

#include <map>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(JumpConsistentHashTest, StaysInRangeAndOneBucketIsZero) {
  EXPECT_EQ(JumpConsistentHash(0, 1), 0);
  EXPECT_EQ(JumpConsistentHash(1, 1), 0);
  EXPECT_EQ(JumpConsistentHash(0xDEADBEEF, 1), 0);
  for (uint64_t key = 0; key < 1000; ++key) {
    for (int n = 1; n < 20; ++n) {
      const int32_t b = JumpConsistentHash(key, n);
      ASSERT_GE(b, 0);
      ASSERT_LT(b, n);
    }
  }
}

TEST(JumpConsistentHashTest, GrowingMovesOnlyToTheNewBucket) {
  int moved = 0;
  const int kKeys = 10000;
  for (int k = 0; k < kKeys; ++k) {
    const uint64_t key = PartitionKey(static_cast<uint32_t>(k), 0);
    const int32_t before = JumpConsistentHash(key, 4);
    const int32_t after = JumpConsistentHash(key, 5);
    if (before != after) {
      EXPECT_EQ(after, 4);
      ++moved;
    }
  }
  // About 1/5 of the keys move.
  EXPECT_GT(moved, kKeys / 5 - kKeys / 25);
  EXPECT_LT(moved, kKeys / 5 + kKeys / 25);
}

TEST(JumpConsistentHashTest, SpreadsEvenly) {
  std::map<int32_t, int> per_shard;
  for (uint32_t b = 0; b < 100; ++b) {
    for (uint32_t p = 0; p < 80; ++p) per_shard[ShardOf(b, p, 4)]++;
  }
  ASSERT_EQ(per_shard.size(), 4u);
  for (const auto& [shard, n] : per_shard) {
    EXPECT_GT(n, 1700) << "shard " << shard;
    EXPECT_LT(n, 2300) << "shard " << shard;
  }
}

TEST(PlanPartitionsTest, CutsIntoWholeElementsAndCoversTheBucket) {
  auto spans = PlanPartitions(7, 1000, 4, 1024, 3);
  ASSERT_EQ(spans.size(), 4u);  // 256 elements per partition
  size_t next = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].partition, i);
    EXPECT_EQ(spans[i].offset, next);
    EXPECT_EQ(spans[i].shard, ShardOf(7, static_cast<uint32_t>(i), 3));
    next += spans[i].count;
  }
  EXPECT_EQ(next, 1000u);
  EXPECT_EQ(spans.back().count, 1000u - 3 * 256);
}

TEST(PlanPartitionsTest, TinyPartitionsHoldOneElementAndEmptyBucketsNone) {
  EXPECT_EQ(PlanPartitions(0, 5, 4, 1, 2).size(), 5u);
  EXPECT_TRUE(PlanPartitions(0, 0, 4, 1024, 2).empty());
  EXPECT_EQ(PlanPartitions(0, 10, 4, size_t{4} << 20, 1).size(), 1u);
}

}  // namespace
}  // namespace gradsync
