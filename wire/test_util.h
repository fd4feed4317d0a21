// Test helpers for the wire package: one valid sample message per type, a
// policy that accepts every type, and a reader that touches every field of a
// verified header. Shared by the unit tests, the fuzzer and its seed writer.
//
// Thread-safety: pure functions.
#ifndef GRADSYNC_WIRE_TEST_UTIL_H_
#define GRADSYNC_WIRE_TEST_UTIL_H_

#include <string>
#include <vector>

#include "wire/message.h"
#include "wire/validate.h"

namespace gradsync::wire {

// Every message type, in enum order.
std::vector<MsgType> AllMsgTypes();

// A policy (default limits, any job) that accepts every message type.
Policy AcceptAllPolicy();

// The sender the samples use: worker 3 of job 42.
Sender TestSender();

// A valid message of `type` from TestSender(), with every field of its body
// set to a value other than the default. Push, Reply and RingData carry two payload
// frames.
Message SampleMessage(MsgType type);

// Reads every field of a verified header (nested tables and vectors
// included) into one line of text, enums as numbers. Only call it on a
// header that Validate() accepted.
std::string DumpHeader(const Header& header);

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_TEST_UTIL_H_
