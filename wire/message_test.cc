#include "wire/message.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/version.h"
#include "gtest/gtest.h"
#include "wire/test_util.h"
#include "wire/validate.h"

namespace gradsync::wire {
namespace {

Sender From(Role role, int32_t rank, uint64_t job_id) {
  Sender s;
  s.role = role;
  s.rank = rank;
  s.job_id = job_id;
  return s;
}

NodeInfo Node(Role role, int32_t rank, const std::string& host, uint16_t data_port,
              uint16_t metrics_port) {
  NodeInfo n;
  n.role = role;
  n.rank = rank;
  n.host = host;
  n.data_port = data_port;
  n.metrics_port = metrics_port;
  n.identity = "id-" + host;
  n.boot_id = "boot-" + host.substr(0, 1);
  n.stream_port = static_cast<uint16_t>(data_port == 0 ? 0 : data_port + 100);
  return n;
}

// Validates `msg` with a policy that accepts only `type` and returns the
// header; fails the test if it is refused.
const Header* Accepted(const Message& msg, MsgType type) {
  Verdict v = Validate(msg, Policy::Accepting({type}));
  EXPECT_TRUE(v.ok()) << v.detail;
  EXPECT_EQ(v.type, type);
  if (!v.ok()) return nullptr;
  EXPECT_EQ(v.header, msg.header_view());
  return v.header;
}

void ExpectCommon(const Header& h, MsgType type, const Sender& from, uint64_t step = 0,
                  uint64_t seq = 0) {
  EXPECT_EQ(h.type(), type);
  EXPECT_EQ(h.body_type(), ExpectedBody(type));
  EXPECT_EQ(h.protocol_version(), kProtocolVersion);
  EXPECT_EQ(h.job_id(), from.job_id);
  EXPECT_EQ(h.sender_role(), from.role);
  EXPECT_EQ(h.sender_rank(), from.rank);
  EXPECT_EQ(h.step(), step);
  EXPECT_EQ(h.seq(), seq);
}

void ExpectAddress(const NodeAddress* a, const NodeInfo& want) {
  ASSERT_NE(a, nullptr);
  NodeInfo got = ToNodeInfo(*a);
  EXPECT_EQ(got.role, want.role);
  EXPECT_EQ(got.rank, want.rank);
  EXPECT_EQ(got.host, want.host);
  EXPECT_EQ(got.data_port, want.data_port);
  EXPECT_EQ(got.metrics_port, want.metrics_port);
  EXPECT_EQ(got.identity, want.identity);
  EXPECT_EQ(got.boot_id, want.boot_id);
  EXPECT_EQ(got.stream_port, want.stream_port);
  EXPECT_EQ(
      got.StreamEndpoint(),
      want.stream_port == 0 ? "" : "tcp://" + want.host + ":" + std::to_string(want.stream_port));
}

TEST(MessageTest, RegisterRoundTrip) {
  const Sender from = From(Role::Server, -1, 0);
  const NodeInfo me = Node(Role::Server, 2, "host-a", 5002, 9102);
  Message msg = MakeRegister(from, me, "build-x", 777, kProtocolVersion, 8, 3);
  const Header* h = Accepted(msg, MsgType::Register);
  ASSERT_NE(h, nullptr);
  ExpectCommon(*h, MsgType::Register, from);
  const RegisterBody* b = h->body_as_RegisterBody();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->role(), Role::Server);
  EXPECT_EQ(b->requested_rank(), 2);
  EXPECT_EQ(b->build_id()->str(), "build-x");
  EXPECT_EQ(b->host()->str(), "host-a");
  EXPECT_EQ(b->data_port(), 5002);
  EXPECT_EQ(b->metrics_port(), 9102);
  EXPECT_EQ(b->pid(), 777u);
  EXPECT_EQ(b->num_workers(), 8);
  EXPECT_EQ(b->num_servers(), 3);
  EXPECT_EQ(b->identity()->str(), "id-host-a");
  EXPECT_EQ(b->boot_id()->str(), "boot-h");
  EXPECT_EQ(b->stream_port(), 5102);
  EXPECT_TRUE(msg.payloads.empty());
}

TEST(MessageTest, RegisterDefaultsReadMinusOne) {
  Message msg = MakeRegister(From(Role::Worker, -1, 0), Node(Role::Worker, -1, "h", 1, 2), kBuildId,
                             1, kProtocolVersion);
  const Header* h = Accepted(msg, MsgType::Register);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->body_as_RegisterBody()->requested_rank(), -1);
  EXPECT_EQ(h->body_as_RegisterBody()->num_workers(), -1);  // job size unknown
  EXPECT_EQ(h->body_as_RegisterBody()->num_servers(), -1);
  EXPECT_EQ(h->sender_rank(), -1);
}

