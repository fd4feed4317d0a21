#include "compression/sign_compressor.h"

#include <algorithm>
#include <limits>

#include "compression/quantize_kernels.h"
#include "compression/wire_util.h"

namespace gradsync::compression {
namespace {

constexpr size_t kMaxElements = std::numeric_limits<size_t>::max() / 8;

}  // namespace

StatusOr<std::unique_ptr<SignCompressor>> SignCompressor::Create(size_t chunk) {
  if (chunk == 0 || chunk % 8 != 0) {
    return InvalidArgumentError("sign: chunk must be a positive multiple of 8, got " +
                                std::to_string(chunk));
  }
  return std::unique_ptr<SignCompressor>(new SignCompressor(chunk));
}

size_t SignCompressor::WireBytes(size_t num_elements) const {
  return 4 * CeilDiv(num_elements, chunk_) + CeilDiv(num_elements, 8);
}

Status SignCompressor::Compress(const float* in, size_t n, const CompressContext& /*ctx*/,
                                uint8_t* out, size_t out_size) {
  GS_RETURN_IF_ERROR(CheckCount(kName, n, kMaxElements));
  GS_RETURN_IF_ERROR(CheckOutSize(kName, n, WireBytes(n), out_size));
  const size_t chunks = CeilDiv(n, chunk_);
  uint8_t* bits = out + 4 * chunks;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t first = c * chunk_;
    const size_t len = std::min(chunk_, n - first);
    StoreAt<float>(out, c, SignEncodeChunk(in + first, len, bits + first / 8));
  }
  return OkStatus();
}

Status SignCompressor::Decompress(const uint8_t* in, size_t in_size, size_t n,
                                  const CompressContext& /*ctx*/, float* out) {
  GS_RETURN_IF_ERROR(CheckCount(kName, n, kMaxElements));
  GS_RETURN_IF_ERROR(CheckInSize(kName, n, WireBytes(n), in_size));
  const size_t chunks = CeilDiv(n, chunk_);
  const uint8_t* bits = in + 4 * chunks;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t first = c * chunk_;
    const size_t len = std::min(chunk_, n - first);
    SignDecodeChunk(bits + first / 8, len, LoadAt<float>(in, c), out + first);
  }
  return OkStatus();
}

}  // namespace gradsync::compression
