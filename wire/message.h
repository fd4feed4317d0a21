// Messages as they travel: one FlatBuffers header frame plus raw payload
// frames, and builders for every message type in gradsync.fbs.
//
// Payload bytes are never copied on the way out: a Payload points at the
// caller's bytes and holds `owner` until the transport has sent them. On the
// way in, payload frames are not aligned; read floats with memcpy.
//
// Thread-safety: plain values; a Message may be moved between threads.
#ifndef GRADSYNC_WIRE_MESSAGE_H_
#define GRADSYNC_WIRE_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "wire/gradsync_generated.h"

namespace gradsync::wire {

constexpr int kNumMsgTypes = static_cast<int>(MsgType::MAX) + 1;
constexpr size_t kNcclIdBytes = 128;

// A run of bytes kept alive by `owner` (null when the bytes are static).
struct Payload {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;

  // A payload holding its own copy of `size` bytes.
  static Payload Copy(const void* data, size_t size);
  // A payload that points at `data`, which `owner` keeps alive.
  static Payload Borrow(const void* data, size_t size, std::shared_ptr<const void> owner);
};

struct Message {
  // The verified-on-receipt FlatBuffers Header. Heap storage, so suitably
  // aligned for the verifier and for reading the fields in place.
  std::vector<uint8_t> header;
  std::vector<Payload> payloads;

  size_t PayloadBytes() const;
  // The header, without verification. Only after Validate() said ok.
  const Header* header_view() const { return GetHeader(header.data()); }
};

// Who sends: filled into every header.
struct Sender {
  Role role = Role::Worker;
  int32_t rank = -1;
  uint64_t job_id = 0;
};

// A node as registered with the scheduler.
struct NodeInfo {
  Role role = Role::Worker;
  int32_t rank = -1;
  std::string host;
  uint16_t data_port = 0;
  uint16_t metrics_port = 0;
  std::string identity;  // of its data transport; "" when unknown
  std::string boot_id;   // of its machine; "" when unknown
  // Its own CURVE public key (40 Z85 characters; "" without CURVE): its
  // data port serves with it and peers admit it by it (docs/security.md).
  std::string public_key;
  // A shard's TCP stream port (0: none): workers of other hosts push and
  // pull there (docs/design/tcp_streams.md#parameter-server).
  uint16_t stream_port = 0;

  // Whether `other` runs on the same machine: the same host address and
  // the same, known, boot id.
  bool SameMachine(const NodeInfo& other) const {
    return host == other.host && !boot_id.empty() && boot_id == other.boot_id;
  }

