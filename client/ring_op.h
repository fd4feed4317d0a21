// RingCollectives::Op: one collective operation of the ring in flight, and
// what it shares with its sends. Internal to client/ring.cc and ring_op.cc.
#ifndef GRADSYNC_CLIENT_RING_OP_H_
#define GRADSYNC_CLIENT_RING_OP_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "client/ring.h"
#include "client/ring_plan.h"
#include "wire/validate.h"

namespace gradsync::client {

// The wire vocabulary of the ring's two files.
using wire::ErrorCode;
using wire::Message;
using wire::MsgType;

// Error replies to refused messages posted and not yet sent (or failed).
constexpr int kMaxRepliesInFlight = 64;

// Counts the sends that still point into each segment of the caller's
// buffer; a segment is overwritten only once its count is back to zero.
// Shared with the payload owners, which may outlive the operation. `total`
// counts the sends of every operation of the ring (RingCollectives::Idle).
class RingSendHolds {
 public:
  RingSendHolds(int segments, std::shared_ptr<std::atomic<int64_t>> total)
      : held_(static_cast<size_t>(segments), 0), total_(std::move(total)) {}

  std::shared_ptr<const void> Hold(const std::shared_ptr<RingSendHolds>& self, int seg) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++held_[static_cast<size_t>(seg)];
    }
    total_->fetch_add(1);
    return std::shared_ptr<const void>(nullptr, [self, seg](const void*) { self->Release(seg); });
  }

  // Waits until no send points into `seg` (all segments if seg < 0).
  bool WaitReleased(int seg, Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    auto done = [&] {
      if (seg >= 0) return held_[static_cast<size_t>(seg)] == 0;
      return std::all_of(held_.begin(), held_.end(), [](int h) { return h == 0; });
    };
    if (deadline.infinite()) {
      cv_.wait(lock, done);
      return true;
    }
    return cv_.wait_until(lock, deadline.at(), done);
  }

 private:
  void Release(int seg) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --held_[static_cast<size_t>(seg)];
      cv_.notify_all();
    }
    total_->fetch_sub(1);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> held_;
  const std::shared_ptr<std::atomic<int64_t>> total_;
};

class RingCollectives::Op {
 public:
  Op(RingCollectives* ring, RingOpKind kind, const OpTag& tag, DType dtype, uint64_t count,
     uint64_t extra, int segments, Deadline deadline)
      : ring_(ring),
        kind_(kind),
        tag_(InEpoch(tag, ring->peers_.epoch)),
        dtype_(dtype),
        fingerprint_(RingFingerprint(kind, tag_, dtype, count, extra)),
        deadline_(deadline),
        holds_(std::make_shared<RingSendHolds>(segments, ring->sends_out_)) {}

  int rank() const { return ring_->peers_.rank; }
  // A rank of the ring as the job numbers it, for messages.
  std::string Named(int ring_rank) const { return std::to_string(ring_->JobRank(ring_rank)); }
  int left() const { return ring_->RankAt(ring_->pos_ - 1); }
  int right() const { return ring_->RankAt(ring_->pos_ + 1); }

  // Sends bytes [data, data + elems) of segment `seg` without copying.
  Status SendFromBuffer(const uint8_t* data, size_t elems, int seg) {
    return SendPayload(
        wire::Payload::Borrow(data, elems * DTypeSize(dtype_), holds_->Hold(holds_, seg)), elems);
  }
  // Forwards a payload as it came from the left.
  Status Forward(wire::Payload payload, size_t elems) {
    return SendPayload(std::move(payload), elems);
  }
  // Every message of the operation, data or not, takes the next index.
  // Posted: the caller goes on at once, and the transport keeps the
  // messages to the right neighbour in order, holding each payload until it
  // is out (WaitReleased). A send that fails is seen by the next wait
  // (SendFailure); one the neighbour never takes ends with the operation's
  // deadline, meanwhile the waits check `health`.
  Status SendMessage(Message msg) {
    GS_RETURN_IF_ERROR(Begin());
    ++sent_;
    GS_RETURN_IF_ERROR(SendFailure());
    ring_->messages_sent_.fetch_add(1, std::memory_order_relaxed);
    ring_->bytes_sent_.fetch_add(msg.PayloadBytes(), std::memory_order_relaxed);
    ring_->transport_->Post(wire::Route::Connection(ring_->right_), std::move(msg), deadline_,
                            posted_.callback());
    return Status();
  }
  // The first posted send of this operation that failed, as the failure
  // of the operation (OK while none has).
  Status SendFailure() {
    const Status first = posted_.first_failure();
    if (first.ok() || !send_failure_.ok()) return send_failure_;
    send_failure_ = Fail(UnavailableError(Describe() + ": sending to rank " + Named(right()) +
                                          " failed: " + first.message()),
                         ErrorCode::Unreachable, -1);
    return send_failure_;
  }

  // The next message of this operation from the left: a RingData of `elems`
  // elements (its single payload frame), or a Layout when `want` says so.
  StatusOr<Message> Receive(MsgType want, size_t elems);
  // While this rank's sends are held (a right neighbour that takes nothing,
  // having failed), the ring's abort comes from the left: reads one waiting
  // message, if any and none is held yet. An abort or anything else a
  // Receive would fail on fails the operation now; the left neighbour's
  // RingData or Layout (this operation's, or the next one's when it is
  // ahead) is held for the next Receive; a stale or refused one is dropped.
  Status Peek();

