#include "compression/quantize_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/seeded_random.h"

namespace gradsync::compression {
namespace {

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

constexpr float kTwoToMinus24 = 5.9604644775390625e-08f;

float ReduceLanes(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// Stochastic rounding as floor(r + u), u uniform in [0, 1): rounds up with
// probability frac(r).
int8_t QuantizeOne(float x, float inv, float levels, uint64_t key, uint32_t index) {
  const float r = std::fabs(x) * inv;
  const float u = static_cast<float>(RoundingHash(key, index) >> 8) * kTwoToMinus24;
  const float t = std::min(r + u, levels);
  const int8_t q = static_cast<int8_t>(static_cast<int32_t>(t));
  return std::signbit(x) ? static_cast<int8_t>(-q) : q;
}

// ---- AVX2 versions: the same operations, 8 lanes at a time. ----

__attribute__((target("avx2"))) float SignEncodeAvx2(const float* x, size_t len, uint8_t* bits) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_add_ps(acc, _mm256_and_ps(v, abs_mask));
    bits[i / 8] = static_cast<uint8_t>(_mm256_movemask_ps(v));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  uint8_t tail = 0;
  for (; i < len; ++i) {
    lanes[i % 8] += std::fabs(x[i]);
    tail |= static_cast<uint8_t>((Bits(x[i]) >> 31) << (i % 8));
  }
  if (len % 8 != 0) bits[len / 8] = tail;
  return ReduceLanes(lanes) / static_cast<float>(len);
}

__attribute__((target("avx2"))) void SignDecodeAvx2(const uint8_t* bits, size_t len, float scale,
                                                    float* out) {
  const __m256i select = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i sign = _mm256_set1_epi32(static_cast<int32_t>(0x80000000u));
  const __m256i value = _mm256_castps_si256(_mm256_set1_ps(scale));
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256i b = _mm256_and_si256(_mm256_set1_epi32(bits[i / 8]), select);
    const __m256i set = _mm256_cmpeq_epi32(b, select);
    const __m256i v = _mm256_xor_si256(value, _mm256_and_si256(set, sign));
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(v));
  }
  if (i < len) SignDecodeChunkScalar(bits + i / 8, len - i, scale, out + i);
}

__attribute__((target("avx2"))) uint32_t MaxKeyAvx2(const float* x, size_t len) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i best = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256i key =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask);
    best = _mm256_max_epu32(best, key);
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), best);
  uint32_t m = *std::max_element(lanes, lanes + 8);
  return std::max(m, MaxMagnitudeKeyScalar(x + i, len - i));
}

// RoundingHash on 8 counters.
__attribute__((target("avx2"))) __m256i Hash8(__m256i i, __m256i key_lo, __m256i key_hi) {
  __m256i x = _mm256_xor_si256(i, key_lo);
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7FEB352D));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846CA68Bu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  return _mm256_xor_si256(x, key_hi);
}

// Levels of 8 elements as int32 with their signs.
__attribute__((target("avx2"))) __m256i Quantize8(const float* x, __m256 inv, __m256 top,
                                                  __m256i h) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 v = _mm256_loadu_ps(x);
  const __m256 r = _mm256_mul_ps(_mm256_and_ps(v, abs_mask), inv);
  const __m256 u =
      _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), _mm256_set1_ps(kTwoToMinus24));
  const __m256i l = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_add_ps(r, u), top));
  // sign_epi32 negates where v < 0 and zeroes where v == 0: or-ing 1 into v
  // keeps +0.0 from zeroing (its level is 0 anyway) and -0.0 negative.
  return _mm256_sign_epi32(l, _mm256_or_si256(_mm256_castps_si256(v), _mm256_set1_epi32(1)));
}

__attribute__((target("avx2"))) void QsgdEncodeAvx2(const float* x, size_t len, float inv,
                                                    int levels, uint64_t key, uint32_t first,
                                                    int8_t* q) {
  const __m256 inv8 = _mm256_set1_ps(inv);
  const __m256 top = _mm256_set1_ps(static_cast<float>(levels));
  const __m256i key_lo = _mm256_set1_epi32(static_cast<int32_t>(key));
  const __m256i key_hi = _mm256_set1_epi32(static_cast<int32_t>(key >> 32));
  const __m256i eight = _mm256_set1_epi32(8);
  __m256i counter = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)),
                                     _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    const __m256i a = Quantize8(x + i, inv8, top, Hash8(counter, key_lo, key_hi));
    counter = _mm256_add_epi32(counter, eight);
    const __m256i b = Quantize8(x + i + 8, inv8, top, Hash8(counter, key_lo, key_hi));
    counter = _mm256_add_epi32(counter, eight);
    // packs work per 128-bit lane: a0 b0 a1 b1 -> a0 a1 b0 b1 after the
    // permute of the 64-bit pieces of the byte pack.
    const __m256i p16 = _mm256_packs_epi32(a, b);
    const __m256i p8 = _mm256_packs_epi16(p16, p16);
    const __m256i ordered =
        _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm256_castsi256_si128(ordered));
  }
  QsgdEncodeChunkScalar(x + i, len - i, inv, levels, key, first + static_cast<uint32_t>(i), q + i);
}

