#include "client/halving_doubling.h"

#include <algorithm>
#include <utility>

#include "client/elementwise.h"

namespace gradsync::client {

bool HalvingDoublingFits(int world) { return world >= 4 && (world & (world - 1)) == 0; }

int HalvingDoublingLevels(int world) {
  int levels = 0;
  while ((1 << levels) < world) ++levels;
  return levels;
}

RingPeers HalvingDoublingPairPeers(RingPeers job, int level, std::string partner_endpoint,
                                   std::string partner_identity) {
  const int partner = HalvingDoublingPartner(job.rank, level);
  job.job_ranks = {std::min(job.rank, partner), std::max(job.rank, partner)};
  job.rank = (job.rank >> level) & 1;
  job.world_size = 2;
  job.order.clear();
  job.right_endpoint = std::move(partner_endpoint);
  job.left_identity = std::move(partner_identity);
  return job;
}

// One all-reduce: what every level shares, and how deep it got.
struct HalvingDoubling::Call {
  DType dtype;
  ReduceOp op;
  OpTag tag;
  Deadline deadline;
  size_t reached = 0;  // the deepest level entered
};

StatusOr<std::unique_ptr<HalvingDoubling>> HalvingDoubling::Create(
    int rank, int world, std::vector<std::unique_ptr<RingCollectives>> pairs, Collectives* others,
    size_t max_bytes) {
  if (!HalvingDoublingFits(world) || rank < 0 || rank >= world) {
    return InvalidArgumentError(
        "halving and doubling needs a power of two of at least 4 workers, "
        "not rank " +
        std::to_string(rank) + " of " + std::to_string(world));
  }
  const int levels = HalvingDoublingLevels(world);
  if (pairs.size() != static_cast<size_t>(levels)) {
    return InvalidArgumentError(std::to_string(world) + " workers pair at " +
                                std::to_string(levels) + " levels, not " +
                                std::to_string(pairs.size()));
  }
  for (int k = 0; k < levels; ++k) {
    const RingCollectives& pair = *pairs[static_cast<size_t>(k)];
    const int partner = HalvingDoublingPartner(rank, k);
    const bool ok = pair.world_size() == 2 && pair.JobRank(pair.rank()) == rank &&
                    pair.JobRank(1 - pair.rank()) == partner;
    if (!ok) {
      return InvalidArgumentError("the ring of level " + std::to_string(k) + " is not of ranks " +
                                  std::to_string(rank) + " and " + std::to_string(partner));
    }
  }
  return std::unique_ptr<HalvingDoubling>(
      new HalvingDoubling(rank, world, std::move(pairs), others, max_bytes));
}

Status HalvingDoubling::AllReduce(void* data, size_t count, DType dtype, ReduceOp op,
                                  const OpTag& tag, Deadline deadline) {
  if (!broken_.ok()) return broken_;
  if (count * DTypeSize(dtype) > max_bytes_) {
    return others_->AllReduce(data, count, dtype, op, tag, deadline);
  }
  GS_RETURN_IF_ERROR(CheckReducible(dtype));
  if (count == 0) return Status();
  Call call{dtype, op, tag, deadline};
  auto* base = static_cast<uint8_t*>(data);
  Status s;
  if (count * DTypeSize(dtype) <= pairs_[0]->options().small_bytes) {
    // Recursive doubling: the whole buffer with each partner in turn (each
    // pair ring takes its small path, and both partners add in rank order).
    for (size_t k = 0; s.ok() && k < pairs_.size(); ++k) {
      call.reached = k;
      s = pairs_[k]->AllReduce(base, count, dtype, ReduceOp::kSum, tag, deadline);
    }
    if (s.ok() && op == ReduceOp::kAverage) DivideBy(base, count, dtype, world_);
  } else {
    s = Level(call, 0, base, count);
  }
  if (s.ok() || s.code() == StatusCode::kMembershipChanged) return s;
  broken_ = s;
  for (size_t k = call.reached + 1; k < pairs_.size(); ++k) {
    pairs_[k]->Abandon(tag, s);
  }
  return s;
}

Status HalvingDoubling::Level(Call& call, size_t level, uint8_t* data, size_t count) {
  if (level == pairs_.size()) {
    if (call.op == ReduceOp::kAverage) DivideBy(data, count, call.dtype, world_);
    return Status();
  }
  call.reached = level;
  return pairs_[level]->AllReduceAround(
      data, count, call.dtype, call.tag, call.deadline,
      [&](uint8_t* part, size_t part_count) { return Level(call, level + 1, part, part_count); });
}

RingStats HalvingDoubling::stats() const {
  RingStats sum;
  for (const auto& pair : pairs_) {
    sum += pair->stats();
  }
  return sum;
}

bool HalvingDoubling::Idle() const {
  for (const auto& pair : pairs_) {
    if (!pair->Idle()) return false;
  }
  return true;
}

}  // namespace gradsync::client