TEST(MessageTest, RankAssignmentRoundTrip) {
  const Sender from = From(Role::Scheduler, -1, 99);
  const std::vector<NodeInfo> peers = {Node(Role::Worker, 0, "w0", 6000, 9000),
                                       Node(Role::Worker, 1, "w1", 6001, 9001),
                                       Node(Role::Server, 0, "s0", 7000, 9100)};
  Message msg = MakeRankAssignment(from, 1, 2, 1, peers, 250, 4);
  const Header* h = Accepted(msg, MsgType::RankAssignment);
  ASSERT_NE(h, nullptr);
  ExpectCommon(*h, MsgType::RankAssignment, from);
  const RankAssignmentBody* b = h->body_as_RankAssignmentBody();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->rank(), 1);
  EXPECT_EQ(b->num_workers(), 2);
  EXPECT_EQ(b->num_servers(), 1);
  EXPECT_EQ(b->heartbeat_interval_ms(), 250u);
  EXPECT_EQ(b->missed_heartbeats(), 4u);
  ASSERT_NE(b->peers(), nullptr);
  ASSERT_EQ(b->peers()->size(), peers.size());
  for (size_t i = 0; i < peers.size(); ++i) ExpectAddress(b->peers()->Get(i), peers[i]);
}

// Same machine: the same host address and the same known boot id.
TEST(MessageTest, NodesShareAMachineOnlyWithTheSameHostAndBootId) {
  NodeInfo a = Node(Role::Worker, 0, "10.0.0.1", 1, 2);
  NodeInfo b = Node(Role::Worker, 1, "10.0.0.1", 3, 4);
  EXPECT_TRUE(a.SameMachine(b));
  b.boot_id = "another boot";
  EXPECT_FALSE(a.SameMachine(b));
  b = Node(Role::Worker, 1, "10.0.0.2", 3, 4);  // the same boot id prefix, another host
  EXPECT_FALSE(a.SameMachine(b));
  a.boot_id.clear();
  b = a;
  EXPECT_FALSE(a.SameMachine(b)) << "an unknown boot id is never the same machine";
}

TEST(MessageTest, HeartbeatRoundTrip) {
  const Sender from = From(Role::Worker, 7, 5);
  Message msg = MakeHeartbeat(from);
  const Header* h = Accepted(msg, MsgType::Heartbeat);
  ASSERT_NE(h, nullptr);
  ExpectCommon(*h, MsgType::Heartbeat, from);
  EXPECT_NE(h->body_as_HeartbeatBody(), nullptr);
}

TEST(MessageTest, LeaveRoundTrip) {
  const Sender from = From(Role::Worker, 0, 5);
  Message msg = MakeLeave(from, "done after 10 epochs");
  const Header* h = Accepted(msg, MsgType::Leave);
  ASSERT_NE(h, nullptr);
  ExpectCommon(*h, MsgType::Leave, from);
  EXPECT_EQ(h->body_as_LeaveBody()->reason()->str(), "done after 10 epochs");
  EXPECT_FALSE(h->body_as_LeaveBody()->departing());
  EXPECT_EQ(h->body_as_LeaveBody()->failure(), ErrorCode::Unknown);
  Message failed = MakeLeave(from, "its communicator failed", true, ErrorCode::Timeout);
  h = Accepted(failed, MsgType::Leave);
  ASSERT_NE(h, nullptr);
  EXPECT_TRUE(h->body_as_LeaveBody()->departing());
  EXPECT_EQ(h->body_as_LeaveBody()->failure(), ErrorCode::Timeout);
}

