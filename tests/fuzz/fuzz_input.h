// The input format of the header fuzzer (header_fuzzer.cc), shared with the
// seed writer (make_seeds.cc):
//
//   byte 0        low two bits: n, the number of payload frames (0..3)
//   2 * n bytes   each frame's length, uint16 little-endian
//   the rest      the header frame, then the n payload frames
//
// Frame lengths longer than what is left are cut short, so every input
// decodes (except ones too short to hold the lengths).
//
// Thread-safety: pure functions.
#ifndef GRADSYNC_TESTS_FUZZ_FUZZ_INPUT_H_
#define GRADSYNC_TESTS_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "wire/message.h"

namespace gradsync::fuzz {

constexpr size_t kMaxFuzzFrames = 3;

// Splits a fuzzer input into a message; false when it is too short. Every
// frame is copied into storage of exactly its size, so that a read past its
// end is caught by AddressSanitizer.
inline bool DecodeFuzzInput(const uint8_t* data, size_t size, wire::Message* msg) {
  if (size < 1) return false;
  const size_t n = data[0] & 3;
  const size_t prefix = 1 + 2 * n;
  if (size < prefix) return false;
  const uint8_t* rest = data + prefix;
  const size_t rest_size = size - prefix;
  std::vector<size_t> lengths(n);
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t want = data[1 + 2 * i] | (size_t{data[2 + 2 * i]} << 8);
    lengths[i] = std::min(want, rest_size - total);
    total += lengths[i];
  }
  const size_t header_size = rest_size - total;
  msg->header.assign(rest, rest + header_size);
  msg->payloads.clear();
  size_t offset = header_size;
  for (size_t len : lengths) {
    msg->payloads.push_back(wire::Payload::Copy(rest + offset, len));
    offset += len;
  }
  return true;
}

// The input that decodes into `msg`; false if it has more than
// kMaxFuzzFrames payload frames or one longer than 65535 bytes.
inline bool EncodeFuzzInput(const wire::Message& msg, std::vector<uint8_t>* out) {
  if (msg.payloads.size() > kMaxFuzzFrames) return false;
  out->clear();
  out->push_back(static_cast<uint8_t>(msg.payloads.size()));
  for (const wire::Payload& p : msg.payloads) {
    if (p.size > 0xffff) return false;
    out->push_back(static_cast<uint8_t>(p.size & 0xff));
    out->push_back(static_cast<uint8_t>(p.size >> 8));
  }
  out->insert(out->end(), msg.header.begin(), msg.header.end());
  for (const wire::Payload& p : msg.payloads) out->insert(out->end(), p.data, p.data + p.size);
  return true;
}

}  // namespace gradsync::fuzz

#endif  // GRADSYNC_TESTS_FUZZ_FUZZ_INPUT_H_