__attribute__((target("avx2"))) void QsgdDecodeAvx2(const int8_t* q, size_t len, float step,
                                                    float* out) {
  const __m256 step8 = _mm256_set1_ps(step);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(f, step8));
  }
  QsgdDecodeChunkScalar(q + i, len - i, step, out + i);
}

__attribute__((target("avx2"))) int MaxAbsLevelAvx2(const int8_t* q, size_t len) {
  __m256i best = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));
    best = _mm256_max_epu8(best, _mm256_abs_epi8(b));  // |-128| reads 128.
  }
  alignas(32) uint8_t lanes[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), best);
  int m = *std::max_element(lanes, lanes + 32);
  return std::max(m, MaxAbsLevelScalar(q + i, len - i));
}

}  // namespace

float SignEncodeChunkScalar(const float* x, size_t len, uint8_t* bits) {
  float lanes[8] = {};
  std::memset(bits, 0, (len + 7) / 8);
  for (size_t i = 0; i < len; ++i) {
    lanes[i % 8] += std::fabs(x[i]);
    bits[i / 8] |= static_cast<uint8_t>((Bits(x[i]) >> 31) << (i % 8));
  }
  return ReduceLanes(lanes) / static_cast<float>(len);
}

float SignEncodeChunk(const float* x, size_t len, uint8_t* bits) {
  return HasAvx2() ? SignEncodeAvx2(x, len, bits) : SignEncodeChunkScalar(x, len, bits);
}

void SignDecodeChunkScalar(const uint8_t* bits, size_t len, float scale, float* out) {
  const uint32_t value = Bits(scale);
  for (size_t i = 0; i < len; ++i) {
    const uint32_t bit = (bits[i / 8] >> (i % 8)) & 1u;
    out[i] = FromBits(value ^ (bit << 31));
  }
}

void SignDecodeChunk(const uint8_t* bits, size_t len, float scale, float* out) {
  if (HasAvx2()) {
    SignDecodeAvx2(bits, len, scale, out);
  } else {
    SignDecodeChunkScalar(bits, len, scale, out);
  }
}

uint32_t MaxMagnitudeKeyScalar(const float* x, size_t len) {
  uint32_t m = 0;
  for (size_t i = 0; i < len; ++i) m = std::max(m, Bits(x[i]) & 0x7FFFFFFFu);
  return m;
}

uint32_t MaxMagnitudeKey(const float* x, size_t len) {
  return HasAvx2() ? MaxKeyAvx2(x, len) : MaxMagnitudeKeyScalar(x, len);
}

void QsgdEncodeChunkScalar(const float* x, size_t len, float inv, int levels, uint64_t key,
                           uint32_t first, int8_t* q) {
  const float top = static_cast<float>(levels);
  for (size_t i = 0; i < len; ++i) {
    q[i] = QuantizeOne(x[i], inv, top, key, first + static_cast<uint32_t>(i));
  }
}

void QsgdEncodeChunk(const float* x, size_t len, float inv, int levels, uint64_t key,
                     uint32_t first, int8_t* q) {
  if (HasAvx2()) {
    QsgdEncodeAvx2(x, len, inv, levels, key, first, q);
  } else {
    QsgdEncodeChunkScalar(x, len, inv, levels, key, first, q);
  }
}

void QsgdDecodeChunkScalar(const int8_t* q, size_t len, float step, float* out) {
  for (size_t i = 0; i < len; ++i) out[i] = static_cast<float>(q[i]) * step;
}

void QsgdDecodeChunk(const int8_t* q, size_t len, float step, float* out) {
  if (HasAvx2()) {
    QsgdDecodeAvx2(q, len, step, out);
  } else {
    QsgdDecodeChunkScalar(q, len, step, out);
  }
}

int MaxAbsLevelScalar(const int8_t* q, size_t len) {
  int m = 0;
  for (size_t i = 0; i < len; ++i) m = std::max(m, std::abs(int{q[i]}));
  return m;
}

int MaxAbsLevel(const int8_t* q, size_t len) {
  return HasAvx2() ? MaxAbsLevelAvx2(q, len) : MaxAbsLevelScalar(q, len);
}

}  // namespace gradsync::compression