TEST(MessageTest, BarrierAndReleaseRoundTrip) {
  const Sender from = From(Role::Server, 1, 5);
  for (MsgType type : {MsgType::Barrier, MsgType::BarrierRelease}) {
    for (Group group : {Group::All, Group::Workers, Group::Servers}) {
      Message msg = MakeBarrier(from, type, 123456789012ULL, group, 7);
      const Header* h = Accepted(msg, type);
      ASSERT_NE(h, nullptr);
      ExpectCommon(*h, type, from);
      const BarrierBody* b = h->body_as_BarrierBody();
      ASSERT_NE(b, nullptr);
      EXPECT_EQ(b->barrier_id(), 123456789012ULL);
      EXPECT_EQ(b->group(), group);
      EXPECT_EQ(h->epoch(), 7u);
    }
  }
}

TEST(MessageTest, ErrorRoundTrip) {
  const Sender from = From(Role::Scheduler, -1, 5);
  Message msg = MakeError(from, ErrorCode::JobFull, "job has 4 workers already", MsgType::Register);
  const Header* h = Accepted(msg, MsgType::Error);
  ASSERT_NE(h, nullptr);
  ExpectCommon(*h, MsgType::Error, from);
  const ErrorBody* b = h->body_as_ErrorBody();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->code(), ErrorCode::JobFull);
  EXPECT_EQ(b->message()->str(), "job has 4 workers already");
  EXPECT_EQ(b->in_reply_to(), MsgType::Register);
}

TEST(MessageTest, NodeDeadRoundTrip) {
  const Sender from = From(Role::Scheduler, -1, 5);
  Message msg = MakeNodeDead(from, Node(Role::Server, 3, "s3", 1, 2), "missed 5 heartbeats");
  const Header* h = Accepted(msg, MsgType::NodeDead);
  ASSERT_NE(h, nullptr);
  ExpectCommon(*h, MsgType::NodeDead, from);
  const NodeDeadBody* b = h->body_as_NodeDeadBody();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->role(), Role::Server);
  EXPECT_EQ(b->rank(), 3);
  EXPECT_EQ(b->reason()->str(), "missed 5 heartbeats");
  EXPECT_EQ(b->failure(), ErrorCode::Unknown);
  Message departed =
      MakeNodeDead(from, Node(Role::Worker, 1, "w1", 1, 2), "it left", ErrorCode::Mismatch);
  h = Accepted(departed, MsgType::NodeDead);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->body_as_NodeDeadBody()->failure(), ErrorCode::Mismatch);
}

