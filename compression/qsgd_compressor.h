// QSGD stochastic quantisation (Alistarh et al. 2017) to signed 8-bit
// levels.
//
// The elements are cut into chunks of `chunk` elements (the last may be
// shorter). Each chunk sends its norm M = max |x| (the max norm, not the L2
// norm of the paper: it never overflows, needs no reduction order, and uses
// the levels better) and one int8 q per element: with r = |x| * s / M,
// |q| = floor(r) + 1 with probability r - floor(r), else floor(r), and q
// has the sign of x. It decodes to q * (M / s): every decoded value lies on
// the grid {k * M / s : k = -s..s} and E[decoded] = x (up to float rounding
// and the 2^-24 resolution of the random numbers). The variance per chunk
// of length d satisfies the paper's Lemma 3.1 bound, E||Q(x) - x||^2 <=
// min(d / s^2, sqrt(d) / s) ||x||^2, as it does for the L2 norm (each
// element's variance is at most (M / s) |x_i| and at most (M / s)^2 / 4).
//
// The random numbers come from (seed, step, bucket_id) of the context and
// the element index, so compressing the same input with the same context is
// deterministic on every CPU. A chunk of zeros sends M = 0 and q = 0; a
// chunk holding inf or NaN sends that M and q = 0 and decodes to NaN.
//
// Wire format (no header), C = ceil(n / chunk):
//   C fp32 norms M, chunk order                          (4C bytes)
//   n int8 levels q in [-s, s], element order            (n bytes)
// WireBytes(n) = 4 * ceil(n / chunk) + n.
//
// Not summable: all-gather. Errors: as compressor.h; Decompress also
// returns InvalidArgument (writing nothing) if some |q| > s.
// Thread-safety: stateless; methods may run concurrently.
#ifndef GRADSYNC_COMPRESSION_QSGD_COMPRESSOR_H_
#define GRADSYNC_COMPRESSION_QSGD_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "compression/compressor.h"

namespace gradsync::compression {

class QsgdCompressor : public Compressor {
 public:
  static constexpr char kName[] = "qsgd";
  static constexpr size_t kDefaultChunk = 512;
  static constexpr int kDefaultLevels = 127;

  // InvalidArgument unless chunk is a positive multiple of 8 and
  // 1 <= levels <= 127.
  static StatusOr<std::unique_ptr<QsgdCompressor>> Create(size_t chunk, int levels);

  std::string name() const override { return kName; }
  bool summable() const override { return false; }
  size_t WireBytes(size_t num_elements) const override;
  Status Compress(const float* in, size_t n, const CompressContext& ctx, uint8_t* out,
                  size_t out_size) override;
  Status Decompress(const uint8_t* in, size_t in_size, size_t n, const CompressContext& ctx,
                    float* out) override;

  size_t chunk() const { return chunk_; }
  int levels() const { return levels_; }

 private:
  QsgdCompressor(size_t chunk, int levels) : chunk_(chunk), levels_(levels) {}

  // Encodes one chunk whose max magnitude is `norm`.
  void EncodeChunk(const float* x, size_t len, float norm, uint64_t key, uint32_t first, int8_t* q);

  const size_t chunk_;
  const int levels_;
};

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_QSGD_COMPRESSOR_H_