  // Waits until no send points into `seg`, checking `health` and what the
  // left neighbour sent (Peek) meanwhile.
  Status WaitReleased(int seg) {
    for (;;) {
      const Deadline slice = deadline_.Min(Deadline::After(ring_->options_.poll_interval));
      if (holds_->WaitReleased(seg, slice)) return Status();
      GS_RETURN_IF_ERROR(SendFailure());
      GS_RETURN_IF_ERROR(CheckHealth());
      GS_RETURN_IF_ERROR(Peek());
      if (deadline_.Expired()) {
        return Fail(DeadlineExceededError(Describe() + ": rank " + Named(right()) +
                                          " did not take this rank's messages in time"),
                    ErrorCode::Timeout, -1);
      }
    }
  }
  Status WaitAllReleased() { return WaitReleased(-1); }

  // Records `why`, tells the right neighbour (which passes it on), returns it.
  Status Fail(Status why, ErrorCode code, int blamed);
  // The job's health, once per operation, before its first message: a job
  // whose collectives never wait (a fast network) still stops when its
  // scheduler goes silent or a peer is declared dead.
  Status Begin() { return sent_ + received_ == 0 ? CheckHealth() : Status(); }
  // Fails the operation when the job already knows a peer died.
  Status CheckHealth() {
    if (!ring_->health_) return Status();
    Status health = ring_->health_();
    if (health.ok() || health.code() == StatusCode::kMembershipChanged) return health;
    const Status why = CannotFinish(Describe(), health);
    return Fail(why, wire::FailureCode(why), -1);
  }
  std::string Describe() const {
    const uint32_t epoch = ring_->peers_.epoch;
    return std::string(RingOpName(kind_)) + (epoch ? " epoch " + std::to_string(epoch) : "") +
           " step " + std::to_string(tag_.step) + " bucket " + std::to_string(tag_.bucket) +
           " seq " + std::to_string(tag_.seq);
  }

 private:
  Status SendPayload(wire::Payload payload, size_t elems);
  // The held message if there is one, else the transport's next by `until`.
  StatusOr<wire::Incoming> Next(Deadline until);
  // What a transport's failure to give a message means for the operation:
  // a deadline is waited out by the caller, the rest fails it.
  Status TransportFailure(const Status& why);
  // Between two messages of a wait, whatever they were (a flood of them
  // must not hold it): fails once a send failed, the job is unhealthy, or
  // `soft` (the deadline less abort_grace) has passed.
  Status StillWaiting(Deadline soft) {
    GS_RETURN_IF_ERROR(SendFailure());
    GS_RETURN_IF_ERROR(CheckHealth());
    return soft.Expired() ? TimedOut() : Status();
  }
  // Handles a message that is not the expected one; OK means "keep waiting".
  Status HandleOther(const wire::Incoming& in, const wire::Verdict& v);
  // `tag` of membership epoch `epoch`.
  static OpTag InEpoch(OpTag tag, uint32_t epoch) {
    tag.epoch = epoch;
    return tag;
  }
  // Whether `v` is a RingData or RingAbort of an earlier membership epoch,
  // to be dropped; counted (stale).
  bool Stale(const wire::Verdict& v) {
    const bool stale = v.ok() && ring_->peers_.epoch > 0 &&
                       (v.type == MsgType::RingData || v.type == MsgType::RingAbort) &&
                       v.header->epoch() < ring_->peers_.epoch;
    if (stale) ring_->stale_.fetch_add(1, std::memory_order_relaxed);
    return stale;
  }
  // Whether `in` (verdict `v`) comes from the left neighbour: its job rank,
  // over its route.
  bool FromLeft(const wire::Incoming& in, const wire::Verdict& v) const {
    return v.ok() && v.header->sender_role() == wire::Role::Worker &&
           v.header->sender_rank() == ring_->JobRank(left()) && ring_->FromLeft(in.from);
  }
  Status CheckData(const wire::Header& h, size_t elems);
  Status FromAbort(const wire::RingAbortBody& abort);
  struct Report {
    int origin = -1;
    uint64_t received = 0;
  };
  // After a timeout: gathers the other ranks' progress for abort_grace and
  // names the rank that stopped contributing.
  Status TimedOut(std::optional<Report> from_left = std::nullopt);
  std::string Blame(const std::vector<Report>& reports) const;
  void Refuse(const wire::Incoming& in, ErrorCode code, const std::string& detail, MsgType type);
  // A message that failed verification: counted, and answered unless it is
  // itself an Error.
  void RefuseInvalid(const wire::Incoming& in, const wire::Verdict& v) {
    if (v.ShouldAnswer()) {
      Refuse(in, v.code, v.detail, v.type);
    } else {
      ring_->rejected_.fetch_add(1, std::memory_order_relaxed);
      if (ring_->options_.rejected != nullptr) ring_->options_.rejected->Count(v.code);
    }
  }
  // Best effort: a RingAbort to the right neighbour.
  void SendAbort(wire::RingAbortFields fields);  // of this collective

  RingCollectives* const ring_;
  const RingOpKind kind_;
  const OpTag tag_;
  const DType dtype_;
  const uint64_t fingerprint_;
  const Deadline deadline_;
  std::shared_ptr<RingSendHolds> holds_;
  wire::PostedSends posted_;  // this operation's sends
  Status send_failure_;       // SendFailure's verdict, once there is one
  uint64_t sent_ = 0;
  uint64_t received_ = 0;
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_RING_OP_H_