// How one peer's failure reads at another: each kind back as the status
// it came from (a layout's FailedPrecondition is the ring's to restore).
TEST(MessageTest, AFailureReadsAsItsKindAtThePeer) {
  EXPECT_EQ(FailureStatus(FailureCode(DeadlineExceededError("d")), "m").code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(FailureStatus(FailureCode(AbortedError("a")), "m").code(), StatusCode::kAborted);
  EXPECT_EQ(FailureCode(FailedPreconditionError("f")), ErrorCode::Mismatch);
  EXPECT_EQ(FailureStatus(FailureCode(InternalError("i")), "m").code(), StatusCode::kUnavailable);
  EXPECT_EQ(FailureStatus(ErrorCode::Unknown, "m").code(), StatusCode::kUnavailable);
  EXPECT_EQ(FailureStatus(ErrorCode::Timeout, "why").message(), "why");
}

TEST(MessageTest, ReachReportRoundTrip) {
  const Sender from = From(Role::Worker, 2, 5);
  const std::vector<ReachOutcome> results = {
      {Node(Role::Worker, 0, "w0", 6000, 9000), true, ""},
      {Node(Role::Server, 1, "s1", 7001, 9101), false, "connection refused"}};
  Message msg = MakeReachReport(from, results);
  const Header* h = Accepted(msg, MsgType::ReachReport);
  ASSERT_NE(h, nullptr);
  ExpectCommon(*h, MsgType::ReachReport, from);
  const auto* rs = h->body_as_ReachReportBody()->results();
  ASSERT_NE(rs, nullptr);
  ASSERT_EQ(rs->size(), results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    ExpectAddress(rs->Get(i)->peer(), results[i].peer);
    EXPECT_EQ(rs->Get(i)->ok(), results[i].ok);
    EXPECT_EQ(rs->Get(i)->detail()->str(), results[i].detail);
  }
}

TEST(MessageTest, JobStateRoundTrip) {
  const Sender from = From(Role::Scheduler, -1, 5);
  for (JobPhase phase : {JobPhase::Ready, JobPhase::Failed, JobPhase::Shutdown}) {
    Message msg = MakeJobState(from, phase, "phase change");
    const Header* h = Accepted(msg, MsgType::JobState);
    ASSERT_NE(h, nullptr);
    ExpectCommon(*h, MsgType::JobState, from);
    EXPECT_EQ(h->body_as_JobStateBody()->phase(), phase);
    EXPECT_EQ(h->body_as_JobStateBody()->message()->str(), "phase change");
  }
}

TEST(MessageTest, NcclIdRoundTrip) {
  const Sender from = From(Role::Worker, 0, 5);
  std::vector<uint8_t> id(kNcclIdBytes);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(255 - i);
  for (MsgType type : {MsgType::NcclIdOffer, MsgType::NcclId}) {
    Message msg = MakeNcclId(from, type, id);
    const Header* h = Accepted(msg, type);
    ASSERT_NE(h, nullptr);
    ExpectCommon(*h, type, from);
    const auto* got = h->body_as_NcclIdBody()->id();
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(std::vector<uint8_t>(got->begin(), got->end()), id);
  }
  Message request = MakeNcclId(from, MsgType::NcclIdRequest, {});
  const Header* h = Accepted(request, MsgType::NcclIdRequest);
  ASSERT_NE(h, nullptr);
  ExpectCommon(*h, MsgType::NcclIdRequest, from);
  const auto* got = h->body_as_NcclIdBody()->id();
  EXPECT_TRUE(got == nullptr || got->size() == 0);
}

TEST(MessageTest, DataRoundTripWithPayloads) {
  const Sender from = From(Role::Worker, 1, 5);
  DataFields f;
  f.bucket = 4;
  f.partition = 3;
  f.dtype = DType::BF16;
  f.num_elements = 5;
  f.names_hash = 0x0123456789abcdefULL;
  f.round = 77;
  f.base_version = 78;
  f.key_version = 79;
  auto owned = std::make_shared<std::vector<uint8_t>>(std::vector<uint8_t>{1, 2, 3, 4, 5, 6});
  const uint8_t tail[4] = {7, 8, 9, 10};
  for (MsgType type : {MsgType::Push, MsgType::Reply}) {
    std::vector<Payload> payloads = {Payload::Borrow(owned->data(), owned->size(), owned),
                                     Payload::Copy(tail, sizeof(tail))};
    Message msg = MakeData(from, type, f, std::move(payloads), 1000, 1001, 3);
    const Header* h = Accepted(msg, type);
    ASSERT_NE(h, nullptr);
    ExpectCommon(*h, type, from, 1000, 1001);
    EXPECT_EQ(h->epoch(), 3u);
    const DataBody* b = h->body_as_DataBody();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->bucket(), 4u);
    EXPECT_EQ(b->partition(), 3u);
    EXPECT_EQ(b->dtype(), DType::BF16);
    EXPECT_EQ(b->num_elements(), 5u);
    EXPECT_EQ(b->codec(), nullptr);
    EXPECT_EQ(b->wire_bytes(), 10u);
    EXPECT_EQ(b->names_hash(), 0x0123456789abcdefULL);
    EXPECT_EQ(b->round(), 77u);
    EXPECT_EQ(b->base_version(), 78u);
    EXPECT_EQ(b->key_version(), 79u);
    ASSERT_EQ(msg.payloads.size(), 2u);
    EXPECT_EQ(msg.PayloadBytes(), 10u);
    EXPECT_EQ(msg.payloads[0].data, owned->data());  // borrowed, not copied
    EXPECT_EQ(std::memcmp(msg.payloads[1].data, tail, sizeof(tail)), 0);
    EXPECT_NE(msg.payloads[1].data, tail);  // copied
  }
}

