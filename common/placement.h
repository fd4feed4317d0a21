// Placement of parameter-server partitions: which shard holds which part of
// a bucket. Workers and shards compute it independently and agree without
// asking anyone.
//
// A bucket of `count` elements is cut into partitions of equal size (to one
// element) and at most `partition_bytes` bytes each (whole elements, at least
// one), as many as a multiple of the number of shards, so that every shard
// carries an equal share of every bucket, as ps-lite splits a key range
// evenly over its servers. Partition p of bucket b lives on shard
// (first(b) + p) mod num_shards, first(b) a hash of b, so that buckets too
// small to split (partitions are not cut below kMinPartitionElements) still
// spread over the shards. A change in the number of shards moves partitions
// and changes their sizes: a checkpoint is restored with the shard count it
// was written with.
//
// Thread-safety: pure functions.
#ifndef GRADSYNC_COMMON_PLACEMENT_H_
#define GRADSYNC_COMMON_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradsync {

constexpr size_t kDefaultPartitionBytes = size_t{4} << 20;
// Partitions are not cut smaller than this many elements to balance shards
// (nor than partition_bytes allows).
constexpr size_t kMinPartitionElements = 1024;

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
