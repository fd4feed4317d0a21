// Little-endian byte encoding for the shard's checkpoint and journal files:
// fixed-width integers and float arrays (their IEEE-754 bits).
//
// ByteReader checks the bytes left before every read and never reads past
// its end; a failed read returns false and leaves the value unspecified.
//
// Thread-safety: plain values.
#ifndef GRADSYNC_PS_PS_BYTES_H_
#define GRADSYNC_PS_PS_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "float arrays are copied as little-endian bytes"
#endif

namespace gradsync::server {

class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) U8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void I32(int32_t v) { U32(static_cast<uint32_t>(v)); }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) U8(static_cast<uint8_t>(v >> (8 * i)));
  }
  // The u64s (no count).
  void U64s(const std::vector<uint64_t>& v) {
    for (uint64_t x : v) U64(x);
  }
  // A u64 count, then the floats.
  void Floats(const std::vector<float>& v) {
    U64(v.size());
    if (!v.empty()) out_->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }

 private:
  std::string* out_;
};

class ByteReader {
 public:
  ByteReader(const char* data, size_t size) : p_(data), end_(data + size) {}
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  bool U8(uint8_t* v) {
    if (left() < 1) return false;
    *v = static_cast<uint8_t>(*p_++);
    return true;
  }
  bool U32(uint32_t* v) {
    if (left() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= uint32_t{static_cast<uint8_t>(p_[i])} << (8 * i);
    p_ += 4;
    return true;
  }
  bool I32(int32_t* v) {
    uint32_t u;
    if (!U32(&u)) return false;
    *v = static_cast<int32_t>(u);
    return true;
  }
  bool U64(uint64_t* v) {
    if (left() < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= uint64_t{static_cast<uint8_t>(p_[i])} << (8 * i);
    p_ += 8;
    return true;
  }
  // `n` floats (no count).
  bool FloatsOf(uint64_t n, std::vector<float>* v) {
    if (n > left() / sizeof(float)) return false;
    v->resize(n);
    if (n > 0) std::memcpy(v->data(), p_, n * sizeof(float));
    p_ += n * sizeof(float);
    return true;
  }
  // `n` u64s (no count).
  bool U64sOf(uint64_t n, std::vector<uint64_t>* v) {
    if (n > left() / sizeof(uint64_t)) return false;
    v->resize(n);
    for (uint64_t& x : *v) U64(&x);
    return true;
  }
  // A u64 count, then that many u64s.
  bool U64s(std::vector<uint64_t>* v) {
    uint64_t n;
    return U64(&n) && U64sOf(n, v);
  }
  // What ByteWriter::Floats wrote.
  bool Floats(std::vector<float>* v) {
    uint64_t n;
    return U64(&n) && FloatsOf(n, v);
  }
  // A u32 count of entries that each need at least `min_bytes`.
  bool Count(uint32_t* n, size_t min_bytes) { return U32(n) && *n <= left() / min_bytes; }

 private:
  const char* p_;
  const char* end_;
};

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_PS_BYTES_H_
