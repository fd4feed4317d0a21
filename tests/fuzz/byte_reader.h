// A fuzzer input read as a sequence of bytes and little-endian words; past
// its end every read gives zeros. Shared by the operation-sequence fuzzers
// (shm_link_fuzzer.cc, host_collectives_fuzzer.cc).
#ifndef GRADSYNC_TESTS_FUZZ_BYTE_READER_H_
#define GRADSYNC_TESTS_FUZZ_BYTE_READER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace gradsync::fuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint64_t Word(size_t bytes) {
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; ++i) v |= uint64_t{Byte()} << (8 * i);
    return v;
  }
  // Up to `n` bytes of the input (fewer at its end).
  const uint8_t* Take(size_t* n) {
    *n = std::min(*n, size_ - std::min(at_, size_));
    const uint8_t* p = data_ + std::min(at_, size_);
    at_ += *n;
    return p;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

}  // namespace gradsync::fuzz

#endif  // GRADSYNC_TESTS_FUZZ_BYTE_READER_H_
