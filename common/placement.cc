#include "common/placement.h"

#include <algorithm>

namespace gradsync {

uint64_t PartitionKey(uint32_t bucket, uint32_t partition) {
  // splitmix64 finaliser over the packed pair.
  uint64_t z = (static_cast<uint64_t>(bucket) << 32 | partition) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

int32_t ShardOf(uint32_t bucket, uint32_t partition, int32_t num_shards) {
  const uint64_t shards = static_cast<uint64_t>(std::max(num_shards, 1));
  // Each bucket's partitions take the shards in turn, from a shard of its own.
  const uint64_t first = PartitionKey(bucket, 0xFFFFFFFFu) % shards;
  return static_cast<int32_t>((first + partition) % shards);
}

std::vector<PartitionSpan> PlanPartitions(uint32_t bucket, size_t count, size_t element_bytes,
                                          size_t partition_bytes, int32_t num_shards) {
  std::vector<PartitionSpan> spans;
  if (count == 0) return spans;
  const size_t shards = static_cast<size_t>(std::max(num_shards, 1));
  const size_t per_max = std::max<size_t>(1, partition_bytes / std::max<size_t>(element_bytes, 1));
  const size_t fewest = (count + per_max - 1) / per_max;  // none above partition_bytes
  const size_t per_shard = (count + shards * per_max - 1) / (shards * per_max);
  // Every shard an equal share: a multiple of the shards, unless that would
  // cut partitions below kMinPartitionElements.
  const size_t min_elements = std::min(kMinPartitionElements, per_max);
  const size_t parts =
      std::max({fewest, std::min(shards * per_shard, count / min_elements), size_t{1}});
  const size_t base = count / parts;
  const size_t extra = count % parts;
  size_t offset = 0;
  for (size_t p = 0; p < parts; ++p) {
    PartitionSpan s;
    s.partition = static_cast<uint32_t>(p);
    s.offset = offset;
    s.count = base + (p < extra ? 1 : 0);
    s.shard = ShardOf(bucket, s.partition, num_shards);
    offset += s.count;
    spans.push_back(s);
  }
  return spans;
}

}  // namespace gradsync
