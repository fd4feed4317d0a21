#include "compression/randomk_compressor.h"

#include <algorithm>
#include <cstring>

#include "compression/seeded_rng.h"
#include "compression/wire_util.h"

namespace gradsync::compression {
namespace {

constexpr size_t kMaxElements = 0xFFFFFFFFu;  // Indices are uint32.

bool SameContext(const CompressContext& a, const CompressContext& b) {
  return a.seed == b.seed && a.step == b.step && a.bucket_id == b.bucket_id;
}

}  // namespace

StatusOr<std::unique_ptr<RandomKCompressor>> RandomKCompressor::Create(double ratio,
                                                                       bool unbiased) {
  if (!(ratio > 0.0 && ratio <= 1.0)) {
    return InvalidArgumentError("randomk: ratio must be in (0, 1], got " + std::to_string(ratio));
  }
  return std::unique_ptr<RandomKCompressor>(new RandomKCompressor(ratio, unbiased));
}

size_t RandomKCompressor::KeepCount(size_t n) const { return compression::KeepCount(ratio_, n); }

size_t RandomKCompressor::WireBytes(size_t num_elements) const {
  return sizeof(float) * KeepCount(num_elements);
}

const std::vector<uint32_t>& RandomKCompressor::Indices(const CompressContext& ctx, size_t n) {
  if (cached_ && cached_n_ == n && SameContext(cached_ctx_, ctx)) {
    return indices_;
  }
  const size_t k = KeepCount(n);
  bitmap_.assign(CeilDiv(n, 64), 0);
  Xoshiro256 rng(StreamKey(ctx, kRandomKSalt));
  // Floyd: for j = n-k .. n-1 add a uniform t <= j, or j if t is taken.
  for (size_t j = n - k; j < n; ++j) {
    const uint64_t t = rng.Below(j + 1);
    uint64_t& word = bitmap_[t / 64];
    const uint64_t bit = uint64_t{1} << (t % 64);
    if (word & bit) {
      bitmap_[j / 64] |= uint64_t{1} << (j % 64);
    } else {
      word |= bit;
    }
  }
  indices_.clear();
  indices_.reserve(k);
  for (size_t w = 0; w < bitmap_.size(); ++w) {
    for (uint64_t bits = bitmap_[w]; bits != 0; bits &= bits - 1) {
      indices_.push_back(static_cast<uint32_t>(64 * w + __builtin_ctzll(bits)));
    }
  }
  cached_ = true;
  cached_ctx_ = ctx;
  cached_n_ = n;
  return indices_;
}

Status RandomKCompressor::Compress(const float* in, size_t n, const CompressContext& ctx,
                                   uint8_t* out, size_t out_size) {
  GS_RETURN_IF_ERROR(CheckCount(kName, n, kMaxElements));
  GS_RETURN_IF_ERROR(CheckOutSize(kName, n, WireBytes(n), out_size));
  const std::vector<uint32_t>& idx = Indices(ctx, n);
  for (size_t j = 0; j < idx.size(); ++j) StoreAt<float>(out, j, in[idx[j]]);
  return OkStatus();
}

Status RandomKCompressor::Decompress(const uint8_t* in, size_t in_size, size_t n,
                                     const CompressContext& ctx, float* out) {
  GS_RETURN_IF_ERROR(CheckCount(kName, n, kMaxElements));
  GS_RETURN_IF_ERROR(CheckInSize(kName, n, WireBytes(n), in_size));
  const std::vector<uint32_t>& idx = Indices(ctx, n);
  if (n > 0) std::memset(out, 0, n * sizeof(float));
  const float scale =
      unbiased_ ? static_cast<float>(static_cast<double>(n) / static_cast<double>(idx.size()))
                : 1.0f;
  for (size_t j = 0; j < idx.size(); ++j) {
    out[idx[j]] = LoadAt<float>(in, j) * scale;
  }
  return OkStatus();
}

}  // namespace gradsync::compression