TEST(MessageTest, RingDataRoundTrip) {
  const Sender from = From(Role::Worker, 2, 5);
  RingDataFields f;
  f.bucket = 6;
  f.collective = 41;
  f.index = uint64_t{1} << 33;
  f.dtype = DType::F16;
  f.num_elements = 2;
  f.names_hash = 0x0123456789abcdefULL;
  f.op_fingerprint = 0xfedcba9876543210ULL;
  const uint8_t bytes[4] = {1, 2, 3, 4};
  Message msg = MakeRingData(from, f, {Payload::Copy(bytes, sizeof(bytes))}, 40, 2);
  const Header* h = Accepted(msg, MsgType::RingData);
  ASSERT_NE(h, nullptr);
  ExpectCommon(*h, MsgType::RingData, from, 40, 0);  // seq: a request's only
  EXPECT_EQ(h->epoch(), 2u);
  const RingDataBody* b = h->body_as_RingDataBody();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->bucket(), 6u);
  EXPECT_EQ(b->collective(), 41u);
  EXPECT_EQ(b->index(), uint64_t{1} << 33);
  EXPECT_EQ(b->dtype(), DType::F16);
  EXPECT_EQ(b->num_elements(), 2u);
  EXPECT_EQ(b->wire_bytes(), 4u);
  EXPECT_EQ(b->names_hash(), 0x0123456789abcdefULL);
  EXPECT_EQ(b->op_fingerprint(), 0xfedcba9876543210ULL);
}

TEST(MessageTest, PullAndAckRoundTripWithoutPayload) {
  const Sender from = From(Role::Server, 0, 5);
  DataFields f;
  f.bucket = 1;
  f.partition = 9;
  f.dtype = DType::I32;
  f.num_elements = 1 << 20;
  f.codec = "topk:ratio=0.5";
  f.round = 3;
  for (MsgType type : {MsgType::Pull, MsgType::Ack}) {
    Message msg = MakeData(from, type, f, {}, 8, 9);
    const Header* h = Accepted(msg, type);
    ASSERT_NE(h, nullptr);
    ExpectCommon(*h, type, from, 8, 9);
    const DataBody* b = h->body_as_DataBody();
    EXPECT_EQ(b->bucket(), 1u);
    EXPECT_EQ(b->partition(), 9u);
    EXPECT_EQ(b->dtype(), DType::I32);
    EXPECT_EQ(b->num_elements(), uint64_t{1} << 20);
    ASSERT_NE(b->codec(), nullptr);
    EXPECT_EQ(b->codec()->str(), "topk:ratio=0.5");
    EXPECT_EQ(b->wire_bytes(), 0u);
    EXPECT_EQ(b->round(), 3u);
  }
}

// tensors of `name_bytes`-byte names, each name unique.
std::vector<TensorSpecFields> ManyTensors(size_t n, size_t name_bytes) {
  std::vector<TensorSpecFields> tensors;
  for (size_t i = 0; i < n; ++i) {
    std::string name = "layers." + std::to_string(i) + ".weight.";
    name.resize(name_bytes, 'x');
    tensors.push_back({name, i + 1, i % 2 ? DType::BF16 : DType::F32});
  }
  return tensors;
}

// A large model's layout goes in pieces that every receiver takes (each
// well under the default header limit, every transport's), and the pieces
// read back in order give the whole layout.
TEST(MessageTest, ALargeLayoutIsCutIntoBoundedPiecesThatReadBackInOrder) {
  std::vector<TensorSpecFields> tensors = ManyTensors(10000, 100);
  tensors[1234].name.assign(4096, 'n');  // the longest name a receiver allows
  const std::vector<Message> pieces = MakeLayoutPieces(TestSender(), tensors);
  EXPECT_GT(pieces.size(), 30u);
  std::vector<TensorSpecFields> read;
  for (const Message& piece : pieces) {
    EXPECT_LE(piece.header.size(), kLayoutPieceBytes + 4096 + 512);
    const Header* h = Accepted(piece, MsgType::Layout);  // the default Limits
    ASSERT_NE(h, nullptr);
    const LayoutBody* b = h->body_as_LayoutBody();
    EXPECT_EQ(b->first(), read.size());
    EXPECT_EQ(b->total(), tensors.size());
    ASSERT_NE(b->tensors(), nullptr);
    for (const TensorSpec* t : *b->tensors()) {
      read.push_back({t->name()->str(), t->num_elements(), t->dtype()});
    }
  }
  ASSERT_EQ(read.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(read[i].name, tensors[i].name) << i;
    EXPECT_EQ(read[i].num_elements, tensors[i].num_elements) << i;
    EXPECT_EQ(read[i].dtype, tensors[i].dtype) << i;
  }
}

