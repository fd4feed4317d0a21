#include "wire/validate.h"

#include <algorithm>
#include <optional>

#include "common/dtype.h"
#include "common/version.h"

namespace gradsync::wire {
namespace {

static_assert(static_cast<int>(DType::BF16) == static_cast<int>(gradsync::DType::kBF16) &&
                  static_cast<int>(DType::MAX) + 1 == gradsync::kNumDTypes,
              "wire::DType and gradsync::DType must agree");

template <typename E>
bool InRange(E value) {
  return value >= E::MIN && value <= E::MAX;
}

Verdict Reject(ErrorCode code, std::string detail, std::optional<MsgType> type = std::nullopt) {
  Verdict v;
  v.code = code;
  v.detail = std::move(detail);
  v.type_known = type.has_value();
  if (type) v.type = *type;
  return v;
}

bool StringOk(const flatbuffers::String* s, const Limits& limits) {
  return s == nullptr || s->size() <= limits.max_string_bytes;
}

Verdict CheckLayout(const LayoutBody& b, const Limits& limits, MsgType t) {
  const uint64_t n = b.tensors() ? b.tensors()->size() : 0;
  if (b.first() > b.total() || n > b.total() - b.first() || (n == 0 && b.total() != 0)) {
    return Reject(ErrorCode::Malformed,
                  "layout piece of " + std::to_string(n) + " tensors from #" +
                      std::to_string(b.first()) + " does not fit a layout of " +
                      std::to_string(b.total()),
                  t);
  }
  if (b.tensors() == nullptr) return Verdict();
  if (b.tensors()->size() > limits.max_tensors) {
    return Reject(ErrorCode::Oversized,
                  "layout lists " + std::to_string(b.tensors()->size()) + " tensors, at most " +
                      std::to_string(limits.max_tensors) + " allowed",
                  t);
  }
  for (const TensorSpec* spec : *b.tensors()) {
    if (spec == nullptr || spec->name() == nullptr) {
      return Reject(ErrorCode::Malformed, "layout entry without a name", t);
    }
    if (!StringOk(spec->name(), limits)) {
      return Reject(ErrorCode::Oversized, "tensor name too long", t);
    }
    if (!InRange(spec->dtype())) {
      return Reject(ErrorCode::BadEnum,
                    "dtype of tensor '" + spec->name()->str() + "' is out of range", t);
    }
  }
  return Verdict();
}

// Checks of a NodeAddress; a Verdict with code Unknown when it is fine.
Verdict CheckAddress(const NodeAddress* a, const Limits& limits, MsgType t) {
  if (a == nullptr) return Reject(ErrorCode::Malformed, "missing peer address", t);
  if (!InRange(a->role())) return Reject(ErrorCode::BadEnum, "peer role out of range", t);
  if (!StringOk(a->host(), limits)) return Reject(ErrorCode::Oversized, "peer host too long", t);
  if (!StringOk(a->identity(), limits) || !StringOk(a->boot_id(), limits) ||
      !StringOk(a->public_key(), limits)) {
    return Reject(ErrorCode::Oversized, "peer identity, boot id or public key too long", t);
  }
  return Verdict();
}

// Body-specific checks of enums, counts and string lengths.
Verdict CheckBody(const Header& h, const Limits& limits) {
  const MsgType t = h.type();
  auto bad_enum = [t](const std::string& field) {
    return Reject(ErrorCode::BadEnum,
                  std::string(MsgTypeName(t)) + "." + field + " is out of range", t);
  };
  auto too_long = [t]() {
    return Reject(ErrorCode::Oversized,
                  std::string(MsgTypeName(t)) + " has a string longer than allowed", t);
  };
  switch (h.body_type()) {
    case Body::RegisterBody: {
      const auto* b = h.body_as_RegisterBody();
      if (!InRange(b->role()) || b->role() == Role::Scheduler) return bad_enum("role");
      if (b->requested_rank() < -1)
        return Reject(ErrorCode::BadSender, "negative requested rank", t);
      if (!StringOk(b->host(), limits) || !StringOk(b->build_id(), limits) ||
          !StringOk(b->identity(), limits) || !StringOk(b->boot_id(), limits) ||
          !StringOk(b->public_key(), limits) || !StringOk(b->pid_ns(), limits)) {
        return too_long();
      }
      break;
    }
    case Body::RankAssignmentBody: {
      const auto* b = h.body_as_RankAssignmentBody();
      if (b->peers() && b->peers()->size() > limits.max_peers) {
        return Reject(ErrorCode::Oversized,
                      "peer list of " + std::to_string(b->peers()->size()) + " entries", t);
      }
      if (b->peers()) {
        for (const NodeAddress* a : *b->peers()) {
          Verdict bad = CheckAddress(a, limits, t);
          if (bad.code != ErrorCode::Unknown) return bad;
        }
      }
      break;
    }
    case Body::BarrierBody:
      if (!InRange(h.body_as_BarrierBody()->group())) return bad_enum("group");
      break;
    case Body::ErrorBody: {
      const auto* b = h.body_as_ErrorBody();
      if (!InRange(b->code())) return bad_enum("code");
      if (!InRange(b->in_reply_to())) return bad_enum("in_reply_to");
      if (!StringOk(b->message(), limits)) return too_long();
      break;
    }
    case Body::NodeDeadBody:
      if (!InRange(h.body_as_NodeDeadBody()->role())) return bad_enum("role");
      if (!InRange(h.body_as_NodeDeadBody()->failure())) return bad_enum("failure");
      if (!StringOk(h.body_as_NodeDeadBody()->reason(), limits)) return too_long();
      break;
    case Body::LeaveBody:
      if (!InRange(h.body_as_LeaveBody()->failure())) return bad_enum("failure");
      if (!StringOk(h.body_as_LeaveBody()->reason(), limits)) return too_long();
      break;
    case Body::ReachReportBody: {
      const auto* rs = h.body_as_ReachReportBody()->results();
      if (rs && rs->size() > limits.max_peers)
        return Reject(ErrorCode::Oversized, "reach report too long", t);
      if (rs) {
        for (const ReachResult* r : *rs) {
          Verdict bad = CheckAddress(r->peer(), limits, t);
          if (bad.code != ErrorCode::Unknown) return bad;
          if (!StringOk(r->detail(), limits)) return too_long();
        }
      }
      break;
    }
    case Body::JobStateBody:
      if (!InRange(h.body_as_JobStateBody()->phase())) return bad_enum("phase");
      if (!StringOk(h.body_as_JobStateBody()->message(), limits)) return too_long();
      break;
    case Body::NcclIdBody: {
      const auto* id = h.body_as_NcclIdBody()->id();
      size_t n = id ? id->size() : 0;
      size_t want = t == MsgType::NcclIdRequest ? 0 : kNcclIdBytes;
      if (n != want) {
        return Reject(ErrorCode::SizeMismatch,
                      std::string(MsgTypeName(t)) + " carries " + std::to_string(n) +
                          " id bytes, expected " + std::to_string(want),
                      t);
      }
      break;
    }
    case Body::GatherBody: {
      const auto* b = h.body_as_GatherBody();
      auto part_ok = [](const flatbuffers::Vector<uint16_t>* ports,
                        const flatbuffers::Vector<uint8_t>* data) {
        return (ports == nullptr || ports->size() <= kMaxGatherPorts) &&
               (data == nullptr || data->size() <= kMaxGatherBytes);
      };
      if (!part_ok(b->ports(), b->data())) {
        return Reject(ErrorCode::Oversized,
                      "a gather part of more than " + std::to_string(kMaxGatherPorts) +
                          " ports or " + std::to_string(kMaxGatherBytes) + " bytes",
                      t);
      }
      const size_t parts = b->parts() ? b->parts()->size() : 0;
      const bool request = t == MsgType::Gather;
      if ((request && parts != 0) || (!request && ((b->ports() && b->ports()->size() != 0) ||
                                                   (b->data() && b->data()->size() != 0)))) {
        return Reject(ErrorCode::Malformed,
                      request ? "a Gather carries no parts" : "a Gathered carries parts only", t);
      }
      if (parts > limits.max_peers) {
        return Reject(ErrorCode::Oversized, "gather of " + std::to_string(parts) + " parts", t);
      }
      if (b->parts()) {
        for (const GatherPart* p : *b->parts()) {
          if (!part_ok(p->ports(), p->data())) {
            return Reject(ErrorCode::Oversized, "a gathered part is too large", t);
          }
        }
      }
      break;
    }
    case Body::DataBody:
      if (!InRange(h.body_as_DataBody()->dtype())) return bad_enum("dtype");
      if (!StringOk(h.body_as_DataBody()->codec(), limits)) return too_long();
      break;
    case Body::RingDataBody:
      if (!InRange(h.body_as_RingDataBody()->dtype())) return bad_enum("dtype");
      break;
    case Body::RingAbortBody: {
      const auto* b = h.body_as_RingAbortBody();
      if (!InRange(b->code())) return bad_enum("code");
      if (!StringOk(b->message(), limits)) return too_long();
      break;
    }
    case Body::LayoutBody:
      return CheckLayout(*h.body_as_LayoutBody(), limits, t);
    default:
      break;
  }
  return Verdict();
}

// `bytes` (the payload frames' total) against the `wire_bytes` a header
// states and, for uncompressed data (`elements` set), against `elements` of
// `dtype`.
Verdict CheckSizes(const std::string& name, uint64_t wire_bytes, std::optional<uint64_t> elements,
                   DType dtype, uint64_t bytes, const Limits& limits, MsgType t) {
  if (wire_bytes != bytes) {
    return Reject(ErrorCode::SizeMismatch,
                  name + " says wire_bytes=" + std::to_string(wire_bytes) +
                      " but its payload frames hold " + std::to_string(bytes) + " bytes",
                  t);
  }
  if (!elements) return Verdict();
  // wire::DType and gradsync::DType share their values (common/dtype.h).
  const uint64_t size = DTypeSize(static_cast<gradsync::DType>(dtype));
  const bool too_many = *elements > limits.max_payload_bytes / size;
  if (too_many || *elements * size != bytes) {
    // Past the limit the product may wrap: do not print it.
    const std::string needs = too_many ? "more than " + std::to_string(limits.max_payload_bytes)
                                       : std::to_string(*elements * size);
    return Reject(ErrorCode::SizeMismatch,
                  name + " of " + std::to_string(*elements) + " " + EnumNameDType(dtype) +
                      " elements needs " + needs + " bytes, payload holds " + std::to_string(bytes),
                  t);
  }
  return Verdict();
}

// An embedding message's frames against its ids and rows: a pull the ids
// (8 bytes each), a push the ids and their rows (4 bytes an element), rows
// the rows, an ack nothing. Every product is checked against the limit
// before it is formed.
Verdict CheckEmbeddingPayload(const EmbeddingBody& b, const Message& msg, const Limits& limits,
                              MsgType t) {
  const std::string name = MsgTypeName(t);
  const uint64_t max = limits.max_payload_bytes;
  const uint64_t ids = b.num_ids();
  const uint64_t dim = b.dim();
  if (b.wire_bytes() != msg.PayloadBytes()) {
    return Reject(ErrorCode::SizeMismatch,
                  name + " says wire_bytes=" + std::to_string(b.wire_bytes()) +
                      " but its payload frames hold " + std::to_string(msg.PayloadBytes()) +
                      " bytes",
                  t);
  }
  if (ids > max / 8 || (dim > 0 && ids > max / 4 / dim)) {
    return Reject(ErrorCode::Oversized,
                  name + " of " + std::to_string(ids) + " ids of " + std::to_string(dim) +
                      " elements exceeds the payload limit of " + std::to_string(max) + " bytes",
                  t);
  }
  std::vector<uint64_t> want;
  if (t == MsgType::EmbeddingPull) want = {ids * 8};
  if (t == MsgType::EmbeddingPush) want = {ids * 8, ids * dim * 4};
  if (t == MsgType::EmbeddingRows) want = {ids * dim * 4};
  if ((t == MsgType::EmbeddingPush || t == MsgType::EmbeddingRows) && dim == 0) {
    return Reject(ErrorCode::SizeMismatch, name + " of rows of 0 elements", t);
  }
  bool same = msg.payloads.size() == want.size();
  for (size_t i = 0; same && i < want.size(); ++i) same = msg.payloads[i].size == want[i];
  if (!same) {
    std::string sizes;
    for (const Payload& p : msg.payloads)
      sizes += (sizes.empty() ? "" : ", ") + std::to_string(p.size);
    std::string expected;
    for (uint64_t w : want) expected += (expected.empty() ? "" : ", ") + std::to_string(w);
    return Reject(ErrorCode::SizeMismatch,
                  name + " of " + std::to_string(ids) + " ids of " + std::to_string(dim) +
                      " elements needs frames of [" + expected + "] bytes, got [" + sizes + "]",
                  t);
  }
  return Verdict();
}

// Payload frames against what the header says they hold.
Verdict CheckPayload(const Header& h, const Message& msg, const Limits& limits) {
  const MsgType t = h.type();
  const std::string name = MsgTypeName(t);
  const size_t frames = msg.payloads.size();
  const uint64_t bytes = msg.PayloadBytes();
  if (frames > limits.max_payload_frames) {
    return Reject(ErrorCode::Oversized,
                  name + " has " + std::to_string(frames) + " payload frames, at most " +
                      std::to_string(limits.max_payload_frames) + " allowed",
                  t);
  }
  if (bytes > limits.max_payload_bytes) {
    return Reject(ErrorCode::Oversized,
                  name + " payload of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                      std::to_string(limits.max_payload_bytes),
                  t);
  }
  if (h.body_type() == Body::EmbeddingBody) {
    return CheckEmbeddingPayload(*h.body_as_EmbeddingBody(), msg, limits, t);
  }
  const bool carries = t == MsgType::Push || t == MsgType::Reply || t == MsgType::RingData;
  if (!carries) {
    if (frames != 0) {
      return Reject(
          ErrorCode::SizeMismatch,
          name + " carries " + std::to_string(frames) + " payload frame(s), expected none", t);
    }
    return Verdict();
  }
  if (t == MsgType::RingData) {
    const auto* d = h.body_as_RingDataBody();
    return CheckSizes(name, d->wire_bytes(), d->num_elements(), d->dtype(), bytes, limits, t);
  }
  const auto* d = h.body_as_DataBody();
  // What a codec writes its decoder checks (compression/wire_codec.h).
  const bool compressed = d->codec() != nullptr && d->codec()->size() > 0;
  return CheckSizes(name, d->wire_bytes(),
                    compressed ? std::nullopt : std::optional(d->num_elements()), d->dtype(), bytes,
                    limits, t);
}

// The type and protocol version of a header frame, read alone: their slots
// are the same in every version, so that a peer of another version, whose
// body tables this schema may not verify, is told why it is refused.
struct Preamble {
  MsgType type;
  uint32_t protocol_version;
};

// nullopt when the frame does not hold a readable version.
std::optional<Preamble> PeekPreamble(const uint8_t* data, size_t size) {
  using flatbuffers::uoffset_t;
  if (size < sizeof(uoffset_t)) return std::nullopt;
  const uoffset_t root = flatbuffers::ReadScalar<uoffset_t>(data);
  if (root == 0 || root > size - sizeof(uoffset_t)) return std::nullopt;
  flatbuffers::Verifier verifier(data, size, /*max_depth=*/1, /*max_tables=*/1);
  const auto* table = reinterpret_cast<const flatbuffers::Table*>(data + root);
  if (!table->VerifyTableStart(verifier) ||
      !table->VerifyField<uint8_t>(verifier, Header::VT_TYPE, 1) ||
      !table->VerifyField<uint32_t>(verifier, Header::VT_PROTOCOL_VERSION, 4)) {
    return std::nullopt;
  }
  return Preamble{static_cast<MsgType>(table->GetField<uint8_t>(Header::VT_TYPE, 0)),
                  table->GetField<uint32_t>(Header::VT_PROTOCOL_VERSION, 0)};
}

}  // namespace

Policy Policy::Accepting(std::initializer_list<MsgType> types) {
  Policy p;
  for (MsgType t : types) p.accepted.set(static_cast<size_t>(t));
  return p;
}

Verdict Validate(const Message& msg, const Policy& policy) {
  const Limits& limits = policy.limits;
  const size_t size = msg.header.size();
  if (size == 0) return Reject(ErrorCode::Malformed, "empty header frame");
  if (size > limits.max_header_bytes) {
    return Reject(ErrorCode::Oversized, "header frame of " + std::to_string(size) +
                                            " bytes exceeds the limit of " +
                                            std::to_string(limits.max_header_bytes));
  }
  const std::optional<Preamble> preamble = PeekPreamble(msg.header.data(), size);
  if (preamble && preamble->protocol_version != kProtocolVersion) {
    return Reject(ErrorCode::WrongVersion,
                  "peer speaks protocol version " + std::to_string(preamble->protocol_version) +
                      ", this node speaks " + std::to_string(kProtocolVersion),
                  InRange(preamble->type) ? std::optional(preamble->type) : std::nullopt);
  }
  flatbuffers::Verifier verifier(
      msg.header.data(), size, /*max_depth=*/8,
      /*max_tables=*/std::max(limits.max_peers * 2, limits.max_tensors) + 64);
  if (!VerifyHeaderBuffer(verifier)) {
    return Reject(ErrorCode::Malformed, "header frame of " + std::to_string(size) +
                                            " bytes is not a valid gradsync header");
  }
  const Header* h = GetHeader(msg.header.data());
  if (!InRange(h->type())) {
    return Reject(
        ErrorCode::BadEnum,
        "message type " + std::to_string(static_cast<int>(h->type())) + " is out of range");
  }
  const MsgType t = h->type();
  if (h->body() == nullptr || h->body_type() != ExpectedBody(t)) {
    return Reject(ErrorCode::WrongType,
                  std::string(MsgTypeName(t)) + " must carry a " + EnumNameBody(ExpectedBody(t)) +
                      ", found " +
                      (InRange(h->body_type()) ? EnumNameBody(h->body_type()) : "an unknown body"),
                  t);
  }
  if (!policy.accepted.test(static_cast<size_t>(t))) {
    return Reject(ErrorCode::WrongType,
                  std::string(MsgTypeName(t)) + " is not accepted by this endpoint", t);
  }
  if (!InRange(h->sender_role()))
    return Reject(ErrorCode::BadEnum, "sender_role is out of range", t);
  if (h->sender_rank() < -1 || h->sender_rank() >= static_cast<int32_t>(limits.max_peers)) {
    return Reject(ErrorCode::BadSender,
                  "sender rank " + std::to_string(h->sender_rank()) + " is impossible", t);
  }
  // Registrations, and heartbeats sent while waiting for the assignment,
  // carry job id 0.
  const bool before_job = t == MsgType::Register || (t == MsgType::Heartbeat && h->job_id() == 0);
  if (policy.job_id != 0 && !before_job && h->job_id() != policy.job_id) {
    // This job's id is not named: the sender may not be a member.
    return Reject(ErrorCode::WrongJob,
                  "message of job " + std::to_string(h->job_id()) + ", not of this job", t);
  }
  Verdict body = CheckBody(*h, limits);
  if (body.code != ErrorCode::Unknown) return body;
  Verdict payload = CheckPayload(*h, msg, limits);
  if (payload.code != ErrorCode::Unknown) return payload;
  Verdict ok;
  ok.header = h;
  ok.type = t;
  ok.type_known = true;
  return ok;
}

}  // namespace gradsync::wire
