#include "common/placement.h"

#include <algorithm>
#include <map>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(ShardOfTest, StaysInRangeAndTakesTheShardsInTurn) {
  for (uint32_t b = 0; b < 200; ++b) {
    for (int32_t n = 1; n < 9; ++n) {
      const int32_t first = ShardOf(b, 0, n);
      ASSERT_GE(first, 0);
      ASSERT_LT(first, n);
      for (uint32_t p = 1; p < 20; ++p) ASSERT_EQ(ShardOf(b, p, n), (first + p) % n);
    }
  }
  EXPECT_EQ(ShardOf(5, 3, 0), 0);  // no shards: as one
}

TEST(ShardOfTest, SmallBucketsSpreadOverTheShards) {
  std::map<int32_t, int> per_shard;
  for (uint32_t b = 0; b < 400; ++b) per_shard[ShardOf(b, 0, 4)]++;
  ASSERT_EQ(per_shard.size(), 4u);
  for (const auto& [shard, n] : per_shard) {
    EXPECT_GT(n, 70) << "shard " << shard;
    EXPECT_LT(n, 130) << "shard " << shard;
  }
}

// Bytes of a bucket on each shard.
std::map<int32_t, size_t> Shares(const std::vector<PartitionSpan>& spans) {
  std::map<int32_t, size_t> share;
  for (const PartitionSpan& s : spans) share[s.shard] += s.count;
  return share;
}

TEST(PlanPartitionsTest, CoversTheBucketInEqualPartitionsNoneAboveTheLimit) {
  for (size_t count : {size_t{1}, size_t{1000}, size_t{123457}, size_t{5000000}}) {
    for (int32_t shards : {1, 2, 3, 4}) {
      for (size_t partition_bytes : {size_t{64}, size_t{4096}, size_t{4} << 20}) {
        const auto spans = PlanPartitions(7, count, 4, partition_bytes, shards);
        ASSERT_FALSE(spans.empty());
        size_t next = 0, low = count, high = 0;
        for (size_t i = 0; i < spans.size(); ++i) {
          ASSERT_EQ(spans[i].partition, i);
          ASSERT_EQ(spans[i].offset, next);
          ASSERT_GE(spans[i].count, 1u);
          ASSERT_LE(spans[i].count * 4, std::max<size_t>(partition_bytes, 4));
          ASSERT_EQ(spans[i].shard, ShardOf(7, static_cast<uint32_t>(i), shards));
          next += spans[i].count;
          low = std::min(low, spans[i].count);
          high = std::max(high, spans[i].count);
        }
        ASSERT_EQ(next, count);
        ASSERT_LE(high - low, 1u) << count << " " << shards << " " << partition_bytes;
      }
    }
  }
}

// A model smaller than one partition is still carried half
// by each of two shards; a large bucket equally by 4.
TEST(PlanPartitionsTest, EveryShardCarriesAnEqualShareOfEveryBucket) {
  auto two = Shares(PlanPartitions(0, 109386, 4, size_t{4} << 20, 2));
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0], 109386u / 2);
  EXPECT_EQ(two[1], 109386u / 2);
  auto four = Shares(PlanPartitions(3, 25000001, 4, size_t{4} << 20, 4));
  ASSERT_EQ(four.size(), 4u);
  for (const auto& [shard, n] : four) {
    EXPECT_GE(n, 25000001u / 4 - 8) << shard;
    EXPECT_LE(n, 25000001u / 4 + 8) << shard;
  }
}

TEST(PlanPartitionsTest, TinyBucketsAreNotCutBelowTheMinimum) {
  EXPECT_EQ(PlanPartitions(0, 5, 4, 1, 2).size(), 5u);  // the limit wins: one element each
  EXPECT_TRUE(PlanPartitions(0, 0, 4, 1024, 2).empty());
  EXPECT_EQ(PlanPartitions(0, 10, 4, size_t{4} << 20, 1).size(), 1u);
  EXPECT_EQ(PlanPartitions(0, 1500, 4, size_t{4} << 20, 4).size(), 1u);
  EXPECT_EQ(PlanPartitions(0, 2 * kMinPartitionElements, 4, size_t{4} << 20, 4).size(), 2u);
}

}  // namespace
}  // namespace gradsync
