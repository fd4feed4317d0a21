// Random-k sparsification with a shared seed.
//
// Keeps k = ceil(ratio * n) elements whose indices are a uniformly random
// k-subset of [0, n) drawn from (seed, step, bucket_id) of the context, so
// every rank with the same context picks the same indices and no index
// travels. Decompress scales the kept values by n / k and writes zeros
// elsewhere, which makes the estimator unbiased: E[decoded_i] = x_i (each
// index is kept with probability k / n). Its variance is (n / k - 1) x_i^2
// per element: use it with ErrorFeedback or a small n / k.
//
// Summable: with equal contexts the indices agree, so the element-wise sum
// of wire buffers is the wire buffer of the sum.
//
// The subset is drawn by Floyd's algorithm (k draws, exact uniform) into a
// bitmap; the indices are cached for the last (context, n), so Compress and
// Decompress of the same bucket draw once.
//
// Wire format (no header): k fp32 values x_i, unscaled, in ascending index
// order. WireBytes(n) = 4 * ceil(ratio * n), computed in double.
//
// Errors: as compressor.h; InvalidArgument for n > 2^32 - 1.
// Thread-safety: one instance per thread (the index cache).
#ifndef GRADSYNC_COMPRESSION_RANDOMK_COMPRESSOR_H_
#define GRADSYNC_COMPRESSION_RANDOMK_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "compression/compressor.h"

namespace gradsync::compression {

class RandomKCompressor : public Compressor {
 public:
  static constexpr char kName[] = "randomk";
  static constexpr double kDefaultRatio = 0.01;

  // InvalidArgument unless 0 < ratio <= 1.
  static StatusOr<std::unique_ptr<RandomKCompressor>> Create(double ratio, bool unbiased = true);

  std::string name() const override { return kName; }
  bool summable() const override { return true; }
  size_t WireBytes(size_t num_elements) const override;
  Status Compress(const float* in, size_t n, const CompressContext& ctx, uint8_t* out,
                  size_t out_size) override;
  Status Decompress(const uint8_t* in, size_t in_size, size_t n, const CompressContext& ctx,
                    float* out) override;

  size_t KeepCount(size_t n) const;
  // The indices the context selects out of n, ascending (valid until the
  // next call on this instance).
  const std::vector<uint32_t>& Indices(const CompressContext& ctx, size_t n);

 private:
  RandomKCompressor(double ratio, bool unbiased) : ratio_(ratio), unbiased_(unbiased) {}

  const double ratio_;
  const bool unbiased_;
  // Cache of the last Indices() call.
  bool cached_ = false;
  CompressContext cached_ctx_;
  size_t cached_n_ = 0;
  std::vector<uint32_t> indices_;
  std::vector<uint64_t> bitmap_;
};

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_RANDOMK_COMPRESSOR_H_
