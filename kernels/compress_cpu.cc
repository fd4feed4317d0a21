#include "kernels/compress_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "common/half.h"
#include "kernels/compress_math.h"

namespace gradsync::kernels {
namespace {

// Sign bits and scale of one chunk of len elements; bits[0, ceil(len / 8)).
float SignEncodeChunk(const float* x, size_t len, uint8_t* bits) {
  float lanes[8] = {};
  std::memset(bits, 0, (len + 7) / 8);
  for (size_t i = 0; i < len; ++i) {
    lanes[i % 8] = math::Add(lanes[i % 8], math::Abs(x[i]));
    bits[i / 8] |= static_cast<uint8_t>((math::FloatBits(x[i]) >> 31) << (i % 8));
  }
  return math::Div(math::ReduceLanes(lanes), static_cast<float>(len));
}

float QsgdNorm(const float* x, size_t len) {
  uint32_t m = 0;
  for (size_t i = 0; i < len; ++i) m = std::max(m, math::MagnitudeKey(x[i]));
  return math::BitsFloat(m);
}

// c = g + e_old, or g without a residual.
std::vector<float> Corrected(const float* g, const float* residual, bool has_residual, size_t n) {
  std::vector<float> c(g, g + n);
  if (has_residual) {
    for (size_t i = 0; i < n; ++i) c[i] = math::Corrected(g[i], residual[i]);
  }
  return c;
}

void SubtractInto(const std::vector<float>& c, const std::vector<float>& d, float* residual) {
  for (size_t i = 0; i < c.size(); ++i) residual[i] = math::Sub(c[i], d[i]);
}

template <typename Body>
void ForEachChunk(size_t n, size_t chunk, Body body) {
  for (size_t c = 0, first = 0; first < n; ++c, first += chunk) {
    body(c, first, std::min(chunk, n - first));
  }
}

}  // namespace

void FloatToHalfCpu(const float* in, uint16_t* out, size_t n) { FloatToHalf(in, out, n); }

void HalfToFloatCpu(const uint16_t* in, float* out, size_t n) { HalfToFloat(in, out, n); }

void FloatToBf16Cpu(const float* in, uint16_t* out, size_t n) { FloatToBf16(in, out, n); }

void Bf16ToFloatCpu(const uint16_t* in, float* out, size_t n) { Bf16ToFloat(in, out, n); }

void FloatTo16Cpu(Float16Format format, const float* in, uint16_t* out, size_t n) {
  if (format == Float16Format::kFp16) {
    FloatToHalfCpu(in, out, n);
  } else {
    FloatToBf16Cpu(in, out, n);
  }
}

void Float16ToFloatCpu(Float16Format format, const uint16_t* in, float* out, size_t n) {
  if (format == Float16Format::kFp16) {
    HalfToFloatCpu(in, out, n);
  } else {
    Bf16ToFloatCpu(in, out, n);
  }
}

size_t SparseKeepCount(double ratio, size_t n) {
  const double k = std::ceil(ratio * static_cast<double>(n));
  if (!(k > 0)) return 0;
  if (k >= static_cast<double>(n)) return n;
  return static_cast<size_t>(k);
}

void TopKCpu(const float* in, size_t n, size_t k, SparseValueFormat format, int32_t* indices,
             void* values) {
  if (k == 0) return;
  std::vector<uint32_t> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = math::MagnitudeKey(in[i]);
  std::vector<uint32_t> sorted = keys;
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(),
                   std::greater<uint32_t>());
  const uint32_t kth = sorted[k - 1];
  size_t ties = k - static_cast<size_t>(std::count_if(sorted.begin(), sorted.begin() + (k - 1),
                                                      [kth](uint32_t v) { return v > kth; }));
  std::vector<float> kept;
  kept.reserve(k);
  for (size_t i = 0; i < n && kept.size() < k; ++i) {
    const bool tie = keys[i] == kth && ties > 0;
    if (keys[i] > kth || tie) {
      ties -= tie;
      indices[kept.size()] = static_cast<int32_t>(i);
      kept.push_back(in[i]);
    }
  }
  if (format == SparseValueFormat::kF32) {
    std::memcpy(values, kept.data(), k * sizeof(float));
  } else {
    FloatToHalfCpu(kept.data(), static_cast<uint16_t*>(values), k);
  }
}

