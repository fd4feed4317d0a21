// Element-level arithmetic of the compressors, written once for the CPU
// references (compress_cpu.cc) and the CUDA kernels (*.cu), so that both
// compute every output bit the same way.
//
// Every function reproduces the corresponding code in compression/ and
// common/half.cc operation for operation: the fp16/bf16 conversions of
// common/half.h, the magnitude key of compression/topk_select.h, the stream
// keys of compression/seeded_rng.h, and the stochastic rounding of
// compression/quantize_kernels.cc.
//
// Floating-point arithmetic goes through Add/Sub/Mul/Div, which are the
// non-fusable intrinsics on the device. Host translation units that include
// this header must be compiled with -ffp-contract=off so that no product is
// fused into a following sum there either.
//
// Internal to kernels/. Thread-safety: pure functions.
#ifndef GRADSYNC_KERNELS_COMPRESS_MATH_H_
#define GRADSYNC_KERNELS_COMPRESS_MATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/seeded_random.h"

#if defined(__CUDACC__)
#define GRADSYNC_HD __host__ __device__ __forceinline__
#else
#define GRADSYNC_HD inline
#endif

namespace gradsync::kernels::math {

// The seeded streams and the rounding hash (common/seeded_random.h).
using ::gradsync::kQsgdSalt;
using ::gradsync::kRandomKSalt;
using ::gradsync::RoundingHash;
using ::gradsync::StreamKey;

constexpr float kTwoToMinus24 = 5.9604644775390625e-08f;
constexpr float kTwoTo24 = 16777216.0f;
constexpr float kTwoTo64 = 18446744073709551616.0f;
constexpr uint32_t kCanonicalNan = 0x7FC00000u;

GRADSYNC_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

GRADSYNC_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

GRADSYNC_HD float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

GRADSYNC_HD float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

GRADSYNC_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

GRADSYNC_HD float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Error feedback's corrected gradient c = g + e. A NaN sum is made the
// canonical quiet NaN: the payload of a computed NaN differs between the CPU
// and the GPU, and c's bits reach the wire.
GRADSYNC_HD float Corrected(float g, float e) {
  const float c = Add(g, e);
  return c != c ? BitsFloat(kCanonicalNan) : c;
}

// Round to the nearest integer, ties to even (|x| < 2^23 here).
GRADSYNC_HD float RoundEven(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::rint(x);
#endif
}

GRADSYNC_HD float Abs(float x) { return BitsFloat(FloatBits(x) & 0x7FFFFFFFu); }
GRADSYNC_HD bool SignBit(float x) { return (FloatBits(x) >> 31) != 0; }
GRADSYNC_HD bool IsFinite(float x) { return (FloatBits(x) & 0x7F800000u) != 0x7F800000u; }
GRADSYNC_HD bool IsInf(float x) { return (FloatBits(x) & 0x7FFFFFFFu) == 0x7F800000u; }

// ---- 16-bit floats (common/half.cc) ----

// IEEE half, round to nearest even; |x| >= 65520 becomes infinity; NaN
// stays NaN, made quiet, with its sign and upper payload bits.
GRADSYNC_HD uint16_t FloatToHalfBits(float value) {
  uint32_t x = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) {
    return static_cast<uint16_t>(sign | 0x7E00u | ((x >> 13) & 0x3FFu));
  }
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (x < 0x38800000u) {
    // A subnormal half in units of 2^-24: the scaling is exact.
    const float units = RoundEven(Mul(BitsFloat(x), kTwoTo24));
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(units));
  }
  // Rebias the exponent (127 -> 15) and round the 13 dropped bits to even.
  x += 0xC8000FFFu + ((x >> 13) & 1u);
  return static_cast<uint16_t>(sign | (x >> 13));
}

GRADSYNC_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    const float magnitude = Mul(static_cast<float>(mant), kTwoToMinus24);
    return BitsFloat(sign | FloatBits(magnitude));
  }
  if (exp == 31) {
    return BitsFloat(sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  }
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

// bfloat16: the upper half after rounding to nearest even; NaN stays a
// quiet NaN.
GRADSYNC_HD uint16_t FloatToBf16Bits(float value) {
  const uint32_t x = FloatBits(value);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

GRADSYNC_HD float Bf16BitsToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

// ---- Top-k (compression/topk_select.h) ----

// The float's bits without the sign: orders like |x|, NaN above infinity.
GRADSYNC_HD uint32_t MagnitudeKey(float x) { return FloatBits(x) & 0x7FFFFFFFu; }

// ---- Sign (compression/quantize_kernels.cc) ----

// The decoded value of one element: the scale with its sign bit flipped
// where the element's bit is set.
GRADSYNC_HD float SignDecode(float scale, uint32_t bit) {
  return BitsFloat(FloatBits(scale) ^ (bit << 31));
}

// The chunk's scale from its 8 lane sums, in the reduction order of
// compression/quantize_kernels.h.
GRADSYNC_HD float ReduceLanes(const float* l) {
  return Add(Add(Add(l[0], l[4]), Add(l[2], l[6])), Add(Add(l[1], l[5]), Add(l[3], l[7])));
}

// ---- QSGD (compression/qsgd_compressor.cc, quantize_kernels.cc) ----

// How one chunk is quantised, from its norm M = max |x|: every element is
// first multiplied by `prescale` (1, or 2^64 when levels / M overflows,
// which is exact for such tiny values) and then by `inv`. `zero`: M is 0,
// inf or NaN, and every level is 0.
struct QsgdChunkPlan {
  float inv;
  float prescale;
  bool zero;
};

GRADSYNC_HD QsgdChunkPlan PlanQsgdChunk(float norm, int levels) {
  if (!(norm > 0.0f) || IsInf(norm)) return {0.0f, 1.0f, true};
  const float s = static_cast<float>(levels);
  const float inv = Div(s, norm);
  if (IsFinite(inv)) return {inv, 1.0f, false};
  return {Div(s, Mul(norm, kTwoTo64)), kTwoTo64, false};
}

// The level of x: sign(x) * floor(min(|x| * inv + u, levels)) with
// u = (hash >> 8) * 2^-24.
GRADSYNC_HD int8_t QsgdLevel(float x, const QsgdChunkPlan& plan, float top, uint64_t key,
                             uint32_t index) {
  if (plan.zero) return 0;
  const float v = Mul(x, plan.prescale);
  const float r = Mul(Abs(v), plan.inv);
  const float u = Mul(static_cast<float>(RoundingHash(key, index) >> 8), kTwoToMinus24);
  const float sum = Add(r, u);
  const float t = top < sum ? top : sum;
  const int8_t q = static_cast<int8_t>(static_cast<int32_t>(t));
  return SignBit(v) ? static_cast<int8_t>(-q) : q;
}

// The decoded step of a chunk: M / levels, or NaN for a non-finite M.
GRADSYNC_HD float QsgdStep(float norm, int levels) {
  return IsFinite(norm) ? Div(norm, static_cast<float>(levels)) : BitsFloat(kCanonicalNan);
}

GRADSYNC_HD float QsgdDecode(int8_t q, float step) { return Mul(static_cast<float>(q), step); }

}  // namespace gradsync::kernels::math

#endif  // GRADSYNC_KERNELS_COMPRESS_MATH_H_
