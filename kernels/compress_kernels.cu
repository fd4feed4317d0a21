// Element-wise compression kernels: fp16/bf16 casts, sparse gather and
// scatter, fused bucket pack/unpack, and the error-feedback updates of the
// element-wise and sparse compressors. Top-k selection is in
// topk_kernels.cu, sign and QSGD in quantize_kernels.cu.
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/compress_kernels.h"
#include "kernels/compress_math.h"
#include "kernels/cuda_util.cuh"

namespace gradsync::kernels {
namespace {

using device::GridStride;
using device::Groups;
using device::Pack8;
using device::ThreadIndex;
using launch::Blocks;
using launch::CheckPointers;
using launch::LaunchStatus;
using launch::Pointer;
using launch::VectorSplit;

// Calls f(i) for the elements outside the vector groups: the head and the
// tail, grid-stride.
template <typename F>
__device__ __forceinline__ void ForScalars(size_t n, VectorSplit split, F f) {
  const size_t stride = GridStride();
  for (size_t i = ThreadIndex(); i < split.head; i += stride) f(i);
  for (size_t i = split.head + 8 * split.groups + ThreadIndex(); i < n; i += stride) {
    f(i);
  }
}

template <bool kBf16>
__device__ __forceinline__ uint16_t To16(float x) {
  return kBf16 ? math::FloatToBf16Bits(x) : math::FloatToHalfBits(x);
}

template <bool kBf16>
__device__ __forceinline__ float From16(uint16_t h) {
  return kBf16 ? math::Bf16BitsToFloat(h) : math::HalfBitsToFloat(h);
}

struct ToFp16 {
  __device__ uint16_t operator()(float x) const { return To16<false>(x); }
};
struct ToBf16 {
  __device__ uint16_t operator()(float x) const { return To16<true>(x); }
};
struct FromFp16 {
  __device__ float operator()(uint16_t h) const { return From16<false>(h); }
};
struct FromBf16 {
  __device__ float operator()(uint16_t h) const { return From16<true>(h); }
};
struct DividedToFp16 {
  float divisor;
  __device__ uint16_t operator()(float x) const { return To16<false>(math::Div(x, divisor)); }
};
struct Identity {
  __device__ float operator()(float x) const { return x; }
};

// out[i] = conv(in[i]).
template <typename In, typename Out, typename Conv>
__global__ void MapKernel(const In* __restrict__ in, Out* __restrict__ out, size_t n,
                          VectorSplit split, Conv conv) {
  const Pack8<In>* vin = Groups(in, split.head);
  Pack8<Out>* vout = Groups(out, split.head);
  for (size_t g = ThreadIndex(); g < split.groups; g += GridStride()) {
    const Pack8<In> a = vin[g];
    Pack8<Out> b;
#pragma unroll
    for (int j = 0; j < 8; ++j) b.v[j] = conv(a.v[j]);
    vout[g] = b;
  }
  ForScalars(n, split, [&](size_t i) { out[i] = conv(in[i]); });
}

unsigned int MapBlocks(size_t n, VectorSplit split) {
  return Blocks(split.groups > 0 ? split.groups : n);
}

template <typename In, typename Out, typename Conv>
Status Map(const char* fn, const In* in, Out* out, size_t n, cudaStream_t stream,
           Conv conv = Conv()) {
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(CheckPointers(fn, {{"in", in, sizeof(In)}, {"out", out, sizeof(Out)}}));
  const VectorSplit split =
      launch::SplitForVectors(n, launch::VectorHead({{in, sizeof(In), alignof(Pack8<In>)},
                                                     {out, sizeof(Out), alignof(Pack8<Out>)}}));
  MapKernel<<<MapBlocks(n, split), launch::kThreads, 0, stream>>>(in, out, n, split, conv);
  return LaunchStatus(fn);
}

// ---- Error feedback of fp16 / bf16 ----

template <bool kBf16>
__device__ __forceinline__ void EfFloat16One(float g, float* e, bool has, uint16_t* w) {
  const float c = has ? math::Corrected(g, *e) : g;
  *w = To16<kBf16>(c);
  *e = math::Sub(c, From16<kBf16>(*w));
}

template <bool kBf16>
__global__ void EfFloat16Kernel(const float* __restrict__ g, float* residual, bool has, size_t n,
                                VectorSplit split, uint16_t* __restrict__ wire) {
  const Pack8<float>* vg = Groups(g, split.head);
  Pack8<float>* ve = Groups(residual, split.head);
  Pack8<uint16_t>* vw = Groups(wire, split.head);
  for (size_t i = ThreadIndex(); i < split.groups; i += GridStride()) {
    const Pack8<float> a = vg[i];
    Pack8<float> e = ve[i];
    Pack8<uint16_t> w;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      EfFloat16One<kBf16>(a.v[j], &e.v[j], has, &w.v[j]);
    }
    ve[i] = e;
    vw[i] = w;
  }
  ForScalars(n, split, [&](size_t i) { EfFloat16One<kBf16>(g[i], &residual[i], has, &wire[i]); });
}

// residual = g + residual, or g without a residual: c of error feedback.
__global__ void EfCorrectKernel(const float* __restrict__ g, float* residual, size_t n,
                                VectorSplit split) {
  const Pack8<float>* vg = Groups(g, split.head);
  Pack8<float>* ve = Groups(residual, split.head);
  for (size_t i = ThreadIndex(); i < split.groups; i += GridStride()) {
    const Pack8<float> a = vg[i];
    Pack8<float> e = ve[i];
#pragma unroll
    for (int j = 0; j < 8; ++j) e.v[j] = math::Corrected(a.v[j], e.v[j]);
    ve[i] = e;
  }
  ForScalars(n, split, [&](size_t i) { residual[i] = math::Corrected(g[i], residual[i]); });
}

Status EfCorrect(const char* fn, const float* g, float* residual, bool has_residual, size_t n,
                 cudaStream_t stream) {
  if (!has_residual) {
    return LaunchStatus(
        fn, cudaMemcpyAsync(residual, g, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  }
  const VectorSplit split =
      launch::SplitForVectors(n, launch::VectorHead({{g, 4, 16}, {residual, 4, 16}}));
  EfCorrectKernel<<<MapBlocks(n, split), launch::kThreads, 0, stream>>>(g, residual, n, split);
  return LaunchStatus(fn);
}

// ---- Sparse gather / scatter ----

__global__ void GatherKernel(const float* __restrict__ in, const uint32_t* __restrict__ indices,
                             size_t k, float* __restrict__ out) {
  for (size_t j = ThreadIndex(); j < k; j += GridStride()) {
    out[j] = in[indices[j]];
  }
}

template <bool kAdd>
__global__ void ScatterKernel(const float* __restrict__ values,
                              const uint32_t* __restrict__ indices, size_t k, float scale,
                              float* __restrict__ out) {
  for (size_t j = ThreadIndex(); j < k; j += GridStride()) {
    const float v = math::Mul(values[j], scale);
    out[indices[j]] = kAdd ? math::Add(out[indices[j]], v) : v;
  }
}

template <bool kF16>
__global__ void SparseDecompressKernel(const int32_t* __restrict__ indices,
                                       const void* __restrict__ values, size_t k, size_t n,
                                       float* __restrict__ out) {
  for (size_t j = ThreadIndex(); j < k; j += GridStride()) {
    // An index outside the tensor (from a faulty peer) writes nothing.
    if (indices[j] < 0 || static_cast<size_t>(indices[j]) >= n) continue;
    out[indices[j]] = kF16 ? math::HalfBitsToFloat(static_cast<const uint16_t*>(values)[j])
                           : static_cast<const float*>(values)[j];
  }
}

// values[j] = c at indices[j]; there e_new = c - values[j] * scale.
__global__ void EfRandomKFixKernel(float* residual, const uint32_t* __restrict__ indices, size_t k,
                                   float scale, float* __restrict__ values) {
  for (size_t j = ThreadIndex(); j < k; j += GridStride()) {
    const float c = residual[indices[j]];
    values[j] = c;
    residual[indices[j]] = math::Sub(c, math::Mul(c, scale));
  }
}

// At the kept indices e_new = c - decoded(c): 0 for fp32 values (NaN for
// inf and NaN), the fp16 rounding error otherwise.
template <bool kF16>
__global__ void EfTopKFixKernel(float* residual, const int32_t* __restrict__ indices, size_t k) {
  for (size_t j = ThreadIndex(); j < k; j += GridStride()) {
    const float c = residual[indices[j]];
    const float d = kF16 ? math::HalfBitsToFloat(math::FloatToHalfBits(c)) : c;
    residual[indices[j]] = math::Sub(c, d);
  }
}

// ---- Fused buckets ----

constexpr size_t kBucketTile = 4096;

// bucket elements [lo, hi) of one tile, slice by slice: pack (bucket =
// conv(tensor)) or unpack (tensor = conv(bucket)).
template <bool kPack, typename Bucket, typename Conv>
__device__ __forceinline__ void CopyTile(const BucketSlice* slices, size_t num_slices, size_t lo,
                                         size_t hi, Bucket* bucket, Conv conv) {
  // The first slice that ends after lo (ends ascend with offsets).
  size_t a = 0;
  size_t b = num_slices;
  while (a < b) {
    const size_t mid = a + (b - a) / 2;
    if (slices[mid].offset + slices[mid].count <= lo) {
      a = mid + 1;
    } else {
      b = mid;
    }
  }
  using Word = std::conditional_t<std::is_const_v<Bucket>, const uint32_t, uint32_t>;
  constexpr bool kPairs = sizeof(Bucket) == 2;
  // 16-bit buckets move two elements per 32-bit word where they can.
  const bool pairs = kPairs && reinterpret_cast<uintptr_t>(bucket) % 4 == 0;
  for (size_t s = a; s < num_slices; ++s) {
    const BucketSlice slice = slices[s];
    if (slice.offset >= hi) break;
    size_t from = slice.offset > lo ? slice.offset : lo;
    const size_t end = slice.offset + slice.count;
    size_t to = end < hi ? end : hi;
    if constexpr (kPairs) {
      if (pairs && to - from >= 2) {
        // An odd first and last element one by one, the pairs as words.
        const size_t first = from + (from & 1);
        const size_t last = to - ((to - first) & 1);
        Word* words = reinterpret_cast<Word*>(bucket);
        float* t = slice.tensor;
        const size_t o = slice.offset;
        for (size_t k = first + 2 * threadIdx.x; k < last; k += 2 * blockDim.x) {
          if constexpr (kPack) {
            words[k / 2] = static_cast<uint32_t>(conv(t[k - o])) |
                           static_cast<uint32_t>(conv(t[k + 1 - o])) << 16;
          } else {
            const uint32_t w = words[k / 2];
            t[k - o] = conv(static_cast<uint16_t>(w & 0xFFFFu));
            t[k + 1 - o] = conv(static_cast<uint16_t>(w >> 16));
          }
        }
        if (threadIdx.x == 0 && first != from) {
          if constexpr (kPack)
            bucket[from] = conv(t[from - o]);
          else
            t[from - o] = conv(bucket[from]);
        }
        if (threadIdx.x == blockDim.x - 1 && last != to) {
          if constexpr (kPack)
            bucket[last] = conv(t[last - o]);
          else
            t[last - o] = conv(bucket[last]);
        }
        continue;
      }
    }
#pragma unroll 4
    for (size_t i = from + threadIdx.x; i < to; i += blockDim.x) {
      if constexpr (kPack) {
        bucket[i] = conv(slice.tensor[i - slice.offset]);
      } else {
        slice.tensor[i - slice.offset] = conv(bucket[i]);
      }
    }
  }
}

template <bool kPack, typename Bucket, typename Conv>
__global__ void BucketKernel(const BucketSlice* __restrict__ slices, size_t num_slices,
                             size_t bucket_elems, Bucket* bucket, Conv conv) {
  for (size_t tile = blockIdx.x; tile * kBucketTile < bucket_elems; tile += gridDim.x) {
    const size_t lo = tile * kBucketTile;
    const size_t hi = lo + kBucketTile < bucket_elems ? lo + kBucketTile : bucket_elems;
    CopyTile<kPack>(slices, num_slices, lo, hi, bucket, conv);
  }
}

template <bool kPack, typename Bucket, typename Conv>
Status LaunchBucket(const char* fn, const BucketSlice* slices, size_t num_slices,
                    size_t bucket_elems, Bucket* bucket, cudaStream_t stream) {
  if (num_slices == 0 || bucket_elems == 0) return OkStatus();
  GS_RETURN_IF_ERROR(
      CheckPointers(fn, {{"slices", slices, 8}, {"bucket", bucket, sizeof(Bucket)}}));
  BucketKernel<kPack><<<Blocks(bucket_elems, kBucketTile), launch::kThreads, 0, stream>>>(
      slices, num_slices, bucket_elems, bucket, Conv());
  return LaunchStatus(fn);
}

}  // namespace

Status FloatToHalfCuda(const float* in, uint16_t* out, size_t n, cudaStream_t stream) {
  return Map<float, uint16_t, ToFp16>("FloatToHalfCuda", in, out, n, stream);
}

Status HalfToFloatCuda(const uint16_t* in, float* out, size_t n, cudaStream_t stream) {
  return Map<uint16_t, float, FromFp16>("HalfToFloatCuda", in, out, n, stream);
}

Status FloatToBf16Cuda(const float* in, uint16_t* out, size_t n, cudaStream_t stream) {
  return Map<float, uint16_t, ToBf16>("FloatToBf16Cuda", in, out, n, stream);
}

Status Bf16ToFloatCuda(const uint16_t* in, float* out, size_t n, cudaStream_t stream) {
  return Map<uint16_t, float, FromBf16>("Bf16ToFloatCuda", in, out, n, stream);
}

Status DividedToHalfCuda(const float* in, float divisor, uint16_t* out, size_t n,
                         cudaStream_t stream) {
  return Map<float, uint16_t, DividedToFp16>("DividedToHalfCuda", in, out, n, stream,
                                             DividedToFp16{divisor});
}

Status SparseDecompressCuda(const int32_t* indices, const void* values, SparseValueFormat format,
                            size_t k, size_t n, float* out, cudaStream_t stream) {
  constexpr char kFn[] = "SparseDecompressCuda";
  if (k > n) {
    return InvalidArgumentError(std::string(kFn) + ": k " + std::to_string(k) + " exceeds n " +
                                std::to_string(n));
  }
  if (n == 0) return OkStatus();
  const bool f16 = format == SparseValueFormat::kF16;
  GS_RETURN_IF_ERROR(CheckPointers(kFn, {{"out", out, 4}}));
  if (k > 0) {
    GS_RETURN_IF_ERROR(
        CheckPointers(kFn, {{"indices", indices, 4}, {"values", values, f16 ? 2u : 4u}}));
  }
  GS_RETURN_IF_ERROR(LaunchStatus(kFn, cudaMemsetAsync(out, 0, n * sizeof(float), stream)));
  if (k == 0) return OkStatus();
  if (f16) {
    SparseDecompressKernel<true>
        <<<Blocks(k), launch::kThreads, 0, stream>>>(indices, values, k, n, out);
  } else {
    SparseDecompressKernel<false>
        <<<Blocks(k), launch::kThreads, 0, stream>>>(indices, values, k, n, out);
  }
  return LaunchStatus(kFn);
}

Status GatherCuda(const float* in, const uint32_t* indices, size_t k, float* out,
                  cudaStream_t stream) {
  constexpr char kFn[] = "GatherCuda";
  if (k == 0) return OkStatus();
  GS_RETURN_IF_ERROR(CheckPointers(kFn, {{"in", in, 4}, {"indices", indices, 4}, {"out", out, 4}}));
  GatherKernel<<<Blocks(k), launch::kThreads, 0, stream>>>(in, indices, k, out);
  return LaunchStatus(kFn);
}

Status ScatterCuda(const float* values, const uint32_t* indices, size_t k, float scale, size_t n,
                   float* out, cudaStream_t stream) {
  constexpr char kFn[] = "ScatterCuda";
  if (k > n) {
    return InvalidArgumentError(std::string(kFn) + ": k " + std::to_string(k) + " exceeds n " +
                                std::to_string(n));
  }
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(CheckPointers(kFn, {{"out", out, 4}}));
  if (k > 0) {
    GS_RETURN_IF_ERROR(CheckPointers(kFn, {{"values", values, 4}, {"indices", indices, 4}}));
  }
  GS_RETURN_IF_ERROR(LaunchStatus(kFn, cudaMemsetAsync(out, 0, n * sizeof(float), stream)));
  if (k == 0) return OkStatus();
  ScatterKernel<false><<<Blocks(k), launch::kThreads, 0, stream>>>(values, indices, k, scale, out);
  return LaunchStatus(kFn);
}

Status ScatterAddCuda(const float* values, const uint32_t* indices, size_t k, float scale,
                      float* out, cudaStream_t stream) {
  constexpr char kFn[] = "ScatterAddCuda";
  if (k == 0) return OkStatus();
  GS_RETURN_IF_ERROR(
      CheckPointers(kFn, {{"values", values, 4}, {"indices", indices, 4}, {"out", out, 4}}));
  ScatterKernel<true><<<Blocks(k), launch::kThreads, 0, stream>>>(values, indices, k, scale, out);
  return LaunchStatus(kFn);
}

Status PackBucketCuda(const BucketSlice* slices, size_t num_slices, size_t bucket_elems,
                      float* bucket, cudaStream_t stream) {
  return LaunchBucket<true, float, Identity>("PackBucketCuda", slices, num_slices, bucket_elems,
                                             bucket, stream);
}

Status PackBucket16Cuda(Float16Format format, const BucketSlice* slices, size_t num_slices,
                        size_t bucket_elems, uint16_t* bucket, cudaStream_t stream) {
  constexpr char kFn[] = "PackBucket16Cuda";
  if (format == Float16Format::kFp16) {
    return LaunchBucket<true, uint16_t, ToFp16>(kFn, slices, num_slices, bucket_elems, bucket,
                                                stream);
  }
  return LaunchBucket<true, uint16_t, ToBf16>(kFn, slices, num_slices, bucket_elems, bucket,
                                              stream);
}

Status UnpackBucketCuda(const BucketSlice* slices, size_t num_slices, size_t bucket_elems,
                        const float* bucket, cudaStream_t stream) {
  return LaunchBucket<false, const float, Identity>("UnpackBucketCuda", slices, num_slices,
                                                    bucket_elems, bucket, stream);
}

Status UnpackBucket16Cuda(Float16Format format, const BucketSlice* slices, size_t num_slices,
                          size_t bucket_elems, const uint16_t* bucket, cudaStream_t stream) {
  constexpr char kFn[] = "UnpackBucket16Cuda";
  if (format == Float16Format::kFp16) {
    return LaunchBucket<false, const uint16_t, FromFp16>(kFn, slices, num_slices, bucket_elems,
                                                         bucket, stream);
  }
  return LaunchBucket<false, const uint16_t, FromBf16>(kFn, slices, num_slices, bucket_elems,
                                                       bucket, stream);
}

Status EfFloat16Cuda(Float16Format format, const float* g, float* residual, bool has_residual,
                     size_t n, uint16_t* wire, cudaStream_t stream) {
  constexpr char kFn[] = "EfFloat16Cuda";
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(
      CheckPointers(kFn, {{"g", g, 4}, {"residual", residual, 4}, {"wire", wire, 2}}));
  const VectorSplit split = launch::SplitForVectors(
      n, launch::VectorHead({{g, 4, 16}, {residual, 4, 16}, {wire, 2, 16}}));
  if (format == Float16Format::kFp16) {
    EfFloat16Kernel<false><<<MapBlocks(n, split), launch::kThreads, 0, stream>>>(
        g, residual, has_residual, n, split, wire);
  } else {
    EfFloat16Kernel<true><<<MapBlocks(n, split), launch::kThreads, 0, stream>>>(
        g, residual, has_residual, n, split, wire);
  }
  return LaunchStatus(kFn);
}

Status EfTopKCuda(const float* g, float* residual, bool has_residual, size_t n, size_t k,
                  SparseValueFormat format, int32_t* indices, void* values, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream) {
  constexpr char kFn[] = "EfTopKCuda";
  GS_RETURN_IF_ERROR(
      launch::CheckTopKArgs(kFn, n, k, format, indices, values, workspace, workspace_bytes));
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(CheckPointers(kFn, {{"g", g, 4}, {"residual", residual, 4}}));
  GS_RETURN_IF_ERROR(EfCorrect(kFn, g, residual, has_residual, n, stream));
  GS_RETURN_IF_ERROR(
      TopKCuda(residual, n, k, format, indices, values, workspace, workspace_bytes, stream));
  if (k == 0) return OkStatus();
  if (format == SparseValueFormat::kF16) {
    EfTopKFixKernel<true><<<Blocks(k), launch::kThreads, 0, stream>>>(residual, indices, k);
  } else {
    EfTopKFixKernel<false><<<Blocks(k), launch::kThreads, 0, stream>>>(residual, indices, k);
  }
  return LaunchStatus(kFn);
}

Status EfRandomKCuda(const float* g, float* residual, bool has_residual, size_t n,
                     const uint32_t* indices, size_t k, float scale, float* values,
                     cudaStream_t stream) {
  constexpr char kFn[] = "EfRandomKCuda";
  if (k > n) {
    return InvalidArgumentError(std::string(kFn) + ": k " + std::to_string(k) + " exceeds n " +
                                std::to_string(n));
  }
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(CheckPointers(kFn, {{"g", g, 4}, {"residual", residual, 4}}));
  if (k > 0) {
    GS_RETURN_IF_ERROR(CheckPointers(kFn, {{"indices", indices, 4}, {"values", values, 4}}));
  }
  GS_RETURN_IF_ERROR(EfCorrect(kFn, g, residual, has_residual, n, stream));
  if (k == 0) return OkStatus();
  EfRandomKFixKernel<<<Blocks(k), launch::kThreads, 0, stream>>>(residual, indices, k, scale,
                                                                 values);
  return LaunchStatus(kFn);
}

namespace {

template <bool kBf16>
__global__ void Add16Kernel(uint16_t* acc, const uint16_t* __restrict__ in, size_t n) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) {
    acc[i] = To16<kBf16>(math::Add(From16<kBf16>(acc[i]), From16<kBf16>(in[i])));
  }
}

__global__ void DivideKernel(float* data, size_t n, float divisor) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) {
    data[i] = math::Div(data[i], divisor);
  }
}

