#include "compression/none_compressor.h"

#include <cstring>
#include <limits>
#include <string>

namespace gradsync::compression {
namespace {

constexpr size_t kMaxElements = std::numeric_limits<size_t>::max() / sizeof(float);

Status CheckCount(size_t n) {
  if (n <= kMaxElements) return OkStatus();
  return InvalidArgumentError("none: " + std::to_string(n) + " elements overflow the byte count");
}

}  // namespace

size_t NoneCompressor::WireBytes(size_t num_elements) const { return num_elements * sizeof(float); }

Status NoneCompressor::Compress(const float* in, size_t n, const CompressContext& /*ctx*/,
                                uint8_t* out, size_t out_size) {
  GS_RETURN_IF_ERROR(CheckCount(n));
  const size_t bytes = WireBytes(n);
  if (out_size < bytes) {
    return InvalidArgumentError("none: compressing " + std::to_string(n) + " elements needs " +
                                std::to_string(bytes) + " bytes, output buffer has " +
                                std::to_string(out_size));
  }
  if (bytes > 0) std::memcpy(out, in, bytes);
  return OkStatus();
}

Status NoneCompressor::Decompress(const uint8_t* in, size_t in_size, size_t n,
                                  const CompressContext& /*ctx*/, float* out) {
  GS_RETURN_IF_ERROR(CheckCount(n));
  const size_t bytes = WireBytes(n);
  if (in_size != bytes) {
    return InvalidArgumentError("none: decompressing " + std::to_string(n) + " elements expects " +
                                std::to_string(bytes) + " bytes, got " + std::to_string(in_size));
  }
  if (bytes > 0) std::memcpy(out, in, bytes);
  return OkStatus();
}

}  // namespace gradsync::compression
