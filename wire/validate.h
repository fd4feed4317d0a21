// Verification of every received message: structure first (the FlatBuffers
// Verifier with limits tightened to what the schema needs), then meaning
// (version, type, enums, sender, job, and payload sizes against dtype, count
// and wire_bytes).
//
// A rejected message yields a Verdict with the ErrorCode and a detail that
// names what was wrong; the receiver answers with MakeError(), counts it and
// keeps serving. Nothing here aborts on peer input. A detail never names
// the receiver's job id (the sender may be outside the job): the answer to
// a peer not known to be a member carries job id 0 (AnswerAs).
//
// Thread-safety: pure functions.
#ifndef GRADSYNC_WIRE_VALIDATE_H_
#define GRADSYNC_WIRE_VALIDATE_H_

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "wire/message.h"

namespace gradsync::wire {

struct Limits {
  size_t max_header_bytes = 64 * 1024;
  uint64_t max_payload_bytes = uint64_t{1} << 30;  // per message
  size_t max_payload_frames = 64;
  uint32_t max_peers = 4096;         // entries in a peer list or report
  uint32_t max_string_bytes = 4096;  // hosts, reasons, messages
  uint32_t max_tensors = 16384;      // entries in a Layout
};

struct Policy {
  Limits limits;
  std::bitset<kNumMsgTypes> accepted;  // types this endpoint handles
  uint64_t job_id = 0;                 // non-zero: other jobs are refused

  static Policy Accepting(std::initializer_list<MsgType> types);
};

struct Verdict {
  const Header* header = nullptr;  // points into the message; set iff ok
  ErrorCode code = ErrorCode::Unknown;
  std::string detail;
  MsgType type = MsgType::Error;  // the message's type, if type_known
  bool type_known = false;

  bool ok() const { return header != nullptr; }
  // Whether the sender gets an Error reply: always, unless the rejected
  // message is itself an Error (no error ping-pong between two peers).
  bool ShouldAnswer() const { return !(type_known && type == MsgType::Error); }
};

// Verifies `msg` for an endpoint with `policy`.
Verdict Validate(const Message& msg, const Policy& policy);

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_VALIDATE_H_
