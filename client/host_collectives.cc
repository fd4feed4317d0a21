#include "client/host_collectives.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "client/elementwise.h"
#include "client/ring_plan.h"
#include "common/logging.h"
#include "wire/message.h"
#include "wire/shm_common.h"

namespace gradsync::client {

namespace {

constexpr uint32_t kSetupBucket = 0xfffffffdu;  // the ring's setup exchanges
constexpr size_t kControlBytes = 4096;
constexpr size_t kSlotHeaderBytes = 4096;
constexpr size_t kWhyBytes = 1024;

const char* KindName(uint32_t kind) {
  switch (kind) {
    case HostCollectives::kWhole:
      return "whole buffers";
    case HostCollectives::kChunk:
      return "a chunk";
    case HostCollectives::kReduced:
      return "reduced parts";
    default:
      return "an unknown step";
  }
}

}  // namespace

// Each word on a cache line of its own: `published` and `seq` are written
// by the owner at each step, `sleeping` whenever it waits, `aborted` once.
struct HostCollectives::Control {
  alignas(64) std::atomic<uint64_t> published;  // phases published (the next one's number)
  std::atomic<uint32_t> seq;                    // futex: bumped at each publication and abort
  alignas(64) std::atomic<uint32_t> sleeping;   // this rank sleeps on a peer's `seq`
  alignas(64) std::atomic<uint32_t> aborted;    // nonzero once `why` holds why this rank gave up
  char why[kWhyBytes];
};
static_assert(sizeof(HostCollectives::Control) <= kControlBytes);
static_assert(offsetof(HostCollectives::Control, published) == HostCollectives::kPublishedOffset);
static_assert(offsetof(HostCollectives::Control, aborted) == HostCollectives::kAbortedOffset);
static_assert(kControlBytes == HostCollectives::kSlot0Offset);

bool HostCollectives::Fingerprint::SameOperation(const Fingerprint& o) const {
  return step == o.step && seq == o.seq && names_hash == o.names_hash && count == o.count &&
         offset == o.offset && chunk == o.chunk && bucket == o.bucket && dtype == o.dtype &&
         reduce == o.reduce && kind == o.kind && epoch == o.epoch && world == o.world;
}

std::string HostCollectives::Fingerprint::Describe() const {
  const DType d = static_cast<DType>(dtype);
  std::string s = "allreduce step " + std::to_string(step & 0xFFFFFFFFu) + " bucket " +
                  std::to_string(bucket) + " seq " + std::to_string(seq) + " of " +
                  std::to_string(count) + " " +
                  (dtype <= static_cast<uint32_t>(DType::kBF16) ? DTypeName(d) : "?") + " (" +
                  (reduce == static_cast<uint32_t>(ReduceOp::kAverage) ? "average" : "sum") +
                  ") names-hash " + std::to_string(names_hash) + ", " + KindName(kind);
  if (kind != kWhole) {
    s += " [" + std::to_string(offset) + ", " + std::to_string(offset + chunk) + ")";
  }
  if (epoch != 0) s += ", epoch " + std::to_string(epoch);
  return s + " of " + std::to_string(world) + " ranks";
}
static_assert(sizeof(HostCollectives::Fingerprint) <= kSlotHeaderBytes);

// One all-reduce: its fingerprint, its deadline, and the waits for peers.
class HostCollectives::Op {
 public:
  Op(HostCollectives* host, const OpTag& tag, DType dtype, size_t count, ReduceOp reduce,
     Deadline deadline)
      : host_(host), deadline_(deadline), first_(host->phase_) {
    fp_.step = tag.step;
    fp_.seq = tag.seq;
    fp_.names_hash = tag.names_hash;
    fp_.count = count;
    fp_.bucket = tag.bucket;
    fp_.dtype = static_cast<uint32_t>(dtype);
    fp_.reduce = static_cast<uint32_t>(reduce);
    fp_.epoch = host->peers_.epoch;
    fp_.world = static_cast<uint32_t>(host->peers_.world_size);
  }

