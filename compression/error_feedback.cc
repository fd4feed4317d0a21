#include "compression/error_feedback.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <utility>

namespace gradsync::compression {
namespace {

// Separate loops over plain arrays, so the compiler vectorises them.
// A NaN sum becomes the canonical quiet NaN, as on the GPU
// (kernels/compress_math.h: Corrected), so both put the same bits on the wire.
void Add(const float* a, const float* b, float* out, size_t n) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 0; i < n; ++i) {
    const float c = a[i] + b[i];
    out[i] = c == c ? c : nan;
  }
}

// Whether no value is an infinity or a NaN (exponent bits all ones).
bool AllFinite(const float* a, size_t n) {
  uint32_t any = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, a + i, sizeof(bits));
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return any == 0;
}

}  // namespace

ErrorFeedback::ErrorFeedback(std::unique_ptr<Compressor> inner, float momentum)
    : inner_(std::move(inner)), momentum_(momentum) {
  if (inner_ == nullptr || !(momentum >= 0 && momentum < 1)) {
    std::cerr << "ErrorFeedback: the wrapped compressor is null or the momentum is outside [0, 1)"
              << std::endl;
    std::abort();  // Programmer error.
  }
}

void ErrorFeedback::Velocity(const float* in, size_t n, uint32_t bucket_id, float* out) const {
  auto it = velocities_.find(bucket_id);
  if (momentum_ == 0 || it == velocities_.end() || it->second.size() != n) {
    if (out != in) std::copy(in, in + n, out);
    return;
  }
  const float* u = it->second.data();
  for (size_t i = 0; i < n; ++i) out[i] = momentum_ * u[i] + in[i];
}

void ErrorFeedback::KeepMaskedVelocity(size_t n, const std::vector<float>* old_residual,
                                       uint32_t bucket_id) {
  const bool has_old = old_residual != nullptr && old_residual->size() == n;
  for (size_t i = 0; i < n; ++i) {
    const float c = has_old ? velocity_[i] + (*old_residual)[i] : velocity_[i];
    if (corrected_[i] != c) velocity_[i] = 0.0f;
  }
  std::vector<float>& u = velocities_[bucket_id];
  if (u.capacity() == velocity_.capacity()) {
    u.swap(velocity_);
  } else {
    u.assign(velocity_.begin(), velocity_.end());
  }
}

void ErrorFeedback::AddResidual(const float* in, size_t n, const std::vector<float>* residual,
                                float* out) {
  if (residual != nullptr && residual->size() == n) {
    Add(in, residual->data(), out, n);
  } else if (out != in && n > 0) {
    std::copy(in, in + n, out);  // New or resized bucket.
  }
}

const float* ErrorFeedback::CompressedValues(const float* in, size_t n, uint32_t bucket_id,
                                             std::vector<float>* scratch) const {
  scratch->resize(n);
  if (momentum_ > 0 && AllFinite(in, n)) {
    Velocity(in, n, bucket_id, scratch->data());
    in = scratch->data();
  }
  AddResidual(in, n, Residual(bucket_id), scratch->data());
  return scratch->data();
}

Status ErrorFeedback::Compress(const float* in, size_t n, const CompressContext& ctx, uint8_t* out,
                               size_t out_size) {
  // With a momentum, a finite g goes in as m u + g (u is kept below).
  const bool finite = AllFinite(in, n);
  const bool with_velocity = momentum_ > 0 && finite;
  if (with_velocity) {
    velocity_.resize(n);
    Velocity(in, n, ctx.bucket_id, velocity_.data());
    in = velocity_.data();
  }
  auto it = residuals_.find(ctx.bucket_id);
  corrected_.resize(n);
  AddResidual(in, n, it == residuals_.end() ? nullptr : &it->second, corrected_.data());
  GS_RETURN_IF_ERROR(inner_->Compress(corrected_.data(), n, ctx, out, out_size));
  // A gradient with inf or NaN (an overflowed step, which the trainer
  // skips) goes out as it is, so every rank sees the overflow, but leaves
  // the residual as it was: it would carry the inf or NaN into every later
  // step.
  if (!finite) return OkStatus();
  // e_new = c - Decompress(Compress(c)), made in corrected_ and handed to
  // the bucket: buffers of the same capacity are traded (no copy), others
  // copied, so that no buffer moves to a bucket of another size (which
  // would reallocate, or grow every residual to the largest bucket's).
  GS_RETURN_IF_ERROR(inner_->SubtractDecompressed(out, inner_->WireBytes(n), n, ctx,
                                                  corrected_.data(), &scratch_));
  if (with_velocity) {
    KeepMaskedVelocity(n, it == residuals_.end() ? nullptr : &it->second, ctx.bucket_id);
  }
  std::vector<float>& residual = residuals_[ctx.bucket_id];
  if (residual.capacity() == corrected_.capacity()) {
    residual.swap(corrected_);
  } else {
    residual.assign(corrected_.begin(), corrected_.end());
  }
  return OkStatus();
}

Status ErrorFeedback::Decompress(const uint8_t* in, size_t in_size, size_t n,
                                 const CompressContext& ctx, float* out) {
  return inner_->Decompress(in, in_size, n, ctx, out);
}

const std::vector<float>* ErrorFeedback::Residual(uint32_t bucket_id) const {
  auto it = residuals_.find(bucket_id);
  return it == residuals_.end() ? nullptr : &it->second;
}

}  // namespace gradsync::compression
