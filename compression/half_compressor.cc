#include "compression/half_compressor.h"

#include <limits>

#include "common/half.h"
#include "compression/wire_util.h"

namespace gradsync::compression {
namespace {

constexpr size_t kMaxElements = std::numeric_limits<size_t>::max() / 4;

}  // namespace

std::string HalfCompressor::name() const {
  return format_ == HalfFormat::kFp16 ? kFp16Name : kBf16Name;
}

size_t HalfCompressor::WireBytes(size_t num_elements) const {
  return num_elements * sizeof(uint16_t);
}

Status HalfCompressor::Compress(const float* in, size_t n, const CompressContext& /*ctx*/,
                                uint8_t* out, size_t out_size) {
  GS_RETURN_IF_ERROR(CheckCount(name(), n, kMaxElements));
  GS_RETURN_IF_ERROR(CheckOutSize(name(), n, WireBytes(n), out_size));
  if (format_ == HalfFormat::kFp16) {
    FloatToHalf(in, out, n);
  } else {
    FloatToBf16(in, out, n);
  }
  return OkStatus();
}

Status HalfCompressor::Decompress(const uint8_t* in, size_t in_size, size_t n,
                                  const CompressContext& /*ctx*/, float* out) {
  GS_RETURN_IF_ERROR(CheckCount(name(), n, kMaxElements));
  GS_RETURN_IF_ERROR(CheckInSize(name(), n, WireBytes(n), in_size));
  if (format_ == HalfFormat::kFp16) {
    HalfToFloat(in, out, n);
  } else {
    Bf16ToFloat(in, out, n);
  }
  return OkStatus();
}

}  // namespace gradsync::compression
