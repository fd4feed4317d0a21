#include "compression/qsgd_compressor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "compression/quantize_kernels.h"
#include "compression/seeded_rng.h"
#include "compression/wire_util.h"

namespace gradsync::compression {
namespace {

constexpr size_t kMaxElements = std::numeric_limits<size_t>::max() / 8;
constexpr float kTwoTo64 = 18446744073709551616.0f;

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

StatusOr<std::unique_ptr<QsgdCompressor>> QsgdCompressor::Create(size_t chunk, int levels) {
  if (chunk == 0 || chunk % 8 != 0) {
    return InvalidArgumentError("qsgd: chunk must be a positive multiple of 8, got " +
                                std::to_string(chunk));
  }
  if (levels < 1 || levels > 127) {
    return InvalidArgumentError("qsgd: levels must be in [1, 127], got " + std::to_string(levels));
  }
  return std::unique_ptr<QsgdCompressor>(new QsgdCompressor(chunk, levels));
}

size_t QsgdCompressor::WireBytes(size_t num_elements) const {
  return 4 * CeilDiv(num_elements, chunk_) + num_elements;
}

void QsgdCompressor::EncodeChunk(const float* x, size_t len, float norm, uint64_t key,
                                 uint32_t first, int8_t* q) {
  if (!(norm > 0.0f) || std::isinf(norm)) {  // Zero, inf or NaN.
    std::memset(q, 0, len);
    return;
  }
  const float inv = static_cast<float>(levels_) / norm;
  if (std::isfinite(inv)) {
    QsgdEncodeChunk(x, len, inv, levels_, key, first, q);
    return;
  }
  // norm is so small that s / norm overflows: scale the chunk by 2^64
  // (exact for such tiny values) and quantise that instead.
  std::vector<float> scaled(x, x + len);
  for (float& v : scaled) v *= kTwoTo64;
  QsgdEncodeChunk(scaled.data(), len, static_cast<float>(levels_) / (norm * kTwoTo64), levels_, key,
                  first, q);
}

Status QsgdCompressor::Compress(const float* in, size_t n, const CompressContext& ctx, uint8_t* out,
                                size_t out_size) {
  GS_RETURN_IF_ERROR(CheckCount(kName, n, kMaxElements));
  GS_RETURN_IF_ERROR(CheckOutSize(kName, n, WireBytes(n), out_size));
  const uint64_t key = StreamKey(ctx, kQsgdSalt);
  const size_t chunks = CeilDiv(n, chunk_);
  int8_t* levels = reinterpret_cast<int8_t*>(out + 4 * chunks);
  for (size_t c = 0; c < chunks; ++c) {
    const size_t first = c * chunk_;
    const size_t len = std::min(chunk_, n - first);
    const float norm = FromBits(MaxMagnitudeKey(in + first, len));
    StoreAt<float>(out, c, norm);
    EncodeChunk(in + first, len, norm, key, static_cast<uint32_t>(first), levels + first);
  }
  return OkStatus();
}

Status QsgdCompressor::Decompress(const uint8_t* in, size_t in_size, size_t n,
                                  const CompressContext& /*ctx*/, float* out) {
  GS_RETURN_IF_ERROR(CheckCount(kName, n, kMaxElements));
  GS_RETURN_IF_ERROR(CheckInSize(kName, n, WireBytes(n), in_size));
  const size_t chunks = CeilDiv(n, chunk_);
  const int8_t* levels = reinterpret_cast<const int8_t*>(in + 4 * chunks);
  const int max_level = MaxAbsLevel(levels, n);
  if (max_level > levels_) {
    return InvalidArgumentError("qsgd: level " + std::to_string(max_level) + " is outside [-" +
                                std::to_string(levels_) + ", " + std::to_string(levels_) + "]");
  }
  const float s = static_cast<float>(levels_);
  for (size_t c = 0; c < chunks; ++c) {
    const size_t first = c * chunk_;
    const size_t len = std::min(chunk_, n - first);
    const float norm = LoadAt<float>(in, c);
    // A non-finite norm decodes to NaN even where q = 0.
    const float step = std::isfinite(norm) ? norm / s : std::nanf("");
    QsgdDecodeChunk(levels + first, len, step, out + first);
  }
  return OkStatus();
}

}  // namespace gradsync::compression
