// Scaled sign compression (signSGD with a scale, 1 bit per element).
//
// The elements are cut into chunks of `chunk` elements (the last may be
// shorter). Each chunk sends its scale s = mean |x| over the chunk and one
// sign bit per element; it decodes to x' = -s where the bit is set and +s
// where not. The scale is the mean magnitude because, among all codes
// s * sign(x), it minimises ||x - x'||^2 (the best s is <|x|, 1> / len),
// and it makes ||x'||_1 == ||x||_1 per chunk. Zeros keep their sign bit
// (+0 decodes to +s, -0 to -s). A chunk holding inf or NaN has an inf or
// NaN scale. The code is biased: use it with ErrorFeedback (Karimireddy et
// al. 2019, "Error feedback fixes SignSGD").
//
// Wire format (no header), C = ceil(n / chunk):
//   C fp32 scales, chunk order                          (4C bytes)
//   ceil(n / 8) bytes of sign bits: element i is bit (i % 8) of byte i / 8,
//   1 = negative; unused high bits of the last byte are 0
// WireBytes(n) = 4 * ceil(n / chunk) + ceil(n / 8).
//
// Not summable (sums of sign codes are not sign codes): all-gather.
// Errors: as compressor.h. Every bit pattern decodes, so Decompress only
// checks sizes. Thread-safety: stateless; methods may run concurrently.
#ifndef GRADSYNC_COMPRESSION_SIGN_COMPRESSOR_H_
#define GRADSYNC_COMPRESSION_SIGN_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "compression/compressor.h"

namespace gradsync::compression {

class SignCompressor : public Compressor {
 public:
  static constexpr char kName[] = "sign";
  static constexpr size_t kDefaultChunk = 512;

  // InvalidArgument unless chunk is a positive multiple of 8.
  static StatusOr<std::unique_ptr<SignCompressor>> Create(size_t chunk);

  std::string name() const override { return kName; }
  bool summable() const override { return false; }
  size_t WireBytes(size_t num_elements) const override;
  Status Compress(const float* in, size_t n, const CompressContext& ctx, uint8_t* out,
                  size_t out_size) override;
  Status Decompress(const uint8_t* in, size_t in_size, size_t n, const CompressContext& ctx,
                    float* out) override;

  size_t chunk() const { return chunk_; }

 private:
  explicit SignCompressor(size_t chunk) : chunk_(chunk) {}

  const size_t chunk_;
};

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_SIGN_COMPRESSOR_H_
