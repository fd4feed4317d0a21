#include "client/halving_doubling.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "client/elementwise.h"
#include "common/logging.h"

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
    bool measure) {
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
      new HalvingDoubling(rank, world, std::move(pairs), others, measure));
}

namespace {

constexpr int kRingWay = 0;
constexpr int kHalvingWay = 1;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : (v[h - 1] + v[h]) / 2;
}

size_t SizeClass(size_t bytes) {
  size_t k = 0;
  while (k < 63 && (bytes >> (k + 1)) != 0) ++k;
  return k;
}

}  // namespace

std::string HalvingDoubling::ChosenFor(size_t bytes) const {
  if (bytes <= pairs_[0]->options().small_bytes) return "recursive_doubling";
  if (!measure_) return "halving_doubling";
  const int way = choices_[SizeClass(bytes)].way;
  return way < 0 ? "" : way == kRingWay ? "ring" : "halving_doubling";
}

Status HalvingDoubling::AllReduce(void* data, size_t count, DType dtype, ReduceOp op,
                                  const OpTag& tag, Deadline deadline) {
  if (!broken_.ok()) return broken_;
  const size_t bytes = count * DTypeSize(dtype);
  if (measure_ && bytes > pairs_[0]->options().small_bytes) {
    return Measured(choices_[SizeClass(bytes)], bytes, data, count, dtype, op, tag, deadline);
  }
  return Halve(data, count, dtype, op, tag, deadline);
}

Status HalvingDoubling::Measured(Choice& c, size_t bytes, void* data, size_t count, DType dtype,
                                 ReduceOp op, const OpTag& tag, Deadline deadline) {
  const size_t trials = kTrials;
  if (c.way < 0 && c.ms[kRingWay].size() == trials && c.ms[kHalvingWay].size() == trials) {
    GS_RETURN_IF_ERROR(Choose(c, bytes, tag, deadline));
  }
  if (c.way == kRingWay) return others_->AllReduce(data, count, dtype, op, tag, deadline);
  if (c.way == kHalvingWay) return Halve(data, count, dtype, op, tag, deadline);
  const int way = c.ms[kHalvingWay].size() <= c.ms[kRingWay].size() ? kHalvingWay : kRingWay;
  const auto start = std::chrono::steady_clock::now();
  Status s = way == kRingWay ? others_->AllReduce(data, count, dtype, op, tag, deadline)
                             : Halve(data, count, dtype, op, tag, deadline);
  if (!s.ok()) return s;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  // Each way's first all-reduce opens connections and fills pools: not
  // timed.
  c.ms[way].push_back(c.ms[way].empty() ? 0.0 : ms);
  return s;
}

Status HalvingDoubling::Choose(Choice& c, size_t bytes, const OpTag& tag, Deadline deadline) {
  // Every worker timed both ways as often, in the same order: gathered,
  // each trial's slowest worker and the median of those each way are the
  // same numbers everywhere. (A worker's times only pick one of two
  // sound ways.)
  const size_t t = kTrials - 1;
  std::vector<float> mine(2 * t), all(2 * t * static_cast<size_t>(world_));
  for (int way : {kRingWay, kHalvingWay}) {
    for (size_t i = 0; i < t; ++i) mine[way * t + i] = static_cast<float>(c.ms[way][i + 1]);
  }
  OpTag choice = tag;
  choice.bucket = kChoiceBucket;
  GS_RETURN_IF_ERROR(
      others_->AllGather(mine.data(), mine.size() * sizeof(float), all.data(), choice, deadline));
  double ms[2];
  for (int way : {kRingWay, kHalvingWay}) {
    std::vector<double> slowest(t, 0.0);
    for (size_t r = 0; r < static_cast<size_t>(world_); ++r) {
      for (size_t i = 0; i < t; ++i) {
        slowest[i] = std::max(slowest[i], static_cast<double>(all[r * 2 * t + way * t + i]));
      }
    }
    ms[way] = Median(std::move(slowest));
  }
  c.way = ms[kHalvingWay] < kHalvingGain * ms[kRingWay] ? kHalvingWay : kRingWay;
  if (rank_ == 0) {
    const size_t from = size_t{1} << SizeClass(bytes);
    GS_LOG(INFO) << "ring_algorithm=auto: all-reduces of " << from << " to " << 2 * from - 1
                 << " bytes go "
                 << (c.way == kRingWay ? "round the ring" : "by halving and doubling")
                 << " (median of " << t << " trials each way, the slowest worker's time: ring "
                 << ms[kRingWay] << " ms, halving and doubling " << ms[kHalvingWay] << " ms)";
  }
  return Status();
}

Status HalvingDoubling::Halve(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
                              Deadline deadline) {
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
