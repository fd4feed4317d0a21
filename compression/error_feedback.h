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
// With a momentum m > 0 (deep gradient compression's momentum correction
// and momentum factor masking, Lin et al. 2018), it also keeps a velocity u
// per bucket_id: Compress(g) first sets u = m u + g and then compresses
// c = u + e_old as above; wherever the output carries an element (it was
// sent: e_new differs from c there), that element of u is reset to zero, so
// a sent coordinate's momentum does not push it again. The outputs then
// follow momentum SGD's velocity rather than the gradient: the trainer takes
// plain SGD steps with their average (momentum 0 in its optimizer). Meant
// for the sparse compressors (the registry allows it with topk and randomk
// only). A gradient with an inf or NaN leaves u as it was. Velocity() shows
// m u + g for callers that choose elements ahead of Compress.
//
// The wire format, WireBytes, summable() and name() are the wrapped
// compressor's: receivers decompress with a plain instance of it.
// Decompress forwards to the wrapped compressor and never touches a residual.
//
// Errors: the wrapped compressor's; on an error the residual and the
// velocity are unchanged.
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
  // `inner` must not be null; `momentum` in [0, 1) (0: plain error feedback).
  explicit ErrorFeedback(std::unique_ptr<Compressor> inner, float momentum = 0);

  std::string name() const override { return inner_->name(); }
  bool summable() const override { return inner_->summable(); }
  DType summable_dtype() const override { return inner_->summable_dtype(); }
  void BeginStep(uint64_t step) override { inner_->BeginStep(step); }
  size_t WireBytes(size_t num_elements) const override { return inner_->WireBytes(num_elements); }
  Status Compress(const float* in, size_t n, const CompressContext& ctx, uint8_t* out,
                  size_t out_size) override;
  Status Decompress(const uint8_t* in, size_t in_size, size_t n, const CompressContext& ctx,
                    float* out) override;
  KeepRatio* keep_ratio() override { return inner_->keep_ratio(); }
  // c = (m u + g) + e_old, as Compress forms it (g alone without a
  // residual; without the velocity for a gradient with inf or NaN).
  const float* CompressedValues(const float* in, size_t n, uint32_t bucket_id,
                                std::vector<float>* scratch) const override;

  // The residual of `bucket_id`, or null before its first Compress. The
  // pointer is valid until the next Compress or ClearResiduals.
  const std::vector<float>* Residual(uint32_t bucket_id) const;
  // The vector Compress(g) would compress before the residual is added:
  // m u + g with a momentum, g without, into `out` (n elements; `in` and
  // `out` may be the same). Changes nothing.
  void Velocity(const float* in, size_t n, uint32_t bucket_id, float* out) const;
  // Forgets every residual and velocity (e.g. after the model was reloaded).
  void ClearResiduals() {
    residuals_.clear();
    velocities_.clear();
  }

  float momentum() const { return momentum_; }
  Compressor& inner() { return *inner_; }

 private:
  // Keeps velocity_ (m u + g) as the bucket's u, zeroed where the element
  // was sent: where the new residual in corrected_ differs from u + e_old.
  void KeepMaskedVelocity(size_t n, const std::vector<float>* old_residual, uint32_t bucket_id);
  // out = in + residual (in itself without one, or for a resized bucket);
  // `in` may be `out`.
  static void AddResidual(const float* in, size_t n, const std::vector<float>* residual,
                          float* out);

  std::unique_ptr<Compressor> inner_;
  const float momentum_;
  std::unordered_map<uint32_t, std::vector<float>> residuals_;
  std::unordered_map<uint32_t, std::vector<float>> velocities_;
  std::vector<float> corrected_;  // g + e_old, reused across calls.
  std::vector<float> scratch_;    // the inner compressor's SubtractDecompressed
  std::vector<float> velocity_;   // m u + g, reused across calls.
};

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_ERROR_FEEDBACK_H_
