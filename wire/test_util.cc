#include "wire/test_util.h"

#include <sstream>

#include "common/version.h"

namespace gradsync::wire {
namespace {

NodeInfo Node(Role role, int32_t rank) {
  NodeInfo n;
  n.role = role;
  n.rank = rank;
  n.host = "10.0.0." + std::to_string(rank + 1);
  n.data_port = static_cast<uint16_t>(5000 + rank);
  n.metrics_port = static_cast<uint16_t>(9000 + rank);
  return n;
}

std::vector<uint8_t> IdBytes(size_t n) {
  std::vector<uint8_t> id(n);
  for (size_t i = 0; i < n; ++i) id[i] = static_cast<uint8_t>(i * 7 + 1);
  return id;
}

std::vector<Payload> SamplePayloads() {
  const float a[4] = {1.5f, -2.0f, 3.25f, 0.0f};
  const float b[2] = {7.0f, -8.5f};
  std::vector<Payload> payloads;
  payloads.push_back(Payload::Copy(a, sizeof(a)));
  payloads.push_back(Payload::Copy(b, sizeof(b)));
  return payloads;
}

Message SampleData(MsgType type) {
  DataFields f;
  f.bucket = 5;
  f.partition = 2;
  f.dtype = DType::F32;
  f.num_elements = 6;
  f.names_hash = 0xfeedfacecafebeefULL;
  f.round = 11;
  const bool request = type == MsgType::Push || type == MsgType::Pull;
  (request ? f.base_version : f.key_version) = 12;
  std::vector<Payload> payloads;
  if (type == MsgType::Push || type == MsgType::Reply) payloads = SamplePayloads();
  return MakeData(TestSender(), type, f, std::move(payloads), /*step=*/9, /*seq=*/10,
                  /*epoch=*/1);
}

// A push of 2 ids of 3 elements, a pull of them, their rows, an ack.
Message SampleEmbedding(MsgType type) {
  EmbeddingFields f;
  f.table = 7;
  f.dim = 3;
  f.num_ids = type == MsgType::EmbeddingAck ? 0 : 2;
  f.round = 11;
  std::vector<Payload> payloads;
  const uint64_t ids[2] = {5, uint64_t{1} << 40};
  const float rows[6] = {1.0f, -2.0f, 0.5f, 0.25f, 3.0f, -1.0f};
  if (type == MsgType::EmbeddingPull || type == MsgType::EmbeddingPush) {
    payloads.push_back(Payload::Copy(ids, sizeof(ids)));
  }
  if (type == MsgType::EmbeddingPush || type == MsgType::EmbeddingRows) {
    payloads.push_back(Payload::Copy(rows, sizeof(rows)));
  }
  return MakeEmbedding(TestSender(), type, f, std::move(payloads), /*seq=*/10, /*epoch=*/1);
}

Message SampleRingData() {
  RingDataFields f;
  f.bucket = 5;
  f.collective = 10;
  f.index = 2;
  f.dtype = DType::F32;
  f.num_elements = 6;
  f.names_hash = 0xfeedfacecafebeefULL;
  f.op_fingerprint = 0x0123456789abcdefULL;
  return MakeRingData(TestSender(), f, SamplePayloads(), /*step=*/9, /*epoch=*/1);
}

void DumpAddress(std::ostream& os, const NodeAddress* a) {
  if (a == nullptr) {
    os << "{null}";
    return;
  }
  os << "{role=" << static_cast<int>(a->role()) << " rank=" << a->rank()
     << " host=" << (a->host() ? a->host()->str() : "<null>") << " data_port=" << a->data_port()
     << " metrics_port=" << a->metrics_port() << "}";
}

std::string Str(const flatbuffers::String* s) { return s ? s->str() : "<null>"; }

void DumpBody(std::ostream& os, const Header& h) {
  switch (h.body_type()) {
    case Body::RegisterBody: {
      const auto* b = h.body_as_RegisterBody();
      os << "role=" << static_cast<int>(b->role()) << " requested_rank=" << b->requested_rank()
         << " build_id=" << Str(b->build_id()) << " host=" << Str(b->host())
         << " data_port=" << b->data_port() << " metrics_port=" << b->metrics_port()
         << " pid=" << b->pid() << " num_workers=" << b->num_workers()
         << " num_servers=" << b->num_servers();
      break;
    }
    case Body::RankAssignmentBody: {
      const auto* b = h.body_as_RankAssignmentBody();
      os << "rank=" << b->rank() << " num_workers=" << b->num_workers()
         << " num_servers=" << b->num_servers() << " peers=[";
      if (b->peers()) {
        for (const NodeAddress* a : *b->peers()) DumpAddress(os, a);
      }
      os << "] heartbeat_interval_ms=" << b->heartbeat_interval_ms()
         << " missed_heartbeats=" << b->missed_heartbeats();
      break;
    }
    case Body::HeartbeatBody:
      os << "heartbeat";
      break;
    case Body::LeaveBody:
      os << "reason=" << Str(h.body_as_LeaveBody()->reason());
      break;
    case Body::BarrierBody:
      os << "barrier_id=" << h.body_as_BarrierBody()->barrier_id()
         << " group=" << static_cast<int>(h.body_as_BarrierBody()->group());
      break;
    case Body::ErrorBody: {
      const auto* b = h.body_as_ErrorBody();
      os << "code=" << static_cast<int>(b->code()) << " message=" << Str(b->message())
         << " in_reply_to=" << static_cast<int>(b->in_reply_to());
      break;
    }
    case Body::NodeDeadBody: {
      const auto* b = h.body_as_NodeDeadBody();
      os << "role=" << static_cast<int>(b->role()) << " rank=" << b->rank()
         << " reason=" << Str(b->reason());
      break;
    }
    case Body::ReachReportBody: {
      os << "results=[";
      const auto* rs = h.body_as_ReachReportBody()->results();
      if (rs) {
        for (const ReachResult* r : *rs) {
          DumpAddress(os, r->peer());
          os << " ok=" << r->ok() << " detail=" << Str(r->detail()) << ";";
        }
      }
      os << "]";
      break;
    }
    case Body::JobStateBody:
      os << "phase=" << static_cast<int>(h.body_as_JobStateBody()->phase())
         << " message=" << Str(h.body_as_JobStateBody()->message());
      break;
    case Body::NcclIdBody: {
      const auto* id = h.body_as_NcclIdBody()->id();
      os << "id=[";
      if (id) {
        for (uint8_t byte : *id) os << static_cast<int>(byte) << ",";
      }
      os << "]";
      break;
    }
    case Body::DataBody: {
      const auto* b = h.body_as_DataBody();
      os << "bucket=" << b->bucket() << " partition=" << b->partition()
         << " dtype=" << static_cast<int>(b->dtype()) << " num_elements=" << b->num_elements()
         << " wire_bytes=" << b->wire_bytes() << " names_hash=" << b->names_hash()
         << " round=" << b->round() << " base_version=" << b->base_version()
         << " key_version=" << b->key_version() << " codec=" << Str(b->codec());
      break;
    }
    case Body::RingDataBody: {
      const auto* b = h.body_as_RingDataBody();
      os << "bucket=" << b->bucket() << " collective=" << b->collective() << " index=" << b->index()
         << " dtype=" << static_cast<int>(b->dtype()) << " num_elements=" << b->num_elements()
         << " wire_bytes=" << b->wire_bytes() << " names_hash=" << b->names_hash()
         << " op_fingerprint=" << b->op_fingerprint();
      break;
    }
    case Body::RingAbortBody: {
      const auto* b = h.body_as_RingAbortBody();
      os << "collective=" << b->collective() << " origin_rank=" << b->origin_rank()
         << " blamed_rank=" << b->blamed_rank() << " received=" << b->received()
         << " timed_out=" << b->timed_out() << " code=" << static_cast<int>(b->code())
         << " message=" << Str(b->message());
      break;
    }
    case Body::LayoutBody: {
      os << "tensors=[";
      const auto* ts = h.body_as_LayoutBody()->tensors();
      if (ts) {
        for (const TensorSpec* t : *ts) {
          os << "{" << Str(t->name()) << " " << t->num_elements() << " "
             << static_cast<int>(t->dtype()) << "}";
        }
      }
      os << "] first=" << h.body_as_LayoutBody()->first()
         << " total=" << h.body_as_LayoutBody()->total();
      break;
    }
    case Body::EmbeddingBody: {
      const EmbeddingBody* b = h.body_as_EmbeddingBody();
      os << "table=" << b->table() << " dim=" << b->dim() << " num_ids=" << b->num_ids()
         << " round=" << b->round() << " wire_bytes=" << b->wire_bytes() << " part=" << b->part()
         << " parts=" << b->parts();
      break;
    }
    case Body::GatherBody: {
      const GatherBody* b = h.body_as_GatherBody();
      os << "barrier_id=" << b->barrier_id() << " ports=" << (b->ports() ? b->ports()->size() : 0)
         << " data=" << (b->data() ? b->data()->size() : 0)
         << " parts=" << (b->parts() ? b->parts()->size() : 0);
      if (b->parts()) {
        for (const GatherPart* p : *b->parts()) {
          os << " [rank=" << p->rank() << " ports=" << (p->ports() ? p->ports()->size() : 0)
             << " data=" << (p->data() ? p->data()->size() : 0) << "]";
        }
      }
      break;
    }
    default:
      os << "body_type=" << static_cast<int>(h.body_type());
      break;
  }
}

}  // namespace

std::vector<MsgType> AllMsgTypes() {
  std::vector<MsgType> types;
  for (int t = 0; t < kNumMsgTypes; ++t) types.push_back(static_cast<MsgType>(t));
  return types;
}

Policy AcceptAllPolicy() {
  Policy p;
  p.accepted.set();
  return p;
}

Sender TestSender() {
  Sender s;
  s.role = Role::Worker;
  s.rank = 3;
  s.job_id = 42;
  return s;
}

Message SampleMessage(MsgType type) {
  const Sender from = TestSender();
  switch (type) {
    case MsgType::Register:
      return MakeRegister(from, Node(Role::Worker, 3), kBuildId, 4321, kProtocolVersion,
                          /*num_workers=*/4, /*num_servers=*/2);
    case MsgType::RankAssignment:
      return MakeRankAssignment(
          from, 3, 4, 2, {Node(Role::Worker, 0), Node(Role::Worker, 1), Node(Role::Server, 0)}, 500,
          6);
    case MsgType::Heartbeat:
      return MakeHeartbeat(from);
    case MsgType::Leave:
      return MakeLeave(from, "training finished");
    case MsgType::Barrier:
    case MsgType::BarrierRelease:
      return MakeBarrier(from, type, 17, Group::Workers, /*epoch=*/1);
    case MsgType::Error:
      return MakeError(from, ErrorCode::RankTaken, "rank 3 is taken", MsgType::Register);
    case MsgType::NodeDead:
      return MakeNodeDead(from, Node(Role::Server, 1), "missed 6 heartbeats");
    case MsgType::ReachReport:
      return MakeReachReport(from, {{Node(Role::Worker, 1), true, ""},
                                    {Node(Role::Server, 0), false, "connection refused"}});
    case MsgType::JobState:
      return MakeJobState(from, JobPhase::Failed, "server 1 died");
    case MsgType::NcclIdOffer:
    case MsgType::NcclId:
      return MakeNcclId(from, type, IdBytes(kNcclIdBytes));
    case MsgType::NcclIdRequest:
      return MakeNcclId(from, type, {});
    case MsgType::Push:
    case MsgType::Pull:
    case MsgType::Reply:
    case MsgType::Ack:
      return SampleData(type);
    case MsgType::RingData:
      return SampleRingData();
    case MsgType::RingAbort: {
      RingAbortFields f;
      f.collective = 10;
      f.origin_rank = 2;
      f.blamed_rank = 1;
      f.received = 7;
      f.timed_out = true;
      f.code = ErrorCode::Timeout;
      f.message = "rank 2 got nothing from rank 1 for 5 s";
      return MakeRingAbort(from, f, /*step=*/9, /*epoch=*/1);
    }
    case MsgType::Layout:
      return MakeLayout(from, {{"fc1.weight", 200704, DType::F32}, {"fc1.bias", 256, DType::BF16}},
                        0, 2);
    case MsgType::EmbeddingPull:
    case MsgType::EmbeddingPush:
    case MsgType::EmbeddingRows:
    case MsgType::EmbeddingAck:
      return SampleEmbedding(type);
    case MsgType::Gather:
      return MakeGather(from, 23, {-1, {40001, 40002}, {1, 2, 3}}, /*epoch=*/1);
    case MsgType::Gathered:
      return MakeGathered(from, 23, {{0, {40001}, {1}}, {1, {40003, 40004}, {}}}, /*epoch=*/1);
  }
  return MakeHeartbeat(from);
}

std::string DumpHeader(const Header& h) {
  std::ostringstream os;
  os << "type=" << static_cast<int>(h.type()) << " protocol_version=" << h.protocol_version()
     << " job_id=" << h.job_id() << " sender_role=" << static_cast<int>(h.sender_role())
     << " sender_rank=" << h.sender_rank() << " step=" << h.step() << " seq=" << h.seq()
     << " epoch=" << h.epoch() << " body_type=" << static_cast<int>(h.body_type()) << " ";
  DumpBody(os, h);
  return os.str();
}

}  // namespace gradsync::wire
