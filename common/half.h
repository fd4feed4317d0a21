// IEEE half precision (fp16) and bfloat16 (bf16) conversions.
//
// Rounding is to nearest, ties to even, for both formats. fp16: magnitudes
// that round above 65504 become infinity, subnormals are kept, NaN stays NaN
// (quiet, sign and upper payload bits kept), exactly as the x86 F16C
// instructions and CUDA's __float2half_rn convert. bf16: the upper 16 bits
// of the float after rounding; NaN stays a quiet NaN.
//
// The bulk functions pick an AVX2/F16C path at run time where the CPU has
// one and give bit-identical results to the scalar ones on every input.
// Pointers to 16-bit data need no alignment (wire frames are not aligned);
// input and output must not overlap unless stated.
//
// Thread-safety: pure functions.
#ifndef GRADSYNC_COMMON_HALF_H_
#define GRADSYNC_COMMON_HALF_H_

#include <cstddef>
#include <cstdint>

namespace gradsync {

uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t half);
uint16_t FloatToBf16(float value);
float Bf16ToFloat(uint16_t bf16);

// out[i] = fp16(in[i]) for i < n; `out` holds 2n bytes.
void FloatToHalf(const float* in, void* out, size_t n);
// out[i] = float(in[i]); `in` holds 2n bytes.
void HalfToFloat(const void* in, float* out, size_t n);
void FloatToBf16(const float* in, void* out, size_t n);
void Bf16ToFloat(const void* in, float* out, size_t n);

// acc[i] = fp16(float(acc[i]) + float(in[i])): a sum of two fp16 buffers
// computed in fp32 and rounded once. `acc` and `in` may be equal.
void AddHalfInto(void* acc, const void* in, size_t n);
void AddBf16Into(void* acc, const void* in, size_t n);
// acc[i] = round(float(acc[i]) * scale), in place.
void ScaleHalf(void* acc, float scale, size_t n);
void ScaleBf16(void* acc, float scale, size_t n);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_HALF_H_
