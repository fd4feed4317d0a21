// Element kernels of the sign and QSGD compressors, each as a portable
// scalar version and a dispatching version that uses AVX2 where the CPU has
// it. Both give bit-identical results on every input (the vector code does
// the same IEEE operations in the same order), so the tests compare them.
//
// Wire pointers need no alignment. Internal to compression/.
// Thread-safety: pure functions.
#ifndef GRADSYNC_COMPRESSION_QUANTIZE_KERNELS_H_
#define GRADSYNC_COMPRESSION_QUANTIZE_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace gradsync::compression {

// Sign: one chunk of len (1..any) elements starting at element `first`
// (a multiple of 8). Returns mean |x| over the chunk, summed in 8 lanes
// (lane i % 8) and reduced as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), and
// sets bit (i % 8) of bits[i / 8] to the sign bit of x[i] (bits past len in
// the last byte are 0).
float SignEncodeChunk(const float* x, size_t len, uint8_t* bits);
float SignEncodeChunkScalar(const float* x, size_t len, uint8_t* bits);
// out[i] = bit i set ? -scale : +scale (the sign bit of scale flipped).
void SignDecodeChunk(const uint8_t* bits, size_t len, float scale, float* out);
void SignDecodeChunkScalar(const uint8_t* bits, size_t len, float scale, float* out);

// QSGD: the largest magnitude key (float bits without sign) of x[0, len);
// NaN ranks above infinity.
uint32_t MaxMagnitudeKey(const float* x, size_t len);
uint32_t MaxMagnitudeKeyScalar(const float* x, size_t len);
// q[i] = sign(x[i]) * l with l = floor(min(r + u, levels)), where
// r = |x[i]| * inv and u = (h >> 8) * 2^-24 for a keyed 32-bit hash h of
// (key, first + i): l is floor(r) + 1 with probability frac(r) (to the
// rounding of r + u, at most 2^-17 for r < 128). inv must be finite and
// >= 0. The file is built with -ffp-contract=off so that r + u is never
// fused into r's multiply in one path and not the other.
void QsgdEncodeChunk(const float* x, size_t len, float inv, int levels, uint64_t key,
                     uint32_t first, int8_t* q);
void QsgdEncodeChunkScalar(const float* x, size_t len, float inv, int levels, uint64_t key,
                           uint32_t first, int8_t* q);
// out[i] = float(q[i]) * step.
void QsgdDecodeChunk(const int8_t* q, size_t len, float step, float* out);
void QsgdDecodeChunkScalar(const int8_t* q, size_t len, float step, float* out);
// The largest |q[i]| (128 for -128).
int MaxAbsLevel(const int8_t* q, size_t len);
int MaxAbsLevelScalar(const int8_t* q, size_t len);

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_QUANTIZE_KERNELS_H_
