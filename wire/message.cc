#include "wire/message.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "common/version.h"

namespace gradsync::wire {
namespace {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

Message Finish(FlatBufferBuilder& fbb, const Sender& from, MsgType type, Offset<void> body,
               uint64_t step = 0, uint64_t seq = 0, uint32_t epoch = 0,
               uint32_t protocol_version = kProtocolVersion) {
  HeaderBuilder hb(fbb);
  hb.add_job_id(from.job_id);
  hb.add_step(step);
  hb.add_seq(seq);
  hb.add_epoch(epoch);
  hb.add_body(body);
  hb.add_protocol_version(protocol_version);
  hb.add_sender_rank(from.rank);
  hb.add_type(type);
  hb.add_sender_role(from.role);
  hb.add_body_type(ExpectedBody(type));
  fbb.Finish(hb.Finish());
  Message msg;
  msg.header.assign(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  return msg;
}

Offset<NodeAddress> BuildAddress(FlatBufferBuilder& fbb, const NodeInfo& n) {
  return CreateNodeAddress(fbb, n.role, n.rank, fbb.CreateString(n.host), n.data_port,
                           n.metrics_port, fbb.CreateString(n.identity),
                           fbb.CreateString(n.boot_id), fbb.CreateString(n.public_key),
                           n.stream_port);
}

uint64_t TotalBytes(const std::vector<Payload>& payloads) {
  uint64_t total = 0;
  for (const Payload& p : payloads) total += p.size;
  return total;
}

}  // namespace

Payload Payload::Copy(const void* data, size_t size) {
  auto copy = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(data),
                                                     static_cast<const uint8_t*>(data) + size);
  return Payload{copy->data(), size, copy};
}

Payload Payload::Borrow(const void* data, size_t size, std::shared_ptr<const void> owner) {
  return Payload{static_cast<const uint8_t*>(data), size, std::move(owner)};
}

size_t Message::PayloadBytes() const {
  size_t total = 0;
  for (const Payload& p : payloads) total += p.size;
  return total;
}

std::string NodeInfo::Name() const {
  if (role == Role::Scheduler) return "scheduler";
  return std::string(RoleName(role)) + " " + std::to_string(rank);
}

std::string NodeInfo::DataEndpoint() const {
  return "tcp://" + host + ":" + std::to_string(data_port);
}

std::string NodeInfo::StreamEndpoint() const {
  return stream_port == 0 ? "" : "tcp://" + host + ":" + std::to_string(stream_port);
}

Body ExpectedBody(MsgType type) {
  switch (type) {
    case MsgType::Register:
      return Body::RegisterBody;
    case MsgType::RankAssignment:
      return Body::RankAssignmentBody;
    case MsgType::Heartbeat:
      return Body::HeartbeatBody;
    case MsgType::Leave:
      return Body::LeaveBody;
    case MsgType::Barrier:
    case MsgType::BarrierRelease:
      return Body::BarrierBody;
    case MsgType::Error:
      return Body::ErrorBody;
    case MsgType::NodeDead:
      return Body::NodeDeadBody;
    case MsgType::ReachReport:
      return Body::ReachReportBody;
    case MsgType::JobState:
      return Body::JobStateBody;
    case MsgType::NcclIdOffer:
    case MsgType::NcclIdRequest:
    case MsgType::NcclId:
      return Body::NcclIdBody;
    case MsgType::Gather:
    case MsgType::Gathered:
      return Body::GatherBody;
    case MsgType::Push:
    case MsgType::Pull:
    case MsgType::Reply:
    case MsgType::Ack:
      return Body::DataBody;
    case MsgType::RingData:
      return Body::RingDataBody;
    case MsgType::RingAbort:
      return Body::RingAbortBody;
    case MsgType::Layout:
      return Body::LayoutBody;
    case MsgType::EmbeddingPull:
    case MsgType::EmbeddingPush:
    case MsgType::EmbeddingRows:
    case MsgType::EmbeddingAck:
      return Body::EmbeddingBody;
  }
  return Body::NONE;
}

const char* MsgTypeName(MsgType type) {
  if (type < MsgType::MIN || type > MsgType::MAX) return "invalid";
  return EnumNameMsgType(type);
}

const char* RoleName(Role role) {
  switch (role) {
    case Role::Scheduler:
      return "scheduler";
    case Role::Worker:
      return "worker";
    case Role::Server:
      return "server";
  }
  return "invalid-role";
}

std::string ErrorCodeLabel(ErrorCode code) {
  if (code < ErrorCode::MIN || code > ErrorCode::MAX) return "invalid";
  std::string camel = EnumNameErrorCode(code), out;
  for (size_t i = 0; i < camel.size(); ++i) {
    if (i > 0 && std::isupper(static_cast<unsigned char>(camel[i]))) out += '_';
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(camel[i])));
  }
  return out;
}