  std::string Describe() const {
    const uint32_t epoch = host_->peers_.epoch;
    return std::string("allreduce") + (epoch ? " epoch " + std::to_string(epoch) : "") + " step " +
           std::to_string(fp_.step & 0xFFFFFFFFu) + " bucket " + std::to_string(fp_.bucket) +
           " seq " + std::to_string(fp_.seq);
  }

  // This rank's slot for phase p, and rank q's (read-only).
  uint8_t* MySlot(uint64_t p) {
    return host_->own_->mutable_data() + SlotOffset(p) + kSlotHeaderBytes;
  }
  const uint8_t* Slot(int q, uint64_t p) const {
    return SegmentOf(q)->data() + SlotOffset(p) + kSlotHeaderBytes;
  }

  // Writes this rank's header of phase `p` (kind, chunk) and publishes the
  // phase (its slot written already).
  void Publish(uint64_t p, uint32_t kind, uint64_t offset, uint64_t chunk, size_t bytes) {
    fp_.phase = p;
    fp_.kind = kind;
    fp_.offset = offset;
    fp_.chunk = chunk;
    std::memcpy(host_->own_->mutable_data() + SlotOffset(p), &fp_, sizeof(fp_));
    Control* mine = host_->MyControl();
    mine->published.store(p + 1, std::memory_order_seq_cst);
    mine->seq.fetch_add(1, std::memory_order_seq_cst);
    for (int q = 0; q < host_->peers_.world_size; ++q) {
      if (q != host_->peers_.rank && host_->ControlOf(q)->sleeping.load() != 0) {
        wire::shm::FutexWake(&mine->seq, INT_MAX);
        break;
      }
    }
    host_->bytes_published_.fetch_add(bytes, std::memory_order_relaxed);
  }

  // Until every peer published phase `p` of this operation, checking each
  // one's header against this rank's.
  Status WaitForAll(uint64_t p) {
    for (int q = 0; q < host_->peers_.world_size; ++q) {
      if (q != host_->peers_.rank) GS_RETURN_IF_ERROR(WaitFor(q, p));
    }
    return Status();
  }

  Status CheckHealth() {
    if (!host_->health_) return Status();
    Status health = host_->health_();
    if (health.ok() || health.code() == StatusCode::kMembershipChanged) return health;
    return CannotFinish(Describe(), health);
  }

 private:
  size_t SlotOffset(uint64_t p) const {
    return kControlBytes +
           static_cast<size_t>(p % 2) * (kSlotHeaderBytes + host_->options_.slot_bytes);
  }
  const wire::ShmSegment* SegmentOf(int q) const {
    return q == host_->peers_.rank ? host_->own_.get()
                                   : host_->segments_[static_cast<size_t>(q)].get();
  }

  Status WaitFor(int q, uint64_t p) {
    const Control* theirs = host_->ControlOf(q);
    Control* mine = host_->MyControl();
    auto who = [q] { return "rank " + std::to_string(q); };
    SteadyTime poll_at = std::chrono::steady_clock::now() + host_->options_.poll_interval;
    auto ready = [&] {
      return theirs->published.load(std::memory_order_acquire) > p ||
             theirs->aborted.load(std::memory_order_relaxed) != 0 || host_->stopped_.load();
    };
    for (;;) {
      const uint64_t published = theirs->published.load(std::memory_order_acquire);
      if (published > p + 2 || published < p) {
        return OutOfTurn(Describe() + ": " + who() + " published phase " +
                         std::to_string(published) + " while rank " +
                         std::to_string(host_->peers_.rank) + " waits for its phase " +
                         std::to_string(p));
      }
      if (published > p) return CheckHeader(q, p);
      if (theirs->aborted.load(std::memory_order_acquire) != 0) {
        char why[kWhyBytes];
        std::memcpy(why, theirs->why, sizeof(why));
        return AbortedError(Describe() + ": " + who() + " gave up: " +
                            wire::Escaped(std::string(why, strnlen(why, sizeof(why)))));
      }
      if (host_->stopped_.load()) return CancelledError(Describe() + ": shut down");
      const SteadyTime now = std::chrono::steady_clock::now();
      if (now >= poll_at) {
        GS_RETURN_IF_ERROR(CheckHealth());
        if (!SegmentOf(q)->OwnerAlive()) {
          return UnavailableError(Describe() + ": worker " + std::to_string(q) +
                                  " died (its process no longer holds its shared memory)");
        }
        if (deadline_.Expired()) {
          return DeadlineExceededError(Describe() + ": " + who() + " stopped contributing; rank " +
                                       std::to_string(host_->peers_.rank) + " had " +
                                       std::to_string(p - first_) +
                                       " phase(s) of this operation from it before the deadline");
        }
        poll_at = now + host_->options_.poll_interval;
      }
      if (wire::shm::Spin(ready)) continue;
      mine->sleeping.store(1, std::memory_order_seq_cst);
      const uint32_t seen = theirs->seq.load(std::memory_order_seq_cst);
      if (!ready()) {
        wire::shm::FutexWait(&theirs->seq, seen, deadline_.Min(Deadline::At(poll_at)));
      }
      mine->sleeping.store(0, std::memory_order_relaxed);
    }
  }

