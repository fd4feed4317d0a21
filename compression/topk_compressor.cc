#include "compression/topk_compressor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "common/half.h"
#include "compression/seeded_rng.h"
#include "compression/topk_select.h"
#include "compression/wire_util.h"

namespace gradsync::compression {
namespace {

constexpr size_t kMaxElements = 0x7FFFFFFF;  // Indices are int32.
constexpr double kSampleFraction = 0.01;
// Sample elements expected above the threshold: the relative spread of the
// candidate count is about 1 / sqrt(ratio * m).
constexpr double kWantedSampleHits = 640;
constexpr double kMinSampleHits = 400;  // Fewer: too imprecise, use kExact.
constexpr double kOversample = 1.12;    // Aim a little above k.
constexpr int kMaxRetries = 3;
constexpr size_t kBlock = 64;  // Sampled as runs of 64 (4 cache lines).

size_t CandidateCap(size_t k) { return 4 * k + 64; }

}  // namespace

StatusOr<std::unique_ptr<TopKCompressor>> TopKCompressor::Create(TopKMethod method,
                                                                 TopKValues values, double ratio,
                                                                 uint64_t warmup) {
  if (!(ratio > 0.0 && ratio <= 1.0)) {
    return InvalidArgumentError("top-k: ratio must be in (0, 1], got " + std::to_string(ratio));
  }
  return std::unique_ptr<TopKCompressor>(new TopKCompressor(method, values, ratio, warmup));
}

double TopKCompressor::WarmupRatio(double ratio, uint64_t warmup, uint64_t step) {
  constexpr double kWarmupStart = 0.25;
  if (step >= warmup || ratio >= kWarmupStart) return ratio;
  const double t = static_cast<double>(step) / static_cast<double>(warmup);
  return std::max(ratio, kWarmupStart * std::pow(ratio / kWarmupStart, t));
}

void TopKCompressor::BeginStep(uint64_t step) { ratio_ = WarmupRatio(base_ratio_, warmup_, step); }

Status TopKCompressor::SetRatio(double ratio) {
  if (!(ratio > 0.0 && ratio <= 1.0)) {
    return InvalidArgumentError("top-k: ratio must be in (0, 1], got " + std::to_string(ratio));
  }
  ratio_ = ratio;
  return OkStatus();
}

std::string TopKCompressor::name() const {
  std::string name = method_ == TopKMethod::kExact ? "topk" : "topk_sampled";
  return values_ == TopKValues::kFp16 ? name + "_fp16" : name;
}

TopKValues TopKCompressor::ValuesOf(const std::string& name) {
  static const std::string kSuffix = "_fp16";
  const bool half = name.size() > kSuffix.size() &&
                    name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
  return half ? TopKValues::kFp16 : TopKValues::kFp32;
}

size_t TopKCompressor::KeepCount(size_t n) const { return compression::KeepCount(ratio_, n); }

size_t TopKCompressor::SampleSize(size_t n) const {
  if (method_ != TopKMethod::kSampled) return 0;
  const double want =
      std::max(std::ceil(kSampleFraction * n), std::ceil(kWantedSampleHits / ratio_));
  const size_t m = static_cast<size_t>(std::min<double>(want, n / 2)) / kBlock * kBlock;
  return ratio_ * m < kMinSampleHits ? 0 : m;
}

size_t TopKCompressor::WireBytes(size_t num_elements) const {
  return KeepCount(num_elements) * (sizeof(int32_t) + ValueBytes());
}

void TopKCompressor::DrawSample(const float* in, size_t n, size_t m, const CompressContext& ctx) {
  Xoshiro256 rng(StreamKey(ctx, kTopKSampleSalt));
  const uint32_t blocks = static_cast<uint32_t>(n / kBlock);
  keys_.resize(m);
  for (size_t j = 0; j < m; j += kBlock) {
    const float* block = in + kBlock * rng.FastBelow(blocks);
    for (size_t b = 0; b < kBlock; ++b) keys_[j + b] = MagnitudeKey(block[b]);
  }
}

bool TopKCompressor::TrySampled(const float* in, size_t n, size_t k, const CompressContext& ctx) {
  const size_t m = SampleSize(n);
  if (m == 0) return false;
  stats_.sample_size = m;
  DrawSample(in, n, m, ctx);
  const size_t cap = CandidateCap(k);
  indices_.resize(cap + 8);  // CollectAtLeast stores groups of 8.
  candidate_keys_.resize(cap + 8);
  double rank = std::ceil(kOversample * static_cast<double>(k) * m / n);
  for (int attempt = 0; attempt <= kMaxRetries; ++attempt) {
    const size_t r = static_cast<size_t>(std::min<double>(rank, m));
    const uint32_t threshold = KthLargestKey(keys_.data(), m, r, &scratch_).key;
    const size_t count =
        CollectAtLeast(in, n, threshold, indices_.data(), candidate_keys_.data(), cap);
    stats_.candidates = count;
    stats_.retries = attempt;
    if (count > cap) return false;
    if (count >= k) {
      TruncateToTopK(indices_.data(), candidate_keys_.data(), count, k, &scratch_);
      return true;
    }
    if (r == m) return false;
    // Too few: scale the rank by the shortfall, aiming above k again.
    rank = std::max<double>(r + 1, std::ceil(r * kOversample * k / std::max<size_t>(count, 1)));
  }
  return false;
}

bool TopKCompressor::TakeAtLeast(const float* in, size_t n, size_t k, uint32_t key) {
  indices_.resize(std::max(k + 8, indices_.size()));  // groups of 8
  candidate_keys_.resize(std::max(k + 8, candidate_keys_.size()));
  return CollectAtLeast(in, n, key, indices_.data(), candidate_keys_.data(), k) == k;
}

void TopKCompressor::Select(const float* in, size_t n, size_t k, const CompressContext& ctx) {
  stats_ = SampledStats();
  const uint32_t hint = std::exchange(hint_, 0);
  if (hint != 0 && k > 0 && k < n && TakeAtLeast(in, n, k, hint)) return;
  if (method_ == TopKMethod::kSampled && k > 0 && k < n) {
    if (TrySampled(in, n, k, ctx)) return;
    stats_.fell_back = true;
  }
  indices_.resize(std::max(k, indices_.size()));
  ExactTopK(in, n, k, &keys_, indices_.data());
}

Status TopKCompressor::Compress(const float* in, size_t n, const CompressContext& ctx, uint8_t* out,
                                size_t out_size) {
  GS_RETURN_IF_ERROR(CheckCount(name(), n, kMaxElements));
  GS_RETURN_IF_ERROR(CheckOutSize(name(), n, WireBytes(n), out_size));
  const size_t k = KeepCount(n);
  if (k == 0) return OkStatus();
  Select(in, n, k, ctx);
  std::memcpy(out, indices_.data(), k * sizeof(uint32_t));
  values_scratch_.resize(k);
  for (size_t j = 0; j < k; ++j) values_scratch_[j] = in[indices_[j]];
  uint8_t* values_out = out + k * sizeof(uint32_t);
  if (values_ == TopKValues::kFp32) {
    std::memcpy(values_out, values_scratch_.data(), k * sizeof(float));
  } else {
    FloatToHalf(values_scratch_.data(), values_out, k);
  }
  return OkStatus();
}

// The indices are copied out of `in` once and checked in the copy: `in` may
// be memory another process can write (a payload lent from a shared-memory
// link), so what is checked is what is used.
Status TopKCompressor::CopyIndices(const uint8_t* in, size_t k, size_t n) {
  indices_.resize(std::max(k, indices_.size()));
  if (k > 0) std::memcpy(indices_.data(), in, k * sizeof(uint32_t));
  int64_t previous = -1;
  for (size_t j = 0; j < k; ++j) {
    const int64_t index = static_cast<int32_t>(indices_[j]);
    if (index <= previous || index >= static_cast<int64_t>(n)) {
      return InvalidArgumentError(name() + ": index " + std::to_string(index) + " at position " +
                                  std::to_string(j) + " is out of range [0, " + std::to_string(n) +
                                  ") or not above the previous one (" + std::to_string(previous) +
                                  ")");
    }
    previous = index;
  }
  return OkStatus();
}

StatusOr<size_t> TopKCompressor::ReadValues(const uint8_t* in, size_t in_size, size_t n) {
  GS_RETURN_IF_ERROR(CheckCount(name(), n, kMaxElements));
  GS_RETURN_IF_ERROR(CheckInSize(name(), n, WireBytes(n), in_size));
  const size_t k = KeepCount(n);
  GS_RETURN_IF_ERROR(CopyIndices(in, k, n));
  values_scratch_.resize(k);
  const uint8_t* values_in = in + k * sizeof(int32_t);
  if (values_ == TopKValues::kFp32) {
    if (k > 0) std::memcpy(values_scratch_.data(), values_in, k * sizeof(float));
  } else {
    HalfToFloat(values_in, values_scratch_.data(), k);
  }
  return k;
}

Status TopKCompressor::Decompress(const uint8_t* in, size_t in_size, size_t n,
                                  const CompressContext& /*ctx*/, float* out) {
  GS_ASSIGN_OR_RETURN(const size_t k, ReadValues(in, in_size, n));
  if (n > 0) std::memset(out, 0, n * sizeof(float));
  for (size_t j = 0; j < k; ++j) {
    out[indices_[j]] = values_scratch_[j];
  }
  return OkStatus();
}

Status TopKCompressor::SubtractDecompressed(const uint8_t* in, size_t in_size, size_t n,
                                            const CompressContext& /*ctx*/, float* out,
                                            std::vector<float>* /*scratch*/) {
  GS_ASSIGN_OR_RETURN(const size_t k, ReadValues(in, in_size, n));
  for (size_t j = 0; j < k; ++j) {
    out[indices_[j]] -= values_scratch_[j];
  }
  return OkStatus();
}

}  // namespace gradsync::compression