  // "worker 3", "server 0", "scheduler".
  std::string Name() const;
  // "tcp://host:data_port".
  std::string DataEndpoint() const;
  // "tcp://host:stream_port"; "" without a stream port.
  std::string StreamEndpoint() const;
};

// Fields of Push / Pull / Reply / Ack (see DataBody in gradsync.fbs).
struct DataFields {
  uint32_t bucket = 0;
  uint32_t partition = 0;
  DType dtype = DType::F32;
  uint64_t num_elements = 0;
  uint64_t names_hash = 0;
  uint64_t round = 0;
  uint64_t base_version = 0;  // Push, Pull
  uint64_t key_version = 0;   // Reply, Ack
  std::string codec;          // "": uncompressed
};

// Fields of RingData (see RingDataBody in gradsync.fbs).
struct RingDataFields {
  uint32_t bucket = 0;
  uint64_t collective = 0;
  uint64_t index = 0;
  DType dtype = DType::F32;
  uint64_t num_elements = 0;
  uint64_t names_hash = 0;
  uint64_t op_fingerprint = 0;
};

// Fields of EmbeddingPull / EmbeddingPush / EmbeddingRows / EmbeddingAck
// (see EmbeddingBody in gradsync.fbs).
struct EmbeddingFields {
  uint32_t table = 0;
  uint32_t dim = 0;
  uint64_t num_ids = 0;
  uint64_t round = 0;
  uint32_t part = 0;
  uint32_t parts = 1;
  uint32_t partition = 0;
};

// Fields of RingAbort (see gradsync.fbs).
struct RingAbortFields {
  int32_t origin_rank = -1;
  int32_t blamed_rank = -1;
  uint64_t received = 0;
  bool timed_out = false;
  ErrorCode code = ErrorCode::Unknown;
  std::string message;
  uint64_t collective = 0;
};

// One registered tensor, as Layout carries it.
struct TensorSpecFields {
  std::string name;
  uint64_t num_elements = 0;
  DType dtype = DType::F32;
};

// The body table each message type must carry.
Body ExpectedBody(MsgType type);
const char* MsgTypeName(MsgType type);
const char* RoleName(Role role);
// "malformed", "wrong_version", ...: stable, for metric labels.
std::string ErrorCodeLabel(ErrorCode code);

// `num_workers`/`num_servers`: the job size this node expects (-1: unknown).
// `pid_ns`: the namespace of `pid` (wire::PidNamespace), "" when unknown.
// `key_proof`: with CURVE, RegistrationProof (wire/node_keys.h).
Message MakeRegister(const Sender& from, const NodeInfo& me, const std::string& build_id,
                     uint32_t pid, uint32_t protocol_version, int32_t num_workers = -1,
                     int32_t num_servers = -1, const std::string& pid_ns = "",
                     const std::string& key_proof = "");
Message MakeRankAssignment(const Sender& from, int32_t rank, int32_t num_workers,
                           int32_t num_servers, const std::vector<NodeInfo>& peers,
                           uint32_t heartbeat_interval_ms, uint32_t missed_heartbeats);
// The membership fields of an elastic job's assignment (RankAssignmentBody).
struct EpochFields {
  uint32_t epoch = 0;
  std::string change;  // what ended the previous epoch; "" for epoch 0
  bool elastic = false;
};
Message MakeRankAssignment(const Sender& from, int32_t rank, int32_t num_workers,
                           int32_t num_servers, const std::vector<NodeInfo>& peers,
                           uint32_t heartbeat_interval_ms, uint32_t missed_heartbeats,
                           const EpochFields& epoch);
Message MakeHeartbeat(const Sender& from);
Message MakeLeave(const Sender& from, const std::string& reason, bool departing = false,
                  ErrorCode failure = ErrorCode::Unknown);
// Barrier `barrier_id` of `group` in membership epoch `epoch`: a node's
// n-th barrier (or gather) of the group in the epoch is n, from 1; barrier
// kMembershipBarrier of an epoch is the one every worker of an elastic job
// enters before it re-forms in it (group Workers).
Message MakeBarrier(const Sender& from, MsgType type, uint64_t barrier_id, Group group,
                    uint32_t epoch);
constexpr uint64_t kMembershipBarrier = 0;
// An all-gather through the scheduler (Gather, Gathered): one worker's
// part, at most kMaxGatherPorts ports and kMaxGatherBytes of data.
constexpr size_t kMaxGatherPorts = 40;
constexpr size_t kMaxGatherBytes = 8192;
struct GatherPartFields {
  int32_t rank = -1;  // Gathered: the rank the scheduler bound to its sender
  std::vector<uint16_t> ports;
  std::vector<uint8_t> data;
};
// A worker's part of gather `barrier_id` (numbered as its barriers are).
Message MakeGather(const Sender& from, uint64_t barrier_id, const GatherPartFields& part,
                   uint32_t epoch);
// The scheduler's answer: every part, in rank order.
Message MakeGathered(const Sender& from, uint64_t barrier_id,
                     const std::vector<GatherPartFields>& parts, uint32_t epoch);
// The parts of a (validated) Gathered body.
std::vector<GatherPartFields> ReadGathered(const GatherBody& body);
// An Error answering a message of type `in_reply_to`; `seq` repeats the
// request's Header.seq where its sender matches answers by it.
Message MakeError(const Sender& from, ErrorCode code, const std::string& message,
                  MsgType in_reply_to, uint64_t seq = 0);
// The sender to put on an answer to a peer: `self` for a member of the job
// (registered, or the route of a known member), `self` without the job id
// (0) for anyone else, so that a peer outside the job learns nothing of it
// from a refusal.
Sender AnswerAs(const Sender& self, bool member);
Message MakeNodeDead(const Sender& from, const NodeInfo& dead, const std::string& reason,
                     ErrorCode failure = ErrorCode::Unknown);
// The kind of a failure as one peer tells others (a ring's abort, a worker
// that departs on its failure): Timeout for a deadline, Mismatch for peers
// that disagree, PeerDead for anything else; and the Status it reads as
// there (a peer's Unknown or other code reads as Unavailable).
ErrorCode FailureCode(const Status& why);
Status FailureStatus(ErrorCode code, const std::string& message);
struct ReachOutcome {
  NodeInfo peer;
  bool ok = false;
  std::string detail;
};
Message MakeReachReport(const Sender& from, const std::vector<ReachOutcome>& results);
Message MakeJobState(const Sender& from, JobPhase phase, const std::string& message);
// NcclIdOffer / NcclId carry the id; NcclIdRequest carries an empty one.
Message MakeNcclId(const Sender& from, MsgType type, const std::vector<uint8_t>& id);
// Push / Pull / Reply / Ack of training step `step`, request `seq`, in
// membership epoch `epoch`; Push and Reply carry `payloads`, and
// `wire_bytes` is their total size.
Message MakeData(const Sender& from, MsgType type, const DataFields& fields,
                 std::vector<Payload> payloads, uint64_t step = 0, uint64_t seq = 0,
                 uint32_t epoch = 0);
// A RingData of training step `step` in membership epoch `epoch` carrying
// `payloads` (one frame).
Message MakeRingData(const Sender& from, const RingDataFields& fields,
                     std::vector<Payload> payloads, uint64_t step, uint32_t epoch);

// An embedding message of `type` carrying `payloads` (EmbeddingBody says
// which), request `seq`, in membership epoch `epoch`.
Message MakeEmbedding(const Sender& from, MsgType type, const EmbeddingFields& fields,
                      std::vector<Payload> payloads, uint64_t seq, uint32_t epoch);

Message MakeRingAbort(const Sender& from, const RingAbortFields& fields, uint64_t step = 0,
                      uint32_t epoch = 0);
// One Layout piece: `piece`, tensors #first .. of a layout of `total`.
Message MakeLayout(const Sender& from, const std::vector<TensorSpecFields>& piece, uint64_t first,
                   uint64_t total);
// The most bytes of names and fields one Layout piece carries (a tensor
// whose name alone is more goes in a piece of its own): far below
// Limits::max_header_bytes, so that every transport takes it.
constexpr size_t kLayoutPieceBytes = 32 * 1024;
// Where `tensors` are cut into Layout pieces: the index of each piece's
// first tensor, in order (one piece, at 0, for an empty layout). A piece
// holds tensors while their names plus a fixed allowance for each stay
// within `piece_bytes`, and at least one.
std::vector<size_t> LayoutPieceStarts(const std::vector<TensorSpecFields>& tensors,
                                      size_t piece_bytes = kLayoutPieceBytes);
// The Layout pieces of `tensors`, cut as LayoutPieceStarts says.
std::vector<Message> MakeLayoutPieces(const Sender& from,
                                      const std::vector<TensorSpecFields>& tensors,
                                      size_t piece_bytes = kLayoutPieceBytes);

// The transport identity of a worker's parameter-server client, from the
// identity of the worker's data transport: "<identity>/ps" in membership
// epoch 0, "<identity>/ps<epoch>" in a later one (each epoch's client is a
// new peer to the shards, with links of its own).
std::string PsClientIdentity(const std::string& data_identity, uint32_t epoch = 0);
// Whether `identity` may be a node's data identity: 1 to 64 characters of
// letters, digits, '.', '_' and '-' (so no derived identity, which has a
// '/', and no routing id, which has a '#', is one).
bool IsDataIdentity(const std::string& identity);
// Lanes: further connections of one node to one peer, each a TCP
// connection of its own (client/ring_lanes.h, the parameter-server
// client's ps_lanes). Lane `lane` (1 to kMaxLanes - 1) presents the identity
// "<identity>/lane<lane>"; lane 0 is `identity` itself. LaneBase gives the
// identity a lane identity belongs to (`identity` when it is none), LaneOf
// its lane.
constexpr int kMaxLanes = 16;
std::string LaneIdentity(const std::string& identity, int lane);
std::string LaneBase(const std::string& identity);
// The lane of a LaneIdentity; 0 for any other identity.
int LaneOf(const std::string& identity);

// The connections of a worker's all-reduce by halving and doubling
// (client/halving_doubling.h): level `level` (0 to kMaxPairLevels - 1)
// presents "<identity>/pair<level>". PairBase gives the identity a pair
// identity belongs to (`identity` when it is none).
constexpr int kMaxPairLevels = 16;
std::string PairIdentity(const std::string& identity, int level);
std::string PairBase(const std::string& identity);
// A worker's link-timing echoes for the ring order (client/link_probe.h)
// present "<identity>/probe"; ProbeBase gives the identity it belongs to.
std::string ProbeIdentity(const std::string& identity);
std::string ProbeBase(const std::string& identity);

// What a registration says of its node, as a NodeInfo (its requested rank
// as rank).
NodeInfo RegisteredNode(const RegisterBody& r);
// Reads a NodeAddress table into a NodeInfo.
NodeInfo ToNodeInfo(const NodeAddress& address);

// Text a peer supplied, fit for a log line or an error message: printable
// ASCII kept, backslash and every other byte written as \xHH, cut
// after `max_bytes` of input (marked "..."). Null is "".
std::string Escaped(const std::string& text, size_t max_bytes = 512);
std::string Escaped(const flatbuffers::String* text, size_t max_bytes = 512);

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_MESSAGE_H_
