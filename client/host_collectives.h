// HostCollectives: the all-reduce of a job whose workers all share one
// host, through shared-memory segments (wire/shm_segment.h) instead of a
// ring of messages. Each rank publishes into a segment of its own, which the
// others map read-only, and reads theirs. All-gather and broadcast go to the
// ring it was made with.
//
// An all-reduce whose buffer, times the world size, is at most `small_bytes`
// takes one step: every rank publishes its whole buffer and, once all are
// there, adds the n buffers in rank order (all ranks get the same bits; the
// ring takes n - 1 steps). A larger one takes two steps per chunk of at most
// `slot_bytes`: every rank publishes the chunk; each reduces its own 1/n of
// it from all n (in rank order) and publishes that; each copies the others'
// reduced parts (the ring takes 2 (n - 1) steps, each a message to copy in
// and out). fp16 and bf16 are added in fp32 and rounded once per addition,
// as on the ring.
//
// Phases: a rank's publications are numbered 0, 1, 2, ... Phase p goes into
// the rank's slot p % 2 with a header that carries p and the operation's
// fingerprint, and is published by storing p + 1 in its `published` word. A
// rank reads a peer's phase p once the peer published it, and publishes its
// own phase p + 1 only after it read every peer's phase p; so a slot is
// never written while a peer still reads it, and while a rank waits for a
// peer's phase p, that peer's word is p, p + 1 or p + 2.
//
// Nothing read from a peer's segment is trusted: each word is read once,
// headers are copied before they are checked, each element of a payload is
// read once. A word outside what the phases allow, or a header of another
// phase, fails the operation naming the peer (counted in refusals->dropped,
// as a same-host link's bad frame table). A header whose fingerprint
// (operation, step, bucket, seq, dtype, count, names hash, reduction) differs
// from this rank's fails every rank (each sees it) with both ranks and both
// operations. A rank that gives up publishes why in its segment, and the
// others waiting for it fail at once naming it. A peer whose process is gone
// (the lock it holds on its segment went) is named within `poll_interval`;
// one that stops contributing, at the deadline; `health` (as the ring's) is
// run before each operation and every `poll_interval` while waiting. After a
// failure every call returns the first error.
//
// Thread-safety: as Collectives (one operation at a time); Shutdown and
// stats from any thread.
#ifndef GRADSYNC_CLIENT_HOST_COLLECTIVES_H_
#define GRADSYNC_CLIENT_HOST_COLLECTIVES_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/collectives.h"
#include "client/ring.h"
#include "common/status.h"
#include "common/time.h"
#include "wire/shm_segment.h"
#include "wire/transport.h"

namespace gradsync::client {

struct HostPeers {
  int rank = 0;
  int world_size = 1;
  uint64_t job_id = 0;
  uint32_t epoch = 0;  // an elastic job's membership epoch (names the segments)
};

struct HostOptions {
  // False: this rank asks for the ring (every rank then keeps it).
  bool enabled = true;
  size_t slot_bytes = size_t{512} << 10;  // the largest chunk of one step
  size_t small_bytes = size_t{1} << 20;   // buffer bytes x world size for one step
  Millis poll_interval{20};               // how often a waiting rank runs `health`
  // Where a peer's segment written out of turn is also counted, in
  // `dropped` (may be null): a process's gradsync_transport_dropped_total.
  std::shared_ptr<wire::TransportRefusals> refusals;
};

struct HostStats {
  uint64_t bytes_published = 0;  // payload bytes this rank wrote for its peers
  uint64_t operations = 0;
};

class HostCollectives : public Collectives {
 public:
  // Makes this rank's segment and maps every peer's, agreeing with the
  // other ranks over `ring` (which must outlive this object, and is used
  // for all-gather and broadcast): null, with the reason logged, when one
  // rank could not or is not `enabled`, so that all of them keep the ring.
  // Every rank of the ring must call it. An error only when the ring failed.
  static StatusOr<std::unique_ptr<HostCollectives>> Create(const HostPeers& peers,
                                                           const HostOptions& options,
                                                           Collectives* ring, HealthCheck health,
                                                           Deadline deadline);
  ~HostCollectives() override;

  // The shared-memory segment of `rank` in job `job_id`, epoch `epoch`.
  static std::string SegmentName(uint64_t job_id, uint32_t epoch, int rank);
  // Its size for `options`.
  static size_t SegmentBytes(const HostOptions& options);

  const char* name() const override { return ring_->name(); }
  int rank() const override { return peers_.rank; }
  int world_size() const override { return peers_.world_size; }

  Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
                   Deadline deadline) override;
  Status AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                   Deadline deadline) override;
  Status Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                   Deadline deadline) override;

  // Tells the peers this rank is gone (they fail at once naming it) and
  // makes a wait of this rank's end within poll_interval.
  void Shutdown();
  HostStats stats() const;

  struct Control;  // a segment's words (host_collectives.cc)
  // What a slot holds.
  enum Kind : uint32_t { kWhole = 1, kChunk = 2, kReduced = 3 };
  // A slot's header: which publication it is and of what (all compared).
  struct Fingerprint {
    uint64_t phase = 0;
    uint64_t step = 0, seq = 0, names_hash = 0;
    uint64_t count = 0;   // elements of the whole buffer
    uint64_t offset = 0;  // the chunk of this phase, in elements
    uint64_t chunk = 0;
    uint32_t bucket = 0, dtype = 0, reduce = 0, kind = 0;
    uint32_t epoch = 0, world = 0;

    bool SameOperation(const Fingerprint& o) const;
    std::string Describe() const;
  };
  // Byte offsets in a segment (for tests that play a hostile peer): the
  // owner's `published` word (u64), its `aborted` word (u32) and the header
  // of slot 0 (its first u64 the phase).
  static constexpr size_t kPublishedOffset = 0;
  static constexpr size_t kAbortedOffset = 128;
  static constexpr size_t kSlot0Offset = 4096;

 private:
  class Op;
  HostCollectives(const HostPeers& peers, const HostOptions& options, Collectives* ring,
                  HealthCheck health, std::unique_ptr<wire::ShmSegment> own,
                  std::vector<std::unique_ptr<wire::ShmSegment>> segments);
  Status Run(Op& op, uint8_t* base, size_t count, DType dtype, ReduceOp reduce);
  // Records `why` (the first error), tells the peers, returns it.
  Status Fail(Status why);
  // Publishes in this rank's segment that it gave up, and why (once).
  void Abort(const std::string& why);
  Control* MyControl();
  const Control* ControlOf(int q) const;  // a peer's (read-only)

  const HostPeers peers_;
  const HostOptions options_;
  Collectives* const ring_;
  const HealthCheck health_;
  std::unique_ptr<wire::ShmSegment> own_;
  std::vector<std::unique_ptr<wire::ShmSegment>> segments_;  // by rank; own_'s is null
  uint64_t phase_ = 0;                                       // the next phase this rank publishes
  Status broken_;                                            // the first error; sticky
  std::atomic<bool> stopped_{false};
  std::atomic<bool> abort_claimed_{false};
  std::atomic<uint64_t> bytes_published_{0}, operations_{0};
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_HOST_COLLECTIVES_H_