Message MakeRegister(const Sender& from, const NodeInfo& me, const std::string& build_id,
                     uint32_t pid, uint32_t protocol_version, int32_t num_workers,
                     int32_t num_servers, const std::string& pid_ns, const std::string& key_proof) {
  FlatBufferBuilder fbb(256);
  auto proof =
      key_proof.empty()
          ? 0
          : fbb.CreateVector(reinterpret_cast<const uint8_t*>(key_proof.data()), key_proof.size());
  auto body = CreateRegisterBody(
      fbb, me.role, me.rank, fbb.CreateString(build_id), fbb.CreateString(me.host), me.data_port,
      me.metrics_port, pid, num_workers, num_servers, fbb.CreateString(me.identity),
      fbb.CreateString(me.boot_id), fbb.CreateString(me.public_key),
      pid_ns.empty() ? 0 : fbb.CreateString(pid_ns), me.stream_port, proof);
  return Finish(fbb, from, MsgType::Register, body.Union(), 0, 0, 0, protocol_version);
}

Message MakeRankAssignment(const Sender& from, int32_t rank, int32_t num_workers,
                           int32_t num_servers, const std::vector<NodeInfo>& peers,
                           uint32_t heartbeat_interval_ms, uint32_t missed_heartbeats) {
  return MakeRankAssignment(from, rank, num_workers, num_servers, peers, heartbeat_interval_ms,
                            missed_heartbeats, EpochFields{});
}

Message MakeRankAssignment(const Sender& from, int32_t rank, int32_t num_workers,
                           int32_t num_servers, const std::vector<NodeInfo>& peers,
                           uint32_t heartbeat_interval_ms, uint32_t missed_heartbeats,
                           const EpochFields& epoch) {
  FlatBufferBuilder fbb(256 + 64 * peers.size() + epoch.change.size());
  std::vector<Offset<NodeAddress>> addrs;
  addrs.reserve(peers.size());
  for (const NodeInfo& p : peers) addrs.push_back(BuildAddress(fbb, p));
  auto change = epoch.change.empty() ? 0 : fbb.CreateString(epoch.change);
  auto body = CreateRankAssignmentBody(fbb, rank, num_workers, num_servers, fbb.CreateVector(addrs),
                                       heartbeat_interval_ms, missed_heartbeats, epoch.epoch,
                                       change, epoch.elastic);
  return Finish(fbb, from, MsgType::RankAssignment, body.Union());
}

Message MakeHeartbeat(const Sender& from) {
  FlatBufferBuilder fbb(64);
  return Finish(fbb, from, MsgType::Heartbeat, CreateHeartbeatBody(fbb).Union());
}

Message MakeLeave(const Sender& from, const std::string& reason, bool departing,
                  ErrorCode failure) {
  FlatBufferBuilder fbb(128);
  auto body = CreateLeaveBody(fbb, fbb.CreateString(reason), departing, failure);
  return Finish(fbb, from, MsgType::Leave, body.Union());
}

Message MakeBarrier(const Sender& from, MsgType type, uint64_t barrier_id, Group group,
                    uint32_t epoch) {
  FlatBufferBuilder fbb(64);
  return Finish(fbb, from, type, CreateBarrierBody(fbb, barrier_id, group).Union(), 0, 0, epoch);
}

Sender AnswerAs(const Sender& self, bool member) {
  Sender s = self;
  if (!member) s.job_id = 0;
  return s;
}

