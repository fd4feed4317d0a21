// RingCollectives: all-reduce, all-gather and broadcast over a ring of
// workers, each sending to its right neighbour (rank + 1, or the next in
// RingPeers::order) and receiving from its left through a wire::Transport
// (ZeroMQ between processes, in-process in tests).
//
// All-reduce of small buffers (up to `small_bytes`): every rank's whole
// buffer travels once around the ring (n - 1 steps), and each rank adds the n
// buffers in rank order, so all ranks get the same bits.
//
// All-reduce of larger buffers is a reduce-scatter followed by an all-gather. The buffer is cut
// into world_size segments and every segment into chunks of at most
// `chunk_bytes`, so a rank forwards a chunk as soon as it has summed it:
// sending, receiving and summing overlap. Sends are zero-copy (payload frames
// point into the caller's buffer, and received frames are forwarded as they
// came); a region of the buffer is not overwritten until the transport has
// released every send that points into it.
//
// Every RingData message carries the operation's fingerprint (op, step,
// bucket, seq, dtype, count, names hash). A message that does not match what
// this rank expects, or that fails verification, is refused with an Error
// reply; a mismatch from the left neighbour fails the operation on every
// rank: the detecting rank sends a RingAbort around the ring, naming both
// ranks and the differing fields. When nothing arrives before the deadline,
// the ranks pass their progress around the ring and all name the same
// missing rank (the left neighbour of the rank that received least). A
// `health` check (a MembershipChanged from it is returned as it is, and no
// RingAbort is sent: every rank learns it from its own), run before each operation's first message
// and, while waiting, after every message and every poll_interval without one, fails the operation
// at once when the job already knows a peer died or its scheduler went silent; the deadline is
// checked as often, so a stream of refused messages holds no wait past it.
//
// Refusals are answered without waiting: the Error reply is posted, and
// while 64 replies are still on their way (a peer that sends and never
// reads) further refusals go unanswered, counted in replies_dropped.
//
// The ring must be the only reader of `transport` (it calls Receive).
//
// Buffers: a call that succeeds returns only after the transport has let go
// of every send pointing into the caller's buffer. After a failure the
// transport may still hold such sends (a dead peer never takes them), so the
// buffer must stay allocated until the transport is shut down.
//
// Thread-safety: as Collectives (one operation at a time). stats() may be
// called from any thread.
#ifndef GRADSYNC_CLIENT_RING_H_
#define GRADSYNC_CLIENT_RING_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/collectives.h"
#include "client/ring_plan.h"
#include "common/refusal_log.h"
#include "common/status.h"
#include "common/time.h"
#include "wire/message.h"
#include "wire/rejected_metrics.h"
#include "wire/transport.h"
#include "wire/validate.h"

namespace gradsync::client {

struct RingOptions {
  size_t chunk_bytes = size_t{1} << 20;  // pipelining granularity
  // All-reduces of at most this many bytes pass whole buffers around the
  // ring instead (n - 1 steps rather than 2 (n - 1)); 0 turns that off.
  size_t small_bytes = size_t{256} << 10;
  Millis poll_interval{20};  // how often a waiting rank runs `health`
  Millis abort_grace{300};   // after a timeout: how long to gather other ranks' progress
  wire::RejectedMetrics* rejected = nullptr;  // refused messages by reason; may be null
};

struct RingPeers {
  int rank = 0;
  int world_size = 1;
  std::string right_endpoint;  // data endpoint of the right neighbour; unused when world_size == 1
  wire::Sender sender;         // this worker, as headers name it
  // The transport identity of the left neighbour (wire::NodeInfo::identity):
  // only messages under it are taken as the left neighbour's. "": any.
  std::string left_identity;
  // An elastic job's membership epoch (0 before any loss). The ring's
  // messages carry it in their header (and its collectives' fingerprints
  // include it), and a RingData or RingAbort of an
  // earlier epoch (sent before a loss, and late) is dropped unanswered,
  // counted in RingStats::stale.
  uint32_t epoch = 0;
  // The ranks in ring order (a permutation of 0..world_size-1, see
  // cluster/ring_order.h); empty: rank order. Each rank sends to the next
  // one (its right neighbour) and receives from the one before (its left).
  // Results do not depend on it: all-gather places blocks by rank, and
  // broadcast roots are ranks.
  std::vector<int> order;
  // The job-wide rank of each rank of this ring (a ring of some of the
  // job's workers: client/halving_doubling.h); empty: the same numbers.
  // Headers name senders by job rank (`sender`), and so do messages.
  std::vector<int> job_ranks;
};

struct RingStats {
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t bytes_sent = 0;      // payload bytes
  uint64_t bytes_received = 0;  // payload bytes
  uint64_t rejected = 0;        // messages refused (malformed, mismatched, unexpected)
  // Refusals left unanswered: too many answers were still on their way.
  uint64_t replies_dropped = 0;
  // Messages of an earlier membership epoch, dropped.
  uint64_t stale = 0;

