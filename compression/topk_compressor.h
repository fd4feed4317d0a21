// Top-k sparsification: only the k = ceil(ratio * n) elements of largest
// magnitude travel, with their indices. Not summable (every rank picks its
// own indices): the buffers are all-gathered and decompressed one by one.
// Meant to be used with error feedback (ErrorFeedback), which carries what
// is dropped into the next step.
//
// Selection: the k elements of largest |x|, ties broken by the lower index;
// NaN counts as larger than infinity. Both methods select exactly this set:
//   kExact:   std::nth_element over all n magnitudes.
//   kSampled: the sampled threshold of Deep Gradient Compression (Lin et
//     al. 2018). It draws m magnitudes (SampleSize: about max(n / 100,
//     640 / ratio)) as runs of 64 at random positions, from an RNG seeded
//     by the CompressContext, takes the one of rank ceil(1.12 * k * m / n) as
//     the threshold and collects every element at or above it (the
//     "candidates", about 1.12 k, within a few percent for m this large).
//     If there are at least k candidates they are truncated to the k
//     largest, which is then exactly the top-k. If there are fewer, the
//     threshold is lowered (the sample rank scaled by 1.12 k / candidates)
//     up to 3 times. It uses kExact when SampleSize is 0 (a sample of at
//     most n / 2 would hold fewer than 400 elements above the threshold:
//     too imprecise), when candidates would exceed 4k + 64 (many equal
//     magnitudes), or after the retries.
//
// Warm-up (deep gradient compression's, Lin et al. 2018): with `warmup`
// W > 0 steps, the ratio of step t < W is r0 (r / r0)^(t / W), r0 =
// max(r, 1/4): from a quarter of the elements down to r, geometrically;
// from step W on it is r. Early steps, when gradients change fastest and
// error feedback has little to carry, then send more. BeginStep(t) sets it;
// before any BeginStep (a receiver's decoder) the ratio is r.
//
// Wire format (no header), with k = ceil(ratio * n) computed in double:
//   k int32 indices, strictly ascending, each < n        (4k bytes)
//   k values, in the same order, fp32 or fp16            (4k or 2k bytes)
// WireBytes(n) = k * (4 + value bytes). fp16 values are rounded to nearest
// even; magnitudes >= 65520 become +-infinity (see half_compressor.h).
// Decompress writes zeros everywhere else.
//
// Errors: as compressor.h; also InvalidArgument for n > 2^31 - 1 (indices
// are int32) and, from Decompress, for indices that are out of range or not
// strictly ascending (nothing is written then). Decompress reads each byte of
// its input once (indices and values are copied, then checked), so it is safe
// on memory another process may write while it runs.
// Thread-safety: one instance per thread (scratch buffers, statistics).
#ifndef GRADSYNC_COMPRESSION_TOPK_COMPRESSOR_H_
#define GRADSYNC_COMPRESSION_TOPK_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "compression/compressor.h"

namespace gradsync::compression {

enum class TopKMethod { kExact, kSampled };
enum class TopKValues { kFp32, kFp16 };

class TopKCompressor : public Compressor, public KeepRatio {
 public:
  static constexpr double kDefaultRatio = 0.01;

  // What the last kSampled Compress did (all zero after a kExact one or one
  // that took a hinted threshold).
  struct SampledStats {
    size_t sample_size = 0;  // m; 0 when it went straight to kExact.
    size_t candidates = 0;   // Elements at or above the final threshold,
                             // before truncation to k.
    int retries = 0;         // Times the threshold was lowered.
    bool fell_back = false;  // Whether kExact chose the result.
  };

  // InvalidArgument unless 0 < ratio <= 1.
  static StatusOr<std::unique_ptr<TopKCompressor>> Create(TopKMethod method, TopKValues values,
                                                          double ratio, uint64_t warmup = 0);
  // The ratio of step `step` under `warmup` (above).
  static double WarmupRatio(double ratio, uint64_t warmup, uint64_t step);

  // "topk", "topk_fp16", "topk_sampled", "topk_sampled_fp16".
  std::string name() const override;
  // The values a top-k family name sends (its "_fp16" suffix).
  static TopKValues ValuesOf(const std::string& name);
  bool summable() const override { return false; }
  // Sets the ratio of the step's calls (warm-up).
  void BeginStep(uint64_t step) override;
  size_t WireBytes(size_t num_elements) const override;
  Status Compress(const float* in, size_t n, const CompressContext& ctx, uint8_t* out,
                  size_t out_size) override;
  Status Decompress(const uint8_t* in, size_t in_size, size_t n, const CompressContext& ctx,
                    float* out) override;
  // Subtracts the k kept values only.
  Status SubtractDecompressed(const uint8_t* in, size_t in_size, size_t n,
                              const CompressContext& ctx, float* out,
                              std::vector<float>* scratch) override;

  // The next selection of k elements may take those whose magnitude key
  // is at least `key`, in one pass, when exactly k are (they are the k
  // largest then); with any other count it selects as usual. 0: no hint.
  // The selection that uses it clears it.
  void HintThreshold(uint32_t key) override { hint_ = key; }

  // k for n elements.
  size_t KeepCount(size_t n) const;
  double ratio() const override { return ratio_; }
  // The ratio of later calls (a sender varying k per call states it in the
  // spec it sends). InvalidArgument unless 0 < ratio <= 1.
  Status SetRatio(double ratio) override;
  KeepRatio* keep_ratio() override { return this; }
  // m, the sample size kSampled draws for n elements: max(n / 100,
  // 640 / ratio), at most n / 2, rounded down to a multiple of 64; 0 (use
  // kExact) if ratio * m < 400, and always 0 for kExact.
  size_t SampleSize(size_t n) const;
  const SampledStats& last_sampled_stats() const { return stats_; }

 private:
  TopKCompressor(TopKMethod method, TopKValues values, double ratio, uint64_t warmup)
      : method_(method), values_(values), base_ratio_(ratio), warmup_(warmup), ratio_(ratio) {}

  size_t ValueBytes() const { return values_ == TopKValues::kFp32 ? 4 : 2; }
  // Fills indices_[0, k) for in[0, n).
  void Select(const float* in, size_t n, size_t k, const CompressContext& ctx);
  void DrawSample(const float* in, size_t n, size_t m, const CompressContext& ctx);
  bool TrySampled(const float* in, size_t n, size_t k, const CompressContext& ctx);
  // Whether exactly k elements reach `key`; they are in indices_ then.
  bool TakeAtLeast(const float* in, size_t n, size_t k, uint32_t key);
  // Copies the k indices of `in` into indices_ (each wire byte read once)
  // and checks them there: ascending, each < n.
  Status CopyIndices(const uint8_t* in, size_t k, size_t n);
  // Checks in[0, in_size) as Decompress does and puts its k indices in
  // indices_ and its k values, as floats, in values_scratch_ (the bytes of
  // `in` are read once); returns k.
  StatusOr<size_t> ReadValues(const uint8_t* in, size_t in_size, size_t n);

  const TopKMethod method_;
  const TopKValues values_;
  const double base_ratio_;  // the spec's
  const uint64_t warmup_;
  double ratio_;
  uint32_t hint_ = 0;  // HintThreshold's
  SampledStats stats_;
  std::vector<uint32_t> indices_;  // Scratch, reused across calls.
  std::vector<uint32_t> keys_;     // Magnitude keys (sample or all).
  std::vector<uint32_t> candidate_keys_;
  std::vector<uint32_t> scratch_;  // Selection scratch.
  std::vector<float> values_scratch_;
};

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_TOPK_COMPRESSOR_H_
