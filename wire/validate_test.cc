#include "wire/validate.h"

#include <functional>
#include <string>
#include <vector>

#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/test_util.h"

namespace gradsync::wire {
namespace {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Header fields for a header built by hand.
struct Spec {
  MsgType type = MsgType::Heartbeat;
  Body body_type = Body::HeartbeatBody;
  uint32_t protocol_version = kProtocolVersion;
  Role sender_role = Role::Worker;
  int32_t sender_rank = 0;
};

using BodyFn = std::function<Offset<void>(FlatBufferBuilder&)>;

Message HandBuilt(const Spec& spec, const BodyFn& body) {
  FlatBufferBuilder fbb;
  Offset<void> b = body ? body(fbb) : Offset<void>();
  HeaderBuilder hb(fbb);
  hb.add_type(spec.type);
  hb.add_protocol_version(spec.protocol_version);
  hb.add_sender_role(spec.sender_role);
  hb.add_sender_rank(spec.sender_rank);
  hb.add_body_type(spec.body_type);
  if (body) hb.add_body(b);
  fbb.Finish(hb.Finish());
  Message msg;
  msg.header.assign(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  return msg;
}

Verdict Check(const Message& msg) { return Validate(msg, AcceptAllPolicy()); }

void ExpectRejected(const Verdict& v, ErrorCode code, const std::string& detail_part) {
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.header, nullptr);
  EXPECT_EQ(v.code, code) << "got " << ErrorCodeLabel(v.code) << ": " << v.detail;
  EXPECT_THAT(v.detail, HasSubstr(detail_part));
}

Offset<NodeAddress> Address(FlatBufferBuilder& fbb, Role role, const std::string& host) {
  return CreateNodeAddress(fbb, role, 1, fbb.CreateString(host), 5000, 9000);
}

// `codec`: "" for uncompressed data.
Message DataMessage(MsgType type, DType dtype, uint64_t n, const std::string& codec,
                    const std::vector<size_t>& frame_sizes) {
  DataFields f;
  f.dtype = dtype;
  f.num_elements = n;
  f.codec = codec;
  std::vector<Payload> payloads;
  for (size_t size : frame_sizes) {
    std::vector<uint8_t> bytes(size, 0x5a);
    payloads.push_back(Payload::Copy(bytes.data(), bytes.size()));
  }
  return MakeData(TestSender(), type, f, std::move(payloads));
}

TEST(ValidateTest, EverySampleVerifies) {
  for (MsgType type : AllMsgTypes()) {
    Message msg = SampleMessage(type);
    Verdict v = Validate(msg, Policy::Accepting({type}));
    ASSERT_TRUE(v.ok()) << MsgTypeName(type) << ": " << v.detail;
    EXPECT_EQ(v.type, type);
    EXPECT_TRUE(v.type_known);
    EXPECT_EQ(v.header->type(), type);
    EXPECT_EQ(v.code, ErrorCode::Unknown);
  }
}

TEST(ValidateTest, EmptyHeaderIsMalformed) {
  ExpectRejected(Check(Message()), ErrorCode::Malformed, "empty header");
}

TEST(ValidateTest, GarbageIsMalformed) {
  Message msg;
  msg.header.assign(64, 0xff);
  ExpectRejected(Check(msg), ErrorCode::Malformed, "not a valid gradsync header");
  msg.header.assign(3, 0);
  ExpectRejected(Check(msg), ErrorCode::Malformed, "header frame of 3 bytes");
}

// Cutting a header short must never verify into something different: the
// prefix is Malformed, or (when only trailing alignment padding was cut) it
// reads exactly as the whole header does.
TEST(ValidateTest, EveryTruncationIsMalformedOrUnchanged) {
  for (MsgType type : AllMsgTypes()) {
    const Message whole = SampleMessage(type);
    const Verdict full = Check(whole);
    ASSERT_TRUE(full.ok()) << full.detail;
    const std::string want = DumpHeader(*full.header);
    int rejected = 0;
    for (size_t len = 0; len < whole.header.size(); ++len) {
      Message cut;
      cut.header.assign(whole.header.begin(), whole.header.begin() + len);
      cut.payloads = whole.payloads;
      Verdict v = Check(cut);
      if (v.ok()) {
        EXPECT_EQ(DumpHeader(*v.header), want) << MsgTypeName(type) << " cut to " << len;
        EXPECT_GE(len, whole.header.size() - 8) << "only padding may be cut";
      } else {
        ++rejected;
        EXPECT_EQ(v.code, ErrorCode::Malformed)
            << MsgTypeName(type) << " cut to " << len << ": " << v.detail;
        EXPECT_FALSE(v.detail.empty());
      }
    }
    EXPECT_GT(rejected, 0);
  }
}

// Every single-bit corruption of every sample gives a clean verdict; a
// verdict of ok must leave a header whose every field can be read.
TEST(ValidateTest, EveryBitFlipGivesACleanVerdict) {
  int accepted = 0, refused = 0;
  for (MsgType type : AllMsgTypes()) {
    const Message original = SampleMessage(type);
    for (size_t bit = 0; bit < original.header.size() * 8; ++bit) {
      Message msg;
      msg.header = original.header;
      msg.payloads = original.payloads;
      msg.header[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      Verdict v = Check(msg);
      if (v.ok()) {
        ++accepted;
        EXPECT_FALSE(DumpHeader(*v.header).empty());
      } else {
        ++refused;
        EXPECT_NE(v.code, ErrorCode::Unknown) << MsgTypeName(type) << " bit " << bit;
        EXPECT_LE(v.code, ErrorCode::MAX);
        EXPECT_FALSE(v.detail.empty());
      }
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(accepted, 0);  // flips in ports, ids and payload values are legal
}

TEST(ValidateTest, OversizedHeader) {
  Message msg = MakeLeave(TestSender(), std::string(70 * 1024, 'x'));
  ExpectRejected(Check(msg), ErrorCode::Oversized, "exceeds the limit of 65536");
  Policy tight = AcceptAllPolicy();
  tight.limits.max_header_bytes = 32;
  Message small = MakeHeartbeat(TestSender());
  ASSERT_GT(small.header.size(), 32u);
  Verdict v = Validate(small, tight);
  ExpectRejected(v, ErrorCode::Oversized,
                 "header frame of " + std::to_string(small.header.size()) + " bytes");
}

TEST(ValidateTest, OversizedPayload) {
  Policy p = AcceptAllPolicy();
  p.limits.max_payload_bytes = 1024;
  Message msg = DataMessage(MsgType::Push, DType::U8, 2048, "", {1024, 1024});
  ExpectRejected(Validate(msg, p), ErrorCode::Oversized,
                 "payload of 2048 bytes exceeds the limit of 1024");
  Message fits = DataMessage(MsgType::Push, DType::U8, 1024, "", {512, 512});
  EXPECT_TRUE(Validate(fits, p).ok());
}

TEST(ValidateTest, TooManyPayloadFrames) {
  Message msg = DataMessage(MsgType::Push, DType::U8, 65, "", std::vector<size_t>(65, 1));
  ExpectRejected(Check(msg), ErrorCode::Oversized, "has 65 payload frames, at most 64");
  Message ok = DataMessage(MsgType::Push, DType::U8, 64, "", std::vector<size_t>(64, 1));
  EXPECT_TRUE(Check(ok).ok()) << Check(ok).detail;
}

TEST(ValidateTest, StringsListsAndHostsLongerThanAllowed) {
  const std::string long_text(5000, 'r');
  ExpectRejected(Check(MakeLeave(TestSender(), long_text)), ErrorCode::Oversized,
                 "Leave has a string longer than allowed");
  ExpectRejected(Check(MakeError(TestSender(), ErrorCode::Timeout, long_text, MsgType::Barrier)),
                 ErrorCode::Oversized, "Error has a string");
  ExpectRejected(Check(MakeJobState(TestSender(), JobPhase::Failed, long_text)),
                 ErrorCode::Oversized, "JobState has a string");
  NodeInfo far;
  far.host = long_text;
  ExpectRejected(Check(MakeRegister(TestSender(), far, kBuildId, 1, kProtocolVersion)),
                 ErrorCode::Oversized, "Register has a string");
  ExpectRejected(Check(MakeNodeDead(TestSender(), NodeInfo(), long_text)), ErrorCode::Oversized,
                 "NodeDead has a string");
  ExpectRejected(Check(MakeRankAssignment(TestSender(), 0, 1, 0, {far}, 100, 3)),
                 ErrorCode::Oversized, "peer host too long");
  ExpectRejected(Check(MakeReachReport(TestSender(), {{far, true, ""}})), ErrorCode::Oversized,
                 "peer host too long");
  ExpectRejected(Check(MakeReachReport(TestSender(), {{NodeInfo(), false, long_text}})),
                 ErrorCode::Oversized, "ReachReport has a string");

  Policy p = AcceptAllPolicy();
  p.limits.max_peers = 2;
  Sender scheduler;
  scheduler.role = Role::Scheduler;
  std::vector<NodeInfo> three(3);
  ExpectRejected(Validate(MakeRankAssignment(scheduler, 0, 3, 0, three, 100, 3), p),
                 ErrorCode::Oversized, "peer list of 3 entries");
  EXPECT_TRUE(Validate(MakeRankAssignment(scheduler, 0, 2, 0, {{}, {}}, 100, 3), p).ok());
  std::vector<ReachOutcome> outcomes(3);
  ExpectRejected(Validate(MakeReachReport(scheduler, outcomes), p), ErrorCode::Oversized,
                 "reach report too long");
}

TEST(ValidateTest, LayoutPiecesThatDoNotFitTheirTotal) {
  const std::vector<TensorSpecFields> two = {{"a", 1, DType::F32}, {"b", 2, DType::F32}};
  EXPECT_TRUE(Check(MakeLayout(TestSender(), two, 3, 5)).ok());
  EXPECT_TRUE(Check(MakeLayout(TestSender(), {}, 0, 0)).ok());
  ExpectRejected(Check(MakeLayout(TestSender(), two, 4, 5)), ErrorCode::Malformed,
                 "layout piece of 2 tensors from #4 does not fit a layout of 5");
  ExpectRejected(Check(MakeLayout(TestSender(), two, 0, 1)), ErrorCode::Malformed,
                 "does not fit a layout of 1");
  ExpectRejected(Check(MakeLayout(TestSender(), {}, 6, 5)), ErrorCode::Malformed, "does not fit");
  ExpectRejected(Check(MakeLayout(TestSender(), two, ~uint64_t{0}, 1)), ErrorCode::Malformed,
                 "does not fit");
  // An empty piece of a layout that has tensors: a receiver would wait on
  // it for nothing.
  ExpectRejected(Check(MakeLayout(TestSender(), {}, 2, 5)), ErrorCode::Malformed,
                 "piece of 0 tensors");
}

TEST(ValidateTest, WrongProtocolVersion) {
  NodeInfo me;
  me.host = "h";
  Message msg = MakeRegister(TestSender(), me, kBuildId, 1, kProtocolVersion + 7);
  Verdict v = Check(msg);
  ExpectRejected(v, ErrorCode::WrongVersion, "version");
  EXPECT_THAT(v.detail, AllOf(HasSubstr(std::to_string(kProtocolVersion + 7)),
                              HasSubstr(std::to_string(kProtocolVersion))));
  EXPECT_TRUE(v.type_known);  // for the error reply
  EXPECT_EQ(v.type, MsgType::Register);
}

// A RingData as a peer of protocol version 2 sent it: a DataBody whose slot
// 8 held the names hash, where this version's DataBody has its codec
// string. It is refused for its version, not as a header it cannot read.
TEST(ValidateTest, APeerOfVersionTwoIsToldBothVersions) {
  Spec spec;
  spec.type = MsgType::RingData;
  spec.body_type = Body::DataBody;
  spec.protocol_version = 2;
  Message msg = HandBuilt(spec, [](FlatBufferBuilder& fbb) {
    const auto start = fbb.StartTable();
    fbb.AddElement<uint64_t>(flatbuffers::FieldIndexToOffset(3), 6, 0);   // num_elements
    fbb.AddElement<uint64_t>(flatbuffers::FieldIndexToOffset(5), 24, 0);  // wire_bytes
    fbb.AddElement<uint64_t>(flatbuffers::FieldIndexToOffset(6), 0xfeedfacecafebeefULL, 0);
    fbb.AddElement<uint64_t>(flatbuffers::FieldIndexToOffset(7), 10, 0);  // round
    fbb.AddElement<uint64_t>(flatbuffers::FieldIndexToOffset(8), 0x1234567890abcdefULL, 0);
    return Offset<void>(fbb.EndTable(start));
  });
  const float values[6] = {};
  msg.payloads.push_back(Payload::Copy(values, sizeof(values)));
  Verdict v = Check(msg);
  ExpectRejected(
      v, ErrorCode::WrongVersion,
      "peer speaks protocol version 2, this node speaks " + std::to_string(kProtocolVersion));
  EXPECT_TRUE(v.type_known);
  EXPECT_EQ(v.type, MsgType::RingData);
}

// A refused Error is not answered (no error ping-pong between two peers);
// anything else is, including what cannot be parsed at all.
TEST(ValidateTest, EveryRefusalButAnErrorIsAnswered) {
  Verdict empty = Check(Message());
  EXPECT_FALSE(empty.type_known);
  EXPECT_TRUE(empty.ShouldAnswer());

  Spec spec;
  spec.type = static_cast<MsgType>(99);
  Verdict unknown = Check(
      HandBuilt(spec, [](FlatBufferBuilder& fbb) { return CreateHeartbeatBody(fbb).Union(); }));
  EXPECT_FALSE(unknown.type_known);
  EXPECT_TRUE(unknown.ShouldAnswer());

  Verdict heartbeat = Validate(MakeHeartbeat(TestSender()), Policy());
  EXPECT_TRUE(heartbeat.type_known);
  EXPECT_EQ(heartbeat.type, MsgType::Heartbeat);
  EXPECT_TRUE(heartbeat.ShouldAnswer());

  Verdict error = Validate(SampleMessage(MsgType::Error), Policy());
  ASSERT_FALSE(error.ok());
  EXPECT_TRUE(error.type_known);
  EXPECT_EQ(error.type, MsgType::Error);
  EXPECT_FALSE(error.ShouldAnswer());

  spec.type = MsgType::Error;
  spec.protocol_version = 9;
  spec.body_type = Body::ErrorBody;
  Verdict old_error = Check(HandBuilt(spec, [](FlatBufferBuilder& fbb) {
    return CreateErrorBody(fbb, ErrorCode::Timeout).Union();
  }));
  EXPECT_EQ(old_error.code, ErrorCode::WrongVersion);
  EXPECT_FALSE(old_error.ShouldAnswer());
}

TEST(ValidateTest, TypeNotAcceptedByPolicy) {
  Verdict v = Validate(MakeHeartbeat(TestSender()), Policy::Accepting({MsgType::Register}));
  ExpectRejected(v, ErrorCode::WrongType, "Heartbeat is not accepted");
  EXPECT_EQ(v.type, MsgType::Heartbeat);
  ExpectRejected(Validate(SampleMessage(MsgType::Push), Policy()), ErrorCode::WrongType,
                 "Push is not accepted");
}

TEST(ValidateTest, BodyThatDoesNotMatchItsType) {
  Spec spec;
  spec.type = MsgType::Push;
  spec.body_type = Body::HeartbeatBody;
  Message msg =
      HandBuilt(spec, [](FlatBufferBuilder& fbb) { return CreateHeartbeatBody(fbb).Union(); });
  ExpectRejected(Check(msg), ErrorCode::WrongType,
                 "Push must carry a DataBody, found HeartbeatBody");

  spec.type = MsgType::Heartbeat;
  spec.body_type = Body::NONE;
  ExpectRejected(Check(HandBuilt(spec, nullptr)), ErrorCode::WrongType,
                 "Heartbeat must carry a HeartbeatBody");

  spec.body_type = static_cast<Body>(99);  // unknown union member
  Message unknown =
      HandBuilt(spec, [](FlatBufferBuilder& fbb) { return CreateHeartbeatBody(fbb).Union(); });
  ExpectRejected(Check(unknown), ErrorCode::WrongType, "found an unknown body");
}

TEST(ValidateTest, MessageTypeOutOfRange) {
  Spec spec;
  spec.type = static_cast<MsgType>(99);
  Message msg =
      HandBuilt(spec, [](FlatBufferBuilder& fbb) { return CreateHeartbeatBody(fbb).Union(); });
  ExpectRejected(Check(msg), ErrorCode::BadEnum, "message type 99 is out of range");
}

TEST(ValidateTest, SenderRoleOutOfRange) {
  Spec spec;
  spec.sender_role = static_cast<Role>(7);
  Message msg =
      HandBuilt(spec, [](FlatBufferBuilder& fbb) { return CreateHeartbeatBody(fbb).Union(); });
  ExpectRejected(Check(msg), ErrorCode::BadEnum, "sender_role");
}

struct EnumCase {
  const char* name;
  MsgType type;
  BodyFn body;
  const char* detail;
};

TEST(ValidateTest, BodyEnumsOutOfRange) {
  const auto bad_role = static_cast<Role>(99);
  const std::vector<EnumCase> cases = {
      {"dtype", MsgType::Push,
       [](FlatBufferBuilder& fbb) {
         return CreateDataBody(fbb, 0, 0, static_cast<DType>(99)).Union();
       },
       "Push.dtype is out of range"},
      {"register role", MsgType::Register,
       [&](FlatBufferBuilder& fbb) { return CreateRegisterBody(fbb, bad_role).Union(); },
       "Register.role is out of range"},
      {"register as scheduler", MsgType::Register,
       [](FlatBufferBuilder& fbb) { return CreateRegisterBody(fbb, Role::Scheduler).Union(); },
       "Register.role"},
      {"group", MsgType::Barrier,
       [](FlatBufferBuilder& fbb) {
         return CreateBarrierBody(fbb, 1, static_cast<Group>(99)).Union();
       },
       "Barrier.group is out of range"},
      {"error code", MsgType::Error,
       [](FlatBufferBuilder& fbb) {
         return CreateErrorBody(fbb, static_cast<ErrorCode>(99)).Union();
       },
       "Error.code is out of range"},
      {"in_reply_to", MsgType::Error,
       [](FlatBufferBuilder& fbb) {
         return CreateErrorBody(fbb, ErrorCode::Timeout, 0, static_cast<MsgType>(99)).Union();
       },
       "Error.in_reply_to is out of range"},
      {"dead role", MsgType::NodeDead,
       [&](FlatBufferBuilder& fbb) { return CreateNodeDeadBody(fbb, bad_role).Union(); },
       "NodeDead.role is out of range"},
      {"dead failure", MsgType::NodeDead,
       [](FlatBufferBuilder& fbb) {
         return CreateNodeDeadBody(fbb, Role::Worker, 1, 0, static_cast<ErrorCode>(99)).Union();
       },
       "NodeDead.failure is out of range"},
      {"leave failure", MsgType::Leave,
       [](FlatBufferBuilder& fbb) {
         return CreateLeaveBody(fbb, 0, true, static_cast<ErrorCode>(99)).Union();
       },
       "Leave.failure is out of range"},
      {"phase", MsgType::JobState,
       [](FlatBufferBuilder& fbb) {
         return CreateJobStateBody(fbb, static_cast<JobPhase>(99)).Union();
       },
       "JobState.phase is out of range"},
      {"peer role", MsgType::RankAssignment,
       [&](FlatBufferBuilder& fbb) {
         auto peers = fbb.CreateVector(std::vector<Offset<NodeAddress>>{
             Address(fbb, Role::Worker, "a"), Address(fbb, bad_role, "b")});
         return CreateRankAssignmentBody(fbb, 0, 2, 0, peers).Union();
       },
       "peer role out of range"},
      {"reach peer role", MsgType::ReachReport,
       [&](FlatBufferBuilder& fbb) {
         auto r = CreateReachResult(fbb, Address(fbb, bad_role, "b"), true);
         return CreateReachReportBody(fbb, fbb.CreateVector(&r, 1)).Union();
       },
       "peer role out of range"},
  };
  for (const EnumCase& c : cases) {
    SCOPED_TRACE(c.name);
    Spec spec;
    spec.type = c.type;
    spec.body_type = ExpectedBody(c.type);
    ExpectRejected(Check(HandBuilt(spec, c.body)), ErrorCode::BadEnum, c.detail);
  }
}

TEST(ValidateTest, ReachResultWithoutPeerIsMalformed) {
  Spec spec;
  spec.type = MsgType::ReachReport;
  spec.body_type = Body::ReachReportBody;
  Message msg = HandBuilt(spec, [](FlatBufferBuilder& fbb) {
    auto r = CreateReachResult(fbb, 0, false, fbb.CreateString("no peer"));
    return CreateReachReportBody(fbb, fbb.CreateVector(&r, 1)).Union();
  });
  ExpectRejected(Check(msg), ErrorCode::Malformed, "missing peer address");
}

TEST(ValidateTest, ImpossibleSenderRank) {
  Sender s = TestSender();
  s.rank = -2;
  ExpectRejected(Check(MakeHeartbeat(s)), ErrorCode::BadSender, "sender rank -2 is impossible");
  s.rank = 4096;  // == max_peers
  ExpectRejected(Check(MakeHeartbeat(s)), ErrorCode::BadSender, "sender rank 4096");
  s.rank = 4095;
  EXPECT_TRUE(Check(MakeHeartbeat(s)).ok());
  s.rank = -1;  // not yet assigned
  EXPECT_TRUE(Check(MakeHeartbeat(s)).ok());

  NodeInfo me;
  me.rank = -5;
  ExpectRejected(Check(MakeRegister(TestSender(), me, kBuildId, 1, kProtocolVersion)),
                 ErrorCode::BadSender, "negative requested rank");
}

TEST(ValidateTest, WrongJob) {
  Policy p = AcceptAllPolicy();
  p.job_id = 7;
  Sender s = TestSender();
  s.job_id = 8;
  Verdict v = Validate(MakeHeartbeat(s), p);
  ExpectRejected(v, ErrorCode::WrongJob, "message of job 8, not of this job");
  EXPECT_EQ(v.detail.find('7'), std::string::npos) << "the detail names this job: " << v.detail;
  s.job_id = 7;
  EXPECT_TRUE(Validate(MakeHeartbeat(s), p).ok());
  // Register comes before the node knows the job id.
  s.job_id = 0;
  EXPECT_TRUE(Validate(SampleMessage(MsgType::Register), p).ok());
  // A policy without a job id accepts any job.
  s.job_id = 12345;
  EXPECT_TRUE(Check(MakeHeartbeat(s)).ok());
}

TEST(ValidateTest, PayloadThatDisagreesWithDtypeAndCount) {
  Message msg = DataMessage(MsgType::Push, DType::F32, 10, "", {39});
  ExpectRejected(Check(msg), ErrorCode::SizeMismatch,
                 "Push of 10 F32 elements needs 40 bytes, payload holds 39");
  EXPECT_TRUE(Check(DataMessage(MsgType::Push, DType::F32, 10, "", {40})).ok());
  EXPECT_TRUE(Check(DataMessage(MsgType::Reply, DType::F16, 10, "", {8, 12})).ok());
  ExpectRejected(Check(DataMessage(MsgType::Reply, DType::BF16, 3, "", {4})),
                 ErrorCode::SizeMismatch, "Reply of 3 BF16 elements needs 6 bytes");
  // A count whose byte size overflows 64 bits is refused, not wrapped.
  ExpectRejected(Check(DataMessage(MsgType::Push, DType::F32, (uint64_t{1} << 62) + 1, "", {4})),
                 ErrorCode::SizeMismatch, "F32 elements needs more than 1073741824 bytes");
  // Compressed payloads are sized by the compressor: only wire_bytes binds.
  EXPECT_TRUE(Check(DataMessage(MsgType::Push, DType::F32, 1000, "topk:ratio=0.01", {77})).ok());
}

TEST(ValidateTest, CodecIsBounded) {
  DataFields f;
  f.num_elements = 10;
  f.codec = "fp16";
  EXPECT_TRUE(Check(MakeData(TestSender(), MsgType::Pull, f, {})).ok());
  f.codec = std::string(5000, 'x');
  ExpectRejected(Check(MakeData(TestSender(), MsgType::Pull, f, {})), ErrorCode::Oversized, "");
}

TEST(ValidateTest, RingDataPayloadMustHoldItsElements) {
  RingDataFields f;
  f.dtype = DType::F32;
  f.num_elements = 10;
  std::vector<uint8_t> bytes(40, 0);
  EXPECT_TRUE(Check(MakeRingData(TestSender(), f, {Payload::Copy(bytes.data(), 40)}, 1, 2)).ok());
  ExpectRejected(Check(MakeRingData(TestSender(), f, {Payload::Copy(bytes.data(), 39)}, 1, 2)),
                 ErrorCode::SizeMismatch, "RingData of 10 F32 elements needs 40 bytes");
  f.dtype = static_cast<DType>(99);
  ExpectRejected(Check(MakeRingData(TestSender(), f, {}, 1, 2)), ErrorCode::BadEnum,
                 "RingData.dtype is out of range");
}

TEST(ValidateTest, WireBytesThatDisagreeWithFrames) {
  Message msg = DataMessage(MsgType::Push, DType::U8, 40, "", {40});
  const uint8_t extra = 1;
  msg.payloads.push_back(Payload::Copy(&extra, 1));
  ExpectRejected(Check(msg), ErrorCode::SizeMismatch,
                 "Push says wire_bytes=40 but its payload frames hold 41 bytes");
  Message none = DataMessage(MsgType::Reply, DType::U8, 40, "sign", {40});
  none.payloads.clear();
  ExpectRejected(Check(none), ErrorCode::SizeMismatch,
                 "wire_bytes=40 but its payload frames hold 0");
}

TEST(ValidateTest, PayloadOnAMessageThatCarriesNone) {
  const uint8_t byte = 0;
  Message hb = MakeHeartbeat(TestSender());
  hb.payloads.push_back(Payload::Copy(&byte, 1));
  ExpectRejected(Check(hb), ErrorCode::SizeMismatch,
                 "Heartbeat carries 1 payload frame(s), expected none");
  Message pull = SampleMessage(MsgType::Pull);
  pull.payloads.push_back(Payload::Copy(&byte, 1));
  pull.payloads.push_back(Payload::Copy(&byte, 1));
  ExpectRejected(Check(pull), ErrorCode::SizeMismatch, "Pull carries 2 payload frame(s)");
}

TEST(ValidateTest, NcclIdOfTheWrongLength) {
  const std::vector<uint8_t> short_id(kNcclIdBytes - 1, 1);
  ExpectRejected(Check(MakeNcclId(TestSender(), MsgType::NcclId, short_id)),
                 ErrorCode::SizeMismatch, "NcclId carries 127 id bytes, expected 128");
  ExpectRejected(Check(MakeNcclId(TestSender(), MsgType::NcclIdOffer, {})), ErrorCode::SizeMismatch,
                 "NcclIdOffer carries 0 id bytes, expected 128");
  ExpectRejected(Check(MakeNcclId(TestSender(), MsgType::NcclIdRequest, {1, 2, 3})),
                 ErrorCode::SizeMismatch, "NcclIdRequest carries 3 id bytes, expected 0");
  const std::vector<uint8_t> long_id(kNcclIdBytes + 1, 1);
  ExpectRejected(Check(MakeNcclId(TestSender(), MsgType::NcclId, long_id)), ErrorCode::SizeMismatch,
                 "129 id bytes");
}

}  // namespace
}  // namespace gradsync::wire