Message MakeError(const Sender& from, ErrorCode code, const std::string& message,
                  MsgType in_reply_to, uint64_t seq) {
  FlatBufferBuilder fbb(128 + message.size());
  auto body = CreateErrorBody(fbb, code, fbb.CreateString(message), in_reply_to);
  return Finish(fbb, from, MsgType::Error, body.Union(), /*step=*/0, seq);
}

Message MakeNodeDead(const Sender& from, const NodeInfo& dead, const std::string& reason,
                     ErrorCode failure) {
  FlatBufferBuilder fbb(128);
  auto body = CreateNodeDeadBody(fbb, dead.role, dead.rank, fbb.CreateString(reason), failure);
  return Finish(fbb, from, MsgType::NodeDead, body.Union());
}

ErrorCode FailureCode(const Status& why) {
  switch (why.code()) {
    case StatusCode::kDeadlineExceeded:
      return ErrorCode::Timeout;
    case StatusCode::kAborted:
    case StatusCode::kFailedPrecondition:
      return ErrorCode::Mismatch;
    default:
      return ErrorCode::PeerDead;
  }
}

Status FailureStatus(ErrorCode code, const std::string& message) {
  switch (code) {
    case ErrorCode::Timeout:
      return DeadlineExceededError(message);
    case ErrorCode::Mismatch:
      return AbortedError(message);
    default:
      return UnavailableError(message);
  }
}

Message MakeReachReport(const Sender& from, const std::vector<ReachOutcome>& results) {
  FlatBufferBuilder fbb(256);
  std::vector<Offset<ReachResult>> rs;
  for (const ReachOutcome& r : results) {
    rs.push_back(
        CreateReachResult(fbb, BuildAddress(fbb, r.peer), r.ok, fbb.CreateString(r.detail)));
  }
  auto body = CreateReachReportBody(fbb, fbb.CreateVector(rs));
  return Finish(fbb, from, MsgType::ReachReport, body.Union());
}

Message MakeJobState(const Sender& from, JobPhase phase, const std::string& message) {
  FlatBufferBuilder fbb(128 + message.size());
  auto body = CreateJobStateBody(fbb, phase, fbb.CreateString(message));
  return Finish(fbb, from, MsgType::JobState, body.Union());
}

Message MakeGather(const Sender& from, uint64_t barrier_id, const GatherPartFields& part,
                   uint32_t epoch) {
  FlatBufferBuilder fbb(128 + part.data.size() + 2 * part.ports.size());
  auto ports = fbb.CreateVector(part.ports);
  auto data = fbb.CreateVector(part.data);
  auto body = CreateGatherBody(fbb, barrier_id, ports, data);
  return Finish(fbb, from, MsgType::Gather, body.Union(), 0, 0, epoch);
}

Message MakeGathered(const Sender& from, uint64_t barrier_id,
                     const std::vector<GatherPartFields>& parts, uint32_t epoch) {
  size_t bytes = 128;
  for (const GatherPartFields& p : parts) bytes += 32 + p.data.size() + 2 * p.ports.size();
  FlatBufferBuilder fbb(bytes);
  std::vector<flatbuffers::Offset<GatherPart>> made;
  made.reserve(parts.size());
  for (const GatherPartFields& p : parts) {
    auto ports = fbb.CreateVector(p.ports);
    auto data = fbb.CreateVector(p.data);
    made.push_back(CreateGatherPart(fbb, p.rank, ports, data));
  }
  auto list = fbb.CreateVector(made);
  auto body = CreateGatherBody(fbb, barrier_id, 0, 0, list);
  return Finish(fbb, from, MsgType::Gathered, body.Union(), 0, 0, epoch);
}

std::vector<GatherPartFields> ReadGathered(const GatherBody& body) {
  std::vector<GatherPartFields> out;
  if (body.parts() == nullptr) return out;
  out.reserve(body.parts()->size());
  for (const GatherPart* p : *body.parts()) {
    GatherPartFields f;
    f.rank = p->rank();
    if (p->ports()) f.ports.assign(p->ports()->begin(), p->ports()->end());
    if (p->data()) f.data.assign(p->data()->begin(), p->data()->end());
    out.push_back(std::move(f));
  }
  return out;
}

