// fp16 and bf16 compressors: every fp32 element becomes one 16-bit value.
//
// Wire format: n little-endian 16-bit values (2n bytes, no header), element i
// at bytes [2i, 2i + 2). The conversion is common/half.h: round to nearest,
// ties to even, bit-exact and identical on every CPU.
//   "fp16": IEEE half. Relative error <= 2^-11 in the normal range
//           [2^-14, 65504]; below it the absolute error is <= 2^-25
//           (subnormal steps); magnitudes that round above 65504 (any
//           |x| >= 65520) become +-infinity with the sign kept; NaN stays NaN.
//   "bf16": the upper half of the float after rounding. Relative error
//           <= 2^-8 for normal floats; fp32's range, so nothing overflows
//           except values within half a bf16 step of FLT_MAX; NaN stays NaN.
//
// Summable: the element-wise sum of wire buffers (common/half.h AddHalfInto,
// AddBf16Into) decompresses to the sum of the inputs within the format's
// rounding, so the bytes can ride an all-reduce.
//
// Errors: as compressor.h (sizes). Thread-safety: stateless; all methods may
// be called concurrently.
#ifndef GRADSYNC_COMPRESSION_HALF_COMPRESSOR_H_
#define GRADSYNC_COMPRESSION_HALF_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "compression/compressor.h"

namespace gradsync::compression {

enum class HalfFormat { kFp16, kBf16 };

class HalfCompressor : public Compressor {
 public:
  static constexpr char kFp16Name[] = "fp16";
  static constexpr char kBf16Name[] = "bf16";

  explicit HalfCompressor(HalfFormat format) : format_(format) {}

  std::string name() const override;
  bool summable() const override { return true; }
  DType summable_dtype() const override {
    return format_ == HalfFormat::kFp16 ? DType::kF16 : DType::kBF16;
  }
  // 2 * num_elements.
  size_t WireBytes(size_t num_elements) const override;
  Status Compress(const float* in, size_t n, const CompressContext& ctx, uint8_t* out,
                  size_t out_size) override;
  Status Decompress(const uint8_t* in, size_t in_size, size_t n, const CompressContext& ctx,
                    float* out) override;

 private:
  const HalfFormat format_;
};

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_HALF_COMPRESSOR_H_