  // Adds `other`'s counts (rings made of several: lanes, pairs).
  RingStats& operator+=(const RingStats& other) {
    messages_sent += other.messages_sent;
    messages_received += other.messages_received;
    bytes_sent += other.bytes_sent;
    bytes_received += other.bytes_received;
    rejected += other.rejected;
    replies_dropped += other.replies_dropped;
    stale += other.stale;
    return *this;
  }
};

// Returns an error when the job already knows the ring cannot finish (a
// worker died, the job failed); OK otherwise.
using HealthCheck = std::function<Status()>;
// What an operation `what` that cannot finish returns for the job's ill
// `health`: a peer that departed on its deadline reads as DeadlineExceeded
// (NodeAgent::PeerDeathStatus), anything else as Unavailable.
inline Status CannotFinish(const std::string& what, const Status& health) {
  const std::string message = what + " cannot finish: " + health.message();
  return health.code() == StatusCode::kDeadlineExceeded ? DeadlineExceededError(message)
                                                        : UnavailableError(message);
}

// The largest frame a ring with `options` sends or takes: a chunk, a small
// all-reduce's whole buffer, or a header. A worker's data port refuses
// larger frames before reading them.
size_t RingFrameBytes(const RingOptions& options);

class RingCollectives : public Collectives {
 public:
  // Connects to the right neighbour. `transport` must be listening and must
  // outlive the ring. `health` may be null.
  static StatusOr<std::unique_ptr<RingCollectives>> Create(wire::Transport* transport,
                                                           const RingPeers& peers,
                                                           const RingOptions& options,
                                                           HealthCheck health);
  ~RingCollectives() override;

