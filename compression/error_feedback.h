// ErrorFeedback: a decorator that adds error feedback (EF-SGD, Karimireddy et
// al. 2019) to any Compressor.
//
// It keeps one fp32 residual e per bucket_id. Compress(g) compresses
// c = g + e_old (one float addition per element) with the wrapped compressor
// and sets e_new = c - Decompress(Compress(c)), so whatever the compressor
// drops is added back into the next step of the same bucket. A bucket's
// residual starts at zero and is reset to zero when the bucket's element
// count changes. The sum over steps of the decompressed outputs plus the
// final residual equals the sum of the inputs, up to float rounding.
//
// The wire format, WireBytes, summable() and name() are the wrapped
// compressor's: receivers decompress with a plain instance of it.
// Decompress forwards to the wrapped compressor and never touches a residual.
//
// Errors: the wrapped compressor's; on an error the residual is unchanged.
// Thread-safety: like any Compressor, one instance per thread. Ownership:
// owns the wrapped compressor.
#ifndef GRADSYNC_COMPRESSION_ERROR_FEEDBACK_H_
#define GRADSYNC_COMPRESSION_ERROR_FEEDBACK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "compression/compressor.h"

namespace gradsync::compression {

class ErrorFeedback : public Compressor {
 public:
  // `inner` must not be null.
  explicit ErrorFeedback(std::unique_ptr<Compressor> inner);

  std::string name() const override { return inner_->name(); }
  bool summable() const override { return inner_->summable(); }
  DType summable_dtype() const override { return inner_->summable_dtype(); }
  size_t WireBytes(size_t num_elements) const override {
    return inner_->WireBytes(num_elements);
  }
  Status Compress(const float* in, size_t n, const CompressContext& ctx,
                  uint8_t* out, size_t out_size) override;
  Status Decompress(const uint8_t* in, size_t in_size, size_t n,
                    const CompressContext& ctx, float* out) override;

  // The residual of `bucket_id`, or null before its first Compress. The
  // pointer is valid until the next Compress or ClearResiduals.
  const std::vector<float>* Residual(uint32_t bucket_id) const;
  // Forgets every residual (e.g. after the model was reloaded).
  void ClearResiduals() { residuals_.clear(); }

  Compressor& inner() { return *inner_; }

 private:
  std::unique_ptr<Compressor> inner_;
  std::unordered_map<uint32_t, std::vector<float>> residuals_;
  std::vector<float> corrected_;  // g + e_old, reused across calls.
  std::vector<float> scratch_;    // the inner compressor's SubtractDecompressed
};

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_ERROR_FEEDBACK_H_
