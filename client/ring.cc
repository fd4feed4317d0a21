#include "client/ring.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>

#include "client/elementwise.h"
#include "client/ring_plan.h"
#include "common/logging.h"
#include "wire/validate.h"

namespace gradsync::client {
namespace {

using wire::ErrorCode;
using wire::Message;
using wire::MsgType;

// Error replies to refused messages posted and not yet sent (or failed).
constexpr int kMaxRepliesInFlight = 64;

// Counts the sends that still point into each segment of the caller's
// buffer; a segment is overwritten only once its count is back to zero.
// Shared with the payload owners, which may outlive the operation.
class SendHolds {
 public:
  explicit SendHolds(int segments) : held_(static_cast<size_t>(segments), 0) {}

  std::shared_ptr<const void> Hold(const std::shared_ptr<SendHolds>& self, int seg) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++held_[static_cast<size_t>(seg)];
    }
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
    std::lock_guard<std::mutex> lock(mu_);
    --held_[static_cast<size_t>(seg)];
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> held_;
};

std::string DescribeData(const wire::Header& h) {
  const auto* d = h.body_as_RingDataBody();
  return "step " + std::to_string(h.step()) + " bucket " + std::to_string(d->bucket()) + " seq " +
         std::to_string(h.seq()) + " " + wire::EnumNameDType(d->dtype()) + " names-hash " +
         std::to_string(d->names_hash());
}

std::string SpecText(const std::string& name, uint64_t count, wire::DType dtype) {
  return "'" + wire::Escaped(name) + "' (" + std::to_string(count) + " x " +
         DTypeName(static_cast<DType>(dtype)) + ")";
}

// "" when tensor #i is the same on both sides (`theirs` null, or `i` past
// `mine`: that side has none); otherwise the difference, both sides named.
std::string CompareSpec(size_t i, const wire::TensorSpec* theirs,
                        const std::vector<wire::TensorSpecFields>& mine, int left, int me) {
  const wire::TensorSpecFields* own = i < mine.size() ? &mine[i] : nullptr;
  if (theirs != nullptr && own != nullptr && theirs->name()->str() == own->name &&
      theirs->num_elements() == own->num_elements && theirs->dtype() == own->dtype) {
    return "";
  }
  if (theirs == nullptr && own == nullptr) return "";
  const std::string none = " has no tensor #" + std::to_string(i);
  const std::string a =
      theirs ? " has " + SpecText(theirs->name()->str(), theirs->num_elements(), theirs->dtype())
             : none;
  const std::string b = own ? " has " + SpecText(own->name, own->num_elements, own->dtype) : none;
  return "first difference at tensor #" + std::to_string(i) + ": rank " + std::to_string(left) + a +
         ", rank " + std::to_string(me) + b;
}

}  // namespace

size_t RingFrameBytes(const RingOptions& options) {
  return std::max({options.chunk_bytes, options.small_bytes, wire::Limits{}.max_header_bytes});
}

