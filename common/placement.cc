#include "common/placement.h"

#include <algorithm>

namespace gradsync {

int32_t JumpConsistentHash(uint64_t key, int32_t num_buckets) {
  int64_t b = -1;
  int64_t j = 0;
  while (j < num_buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<int64_t>(static_cast<double>(b + 1) *
                             (static_cast<double>(int64_t{1} << 31) /
                              static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<int32_t>(b);
}

uint64_t PartitionKey(uint32_t bucket, uint32_t partition) {
  // splitmix64 finaliser over the packed pair.
  uint64_t z = (static_cast<uint64_t>(bucket) << 32 | partition) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

int32_t ShardOf(uint32_t bucket, uint32_t partition, int32_t num_shards) {
  return JumpConsistentHash(PartitionKey(bucket, partition), std::max(num_shards, 1));
}

std::vector<PartitionSpan> PlanPartitions(uint32_t bucket, size_t count, size_t element_bytes,
                                          size_t partition_bytes, int32_t num_shards) {
  const size_t per = std::max<size_t>(1, partition_bytes / std::max<size_t>(element_bytes, 1));
  std::vector<PartitionSpan> spans;
  for (size_t offset = 0; offset < count; offset += per) {
    PartitionSpan s;
    s.partition = static_cast<uint32_t>(spans.size());
    s.offset = offset;
    s.count = std::min(per, count - offset);
    s.shard = ShardOf(bucket, s.partition, num_shards);
    spans.push_back(s);
  }
  return spans;
}

}  // namespace gradsync