TEST(MessageTest, LayoutPiecesHoldAtLeastOneTensorAndAnEmptyLayoutIsOnePiece) {
  const std::vector<TensorSpecFields> tensors = ManyTensors(5, 1000);
  EXPECT_EQ(LayoutPieceStarts(tensors, 10), (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(LayoutPieceStarts(tensors, 2200), (std::vector<size_t>{0, 2, 4}));
  EXPECT_EQ(LayoutPieceStarts(tensors), (std::vector<size_t>{0}));
  const std::vector<Message> none = MakeLayoutPieces(TestSender(), {});
  ASSERT_EQ(none.size(), 1u);
  const Header* h = Accepted(none[0], MsgType::Layout);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->body_as_LayoutBody()->total(), 0u);
}

TEST(MessageTest, EverySampleCarriesItsExpectedBody) {
  for (MsgType type : AllMsgTypes()) {
    Message msg = SampleMessage(type);
    const Header* h = Accepted(msg, type);
    ASSERT_NE(h, nullptr) << MsgTypeName(type);
    EXPECT_EQ(h->type(), type);
    EXPECT_EQ(h->body_type(), ExpectedBody(type)) << MsgTypeName(type);
    EXPECT_NE(ExpectedBody(type), Body::NONE);
  }
}

TEST(MessageTest, NamesAndLabels) {
  EXPECT_STREQ(MsgTypeName(MsgType::NcclIdOffer), "NcclIdOffer");
  EXPECT_STREQ(MsgTypeName(static_cast<MsgType>(200)), "invalid");
  EXPECT_STREQ(RoleName(Role::Server), "server");
  EXPECT_STREQ(RoleName(static_cast<Role>(9)), "invalid-role");
  EXPECT_EQ(ErrorCodeLabel(ErrorCode::WrongVersion), "wrong_version");
  EXPECT_EQ(ErrorCodeLabel(ErrorCode::Malformed), "malformed");
  EXPECT_EQ(ErrorCodeLabel(static_cast<ErrorCode>(99)), "invalid");
  EXPECT_EQ(Node(Role::Worker, 3, "h", 1, 2).Name(), "worker 3");
  EXPECT_EQ(Node(Role::Scheduler, -1, "h", 1, 2).Name(), "scheduler");
  EXPECT_EQ(Node(Role::Server, 0, "10.1.2.3", 5000, 2).DataEndpoint(), "tcp://10.1.2.3:5000");
}

TEST(MessageTest, PayloadCopyOwnsItsBytes) {
  std::vector<uint8_t> src = {1, 2, 3};
  Payload p = Payload::Copy(src.data(), src.size());
  src.assign({9, 9, 9});
  ASSERT_EQ(p.size, 3u);
  EXPECT_EQ(p.data[0], 1);
  EXPECT_EQ(p.data[2], 3);
  EXPECT_NE(p.owner, nullptr);
  Payload empty = Payload::Copy(nullptr, 0);
  EXPECT_EQ(empty.size, 0u);
}

TEST(EscapedTest, PeerTextCannotForgeLogLines) {
  EXPECT_EQ(Escaped("ok \"fp16\""), "ok \"fp16\"");
  EXPECT_EQ(Escaped("a\nW fake line\x1b[0m\\"), "a\\x0aW fake line\\x1b[0m\\x5c");
  EXPECT_EQ(Escaped(std::string(600, 'x')).size(), 515u);
  EXPECT_EQ(Escaped(static_cast<const flatbuffers::String*>(nullptr)), "");
}

TEST(Identities, ADataIdentityIsNoDerivedIdentityOrRoutingId) {
  EXPECT_TRUE(IsDataIdentity("node-0123abcd"));
  EXPECT_TRUE(IsDataIdentity("w_1.A"));
  EXPECT_TRUE(IsDataIdentity(std::string(64, 'a')));
  EXPECT_FALSE(IsDataIdentity(std::string(65, 'a')));
  EXPECT_FALSE(IsDataIdentity(""));
  EXPECT_FALSE(IsDataIdentity(PsClientIdentity("node-1", 2)));
  EXPECT_FALSE(IsDataIdentity(LaneIdentity("node-1", 1)));
  EXPECT_FALSE(IsDataIdentity(PairIdentity("node-1", 1)));
  EXPECT_FALSE(IsDataIdentity("node-1#abc"));
  EXPECT_FALSE(IsDataIdentity(std::string("node\0x", 6)));
}

}  // namespace
}  // namespace gradsync::wire