// One collective in flight: numbered sends to the right, verified receives
// from the left, and the failure protocol.
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
        holds_(std::make_shared<SendHolds>(segments)) {}

  int rank() const { return ring_->peers_.rank; }
  int left() const { return RingIndex(rank() - 1, ring_->peers_.world_size); }

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
    send_failure_ =
        Fail(UnavailableError(Describe() + ": sending to rank " +
                              std::to_string(RingIndex(rank() + 1, ring_->peers_.world_size)) +
                              " failed: " + first.message()),
             ErrorCode::Unreachable, -1);
    return send_failure_;
  }

  // The next message of this operation from the left: a RingData of `elems`
  // elements (its single payload frame), or a Layout when `want` says so.
  StatusOr<Message> Receive(MsgType want, size_t elems);

  // Waits until no send points into `seg`, checking `health` meanwhile.
  Status WaitReleased(int seg) {
    for (;;) {
      const Deadline slice = deadline_.Min(Deadline::After(ring_->options_.poll_interval));
      if (holds_->WaitReleased(seg, slice)) return Status();
      GS_RETURN_IF_ERROR(SendFailure());
      GS_RETURN_IF_ERROR(CheckHealth());
      if (deadline_.Expired()) {
        return Fail(
            DeadlineExceededError(Describe() + ": rank " +
                                  std::to_string(RingIndex(rank() + 1, ring_->peers_.world_size)) +
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
    return Fail(UnavailableError(Describe() + " cannot finish: " + health.message()),
                ErrorCode::PeerDead, -1);
  }
  std::string Describe() const {
    const uint32_t epoch = ring_->peers_.epoch;
    return std::string(RingOpName(kind_)) + (epoch ? " epoch " + std::to_string(epoch) : "") +
           " step " + std::to_string(tag_.step & 0xFFFFFFFFu) + " bucket " +
           std::to_string(tag_.bucket) + " seq " + std::to_string(tag_.seq);
  }

 private:
  Status SendPayload(wire::Payload payload, size_t elems);
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
  // `tag` with the membership epoch in the upper 32 bits of its step.
  static OpTag InEpoch(OpTag tag, uint32_t epoch) {
    tag.step |= static_cast<uint64_t>(epoch) << 32;
    return tag;
  }
  // A RingData or RingAbort of an earlier membership epoch.
  bool Stale(const wire::Verdict& v) const {
    return v.ok() && ring_->peers_.epoch > 0 &&
           (v.type == MsgType::RingData || v.type == MsgType::RingAbort) &&
           (v.header->step() >> 32) < ring_->peers_.epoch;
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
  void SendAbort(const wire::RingAbortFields& fields);

  RingCollectives* const ring_;
  const RingOpKind kind_;
  const OpTag tag_;
  const DType dtype_;
  const uint64_t fingerprint_;
  const Deadline deadline_;
  std::shared_ptr<SendHolds> holds_;
  wire::PostedSends posted_;  // this operation's sends
  Status send_failure_;       // SendFailure's verdict, once there is one
  uint64_t sent_ = 0;
  uint64_t received_ = 0;
};

Status RingCollectives::Op::SendPayload(wire::Payload payload, size_t elems) {
  wire::RingDataFields f;
  f.bucket = tag_.bucket;
  f.index = sent_;
  f.dtype = static_cast<wire::DType>(dtype_);
  f.num_elements = elems;
  f.names_hash = tag_.names_hash;
  f.op_fingerprint = fingerprint_;
  std::vector<wire::Payload> payloads;
  payloads.push_back(std::move(payload));
  Message msg =
      wire::MakeRingData(ring_->peers_.sender, f, std::move(payloads), tag_.step, tag_.seq);
  return SendMessage(std::move(msg));
}

StatusOr<Message> RingCollectives::Op::Receive(MsgType want, size_t elems) {
  GS_RETURN_IF_ERROR(Begin());
  const Deadline soft = Deadline::At(deadline_.at() - ring_->options_.abort_grace);
  for (;;) {
    const Deadline poll = soft.Min(Deadline::After(ring_->options_.poll_interval));
    StatusOr<wire::Incoming> got = ring_->transport_->Receive(poll);
    if (!got.ok()) {
      if (got.status().code() != StatusCode::kDeadlineExceeded) return got.status();
      GS_RETURN_IF_ERROR(StillWaiting(soft));
      continue;
    }
    wire::Incoming in = std::move(*got);
    wire::Verdict v = wire::Validate(in.message, ring_->policy_);
    if (Stale(v)) {
      ring_->stale_.fetch_add(1, std::memory_order_relaxed);
      GS_RETURN_IF_ERROR(StillWaiting(soft));
      continue;
    }
    const bool from_left = v.ok() && v.header->sender_role() == wire::Role::Worker &&
                           v.header->sender_rank() == left() && ring_->FromLeft(in.from);
    if (!from_left || v.type != want) {
      GS_RETURN_IF_ERROR(HandleOther(in, v));
      GS_RETURN_IF_ERROR(StillWaiting(soft));
      continue;
    }
    if (want == MsgType::RingData) {
      // What the bytes are must match before the fingerprint is even read:
      // with this dtype, Validate has checked the payload size against
      // num_elements, and CheckData checks num_elements.
      const auto* d = v.header->body_as_RingDataBody();
      if (d->dtype() != static_cast<wire::DType>(dtype_) || in.message.payloads.size() != 1) {
        Refuse(in, ErrorCode::WrongType,
               std::string("a RingData of ") + RingOpName(kind_) + " carries one " +
                   DTypeName(dtype_) + " payload frame, not " +
                   std::to_string(in.message.payloads.size()) + " frame(s) of " +
                   wire::EnumNameDType(d->dtype()),
               v.type);
        GS_RETURN_IF_ERROR(StillWaiting(soft));
        continue;
      }
      GS_RETURN_IF_ERROR(CheckData(*v.header, elems));
    }
    ++received_;
    ring_->messages_received_.fetch_add(1, std::memory_order_relaxed);
    ring_->bytes_received_.fetch_add(in.message.PayloadBytes(), std::memory_order_relaxed);
    return std::move(in.message);
  }
}

void RingCollectives::Op::Refuse(const wire::Incoming& in, ErrorCode code,
                                 const std::string& detail, MsgType type) {
  ring_->rejected_.fetch_add(1, std::memory_order_relaxed);
  if (ring_->options_.rejected != nullptr) ring_->options_.rejected->Count(code);
  uint64_t left_out = 0;
  if (ring_->refusal_log_.Admit(in.from.ToString(), wire::ErrorCodeLabel(code), &left_out)) {
    GS_LOG(WARNING) << "rank " << rank() << " refused a message from " << in.from.ToString() << ": "
                    << wire::Escaped(detail) << LeftOutNote(left_out);
  }
  // Posted, never waited for: a peer that sends and never reads holds at
  // most kMaxRepliesInFlight answers, and the rest go unanswered.
  std::shared_ptr<std::atomic<int>> in_flight = ring_->replies_in_flight_;
  if (in_flight->fetch_add(1) >= kMaxRepliesInFlight) {
    in_flight->fetch_sub(1);
    ring_->replies_dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  ring_->transport_->Post(
      in.from,
      wire::MakeError(wire::AnswerAs(ring_->peers_.sender, ring_->IsMember(in.from)), code, detail,
                      type),
      Deadline::After(Millis(100)), [in_flight](const Status&) { in_flight->fetch_sub(1); });
}

Status RingCollectives::Op::HandleOther(const wire::Incoming& in, const wire::Verdict& v) {
  if (!v.ok()) {
    RefuseInvalid(in, v);
    return Status();
  }
  const wire::Header& h = *v.header;
  const bool from_right_conn = in.from.kind == wire::Route::Kind::kConnection;
  if (v.type == MsgType::Error && from_right_conn) {
    const auto* e = h.body_as_ErrorBody();
    return Fail(
        AbortedError(Describe() + ": rank " + std::to_string(h.sender_rank()) +
                     " refused this rank's message: " + (e->message() ? e->message()->str() : "")),
        e->code(), -1);
  }
  if (h.sender_role() != wire::Role::Worker || h.sender_rank() != left() || from_right_conn ||
      !ring_->FromLeft(in.from)) {
    Refuse(in, ErrorCode::BadSender,
           std::string(wire::RoleName(h.sender_role())) + " " + std::to_string(h.sender_rank()) +
               " over " + in.from.ToString() + " is not this worker's left neighbour (rank " +
               std::to_string(left()) + ")",
           v.type);
    return Status();
  }
  if (v.type == MsgType::RingAbort) return FromAbort(*h.body_as_RingAbortBody());
  // The left neighbour runs a different kind of operation.
  const std::string theirs = v.type == MsgType::Layout ? "a layout check" : "a collective";
  return Fail(AbortedError("ranks disagree: rank " + std::to_string(left()) + " sent " + theirs +
                           " (" + wire::MsgTypeName(v.type) + ") while rank " +
                           std::to_string(rank()) + " runs " + Describe()),
              ErrorCode::Mismatch, -1);
}

Status RingCollectives::Op::CheckData(const wire::Header& h, size_t elems) {
  const auto* d = h.body_as_RingDataBody();
  if (d->op_fingerprint() != fingerprint_) {
    std::string mine = "step " + std::to_string(tag_.step) + " bucket " +
                       std::to_string(tag_.bucket) + " seq " + std::to_string(tag_.seq) + " " +
                       DTypeName(dtype_) + " names-hash " + std::to_string(tag_.names_hash);
    std::string theirs = DescribeData(h);
    std::string why = mine == theirs ? " (same fields: the operation or its size differ)" : "";
    return Fail(
        AbortedError("ranks disagree on collective seq " + std::to_string(tag_.seq) + ": rank " +
                     std::to_string(left()) + " sent " + theirs + ", rank " +
                     std::to_string(rank()) + " runs " + RingOpName(kind_) + " " + mine + why),
        ErrorCode::Mismatch, -1);
  }
  if (d->index() != received_ || d->num_elements() != elems) {
    return Fail(
        AbortedError(Describe() + ": rank " + std::to_string(left()) + " sent message #" +
                     std::to_string(d->index()) + " of " + std::to_string(d->num_elements()) +
                     " elements, rank " + std::to_string(rank()) + " expected #" +
                     std::to_string(received_) + " of " + std::to_string(elems)),
        ErrorCode::Mismatch, -1);
  }
  return Status();
}

Status RingCollectives::Op::Fail(Status why, ErrorCode code, int blamed) {
  if (ring_->peers_.world_size > 1) {
    wire::RingAbortFields f;
    f.origin_rank = rank();
    f.blamed_rank = blamed;
    f.received = received_;
    f.code = code;
    f.message = why.message();
    SendAbort(f);
  }
  return why;
}

void RingCollectives::Op::SendAbort(const wire::RingAbortFields& fields) {
  ring_->transport_
      ->Send(wire::Route::Connection(ring_->right_),
             wire::MakeRingAbort(ring_->peers_.sender, fields, tag_.step, tag_.seq),
             Deadline::After(Millis(200)))
      .IgnoreError();
}

Status RingCollectives::Op::FromAbort(const wire::RingAbortBody& a) {
  const std::string msg = a.message() ? a.message()->str() : "";
  // Pass it on unless it has been all the way round.
  if (a.origin_rank() != rank()) {
    SendAbort({a.origin_rank(), a.blamed_rank(), a.received(), a.timed_out(), a.code(), msg});
  }
  if (a.timed_out()) return TimedOut(Report{a.origin_rank(), a.received()});
  if (a.code() == ErrorCode::Mismatch) {
    return kind_ == RingOpKind::kLayout ? FailedPreconditionError(msg) : AbortedError(msg);
  }
  if (a.code() == ErrorCode::Timeout) return DeadlineExceededError(msg);
  return UnavailableError(msg);
}

Status RingCollectives::Op::TimedOut(std::optional<Report> from_left) {
  std::vector<Report> reports{{rank(), received_}};
  wire::RingAbortFields mine;
  mine.origin_rank = rank();
  mine.received = received_;
  mine.timed_out = true;
  mine.code = ErrorCode::Timeout;
  mine.message = Describe() + " timed out";
  SendAbort(mine);
  if (from_left) reports.push_back(*from_left);
  const Deadline end = Deadline::After(ring_->options_.abort_grace).Min(deadline_);
  while (!end.Expired()) {
    StatusOr<wire::Incoming> got = ring_->transport_->Receive(end);
    if (!got.ok()) break;
    wire::Verdict v = wire::Validate(got->message, ring_->policy_);
    if (!v.ok()) {
      RefuseInvalid(*got, v);  // still a peer's bad message: answered and counted
      continue;
    }
    // Late data of this operation is dropped: every rank is failing it.
    if (v.type != MsgType::RingAbort || v.header->sender_rank() != left() ||
        !ring_->FromLeft(got->from)) {
      continue;
    }
    const auto* a = v.header->body_as_RingAbortBody();
    if (!a->timed_out()) return FromAbort(*a);
    if (a->origin_rank() == rank()) continue;
    SendAbort({a->origin_rank(), a->blamed_rank(), a->received(), true, a->code(),
               a->message() ? a->message()->str() : ""});
    reports.push_back(Report{a->origin_rank(), a->received()});
  }
  return DeadlineExceededError(Blame(reports));
}

// The rank that received least from its left neighbour (on a tie the one
// furthest upstream) waits on the rank that stopped contributing.
std::string RingCollectives::Op::Blame(const std::vector<Report>& reports) const {
  const int n = ring_->peers_.world_size;
  const Report* worst = &reports[0];
  for (const Report& r : reports) {
    const bool fewer = r.received < worst->received;
    const bool further = r.received == worst->received &&
                         RingIndex(rank() - r.origin, n) > RingIndex(rank() - worst->origin, n);
    if (fewer || further) worst = &r;
  }
  const int blamed = RingIndex(worst->origin - 1, n);
  return Describe() + ": rank " + std::to_string(blamed) + " stopped contributing; rank " +
         std::to_string(worst->origin) + " received " + std::to_string(worst->received) +
         " message(s) of this operation from it before the deadline";
}

RingCollectives::RingCollectives(wire::Transport* transport, const RingPeers& peers,
                                 const RingOptions& options, HealthCheck health)
    : transport_(transport), peers_(peers), options_(options), health_(std::move(health)) {
  policy_ = wire::Policy::Accepting(
      {MsgType::RingData, MsgType::RingAbort, MsgType::Layout, MsgType::Error});
  policy_.job_id = peers.sender.job_id;
}

RingCollectives::~RingCollectives() = default;

StatusOr<std::unique_ptr<RingCollectives>> RingCollectives::Create(wire::Transport* transport,
                                                                   const RingPeers& peers,
                                                                   const RingOptions& options,
                                                                   HealthCheck health) {
  if (peers.world_size < 1 || peers.rank < 0 || peers.rank >= peers.world_size) {
    return InvalidArgumentError("ring rank " + std::to_string(peers.rank) + " of " +
                                std::to_string(peers.world_size) + " is impossible");
  }
  if (options.chunk_bytes < 64) {
    return InvalidArgumentError("ring chunk_bytes must be at least 64, got " +
                                std::to_string(options.chunk_bytes));
  }
  std::unique_ptr<RingCollectives> ring(
      new RingCollectives(transport, peers, options, std::move(health)));
  if (peers.world_size > 1) {
    GS_ASSIGN_OR_RETURN(ring->right_, transport->Connect(peers.right_endpoint));
  }
  return ring;
}

RingStats RingCollectives::stats() const {
  RingStats s;
  s.messages_sent = messages_sent_.load();
  s.messages_received = messages_received_.load();
  s.bytes_sent = bytes_sent_.load();
  s.bytes_received = bytes_received_.load();
  s.stale = stale_.load();
  s.rejected = rejected_.load();
  s.replies_dropped = replies_dropped_.load();
  return s;
}

Status RingCollectives::Finish(Op& op, Status result) {
  if (result.ok()) result = op.WaitAllReleased();
  if (!result.ok()) broken_ = result;
  return result;
}

Status RingCollectives::AllReduce(void* data, size_t count, DType dtype, ReduceOp reduce,
                                  const OpTag& tag, Deadline deadline) {
  if (!broken_.ok()) return broken_;
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return InvalidArgumentError(std::string("allreduce supports f32, f16 and bf16, not ") +
                                DTypeName(dtype));
  }
  const int n = peers_.world_size;
  if (n == 1 || count == 0) return Status();
  Op op(this, RingOpKind::kAllReduce, tag, dtype, count, static_cast<uint64_t>(reduce), n,
        deadline);
  auto* base = static_cast<uint8_t*>(data);
  if (count * DTypeSize(dtype) <= options_.small_bytes) {
    return Finish(op, RunSmallAllReduce(op, base, count, dtype, reduce));
  }
  return Finish(op, RunAllReduce(op, base, count, dtype, reduce));
}

Status RingCollectives::RunSmallAllReduce(Op& op, uint8_t* base, size_t count, DType dtype,
                                          ReduceOp reduce) {
  const int n = peers_.world_size;
  const int r = peers_.rank;
  const size_t bytes = count * DTypeSize(dtype);
  // Every rank's buffer, by rank, in the ring's scratch space.
  // Grown, never shrunk: a smaller operation in between (a barrier, a
  // one-float all-reduce) does not make the next one fill it again.
  const size_t scratch = bytes * static_cast<size_t>(n);
  if (scratch_.size() < scratch) scratch_.resize(scratch);
  auto block = [&](int q) { return scratch_.data() + static_cast<size_t>(q) * bytes; };
  std::memcpy(block(r), base, bytes);
  Status s = [&]() -> Status {
    GS_RETURN_IF_ERROR(op.SendFromBuffer(block(r), count, 0));
    for (int step = 0; step + 1 < n; ++step) {
      GS_ASSIGN_OR_RETURN(Message msg, op.Receive(MsgType::RingData, count));
      std::memcpy(block(RingIndex(r - 1 - step, n)), msg.payloads[0].data, bytes);
      if (step + 2 < n) GS_RETURN_IF_ERROR(op.Forward(std::move(msg.payloads[0]), count));
    }
    return op.WaitAllReleased();
  }();
  if (!s.ok()) return s;
  std::memcpy(base, block(0), bytes);
  for (int q = 1; q < n; ++q) AddInto(base, block(q), count, dtype);
  if (reduce == ReduceOp::kAverage) DivideBy(base, count, dtype, n);
  return Status();
}

Status RingCollectives::RunAllReduce(Op& op, uint8_t* base, size_t count, DType dtype,
                                     ReduceOp reduce) {
  const int n = peers_.world_size;
  const int r = peers_.rank;
  const size_t es = DTypeSize(dtype);
  const size_t ce = std::max<size_t>(1, options_.chunk_bytes / es);
  const Span own = Segment(count, n, r);
  for (size_t j = 0; j < NumChunks(own, ce); ++j) {
    const Span c = Chunk(own, ce, j);
    GS_RETURN_IF_ERROR(op.SendFromBuffer(base + c.begin * es, c.size(), r));
  }
  // Reduce-scatter: at step s, segment r-s-1 arrives, is added to, and goes on.
  for (int s = 0; s + 1 < n; ++s) {
    const int seg = RingIndex(r - s - 1, n);
    const Span span = Segment(count, n, seg);
    for (size_t j = 0; j < NumChunks(span, ce); ++j) {
      const Span c = Chunk(span, ce, j);
      GS_ASSIGN_OR_RETURN(Message msg, op.Receive(MsgType::RingData, c.size()));
      uint8_t* dst = base + c.begin * es;
      AddInto(dst, msg.payloads[0].data, c.size(), dtype);
      if (s + 2 == n && reduce == ReduceOp::kAverage) DivideBy(dst, c.size(), dtype, n);
      GS_RETURN_IF_ERROR(op.SendFromBuffer(dst, c.size(), seg));
    }
  }
  // All-gather: at step s, the finished segment r-s arrives and is passed on.
  for (int s = 0; s + 1 < n; ++s) {
    const int seg = RingIndex(r - s, n);
    GS_RETURN_IF_ERROR(op.WaitReleased(seg));
    const Span span = Segment(count, n, seg);
    for (size_t j = 0; j < NumChunks(span, ce); ++j) {
      const Span c = Chunk(span, ce, j);
      GS_ASSIGN_OR_RETURN(Message msg, op.Receive(MsgType::RingData, c.size()));
      std::memcpy(base + c.begin * es, msg.payloads[0].data, c.size() * es);
      if (s + 2 < n) GS_RETURN_IF_ERROR(op.Forward(std::move(msg.payloads[0]), c.size()));
    }
  }
  return Status();
}

Status RingCollectives::AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                                  Deadline deadline) {
  if (!broken_.ok()) return broken_;
  const int n = peers_.world_size;
  const int r = peers_.rank;
  auto* base = static_cast<uint8_t*>(out);
  if (bytes > 0) std::memcpy(base + static_cast<size_t>(r) * bytes, in, bytes);
  if (n == 1 || bytes == 0) return Status();
  Op op(this, RingOpKind::kAllGather, tag, DType::kU8, bytes, 0, n, deadline);
  return Finish(op, RunAllGather(op, bytes, base));
}

// out[r * bytes, (r + 1) * bytes) already holds this rank's block.
Status RingCollectives::RunAllGather(Op& op, size_t bytes, uint8_t* base) {
  const int n = peers_.world_size;
  const int r = peers_.rank;
  const size_t ce = options_.chunk_bytes;
  const Span own{static_cast<size_t>(r) * bytes, static_cast<size_t>(r + 1) * bytes};
  for (size_t j = 0; j < NumChunks(own, ce); ++j) {
    const Span c = Chunk(own, ce, j);
    GS_RETURN_IF_ERROR(op.SendFromBuffer(base + c.begin, c.size(), 0));
  }
  for (int s = 0; s + 1 < n; ++s) {
    const size_t block = static_cast<size_t>(RingIndex(r - s - 1, n));
    const Span span{block * bytes, (block + 1) * bytes};
    for (size_t j = 0; j < NumChunks(span, ce); ++j) {
      const Span c = Chunk(span, ce, j);
      GS_ASSIGN_OR_RETURN(Message msg, op.Receive(MsgType::RingData, c.size()));
      std::memcpy(base + c.begin, msg.payloads[0].data, c.size());
      if (s + 2 < n) GS_RETURN_IF_ERROR(op.Forward(std::move(msg.payloads[0]), c.size()));
    }
  }
  return Status();
}

Status RingCollectives::Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                                  Deadline deadline) {
  if (!broken_.ok()) return broken_;
  const int n = peers_.world_size;
  if (root < 0 || root >= n) {
    return InvalidArgumentError("broadcast root " + std::to_string(root) + " is not a rank of " +
                                std::to_string(n));
  }
  if (n == 1 || bytes == 0) return Status();
  const int r = peers_.rank;
  auto* base = static_cast<uint8_t*>(data);
  Op op(this, RingOpKind::kBroadcast, tag, DType::kU8, bytes, static_cast<uint64_t>(root), 1,
        deadline);
  Status s = [&]() -> Status {
    const size_t ce = options_.chunk_bytes;
    const Span all{0, bytes};
    const bool forward = RingIndex(r + 1, n) != root;
    for (size_t j = 0; j < NumChunks(all, ce); ++j) {
      const Span c = Chunk(all, ce, j);
      if (r == root) {
        GS_RETURN_IF_ERROR(op.SendFromBuffer(base + c.begin, c.size(), 0));
        continue;
      }
      GS_ASSIGN_OR_RETURN(Message msg, op.Receive(MsgType::RingData, c.size()));
      std::memcpy(base + c.begin, msg.payloads[0].data, c.size());
      if (forward) GS_RETURN_IF_ERROR(op.Forward(std::move(msg.payloads[0]), c.size()));
    }
    return Status();
  }();
  return Finish(op, s);
}

StatusOr<std::string> RingCollectives::ReceiveLayoutDiff(
    Op& op, const std::vector<wire::TensorSpecFields>& mine) {
  uint64_t next = 0, total = 0;
  do {
    GS_ASSIGN_OR_RETURN(Message msg, op.Receive(MsgType::Layout, 0));
    // Validate has checked that the piece fits its total and is not empty
    // unless the layout is.
    const wire::LayoutBody* piece = msg.header_view()->body_as_LayoutBody();
    if (piece->first() != next || (next > 0 && piece->total() != total)) {
      return op.Fail(FailedPreconditionError(
                         op.Describe() + ": rank " + std::to_string(op.left()) +
                         " sent the layout piece from tensor #" + std::to_string(piece->first()) +
                         " of " + std::to_string(piece->total()) + ", rank " +
                         std::to_string(peers_.rank) + " expected #" + std::to_string(next) +
                         (next > 0 ? " of " + std::to_string(total) : "")),
                     ErrorCode::Mismatch, -1);
    }
    total = piece->total();
    const size_t n = piece->tensors() ? piece->tensors()->size() : 0;
    for (size_t k = 0; k < n; ++k) {
      const auto* theirs = piece->tensors()->Get(static_cast<flatbuffers::uoffset_t>(k));
      std::string diff = CompareSpec(next + k, theirs, mine, op.left(), peers_.rank);
      if (!diff.empty()) return diff;
    }
    next += n;
  } while (next < total);
  return CompareSpec(total, nullptr, mine, op.left(), peers_.rank);
}

Status RingCollectives::CheckLayout(const std::vector<wire::TensorSpecFields>& tensors,
                                    Deadline deadline) {
  if (!broken_.ok()) return broken_;
  const int n = peers_.world_size;
  if (n == 1) return Status();
  Op op(this, RingOpKind::kLayout, OpTag{}, DType::kU8, tensors.size(), 0, n, deadline);
  Status s = [&]() -> Status {
    // In pieces of bounded size, so that a large model's layout stays
    // within every transport's header limit.
    for (Message& piece : wire::MakeLayoutPieces(peers_.sender, tensors)) {
      GS_RETURN_IF_ERROR(op.SendMessage(std::move(piece)));
    }
    GS_ASSIGN_OR_RETURN(std::string diff, ReceiveLayoutDiff(op, tensors));
    if (diff.empty()) {
      // Every rank compared with its left neighbour; a one-byte all-gather
      // finishes only if all of them agreed (a rank that found a difference
      // sends its RingAbort round instead).
      scratch_.assign(static_cast<size_t>(n), 1);
      return RunAllGather(op, 1, scratch_.data());
    }
    return op.Fail(
        FailedPreconditionError("tensor layouts differ between rank " + std::to_string(op.left()) +
                                " and rank " + std::to_string(peers_.rank) + ": " + diff),
        ErrorCode::Mismatch, -1);
  }();
  return Finish(op, s);
}

}  // namespace gradsync::client
