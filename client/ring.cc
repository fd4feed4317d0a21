#include "client/ring.h"

#include "client/elementwise.h"
#include "client/ring_op.h"
#include "common/logging.h"

namespace gradsync::client {
namespace {

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
StatusOr<std::unique_ptr<RingCollectives>> RingCollectives::Create(wire::Transport* transport,
                                                                   const RingPeers& peers,
                                                                   const RingOptions& options,
                                                                   HealthCheck health) {
  if (peers.world_size < 1 || peers.rank < 0 || peers.rank >= peers.world_size) {
    return InvalidArgumentError("ring rank " + std::to_string(peers.rank) + " of " +
                                std::to_string(peers.world_size) + " is impossible");
  }
  if (!peers.order.empty()) {
    std::vector<int> sorted = peers.order;
    std::sort(sorted.begin(), sorted.end());
    bool permutation = sorted.size() == static_cast<size_t>(peers.world_size);
    for (size_t i = 0; permutation && i < sorted.size(); ++i) {
      permutation = sorted[i] == static_cast<int>(i);
    }
    if (!permutation) {
      return InvalidArgumentError("ring order of " + std::to_string(peers.order.size()) +
                                  " ranks is not an order of the " +
                                  std::to_string(peers.world_size) + " ranks");
    }
  }
  if (!peers.job_ranks.empty() && peers.job_ranks.size() != static_cast<size_t>(peers.world_size)) {
    return InvalidArgumentError("a ring of " + std::to_string(peers.world_size) + " ranks with " +
                                std::to_string(peers.job_ranks.size()) + " job ranks");
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
  GS_RETURN_IF_ERROR(CheckReducible(dtype));
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

Status RingCollectives::AllReduceAround(void* data, size_t count, DType dtype, const OpTag& tag,
                                        Deadline deadline, const Between& between) {
  if (!broken_.ok()) return broken_;
  GS_RETURN_IF_ERROR(CheckReducible(dtype));
  auto* base = static_cast<uint8_t*>(data);
  if (peers_.world_size == 1 || count == 0) return between(base, count);
  Op op(this, RingOpKind::kAllReduce, tag, dtype, count, static_cast<uint64_t>(ReduceOp::kSum),
        peers_.world_size, deadline);
  return Finish(op, RunAllReduce(op, base, count, dtype, ReduceOp::kSum, &between));
}

void RingCollectives::Abandon(const OpTag& tag, const Status& why) {
  if (!broken_.ok()) return;
  broken_ = why;
  if (peers_.world_size == 1) return;
  // Only its abort is sent, which a neighbour takes whatever it runs.
  Op op(this, RingOpKind::kAllReduce, tag, DType::kU8, 0, 0, 1, Deadline::After(Millis(200)));
  op.Fail(why, wire::FailureCode(why), -1).IgnoreError();
}

Status RingCollectives::RunSmallAllReduce(Op& op, uint8_t* base, size_t count, DType dtype,
                                          ReduceOp reduce) {
  const int n = peers_.world_size;
  const int r = pos_;
  const size_t bytes = count * DTypeSize(dtype);
  // Every rank's buffer, by ring position, in the ring's scratch space.
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
                                     ReduceOp reduce, const Between* between) {
  const int n = peers_.world_size;
  const int r = pos_;  // segments go by ring position
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
      // With `between`, the finished part goes on only once it has run.
      if (s + 2 < n || between == nullptr) {
        GS_RETURN_IF_ERROR(op.SendFromBuffer(dst, c.size(), seg));
      }
    }
    if (s + 2 == n && between != nullptr) {
      Status inner = (*between)(base + span.begin * es, span.size());
      if (inner.code() == StatusCode::kMembershipChanged) return inner;
      if (!inner.ok()) return op.Fail(inner, wire::FailureCode(inner), -1);
      for (size_t j = 0; j < NumChunks(span, ce); ++j) {
        const Span c = Chunk(span, ce, j);
        GS_RETURN_IF_ERROR(op.SendFromBuffer(base + c.begin * es, c.size(), seg));
      }
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
  const int p = pos_;
  const size_t ce = options_.chunk_bytes;
  const Span own{static_cast<size_t>(r) * bytes, static_cast<size_t>(r + 1) * bytes};
  for (size_t j = 0; j < NumChunks(own, ce); ++j) {
    const Span c = Chunk(own, ce, j);
    GS_RETURN_IF_ERROR(op.SendFromBuffer(base + c.begin, c.size(), 0));
  }
  for (int s = 0; s + 1 < n; ++s) {
    const size_t block = static_cast<size_t>(RankAt(p - s - 1));
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
    const bool forward = RankAt(pos_ + 1) != root;
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
                         op.Describe() + ": rank " + op.Named(op.left()) +
                         " sent the layout piece from tensor #" + std::to_string(piece->first()) +
                         " of " + std::to_string(piece->total()) + ", rank " +
                         std::to_string(JobRank(peers_.rank)) + " expected #" +
                         std::to_string(next) + (next > 0 ? " of " + std::to_string(total) : "")),
                     ErrorCode::Mismatch, -1);
    }
    total = piece->total();
    const size_t n = piece->tensors() ? piece->tensors()->size() : 0;
    for (size_t k = 0; k < n; ++k) {
      const auto* theirs = piece->tensors()->Get(static_cast<flatbuffers::uoffset_t>(k));
      std::string diff =
          CompareSpec(next + k, theirs, mine, JobRank(op.left()), JobRank(peers_.rank));
      if (!diff.empty()) return diff;
    }
    next += n;
  } while (next < total);
  return CompareSpec(total, nullptr, mine, JobRank(op.left()), JobRank(peers_.rank));
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
        FailedPreconditionError("tensor layouts differ between rank " + op.Named(op.left()) +
                                " and rank " + std::to_string(JobRank(peers_.rank)) + ": " + diff),
        ErrorCode::Mismatch, -1);
  }();
  return Finish(op, s);
}

}  // namespace gradsync::client