void SparseDecompressCpu(const int32_t* indices, const void* values, SparseValueFormat format,
                         size_t k, size_t n, float* out) {
  std::vector<float> v(k);
  if (format == SparseValueFormat::kF32) {
    if (k > 0) std::memcpy(v.data(), values, k * sizeof(float));
  } else {
    HalfToFloatCpu(static_cast<const uint16_t*>(values), v.data(), k);
  }
  std::fill(out, out + n, 0.0f);
  for (size_t j = 0; j < k; ++j) out[indices[j]] = v[j];
}

std::vector<uint32_t> RandomKIndicesCpu(const SeedContext& ctx, size_t n, size_t k) {
  std::vector<uint64_t> bitmap((n + 63) / 64, 0);
  Xoshiro256 rng(math::StreamKey(ctx.seed, ctx.step, ctx.bucket_id, math::kRandomKSalt));
  // Floyd: for j = n-k .. n-1 add a uniform t <= j, or j if t is taken.
  for (size_t j = n - k; j < n; ++j) {
    const uint64_t t = rng.Below(j + 1);
    uint64_t& word = bitmap[t / 64];
    const uint64_t bit = uint64_t{1} << (t % 64);
    if (word & bit) {
      bitmap[j / 64] |= uint64_t{1} << (j % 64);
    } else {
      word |= bit;
    }
  }
  std::vector<uint32_t> indices;
  indices.reserve(k);
  for (size_t w = 0; w < bitmap.size(); ++w) {
    for (uint64_t bits = bitmap[w]; bits != 0; bits &= bits - 1) {
      indices.push_back(static_cast<uint32_t>(64 * w + __builtin_ctzll(bits)));
    }
  }
  return indices;
}

float RandomKScale(size_t n, size_t k) {
  return static_cast<float>(static_cast<double>(n) / static_cast<double>(k));
}

void GatherCpu(const float* in, const uint32_t* indices, size_t k, float* out) {
  for (size_t j = 0; j < k; ++j) out[j] = in[indices[j]];
}

void ScatterCpu(const float* values, const uint32_t* indices, size_t k, float scale, size_t n,
                float* out) {
  std::fill(out, out + n, 0.0f);
  for (size_t j = 0; j < k; ++j) out[indices[j]] = math::Mul(values[j], scale);
}

void ScatterAddCpu(const float* values, const uint32_t* indices, size_t k, float scale,
                   float* out) {
  for (size_t j = 0; j < k; ++j) {
    out[indices[j]] = math::Add(out[indices[j]], math::Mul(values[j], scale));
  }
}

size_t NumChunks(size_t n, size_t chunk) { return n / chunk + (n % chunk != 0); }

void SignEncodeCpu(const float* in, size_t n, size_t chunk, float* scales, uint8_t* bits) {
  ForEachChunk(n, chunk, [&](size_t c, size_t first, size_t len) {
    scales[c] = SignEncodeChunk(in + first, len, bits + first / 8);
  });
}

void SignDecodeCpu(const float* scales, const uint8_t* bits, size_t n, size_t chunk, float* out) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = math::SignDecode(scales[i / chunk], (bits[i / 8] >> (i % 8)) & 1u);
  }
}

uint64_t QsgdKey(const SeedContext& ctx) {
  return math::StreamKey(ctx.seed, ctx.step, ctx.bucket_id, math::kQsgdSalt);
}

void QsgdEncodeCpu(const float* in, size_t n, size_t chunk, int levels, uint64_t key, float* norms,
                   int8_t* q) {
  const float top = static_cast<float>(levels);
  ForEachChunk(n, chunk, [&](size_t c, size_t first, size_t len) {
    norms[c] = QsgdNorm(in + first, len);
    const math::QsgdChunkPlan plan = math::PlanQsgdChunk(norms[c], levels);
    for (size_t i = first; i < first + len; ++i) {
      q[i] = math::QsgdLevel(in[i], plan, top, key, static_cast<uint32_t>(i));
    }
  });
}

void QsgdDecodeCpu(const float* norms, const int8_t* q, size_t n, size_t chunk, int levels,
                   float* out) {
  ForEachChunk(n, chunk, [&](size_t c, size_t first, size_t len) {
    const float step = math::QsgdStep(norms[c], levels);
    for (size_t i = first; i < first + len; ++i) {
      out[i] = math::QsgdDecode(q[i], step);
    }
  });
}

