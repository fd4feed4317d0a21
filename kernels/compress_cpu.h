// CPU references of the compression kernels (compress_kernels.h). The CUDA
// tests compare every kernel against these, and they produce exactly what
// the CPU compressors of compression/ put on the wire:
//
//   fp16 / bf16   common/half.h conversions (round to nearest even, NaN kept
//                 quiet, fp16 overflow to infinity from 65520 on).
//   top-k         compression/topk_compressor.h: the k largest |x| (NaN
//                 above infinity), ties broken by the lower index, indices
//                 ascending, values fp32 or fp16.
//   random-k      compression/randomk_compressor.h: the same k-subset
//                 (Floyd's algorithm on xoshiro256** keyed by the context),
//                 values in ascending index order, decoded times n / k.
//   sign          compression/sign_compressor.h: per chunk the scale mean |x|
//                 (summed in 8 lanes, reduced in a fixed order) and one bit
//                 per element, bit i % 8 of byte i / 8, 1 = negative.
//   QSGD          compression/qsgd_compressor.h: per chunk the norm max |x|
//                 and int8 levels rounded stochastically by a counter-based
//                 hash of (context key, element index).
//   error feedback compression/error_feedback.h: c = g + e_old, e_new =
//                 c - decompress(compress(c)); without a residual c = g.
//
// Splitting a wire buffer into its parts (scales, bits, norms, levels,
// indices, values) is the caller's: each function names where its outputs
// sit in the wire format. Computed NaNs (a NaN scale, a decoded NaN) are
// NaN here and on the GPU, but their payload bits may differ; every other
// bit of every output is identical.
//
// Preconditions are the caller's (chunk a positive multiple of 8, 1 <= levels
// <= 127, k <= n, buffers of the stated sizes); the CUDA wrappers check
// them and return InvalidArgument. Outputs must not overlap inputs unless
// stated. Thread-safety: pure functions of their arguments.
#ifndef GRADSYNC_KERNELS_COMPRESS_CPU_H_
#define GRADSYNC_KERNELS_COMPRESS_CPU_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/compress_types.h"

namespace gradsync::kernels {

// ---- fp16 / bf16 ----

void FloatToHalfCpu(const float* in, uint16_t* out, size_t n);
void HalfToFloatCpu(const uint16_t* in, float* out, size_t n);
void FloatToBf16Cpu(const float* in, uint16_t* out, size_t n);
void Bf16ToFloatCpu(const uint16_t* in, float* out, size_t n);
void FloatTo16Cpu(Float16Format format, const float* in, uint16_t* out, size_t n);
void Float16ToFloatCpu(Float16Format format, const uint16_t* in, float* out, size_t n);

// ---- Sparsifiers ----

// The number of elements top-k and random-k keep out of n: ceil(ratio * n)
// in double, clamped to [0, n]; ratio in (0, 1].
size_t SparseKeepCount(double ratio, size_t n);

// The k largest elements of in[0, n) by magnitude (NaN above infinity, ties
// to the lower index): indices[0, k) ascending; values[j] = in[indices[j]]
// as fp32 (float*) or fp16 (uint16_t*) per `format`. On the wire: k int32
// indices, then the k values.
void TopKCpu(const float* in, size_t n, size_t k, SparseValueFormat format, int32_t* indices,
             void* values);

// Top-k decompression: out[0, n) = 0, then out[indices[j]] = value j (fp32,
// or fp16 widened). Indices distinct, < n.
void SparseDecompressCpu(const int32_t* indices, const void* values, SparseValueFormat format,
                         size_t k, size_t n, float* out);

// The random-k subset for (context, n): k distinct indices, ascending,
// exactly those RandomKCompressor::Indices returns. n < 2^32.
std::vector<uint32_t> RandomKIndicesCpu(const SeedContext& ctx, size_t n, size_t k);
// The decoding scale of random-k: float(n / k) in double (unbiased).
float RandomKScale(size_t n, size_t k);

// out[j] = in[indices[j]] for j < k (random-k compression).
void GatherCpu(const float* in, const uint32_t* indices, size_t k, float* out);
// out[0, n) = 0, then out[indices[j]] = values[j] * scale (random-k
// decompression). Indices distinct, < n.
void ScatterCpu(const float* values, const uint32_t* indices, size_t k, float scale, size_t n,
                float* out);
// out[indices[j]] += values[j] * scale (one product, one sum, unfused).
// Indices distinct.
void ScatterAddCpu(const float* values, const uint32_t* indices, size_t k, float scale, float* out);

// ---- Sign ----

// ceil(n / chunk).
size_t NumChunks(size_t n, size_t chunk);
// scales[0, NumChunks) (wire bytes [0, 4C)) and bits[0, ceil(n / 8)) (the
// bytes after them).
void SignEncodeCpu(const float* in, size_t n, size_t chunk, float* scales, uint8_t* bits);
void SignDecodeCpu(const float* scales, const uint8_t* bits, size_t n, size_t chunk, float* out);

// ---- QSGD ----

// The key of the rounding hash for a context (seeded_rng StreamKey with the
// QSGD salt).
uint64_t QsgdKey(const SeedContext& ctx);
// norms[0, NumChunks) (wire bytes [0, 4C)) and levels q[0, n) (the n bytes
// after them).
void QsgdEncodeCpu(const float* in, size_t n, size_t chunk, int levels, uint64_t key, float* norms,
                   int8_t* q);
void QsgdDecodeCpu(const float* norms, const int8_t* q, size_t n, size_t chunk, int levels,
                   float* out);

// ---- Fused buckets ----

// OK if the slices are sorted by offset, do not overlap, end within
// bucket_elems and have non-null tensors where count > 0; InvalidArgument
// naming the first bad slice otherwise. Host memory.
Status ValidateSlices(const BucketSlice* slices, size_t num_slices, size_t bucket_elems);
// bucket[offset + i] = tensor[i] for every slice (fp32 or rounded to a
// 16-bit format); bucket elements outside every slice are left alone.
void PackBucketCpu(const BucketSlice* slices, size_t num_slices, float* bucket);
void PackBucket16Cpu(Float16Format format, const BucketSlice* slices, size_t num_slices,
                     uint16_t* bucket);
// tensor[i] = bucket[offset + i] for every slice.
void UnpackBucketCpu(const BucketSlice* slices, size_t num_slices, const float* bucket);
void UnpackBucket16Cpu(Float16Format format, const BucketSlice* slices, size_t num_slices,
                       const uint16_t* bucket);

// ---- Error feedback ----
//
// `residual` holds e_old on entry when has_residual (otherwise it is only
// written) and e_new on return; the wire outputs are those of the
// compressor applied to c = g + e_old (c = g without a residual).

void EfFloat16Cpu(Float16Format format, const float* g, float* residual, bool has_residual,
                  size_t n, uint16_t* wire);
void EfSignCpu(const float* g, float* residual, bool has_residual, size_t n, size_t chunk,
               float* scales, uint8_t* bits);
void EfQsgdCpu(const float* g, float* residual, bool has_residual, size_t n, size_t chunk,
               int levels, uint64_t key, float* norms, int8_t* q);
void EfTopKCpu(const float* g, float* residual, bool has_residual, size_t n, size_t k,
               SparseValueFormat format, int32_t* indices, void* values);
// `indices` from RandomKIndicesCpu, `scale` from RandomKScale.
void EfRandomKCpu(const float* g, float* residual, bool has_residual, size_t n,
                  const uint32_t* indices, size_t k, float scale, float* values);

}  // namespace gradsync::kernels

#endif  // GRADSYNC_KERNELS_COMPRESS_CPU_H_
