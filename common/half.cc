#include "common/half.h"

#include <cpuid.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>

namespace gradsync {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t Load16(const void* p, size_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const uint8_t*>(p) + 2 * i, 2);
  return v;
}

void Store16(void* p, size_t i, uint16_t v) {
  std::memcpy(static_cast<uint8_t*>(p) + 2 * i, &v, 2);
}

// F16C from CPUID leaf 1 (ECX bit 29): not every compiler's
// __builtin_cpu_supports knows the name.
bool HasAvx2F16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  }();
  return has;
}

// The vector paths handle whole groups of 8 and return how many they did;
// the scalar loops finish the rest.
__attribute__((target("avx2,f16c"))) size_t ToHalfAvx(const float* in, void* out, size_t n) {
  size_t i = 0;
  auto* o = static_cast<uint8_t*>(out);
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * i), h);
  }
  return i;
}

__attribute__((target("avx2,f16c"))) size_t FromHalfAvx(const void* in, float* out, size_t n) {
  size_t i = 0;
  const auto* p = static_cast<const uint8_t*>(in);
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  return i;
}

__attribute__((target("avx2"))) __m128i PackBf16(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, quiet, nan);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

__attribute__((target("avx2"))) __m256 UnpackBf16(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2"))) size_t ToBf16Avx(const float* in, void* out, size_t n) {
  size_t i = 0;
  auto* o = static_cast<uint8_t*>(out);
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * i), PackBf16(_mm256_loadu_ps(in + i)));
  }
  return i;
}

__attribute__((target("avx2"))) size_t FromBf16Avx(const void* in, float* out, size_t n) {
  size_t i = 0;
  const auto* p = static_cast<const uint8_t*>(in);
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
    _mm256_storeu_ps(out + i, UnpackBf16(h));
  }
  return i;
}

__attribute__((target("avx2,f16c"))) size_t AddHalfAvx(void* acc, const void* in, size_t n) {
  size_t i = 0;
  auto* a = static_cast<uint8_t*>(acc);
  const auto* b = static_cast<const uint8_t*>(in);
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 2 * i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 * i)));
    __m128i s = _mm256_cvtps_ph(_mm256_add_ps(x, y), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a + 2 * i), s);
  }
  return i;
}

__attribute__((target("avx2"))) size_t AddBf16Avx(void* acc, const void* in, size_t n) {
  size_t i = 0;
  auto* a = static_cast<uint8_t*>(acc);
  const auto* b = static_cast<const uint8_t*>(in);
  for (; i + 8 <= n; i += 8) {
    __m256 x = UnpackBf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 2 * i)));
    __m256 y = UnpackBf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 * i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a + 2 * i), PackBf16(_mm256_add_ps(x, y)));
  }
  return i;
}

}  // namespace

uint16_t FloatToHalf(float value) {
  uint32_t x = Bits(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7FFFFFFF;
  if (x > 0x7F800000) return sign | 0x7E00 | ((x >> 13) & 0x3FF);  // NaN, made quiet
  if (x >= 0x477FF000) return sign | 0x7C00;  // rounds to 65520 or more: infinity
  if (x < 0x38800000) {
    // Below the smallest normal half: a subnormal in units of 2^-24. The
    // scaling is exact; rint rounds to nearest even.
    return sign | static_cast<uint16_t>(std::rint(FromBits(x) * 16777216.0f));
  }
  // Rebias the exponent (127 -> 15) and round the 13 dropped bits to even.
  x += 0xC8000FFFu + ((x >> 13) & 1);
  return sign | static_cast<uint16_t>(x >> 13);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    const float magnitude = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
    return FromBits(sign | Bits(magnitude));
  }
  if (exp == 31) return FromBits(sign | 0x7F800000 | (mant << 13) | (mant ? 0x400000 : 0));
  return FromBits(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToBf16(float value) {
  const uint32_t x = Bits(value);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  return static_cast<uint16_t>((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

float Bf16ToFloat(uint16_t bf16) { return FromBits(static_cast<uint32_t>(bf16) << 16); }

void FloatToHalf(const float* in, void* out, size_t n) {
  size_t i = HasAvx2F16c() ? ToHalfAvx(in, out, n) : 0;
  for (; i < n; ++i) Store16(out, i, FloatToHalf(in[i]));
}

void HalfToFloat(const void* in, float* out, size_t n) {
  size_t i = HasAvx2F16c() ? FromHalfAvx(in, out, n) : 0;
  for (; i < n; ++i) out[i] = HalfToFloat(Load16(in, i));
}

void FloatToBf16(const float* in, void* out, size_t n) {
  size_t i = HasAvx2F16c() ? ToBf16Avx(in, out, n) : 0;
  for (; i < n; ++i) Store16(out, i, FloatToBf16(in[i]));
}

void Bf16ToFloat(const void* in, float* out, size_t n) {
  size_t i = HasAvx2F16c() ? FromBf16Avx(in, out, n) : 0;
  for (; i < n; ++i) out[i] = Bf16ToFloat(Load16(in, i));
}

void AddHalfInto(void* acc, const void* in, size_t n) {
  size_t i = HasAvx2F16c() ? AddHalfAvx(acc, in, n) : 0;
  for (; i < n; ++i) {
    Store16(acc, i, FloatToHalf(HalfToFloat(Load16(acc, i)) + HalfToFloat(Load16(in, i))));
  }
}

void AddBf16Into(void* acc, const void* in, size_t n) {
  size_t i = HasAvx2F16c() ? AddBf16Avx(acc, in, n) : 0;
  for (; i < n; ++i) {
    Store16(acc, i, FloatToBf16(Bf16ToFloat(Load16(acc, i)) + Bf16ToFloat(Load16(in, i))));
  }
}

// Scales through the bulk conversions (vectorised where the CPU allows),
// a block of floats at a time; each element is still one rounding.
template <void (*ToFloat)(const void*, float*, size_t),
          void (*FromFloat)(const float*, void*, size_t)>
void Scale16(void* acc, float scale, size_t n) {
  float tmp[512];
  auto* bytes = static_cast<uint8_t*>(acc);
  for (size_t i = 0; i < n; i += 512) {
    const size_t m = n - i < 512 ? n - i : 512;
    ToFloat(bytes + 2 * i, tmp, m);
    for (size_t j = 0; j < m; ++j) tmp[j] *= scale;
    FromFloat(tmp, bytes + 2 * i, m);
  }
}

void ScaleHalf(void* acc, float scale, size_t n) {
  Scale16<HalfToFloat, FloatToHalf>(acc, scale, n);
}

void ScaleBf16(void* acc, float scale, size_t n) {
  Scale16<Bf16ToFloat, FloatToBf16>(acc, scale, n);
}

}  // namespace gradsync