  // A peer wrote its segment as the phases do not allow: counted as a
  // message dropped as it was read (as a same-host link's bad frame table).
  Status OutOfTurn(const std::string& what) {
    if (host_->options_.refusals) host_->options_.refusals->dropped.fetch_add(1);
    return AbortedError(what + " (its shared memory was written out of turn)");
  }

  // Rank q's header of phase p, copied before it is checked.
  Status CheckHeader(int q, uint64_t p) {
    Fingerprint theirs;
    std::memcpy(&theirs, SegmentOf(q)->data() + SlotOffset(p), sizeof(theirs));
    if (theirs.phase != p) {
      return OutOfTurn(Describe() + ": rank " + std::to_string(q) + "'s slot for phase " +
                       std::to_string(p) + " holds phase " + std::to_string(theirs.phase));
    }
    if (!theirs.SameOperation(fp_)) {
      return AbortedError("ranks disagree on collective seq " + std::to_string(fp_.seq) +
                          ": rank " + std::to_string(q) + " runs " + theirs.Describe() + ", rank " +
                          std::to_string(host_->peers_.rank) + " runs " + fp_.Describe());
    }
    return Status();
  }

 private:
  HostCollectives* host_;
  Deadline deadline_;
  const uint64_t first_;  // the operation's first phase
  Fingerprint fp_;
};

std::string HostCollectives::SegmentName(uint64_t job_id, uint32_t epoch, int rank) {
  char name[96];
  std::snprintf(name, sizeof(name), "/gradsync-%016llx-e%u-host%d",
                static_cast<unsigned long long>(job_id), epoch, rank);
  return name;
}

size_t HostCollectives::SegmentBytes(const HostOptions& options) {
  return kControlBytes + 2 * (kSlotHeaderBytes + options.slot_bytes);
}

StatusOr<std::unique_ptr<HostCollectives>> HostCollectives::Create(const HostPeers& peers,
                                                                   const HostOptions& options,
                                                                   Collectives* ring,
                                                                   HealthCheck health,
                                                                   Deadline deadline) {
  const int n = peers.world_size;
  const int r = peers.rank;
  if (options.slot_bytes < 4096 || options.slot_bytes % 64 != 0) {
    return InvalidArgumentError("the shared-memory all-reduce's slot of " +
                                std::to_string(options.slot_bytes) +
                                " bytes: at least 4096, a multiple of 64");
  }
  const size_t bytes = SegmentBytes(options);
  // Each rank makes its segment; once all did (the ring's all-gather is the
  // barrier), each maps the others'; once all did, each removes its name.
  // A rank whose setting is off takes part in the first exchange only.
  enum Vote : uint8_t { kFailed = 0, kDone = 1, kOff = 2 };
  auto agree = [&](Vote mine, uint64_t step, std::string* reason) -> StatusOr<bool> {
    std::vector<uint8_t> all(static_cast<size_t>(n));
    GS_RETURN_IF_ERROR(
        ring->AllGather(&mine, 1, all.data(), OpTag{step, kSetupBucket, 0, 0}, deadline));
    for (int q = 0; q < n; ++q) {
      const uint8_t vote = all[static_cast<size_t>(q)];
      if (vote == kDone) continue;
      *reason = "rank " + std::to_string(q) +
                (vote == kOff ? " has ring_shm_allreduce=ring"
                 : step == 0  ? " could not make its shared memory"
                              : " could not map the others' shared memory");
      return false;
    }
    return true;
  };
  auto fallback = [&](const std::string& reason, const Status& mine) {
    GS_LOG(WARNING) << "rank " << r << ": all-reduces go through the ring, not shared-memory "
                    << "segments (" << reason << (mine.ok() ? "" : "; here: " + mine.message())
                    << ")";
    return std::unique_ptr<HostCollectives>();
  };
  StatusOr<std::unique_ptr<wire::ShmSegment>> own =
      options.enabled
          ? wire::ShmSegment::Create(SegmentName(peers.job_id, peers.epoch, r), bytes)
          : StatusOr<std::unique_ptr<wire::ShmSegment>>(std::unique_ptr<wire::ShmSegment>());
  std::string reason;
  GS_ASSIGN_OR_RETURN(bool made, agree(!options.enabled ? kOff
                                       : own.ok()       ? kDone
                                                        : kFailed,
                                       0, &reason));
  if (!made) {
    if (options.enabled) return fallback(reason, own.status());
    if (r == 0) GS_LOG(INFO) << "all-reduces go through the ring (" << reason << ")";
    return std::unique_ptr<HostCollectives>();
  }
  std::vector<std::unique_ptr<wire::ShmSegment>> segments(static_cast<size_t>(n));
  Status mapped;
  for (int q = 0; q < n && mapped.ok(); ++q) {
    if (q == r) continue;
    auto segment = wire::ShmSegment::Open(SegmentName(peers.job_id, peers.epoch, q), bytes);
    if (segment.ok()) {
      segments[static_cast<size_t>(q)] = std::move(*segment);
    } else {
      mapped = segment.status();
    }
  }
  GS_ASSIGN_OR_RETURN(bool all_mapped, agree(mapped.ok() ? kDone : kFailed, 1, &reason));
  if (!all_mapped) return fallback(reason, mapped);
  (*own)->Unlink();
  return std::unique_ptr<HostCollectives>(new HostCollectives(
      peers, options, ring, std::move(health), std::move(*own), std::move(segments)));
}

HostCollectives::HostCollectives(const HostPeers& peers, const HostOptions& options,
                                 Collectives* ring, HealthCheck health,
                                 std::unique_ptr<wire::ShmSegment> own,
                                 std::vector<std::unique_ptr<wire::ShmSegment>> segments)
    : peers_(peers),
      options_(options),
      ring_(ring),
      health_(std::move(health)),
      own_(std::move(own)),
      segments_(std::move(segments)) {
  new (own_->mutable_data()) Control();
}

HostCollectives::~HostCollectives() { Shutdown(); }

HostCollectives::Control* HostCollectives::MyControl() {
  return reinterpret_cast<Control*>(own_->mutable_data());
}

const HostCollectives::Control* HostCollectives::ControlOf(int q) const {
  return reinterpret_cast<const Control*>(segments_[static_cast<size_t>(q)]->data());
}

void HostCollectives::Abort(const std::string& why) {
  if (abort_claimed_.exchange(true)) return;
  Control* mine = MyControl();
  std::strncpy(mine->why, why.c_str(), sizeof(mine->why) - 1);
  mine->aborted.store(1, std::memory_order_seq_cst);
  mine->seq.fetch_add(1, std::memory_order_seq_cst);
  wire::shm::FutexWake(&mine->seq, INT_MAX);
}

void HostCollectives::Shutdown() {
  stopped_.store(true);
  Abort("rank " + std::to_string(peers_.rank) + " shut down");
}

Status HostCollectives::Fail(Status why) {
  if (why.code() != StatusCode::kMembershipChanged) {
    broken_ = why;
    Abort(why.message());
  }
  return why;
}

HostStats HostCollectives::stats() const {
  return HostStats{bytes_published_.load(), operations_.load()};
}

Status HostCollectives::AllReduce(void* data, size_t count, DType dtype, ReduceOp reduce,
                                  const OpTag& tag, Deadline deadline) {
  if (!broken_.ok()) return broken_;
  GS_RETURN_IF_ERROR(CheckReducible(dtype));
  if (peers_.world_size == 1 || count == 0) return Status();
  Op op(this, tag, dtype, count, reduce, deadline);
  Status s = op.CheckHealth();
  if (s.ok()) s = Run(op, static_cast<uint8_t*>(data), count, dtype, reduce);
  if (!s.ok()) return Fail(s);
  operations_.fetch_add(1, std::memory_order_relaxed);
  return s;
}

Status HostCollectives::Run(Op& op, uint8_t* base, size_t count, DType dtype, ReduceOp reduce) {
  const int n = peers_.world_size;
  const int r = peers_.rank;
  const size_t es = DTypeSize(dtype);
  if (count * es * static_cast<size_t>(n) <= options_.small_bytes &&
      count * es <= options_.slot_bytes) {
    const uint64_t p = phase_;
    const size_t bytes = count * es;
    std::memcpy(op.MySlot(p), base, bytes);
    op.Publish(p, kWhole, 0, count, bytes);
    GS_RETURN_IF_ERROR(op.WaitForAll(p));
    // In rank order, each peer's bytes read once (rank 0's are in `base`
    // already on rank 0).
    if (r != 0) std::memcpy(base, op.Slot(0, p), bytes);
    for (int q = 1; q < n; ++q) AddInto(base, op.Slot(q, p), count, dtype);
    if (reduce == ReduceOp::kAverage) DivideBy(base, count, dtype, n);
    phase_ = p + 1;
    return Status();
  }
  const size_t slot_elems = options_.slot_bytes / es;
  for (size_t offset = 0; offset < count; offset += slot_elems) {
    const size_t len = std::min(slot_elems, count - offset);
    uint8_t* chunk = base + offset * es;
    const uint64_t p = phase_;
    std::memcpy(op.MySlot(p), chunk, len * es);
    op.Publish(p, kChunk, offset, len, len * es);
    GS_RETURN_IF_ERROR(op.WaitForAll(p));
    // This rank's part, from every rank's chunk in rank order.
    const Span part = Segment(len, n, r);
    uint8_t* dst = chunk + part.begin * es;
    if (r != 0) std::memcpy(dst, op.Slot(0, p) + part.begin * es, part.size() * es);
    for (int q = 1; q < n; ++q) {
      AddInto(dst, op.Slot(q, p) + part.begin * es, part.size(), dtype);
    }
    if (reduce == ReduceOp::kAverage) DivideBy(dst, part.size(), dtype, n);
    std::memcpy(op.MySlot(p + 1) + part.begin * es, dst, part.size() * es);
    op.Publish(p + 1, kReduced, offset, len, part.size() * es);
    GS_RETURN_IF_ERROR(op.WaitForAll(p + 1));
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const Span theirs = Segment(len, n, q);
      std::memcpy(chunk + theirs.begin * es, op.Slot(q, p + 1) + theirs.begin * es,
                  theirs.size() * es);
    }
    phase_ = p + 2;
  }
  return Status();
}

Status HostCollectives::AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                                  Deadline deadline) {
  if (!broken_.ok()) return broken_;
  return ring_->AllGather(in, bytes, out, tag, deadline);
}

Status HostCollectives::Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                                  Deadline deadline) {
  if (!broken_.ok()) return broken_;
  return ring_->Broadcast(data, bytes, root, tag, deadline);
}

}  // namespace gradsync::client