Status ValidateSlices(const BucketSlice* slices, size_t num_slices, size_t bucket_elems) {
  uint64_t end = 0;
  for (size_t s = 0; s < num_slices; ++s) {
    const BucketSlice& slice = slices[s];
    const std::string where = "bucket slice " + std::to_string(s) + " (offset " +
                              std::to_string(slice.offset) + ", count " +
                              std::to_string(slice.count) + ")";
    if (slice.offset < end) {
      return InvalidArgumentError(where +
                                  " starts before the previous one "
                                  "ends at " +
                                  std::to_string(end));
    }
    if (slice.count > bucket_elems || slice.offset > bucket_elems - slice.count) {
      return InvalidArgumentError(where + " ends past the bucket's " +
                                  std::to_string(bucket_elems) + " elements");
    }
    if (slice.count > 0 && slice.tensor == nullptr) {
      return InvalidArgumentError(where + " has a null tensor");
    }
    end = slice.offset + slice.count;
  }
  return OkStatus();
}

void PackBucketCpu(const BucketSlice* slices, size_t num_slices, float* bucket) {
  for (size_t s = 0; s < num_slices; ++s) {
    std::copy(slices[s].tensor, slices[s].tensor + slices[s].count, bucket + slices[s].offset);
  }
}

void PackBucket16Cpu(Float16Format format, const BucketSlice* slices, size_t num_slices,
                     uint16_t* bucket) {
  for (size_t s = 0; s < num_slices; ++s) {
    FloatTo16Cpu(format, slices[s].tensor, bucket + slices[s].offset, slices[s].count);
  }
}

void UnpackBucketCpu(const BucketSlice* slices, size_t num_slices, const float* bucket) {
  for (size_t s = 0; s < num_slices; ++s) {
    std::copy(bucket + slices[s].offset, bucket + slices[s].offset + slices[s].count,
              slices[s].tensor);
  }
}

void UnpackBucket16Cpu(Float16Format format, const BucketSlice* slices, size_t num_slices,
                       const uint16_t* bucket) {
  for (size_t s = 0; s < num_slices; ++s) {
    Float16ToFloatCpu(format, bucket + slices[s].offset, slices[s].tensor, slices[s].count);
  }
}

void EfFloat16Cpu(Float16Format format, const float* g, float* residual, bool has_residual,
                  size_t n, uint16_t* wire) {
  const std::vector<float> c = Corrected(g, residual, has_residual, n);
  std::vector<float> d(n);
  FloatTo16Cpu(format, c.data(), wire, n);
  Float16ToFloatCpu(format, wire, d.data(), n);
  SubtractInto(c, d, residual);
}

void EfSignCpu(const float* g, float* residual, bool has_residual, size_t n, size_t chunk,
               float* scales, uint8_t* bits) {
  const std::vector<float> c = Corrected(g, residual, has_residual, n);
  std::vector<float> d(n);
  SignEncodeCpu(c.data(), n, chunk, scales, bits);
  SignDecodeCpu(scales, bits, n, chunk, d.data());
  SubtractInto(c, d, residual);
}

void EfQsgdCpu(const float* g, float* residual, bool has_residual, size_t n, size_t chunk,
               int levels, uint64_t key, float* norms, int8_t* q) {
  const std::vector<float> c = Corrected(g, residual, has_residual, n);
  std::vector<float> d(n);
  QsgdEncodeCpu(c.data(), n, chunk, levels, key, norms, q);
  QsgdDecodeCpu(norms, q, n, chunk, levels, d.data());
  SubtractInto(c, d, residual);
}

void EfTopKCpu(const float* g, float* residual, bool has_residual, size_t n, size_t k,
               SparseValueFormat format, int32_t* indices, void* values) {
  const std::vector<float> c = Corrected(g, residual, has_residual, n);
  std::vector<float> d(n);
  TopKCpu(c.data(), n, k, format, indices, values);
  SparseDecompressCpu(indices, values, format, k, n, d.data());
  SubtractInto(c, d, residual);
}

void EfRandomKCpu(const float* g, float* residual, bool has_residual, size_t n,
                  const uint32_t* indices, size_t k, float scale, float* values) {
  const std::vector<float> c = Corrected(g, residual, has_residual, n);
  std::vector<float> d(n);
  GatherCpu(c.data(), indices, k, values);
  ScatterCpu(values, indices, k, scale, n, d.data());
  SubtractInto(c, d, residual);
}

}  // namespace gradsync::kernels
