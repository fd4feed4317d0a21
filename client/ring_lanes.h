// RingLanes: collectives striped over several rings ("lanes") of the same
// workers in the same order, each over a transport of its own and so over
// TCP connections of its own: where the network caps each flow (cloud
// instances outside a placement group, long links whose window limits one
// connection), L lanes carry up to L flows' worth; each lane also has its
// own I/O thread and, with CURVE, its own cipher streams.
//
// An all-reduce, broadcast or all-gather (of a rank's block) of at least
// 2 x kMinLaneBytes is cut into contiguous slices, one per lane (as many
// lanes as slices of at least kMinLaneBytes), each run by its lane's ring
// side by side; lane 0 runs on the caller's thread. An all-gather's lanes
// gather into buffers of their own (kept for the next) and copy each
// rank's slice to its place. Smaller operations and the layout check go
// over lane 0 alone. Every rank cuts a buffer the same way (from its count,
// which each lane's fingerprint checks), so all ranks get the same bits;
// how a buffer is cut is fixed by its size and the lane count, so the
// results of a job are the same from run to run, though not bit-equal to a
// job with another lane count (sums of one element may go round the ring
// from another start).
//
// A lane that fails fails the operation on every lane: the first failure is
// kept, the other lanes' health checks return it at their next poll
// (RingOptions::poll_interval), and the operation returns it. After a
// failure (of any operation, one lane's included) every operation returns
// it, as a broken RingCollectives does.
//
// Thread-safety: as Collectives (one operation at a time); stats() from any
// thread.
#ifndef GRADSYNC_CLIENT_RING_LANES_H_
#define GRADSYNC_CLIENT_RING_LANES_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "client/collectives.h"
#include "client/ring.h"
#include "common/status.h"
#include "common/task_pool.h"

namespace gradsync::client {

// The first failure of any lane; shared by the lanes' health checks.
class LaneAlarm {
 public:
  // Keeps `failure` unless one is kept already.
  void Raise(const Status& failure);
  // OK until a lane failed; then that failure.
  Status status() const;

 private:
  std::atomic<bool> raised_{false};  // first_ is set
  mutable std::mutex mu_;
  Status first_;  // guarded by mu_
};

class RingLanes : public Collectives {
 public:
  // The smallest slice a lane takes.
  static constexpr size_t kMinLaneBytes = size_t{1} << 20;

  // `lanes` (at least one) are rings of the same ranks in the same order,
  // each over its own transport; their health checks must return
  // alarm->status() when it is not OK.
  RingLanes(std::vector<std::unique_ptr<RingCollectives>> lanes, std::shared_ptr<LaneAlarm> alarm);
  ~RingLanes() override;

  const char* name() const override { return "ring"; }
  int rank() const override { return lanes_[0]->rank(); }
  int world_size() const override { return lanes_[0]->world_size(); }
  size_t lanes() const { return lanes_.size(); }
  // Buffers are cut over the first `used` lanes only (1 to lanes(); all
  // of them until set), the others left idle. Between operations; every
  // rank must use the same count.
  void SetActive(size_t used) { active_ = std::max<size_t>(1, std::min(used, lanes_.size())); }
  size_t active() const { return active_; }
  RingCollectives& first() { return *lanes_[0]; }

  Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
                   Deadline deadline) override;
  Status AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                   Deadline deadline) override;
  Status Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                   Deadline deadline) override;

  // The lanes' counts added up.
  RingStats stats() const;
  // Whether every lane is Idle (RingCollectives::Idle).
  bool Idle() const;

 private:
  // Runs run(lane, first unit, units) on `used` lanes over `units` units
  // cut as evenly as they go (lane 0 on this thread); returns the first
  // failure.
  Status OnLanes(size_t used, size_t units,
                 const std::function<Status(size_t lane, size_t first, size_t count)>& run);
  // How many lanes a buffer of `bytes` goes over.
  size_t LanesFor(size_t bytes) const;
  // Raises a failure `s` of one lane on the alarm; returns `s`.
  Status Raised(Status s);

  std::vector<std::unique_ptr<RingCollectives>> lanes_;
  size_t active_;  // SetActive
  std::shared_ptr<LaneAlarm> alarm_;
  // Each lane's all-gather output; after a failure sends may still point
  // into them (OnLanes runs nothing then, so they are never resized again).
  std::vector<std::vector<uint8_t>> gathered_;
  std::unique_ptr<TaskPool> pool_;  // lanes 1 and up; null with one lane
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_RING_LANES_H_