  const char* name() const override { return "ring"; }
  int rank() const override { return peers_.rank; }
  int world_size() const override { return peers_.world_size; }

  Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
                   Deadline deadline) override;
  Status AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                   Deadline deadline) override;
  Status Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                   Deadline deadline) override;

  // What AllReduceAround does between its two halves: `part` (`count`
  // elements, inside the caller's buffer) holds the sum over this ring's
  // ranks of this rank's part, and what it holds on return is what the
  // all-gather passes on.
  using Between = std::function<Status(uint8_t* part, size_t count)>;
  // A building block of other all-reduces (client/halving_doubling.h): a
  // sum's reduce-scatter around the ring, then `between` on the part this
  // rank holds, then the all-gather of every rank's part. Always the
  // chunked path, whatever small_bytes says; a rank whose `between` fails
  // fails the operation on every rank of this ring with its message.
  Status AllReduceAround(void* data, size_t count, DType dtype, const OpTag& tag, Deadline deadline,
                         const Between& between);
  // Fails, on every rank of this ring, the operation `tag` this rank will
  // not run (it failed elsewhere first): a neighbour waiting in it learns
  // `why` at once. The ring is broken from then on.
  void Abandon(const OpTag& tag, const Status& why);
  // The job-wide rank of ring rank `ring_rank` (RingPeers::job_ranks).
  int JobRank(int ring_rank) const {
    return peers_.job_ranks.empty() ? ring_rank : peers_.job_ranks[static_cast<size_t>(ring_rank)];
  }

  // Sends this rank's tensor list to the right neighbour, in Layout pieces
  // of at most wire::kLayoutPieceBytes, and compares the left neighbour's
  // with it piece by piece (nothing of it is kept). On a difference every
  // rank fails with FailedPrecondition naming both ranks and the first
  // tensor that differs.
  Status CheckLayout(const std::vector<wire::TensorSpecFields>& tensors, Deadline deadline);

  RingStats stats() const;
  const RingOptions& options() const { return options_; }

  // Whether no send of this ring points into a buffer any more (its own,
  // or a caller's): after a failure, one queued to a neighbour that never
  // took it does until the transport lets go of it. Any thread.
  bool Idle() const { return sends_out_->load() == 0; }

 private:
  class Op;  // one collective in flight (ring.cc)
  RingCollectives(wire::Transport* transport, const RingPeers& peers, const RingOptions& options,
                  HealthCheck health);
  // `between` (may be null): see AllReduceAround.
  Status RunAllReduce(Op& op, uint8_t* base, size_t count, DType dtype, ReduceOp reduce,
                      const Between* between = nullptr);
  Status RunAllGather(Op& op, size_t bytes, uint8_t* base);
  Status RunSmallAllReduce(Op& op, uint8_t* base, size_t count, DType dtype, ReduceOp reduce);
  // The left neighbour's layout, received piece by piece and compared with
  // `mine` as it comes: "" when they are equal, else the first difference.
  StatusOr<std::string> ReceiveLayoutDiff(Op& op, const std::vector<wire::TensorSpecFields>& mine);
  // Waits until no send points into the caller's buffer; a failure breaks
  // the ring for good.
  Status Finish(Op& op, Status result);

  wire::Transport* const transport_;
  const RingPeers peers_;
  const RingOptions options_;
  const HealthCheck health_;
  wire::Policy policy_;
  wire::ConnId right_ = -1;
  // This rank's place in the ring, and the rank at each place.
  int pos_ = 0;
  std::vector<int> rank_at_;
  int RankAt(int pos) const {
    return rank_at_[static_cast<size_t>(RingIndex(pos, peers_.world_size))];
  }
  int PosOf(int rank) const;
  Status broken_;  // the first error; sticky
  // A message of the left neighbour's read while this rank waited for its
  // own sends to go out (Op::Peek), for the next Op::Receive to take
  // first; at most one, so messages keep their order.
  std::optional<wire::Incoming> held_;
  // Whether `from` is a job member's route: the connection to the right
  // neighbour, or the left neighbour's own. Only members get the job id on
  // an Error.
  bool IsMember(const wire::Route& from) const {
    return from.kind == wire::Route::Kind::kConnection ||
           (!peers_.left_identity.empty() && from.identity == peers_.left_identity);
  }
  // Whether a message that came over `from` may be the left neighbour's.
  bool FromLeft(const wire::Route& from) const {
    return from.kind == wire::Route::Kind::kInbound &&
           (peers_.left_identity.empty() || from.identity == peers_.left_identity);
  }
  // Buffers of the ring's own (small all-reduce blocks, layout votes),
  // reused across operations. After a failure sends may still point into
  // it; the ring is broken then, so it is never resized again.
  std::vector<uint8_t> scratch_;
  std::atomic<uint64_t> messages_sent_{0}, messages_received_{0};
  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0}, rejected_{0}, replies_dropped_{0};
  std::atomic<uint64_t> stale_{0};
  // Sends of every operation not yet let go of: shared with their owners.
  std::shared_ptr<std::atomic<int64_t>> sends_out_ = std::make_shared<std::atomic<int64_t>>(0);
  // Error replies posted and not yet sent: shared with the transport's
  // callbacks, which may come after the ring is gone.
  std::shared_ptr<std::atomic<int>> replies_in_flight_ = std::make_shared<std::atomic<int>>(0);
  RefusalLog refusal_log_;
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_RING_H_
