// Small helpers shared by the compressors: buffer-size checks that produce
// the errors promised by compressor.h, unaligned loads and stores for wire
// bytes, and the keep-count rule of the sparsifiers.
//
// Internal to compression/; not part of the public interface.
#ifndef GRADSYNC_COMPRESSION_WIRE_UTIL_H_
#define GRADSYNC_COMPRESSION_WIRE_UTIL_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/status.h"

namespace gradsync::compression {

inline size_t CeilDiv(size_t a, size_t b) { return a / b + (a % b != 0); }

// InvalidArgument unless `have` >= `need` bytes for compressing n elements.
inline Status CheckOutSize(const std::string& name, size_t n, size_t need, size_t have) {
  if (have >= need) return OkStatus();
  return InvalidArgumentError(name + ": compressing " + std::to_string(n) + " elements needs " +
                              std::to_string(need) + " bytes, output buffer has " +
                              std::to_string(have));
}

// InvalidArgument unless the wire holds exactly `need` bytes for n elements.
inline Status CheckInSize(const std::string& name, size_t n, size_t need, size_t have) {
  if (have == need) return OkStatus();
  return InvalidArgumentError(name + ": decompressing " + std::to_string(n) + " elements expects " +
                              std::to_string(need) + " bytes, got " + std::to_string(have));
}

// InvalidArgument if n exceeds `max_n` (a compressor's own element limit).
inline Status CheckCount(const std::string& name, size_t n, size_t max_n) {
  if (n <= max_n) return OkStatus();
  return InvalidArgumentError(name + ": " + std::to_string(n) + " elements exceed the limit of " +
                              std::to_string(max_n));
}

template <typename T>
inline T LoadAt(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
inline void StoreAt(uint8_t* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

// Number of elements a sparsifier keeps out of n: ceil(ratio * n) computed
// in double, clamped to [0, n]. `ratio` must be in (0, 1].
inline size_t KeepCount(double ratio, size_t n) {
  const double k = std::ceil(ratio * static_cast<double>(n));
  if (!(k > 0)) return 0;
  if (k >= static_cast<double>(n)) return n;
  return static_cast<size_t>(k);
}

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_WIRE_UTIL_H_
