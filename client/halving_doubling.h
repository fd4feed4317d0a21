// HalvingDoubling: the all-reduce of a job of 2^L workers by recursive
// halving and doubling (the reduce-scatter and all-gather of Rabenseifner's
// algorithm). At level k every worker pairs with the worker whose rank
// differs from its own in bit k, over a 2-rank ring of their own
// (`pairs[k]`): the pair's reduce-scatter leaves each of the two with half
// of what it held, summed over both; level k + 1 runs on that half; the
// pair's all-gather then doubles it again. An all-reduce takes 2 L steps
// against the ring's 2 (2^L - 1), and each worker sends and receives the
// same bytes as on the ring (2 (n - 1) / n of the buffer each way), in
// messages of half, a quarter, ... of it. Each element's sum is made by one
// worker and handed to the others, so every worker ends with the same bits.
//
// All-reduces of at most the pair rings' small_bytes (RingOptions) go by
// recursive doubling instead, each pair ring's small path: at each level
// the pair swaps whole buffers and both add them in rank order (the same
// two sums, so again the same bits everywhere), log2(n) steps against the
// ring's n - 1. All-gathers and broadcasts go to `others` (the ring the job
// has besides).
//
// With `measure` (ring_algorithm=auto), the all-reduces above small_bytes
// go whichever way measured faster for their size class
// (bytes from 2^k up to 2^(k+1)): the first kTrials of a class go by halving
// and doubling and kTrials round `others`, by turns, each worker timing
// all but the first of each way (which opens connections); the next
// all-reduce of that class first gathers those times (an all-gather on
// `others`, bucket kChoiceBucket) and takes each trial's slowest worker,
// so that every worker takes the same way from then on: halving and
// doubling where the median of those is under
// kHalvingGain of the ring's, the ring otherwise. A link-bound ring keeps
// pace with halving and doubling or beats it, a CPU-bound one (several
// workers a host, fast links) falls behind (docs/benchmarks.md).
//
// Each pair ring checks its messages as any ring does (fingerprints, the
// partner's identity, sizes, the deadline, `health`), and names job ranks
// (RingPeers::job_ranks). A worker whose operation fails at level k tells
// its partners at every level: those of the levels below wait for its
// all-gather and get the failure through the pair ring
// (RingCollectives::AllReduceAround); those of the levels above, which it
// did not reach, are told with RingCollectives::Abandon. After a failure
// every call returns the first error.
//
// Thread-safety: as Collectives (one operation at a time); stats() and
// Idle() from any thread.
#ifndef GRADSYNC_CLIENT_HALVING_DOUBLING_H_
#define GRADSYNC_CLIENT_HALVING_DOUBLING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/collectives.h"
#include "client/ring.h"
#include "common/status.h"
#include "common/time.h"

namespace gradsync::client {

// Whether `world` workers can run HalvingDoubling (a power of two, at least 4:
// with 2 it is the ring), and its number of levels.
bool HalvingDoublingFits(int world);
int HalvingDoublingLevels(int world);
// The rank worker `rank` pairs with at level `level`.
inline int HalvingDoublingPartner(int rank, int level) { return rank ^ (1 << level); }
// The peers of the 2-rank ring of worker `job.rank` and its partner at
// `level`: `job` (this worker's ring peers: sender, epoch) made a pair, the
// partner reached at `partner_endpoint` and taken under `partner_identity`.
RingPeers HalvingDoublingPairPeers(RingPeers job, int level, std::string partner_endpoint,
                                   std::string partner_identity);

class HalvingDoubling : public Collectives {
 public:
  // `pairs[k]`: a 2-rank ring of this worker and its partner at level k
  // (job ranks in RingPeers::job_ranks), one per level. `others` must
  // outlive this object.
  static StatusOr<std::unique_ptr<HalvingDoubling>> Create(
      int rank, int world, std::vector<std::unique_ptr<RingCollectives>> pairs, Collectives* others,
      bool measure = false);

  static constexpr int kTrials = 9;
  static constexpr double kHalvingGain = 0.9;
  static constexpr uint32_t kChoiceBucket = 0xfffffffdu;
  // The way all-reduces of `bytes` bytes go: "recursive_doubling" (up to
  // small_bytes), "ring", "halving_doubling", or "" while `measure` is
  // still timing their size class.
  std::string ChosenFor(size_t bytes) const;

  const char* name() const override { return others_->name(); }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
                   Deadline deadline) override;
  Status AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                   Deadline deadline) override {
    return others_->AllGather(in, bytes, out, tag, deadline);
  }
  Status Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                   Deadline deadline) override {
    return others_->Broadcast(data, bytes, root, tag, deadline);
  }

  // The pair rings' counts, summed.
  RingStats stats() const;
  // Whether no send of a pair ring points into a buffer any more.
  bool Idle() const;

 private:
  HalvingDoubling(int rank, int world, std::vector<std::unique_ptr<RingCollectives>> pairs,
                  Collectives* others, bool measure)
      : rank_(rank), world_(world), pairs_(std::move(pairs)), others_(others), measure_(measure) {}
  struct Call;
  // A size class's measurements (measure_): index 0 the ring, 1 halving
  // and doubling.
  struct Choice {
    std::vector<double> ms[2];  // each way's trials, in ms (the first untimed: 0)
    int way = -1;               // chosen: 0 or 1; -1 while measuring
  };
  // The all-reduce by halving and doubling (or recursive doubling).
  Status Halve(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
               Deadline deadline);
  // Times a trial of `c` (the way it has tried least, halving first), or
  // chooses once both ways have kTrials, then goes the chosen way.
  Status Measured(Choice& c, size_t bytes, void* data, size_t count, DType dtype, ReduceOp op,
                  const OpTag& tag, Deadline deadline);
  // Chooses c's way from every worker's trials.
  Status Choose(Choice& c, size_t bytes, const OpTag& tag, Deadline deadline);
  Status Level(Call& call, size_t level, uint8_t* data, size_t count);

  const int rank_;
  const int world_;
  const std::vector<std::unique_ptr<RingCollectives>> pairs_;
  Collectives* const others_;
  const bool measure_;
  Choice choices_[64];  // by size class: floor(log2(bytes))
  Status broken_;       // the first error; sticky
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_HALVING_DOUBLING_H_
