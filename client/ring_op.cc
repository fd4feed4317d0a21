// RingCollectives::Op: sending, receiving and checking one operation's
// messages, and failing it with the rank to blame.
#include "client/ring_op.h"

#include <algorithm>

#include "client/elementwise.h"
#include "common/logging.h"

namespace gradsync::client {
namespace {

std::string DescribeData(const wire::Header& h) {
  const auto* d = h.body_as_RingDataBody();
  return "step " + std::to_string(h.step()) + " bucket " + std::to_string(d->bucket()) + " seq " +
         std::to_string(d->collective()) + " " + wire::EnumNameDType(d->dtype()) + " names-hash " +
         std::to_string(d->names_hash());
}

}  // namespace

Status RingCollectives::Op::SendPayload(wire::Payload payload, size_t elems) {
  wire::RingDataFields f;
  f.bucket = tag_.bucket;
  f.collective = tag_.seq;
  f.index = sent_;
  f.dtype = static_cast<wire::DType>(dtype_);
  f.num_elements = elems;
  f.names_hash = tag_.names_hash;
  f.op_fingerprint = fingerprint_;
  std::vector<wire::Payload> payloads;
  payloads.push_back(std::move(payload));
  Message msg =
      wire::MakeRingData(ring_->peers_.sender, f, std::move(payloads), tag_.step, tag_.epoch);
  return SendMessage(std::move(msg));
}

StatusOr<wire::Incoming> RingCollectives::Op::Next(Deadline until) {
  if (ring_->held_) {
    wire::Incoming in = std::move(*ring_->held_);
    ring_->held_.reset();
    return in;
  }
  return ring_->transport_->Receive(until);
}

Status RingCollectives::Op::TransportFailure(const Status& why) {
  if (why.code() == StatusCode::kDeadlineExceeded) return Status();
  // Shut down (Cancelled): this worker is leaving, as the job learns.
  if (why.code() == StatusCode::kCancelled) return why;
  // The transport lost what a peer sent (a link or connection that broke its
  // framing): the neighbours hear of it now, not at their deadline.
  return Fail(why, wire::FailureCode(why), -1);
}

Status RingCollectives::Op::Peek() {
  if (ring_->held_) return Status();
  StatusOr<wire::Incoming> got = ring_->transport_->Receive(Deadline::After(Millis(0)));
  if (!got.ok()) return TransportFailure(got.status());
  wire::Verdict v = wire::Validate(got->message, ring_->policy_);
  if (Stale(v)) return Status();
  if (FromLeft(*got, v) && (v.type == MsgType::RingData || v.type == MsgType::Layout)) {
    ring_->held_ = std::move(*got);  // read again, and checked, by Receive
    return Status();
  }
  return HandleOther(*got, v);
}

StatusOr<Message> RingCollectives::Op::Receive(MsgType want, size_t elems) {
  GS_RETURN_IF_ERROR(Begin());
  const Deadline soft = Deadline::At(deadline_.at() - ring_->options_.abort_grace);
  for (;;) {
    const Deadline poll = soft.Min(Deadline::After(ring_->options_.poll_interval));
    StatusOr<wire::Incoming> got = Next(poll);
    if (!got.ok()) {
      GS_RETURN_IF_ERROR(TransportFailure(got.status()));
      GS_RETURN_IF_ERROR(StillWaiting(soft));
      continue;
    }
    wire::Incoming in = std::move(*got);
    wire::Verdict v = wire::Validate(in.message, ring_->policy_);
    if (Stale(v)) {
      GS_RETURN_IF_ERROR(StillWaiting(soft));
      continue;
    }
    if (!FromLeft(in, v) || v.type != want) {
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
    GS_LOG(WARNING) << "rank " << ring_->JobRank(rank()) << " refused a message from "
                    << in.from.ToString() << ": " << wire::Escaped(detail) << LeftOutNote(left_out);
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
  if (h.sender_role() != wire::Role::Worker || h.sender_rank() != ring_->JobRank(left()) ||
      from_right_conn || !ring_->FromLeft(in.from)) {
    Refuse(in, ErrorCode::BadSender,
           std::string(wire::RoleName(h.sender_role())) + " " + std::to_string(h.sender_rank()) +
               " over " + in.from.ToString() + " is not this worker's left neighbour (rank " +
               Named(left()) + ")",
           v.type);
    return Status();
  }
  if (v.type == MsgType::RingAbort) return FromAbort(*h.body_as_RingAbortBody());
  // The left neighbour runs a different kind of operation.
  const std::string theirs = v.type == MsgType::Layout ? "a layout check" : "a collective";
  return Fail(AbortedError("ranks disagree: rank " + Named(left()) + " sent " + theirs + " (" +
                           wire::MsgTypeName(v.type) + ") while rank " + Named(rank()) + " runs " +
                           Describe()),
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
    return Fail(AbortedError("ranks disagree on collective seq " + std::to_string(tag_.seq) +
                             ": rank " + Named(left()) + " sent " + theirs + ", rank " +
                             Named(rank()) + " runs " + RingOpName(kind_) + " " + mine + why),
                ErrorCode::Mismatch, -1);
  }
  if (d->index() != received_ || d->num_elements() != elems) {
    return Fail(
        AbortedError(Describe() + ": rank " + Named(left()) + " sent message #" +
                     std::to_string(d->index()) + " of " + std::to_string(d->num_elements()) +
                     " elements, rank " + Named(rank()) + " expected #" +
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

void RingCollectives::Op::SendAbort(wire::RingAbortFields fields) {
  fields.collective = tag_.seq;
  ring_->transport_
      ->Send(wire::Route::Connection(ring_->right_),
             wire::MakeRingAbort(ring_->peers_.sender, fields, tag_.step, tag_.epoch),
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
  if (a.code() == ErrorCode::Mismatch && kind_ == RingOpKind::kLayout) {
    return FailedPreconditionError(msg);
  }
  return wire::FailureStatus(a.code(), msg);
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
    if (v.type != MsgType::RingAbort || !FromLeft(*got, v)) continue;
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
    const int mine = ring_->pos_;
    const bool further =
        r.received == worst->received && RingIndex(mine - ring_->PosOf(r.origin), n) >
                                             RingIndex(mine - ring_->PosOf(worst->origin), n);
    if (fewer || further) worst = &r;
  }
  const int blamed = ring_->RankAt(ring_->PosOf(worst->origin) - 1);
  return Describe() + ": rank " + Named(blamed) + " stopped contributing; rank " +
         Named(worst->origin) + " received " + std::to_string(worst->received) +
         " message(s) of this operation from it before the deadline";
}

RingCollectives::RingCollectives(wire::Transport* transport, const RingPeers& peers,
                                 const RingOptions& options, HealthCheck health)
    : transport_(transport), peers_(peers), options_(options), health_(std::move(health)) {
  policy_ = wire::Policy::Accepting(
      {MsgType::RingData, MsgType::RingAbort, MsgType::Layout, MsgType::Error});
  policy_.job_id = peers.sender.job_id;
  rank_at_ = peers.order;
  if (rank_at_.empty()) {
    for (int r = 0; r < peers.world_size; ++r) rank_at_.push_back(r);
  }
  pos_ = PosOf(peers.rank);
}

RingCollectives::~RingCollectives() = default;

int RingCollectives::PosOf(int rank) const {
  return static_cast<int>(std::find(rank_at_.begin(), rank_at_.end(), rank) - rank_at_.begin());
}

}  // namespace gradsync::client
