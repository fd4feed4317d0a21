// Placement of parameter-server partitions: which shard holds which part of
// a bucket. Workers and shards compute it independently and agree without
// asking anyone.
//
// A bucket of `count` elements is cut into partitions of at most
// `partition_bytes` bytes (rounded down to whole elements, at least one
// element); partition p of bucket b lives on shard
// JumpConsistentHash(PartitionKey(b, p), num_shards). When the number of
// shards grows from n to n + 1, only about 1/(n + 1) of the partitions move.
//
// Thread-safety: pure functions.
#ifndef GRADSYNC_COMMON_PLACEMENT_H_
#define GRADSYNC_COMMON_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradsync {

constexpr size_t kDefaultPartitionBytes = size_t{4} << 20;

// Lamping & Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm"
// (2014): a bucket in [0, num_buckets) for `key`. num_buckets must be >= 1.
int32_t JumpConsistentHash(uint64_t key, int32_t num_buckets);

// A well-mixed 64-bit key for (bucket, partition).
uint64_t PartitionKey(uint32_t bucket, uint32_t partition);

// The shard that holds (bucket, partition) among `num_shards` >= 1.
int32_t ShardOf(uint32_t bucket, uint32_t partition, int32_t num_shards);

struct PartitionSpan {
  uint32_t partition = 0;
  size_t offset = 0;  // first element
  size_t count = 0;   // elements
  int32_t shard = 0;
};

// The partitions of a bucket of `count` elements of `element_bytes` bytes,
// in order; empty when count is 0.
std::vector<PartitionSpan> PlanPartitions(uint32_t bucket, size_t count, size_t element_bytes,
                                          size_t partition_bytes, int32_t num_shards);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_PLACEMENT_H_