template <bool kBf16>
__global__ void Scale16Kernel(uint16_t* data, size_t n, float scale) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) {
    data[i] = To16<kBf16>(math::Mul(From16<kBf16>(data[i]), scale));
  }
}

}  // namespace

Status Add16IntoCuda(Float16Format format, uint16_t* acc, const uint16_t* in, size_t n,
                     cudaStream_t stream) {
  constexpr char kFn[] = "Add16IntoCuda";
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(CheckPointers(kFn, {{"acc", acc, 2}, {"in", in, 2}}));
  if (format == Float16Format::kBf16) {
    Add16Kernel<true><<<Blocks(n), launch::kThreads, 0, stream>>>(acc, in, n);
  } else {
    Add16Kernel<false><<<Blocks(n), launch::kThreads, 0, stream>>>(acc, in, n);
  }
  return LaunchStatus(kFn);
}

Status DivideFloatCuda(float* data, size_t n, float divisor, cudaStream_t stream) {
  constexpr char kFn[] = "DivideFloatCuda";
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(CheckPointers(kFn, {{"data", data, 4}}));
  DivideKernel<<<Blocks(n), launch::kThreads, 0, stream>>>(data, n, divisor);
  return LaunchStatus(kFn);
}

Status Scale16Cuda(Float16Format format, uint16_t* data, size_t n, float scale,
                   cudaStream_t stream) {
  constexpr char kFn[] = "Scale16Cuda";
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(CheckPointers(kFn, {{"data", data, 2}}));
  if (format == Float16Format::kBf16) {
    Scale16Kernel<true><<<Blocks(n), launch::kThreads, 0, stream>>>(data, n, scale);
  } else {
    Scale16Kernel<false><<<Blocks(n), launch::kThreads, 0, stream>>>(data, n, scale);
  }
  return LaunchStatus(kFn);
}

}  // namespace gradsync::kernels
