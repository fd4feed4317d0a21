// libFuzzer target over what a receiver does with a message from the
// network: decode and validate the header (with its payload frames), and if
// it is accepted, read every field. Any crash, sanitizer report or broken
// invariant of a Verdict is a bug. Input format: fuzz_input.h.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_input.h"
#include "wire/message.h"
#include "wire/test_util.h"
#include "wire/validate.h"

namespace gradsync::fuzz {
namespace {

// A verdict must be either a readable header of the type it names, or a
// refusal with a known code and a detail, whose type (if known) is real.
void CheckVerdict(const wire::Message& msg, const wire::Verdict& v) {
  if (!v.ok()) {
    if (v.code == wire::ErrorCode::Unknown || v.code > wire::ErrorCode::MAX || v.detail.empty()) {
      std::abort();
    }
    if (wire::ErrorCodeLabel(v.code) == "invalid") std::abort();
    if (v.type_known && v.type > wire::MsgType::MAX) std::abort();
    return;
  }
  const wire::Header& h = *v.header;
  if (!v.type_known || h.type() != v.type || h.body_type() != wire::ExpectedBody(h.type()))
    std::abort();
  if (wire::DumpHeader(h).empty()) std::abort();
  uint8_t sum = 0;
  for (const wire::Payload& p : msg.payloads) {
    for (size_t i = 0; i < p.size; ++i) sum ^= p.data[i];
  }
  volatile uint8_t sink = sum;
  (void)sink;
}

}  // namespace
}  // namespace gradsync::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gradsync::wire::Message;
  using gradsync::wire::MsgType;
  using gradsync::wire::Policy;
  Message msg;
  if (!gradsync::fuzz::DecodeFuzzInput(data, size, &msg)) return 0;
  static const Policy accept_all = gradsync::wire::AcceptAllPolicy();
  gradsync::fuzz::CheckVerdict(msg, gradsync::wire::Validate(msg, accept_all));
  // A narrower endpoint: one job, a few types, tight limits.
  static const Policy narrow = [] {
    Policy p = Policy::Accepting({MsgType::Push, MsgType::Pull, MsgType::Heartbeat});
    p.job_id = 42;
    p.limits.max_payload_bytes = 256;
    p.limits.max_payload_frames = 2;
    p.limits.max_peers = 4;
    p.limits.max_string_bytes = 16;
    return p;
  }();
  gradsync::fuzz::CheckVerdict(msg, gradsync::wire::Validate(msg, narrow));
  return 0;
}