Message MakeNcclId(const Sender& from, MsgType type, const std::vector<uint8_t>& id) {
  FlatBufferBuilder fbb(256);
  auto body = CreateNcclIdBody(fbb, fbb.CreateVector(id));
  return Finish(fbb, from, type, body.Union());
}

Message MakeData(const Sender& from, MsgType type, const DataFields& f,
                 std::vector<Payload> payloads, uint64_t step, uint64_t seq, uint32_t epoch) {
  FlatBufferBuilder fbb(128);
  auto codec = f.codec.empty() ? 0 : fbb.CreateString(f.codec);
  auto body =
      CreateDataBody(fbb, f.bucket, f.partition, f.dtype, f.num_elements, TotalBytes(payloads),
                     f.names_hash, f.round, f.base_version, f.key_version, codec);
  Message msg = Finish(fbb, from, type, body.Union(), step, seq, epoch);
  msg.payloads = std::move(payloads);
  return msg;
}

Message MakeRingData(const Sender& from, const RingDataFields& f, std::vector<Payload> payloads,
                     uint64_t step, uint32_t epoch) {
  FlatBufferBuilder fbb(128);
  auto body = CreateRingDataBody(fbb, f.bucket, f.collective, f.index, f.dtype, f.num_elements,
                                 TotalBytes(payloads), f.names_hash, f.op_fingerprint);
  Message msg = Finish(fbb, from, MsgType::RingData, body.Union(), step, 0, epoch);
  msg.payloads = std::move(payloads);
  return msg;
}

Message MakeEmbedding(const Sender& from, MsgType type, const EmbeddingFields& f,
                      std::vector<Payload> payloads, uint64_t seq, uint32_t epoch) {
  FlatBufferBuilder fbb(96);
  auto body = CreateEmbeddingBody(fbb, f.table, f.dim, f.num_ids, f.round, TotalBytes(payloads),
                                  f.part, f.parts, f.partition);
  Message msg = Finish(fbb, from, type, body.Union(), 0, seq, epoch);
  msg.payloads = std::move(payloads);
  return msg;
}

Message MakeRingAbort(const Sender& from, const RingAbortFields& f, uint64_t step, uint32_t epoch) {
  FlatBufferBuilder fbb(256);
  auto message = fbb.CreateString(f.message);
  auto body = CreateRingAbortBody(fbb, f.collective, f.origin_rank, f.blamed_rank, f.received,
                                  f.timed_out, f.code, message);
  return Finish(fbb, from, MsgType::RingAbort, body.Union(), step, 0, epoch);
}

Message MakeLayout(const Sender& from, const std::vector<TensorSpecFields>& piece, uint64_t first,
                   uint64_t total) {
  FlatBufferBuilder fbb(1024);
  std::vector<Offset<TensorSpec>> specs;
  specs.reserve(piece.size());
  for (const TensorSpecFields& t : piece) {
    specs.push_back(CreateTensorSpec(fbb, fbb.CreateString(t.name), t.num_elements, t.dtype));
  }
  auto body = CreateLayoutBody(fbb, fbb.CreateVector(specs), first, total);
  return Finish(fbb, from, MsgType::Layout, body.Union());
}

std::vector<size_t> LayoutPieceStarts(const std::vector<TensorSpecFields>& tensors,
                                      size_t piece_bytes) {
  // A TensorSpec takes its name, its table, vtable offset, string length,
  // terminator, padding and vector slot: well under this many bytes more.
  constexpr size_t kPerTensor = 64;
  std::vector<size_t> starts{0};
  size_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t more = tensors[i].name.size() + kPerTensor;
    if (bytes > 0 && bytes + more > piece_bytes) {
      starts.push_back(i);
      bytes = 0;
    }
    bytes += more;
  }
  return starts;
}

std::vector<Message> MakeLayoutPieces(const Sender& from,
                                      const std::vector<TensorSpecFields>& tensors,
                                      size_t piece_bytes) {
  const std::vector<size_t> starts = LayoutPieceStarts(tensors, piece_bytes);
  std::vector<Message> pieces;
  for (size_t p = 0; p < starts.size(); ++p) {
    const size_t end = p + 1 < starts.size() ? starts[p + 1] : tensors.size();
    const std::vector<TensorSpecFields> piece(tensors.begin() + static_cast<ptrdiff_t>(starts[p]),
                                              tensors.begin() + static_cast<ptrdiff_t>(end));
    pieces.push_back(MakeLayout(from, piece, starts[p], tensors.size()));
  }
  return pieces;
}

namespace {

// A node's fields of a NodeAddress or a RegisterBody (they share their
// names), but its rank.
template <typename Table>
NodeInfo NodeFields(const Table& t) {
  auto text = [](const flatbuffers::String* s) { return s ? s->str() : std::string(); };
  NodeInfo n;
  n.role = t.role();
  n.host = text(t.host());
  n.data_port = t.data_port();
  n.metrics_port = t.metrics_port();
  n.identity = text(t.identity());
  n.boot_id = text(t.boot_id());
  n.public_key = text(t.public_key());
  n.stream_port = t.stream_port();
  return n;
}

}  // namespace

NodeInfo ToNodeInfo(const NodeAddress& a) {
  NodeInfo n = NodeFields(a);
  n.rank = a.rank();
  return n;
}

NodeInfo RegisteredNode(const RegisterBody& r) {
  NodeInfo n = NodeFields(r);
  n.rank = r.requested_rank();
  return n;
}

std::string PsClientIdentity(const std::string& data_identity, uint32_t epoch) {
  return data_identity + "/ps" + (epoch > 0 ? std::to_string(epoch) : "");
}

bool IsDataIdentity(const std::string& identity) {
  if (identity.empty() || identity.size() > 64) return false;
  for (const char c : identity) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

namespace {
constexpr char kLaneSuffix[] = "/lane";
constexpr char kPairSuffix[] = "/pair";
constexpr char kProbeSuffix[] = "/probe";

// The number after the last `suffix` in `identity` when it is one below
// `limit` (< 100) written without leading zeros; -1 otherwise.
int NumberAfter(const std::string& identity, const char* suffix, int limit) {
  const size_t at = identity.rfind(suffix);
  if (at == std::string::npos) return -1;
  const std::string number = identity.substr(at + std::strlen(suffix));
  if (number.empty() || number.size() > 2 || (number[0] == '0' && number.size() > 1) ||
      number.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  const int value = std::stoi(number);
  return value < limit ? value : -1;
}

}  // namespace

std::string LaneIdentity(const std::string& identity, int lane) {
  return identity + kLaneSuffix + std::to_string(lane);
}

int LaneOf(const std::string& identity) {
  return std::max(0, NumberAfter(identity, kLaneSuffix, kMaxLanes));
}

std::string PairIdentity(const std::string& identity, int level) {
  return identity + kPairSuffix + std::to_string(level);
}

std::string PairBase(const std::string& identity) {
  if (NumberAfter(identity, kPairSuffix, kMaxPairLevels) < 0) return identity;
  return identity.substr(0, identity.rfind(kPairSuffix));
}

std::string ProbeIdentity(const std::string& identity) { return identity + kProbeSuffix; }

std::string ProbeBase(const std::string& identity) {
  const size_t n = sizeof(kProbeSuffix) - 1;
  if (identity.size() <= n || identity.compare(identity.size() - n, n, kProbeSuffix) != 0) {
    return identity;
  }
  return identity.substr(0, identity.size() - n);
}

std::string LaneBase(const std::string& identity) {
  if (LaneOf(identity) == 0) return identity;
  return identity.substr(0, identity.rfind(kLaneSuffix));
}

std::string Escaped(const std::string& text, size_t max_bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t n = std::min(text.size(), max_bytes);
  out.reserve(n + 8);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  if (text.size() > n) out += "...";
  return out;
}

std::string Escaped(const flatbuffers::String* text, size_t max_bytes) {
  return text == nullptr ? std::string() : Escaped(text->str(), max_bytes);
}

}  // namespace gradsync::wire
