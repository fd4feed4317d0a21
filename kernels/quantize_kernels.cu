// Sign and QSGD encode/decode, and their fused error-feedback versions.
//
// Sign: the scale of a chunk is mean |x| summed in 8 lanes (lane i % 8, in
// element order) and reduced in a fixed order, so 8 threads encode one
// chunk: thread `lane` adds elements lane, lane + 8, ... one by one, and a
// warp ballot in the same round yields the sign-bit byte of those 8
// elements for each of the warp's 4 chunks.
//
// QSGD: one warp per chunk. The norm (max key) does not depend on the
// reduction order; the levels use the counter-based rounding hash, so each
// element is independent of the others.
//
// With error feedback the kernels encode c = g + e_old (computed in both
// passes from the same inputs) and write e_new = c - decoded in the second
// pass; every element is read and written by the one thread that owns it.
#include <cstdint>
#include <string>

#include "kernels/compress_kernels.h"
#include "kernels/compress_math.h"
#include "kernels/cuda_util.cuh"

namespace gradsync::kernels {
namespace {

using device::GridStride;
using device::kFullMask;

// The largest of the warp's 32 values, in every lane (the same value on
// every architecture: sm_80's reduction instruction, or shuffles before it).
__device__ __forceinline__ uint32_t WarpMax(uint32_t v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFullMask, v);
#else
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint32_t other = __shfl_xor_sync(kFullMask, v, offset);
    v = other > v ? other : v;
  }
  return v;
#endif
}
using device::Pack8;
using device::ThreadIndex;
using launch::Blocks;
using launch::CheckPointers;
using launch::LaunchStatus;

// What the encoder sees of element i: g, or c = g + e_old with a residual.
template <bool kEf>
__device__ __forceinline__ float Input(const float* in, const float* residual, bool has_residual,
                                       size_t i) {
  if (!kEf || !has_residual) return in[i];
  return math::Corrected(in[i], residual[i]);
}

// 8 threads per chunk; `residual` is only touched when kEf.
template <bool kEf>
__global__ void SignEncodeKernel(const float* __restrict__ in, float* residual, bool has_residual,
                                 size_t n, size_t chunk, size_t num_chunks,
                                 float* __restrict__ scales, uint8_t* __restrict__ bits) {
  const size_t c = ThreadIndex() / 8;
  const unsigned int lane = threadIdx.x % 8;
  const unsigned int byte_shift = threadIdx.x % 32 / 8 * 8;
  const size_t first = c * chunk;
  const size_t len = c < num_chunks ? (chunk < n - first ? chunk : n - first) : 0;
  const size_t rounds = chunk / 8;
  float sum = 0.0f;
#pragma unroll 4
  for (size_t r = 0; r < rounds; ++r) {
    const size_t i = 8 * r + lane;
    bool negative = false;
    if (i < len) {
      const float x = Input<kEf>(in, residual, has_residual, first + i);
      sum = math::Add(sum, math::Abs(x));
      negative = math::SignBit(x);
    }
    const unsigned int ballot = __ballot_sync(kFullMask, negative);
    if (lane == 0 && 8 * r < len) {
      bits[first / 8 + r] = static_cast<uint8_t>(ballot >> byte_shift);
    }
  }
  // ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) lands in lane 0.
  sum = math::Add(sum, __shfl_down_sync(kFullMask, sum, 4, 8));
  sum = math::Add(sum, __shfl_down_sync(kFullMask, sum, 2, 8));
  sum = math::Add(sum, __shfl_down_sync(kFullMask, sum, 1, 8));
  const float scale = __shfl_sync(kFullMask, math::Div(sum, static_cast<float>(len)), 0, 8);
  if (len == 0) return;
  if (lane == 0) scales[c] = scale;
  if constexpr (kEf) {
    for (size_t i = lane; i < len; i += 8) {
      const float x = Input<kEf>(in, residual, has_residual, first + i);
      residual[first + i] = math::Sub(x, math::SignDecode(scale, math::SignBit(x) ? 1u : 0u));
    }
  }
}

// One group of 8 elements (one byte of bits) per iteration.
__global__ void SignDecodeKernel(const float* __restrict__ scales, const uint8_t* __restrict__ bits,
                                 size_t n, size_t chunk, float* __restrict__ out, bool vector_out) {
  const size_t groups = (n + 7) / 8;
  for (size_t g = ThreadIndex(); g < groups; g += GridStride()) {
    const size_t i0 = 8 * g;
    const float scale = scales[i0 / chunk];
    const uint32_t byte = bits[g];
    if (vector_out && i0 + 8 <= n) {
      Pack8<float> v;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        v.v[j] = math::SignDecode(scale, (byte >> j) & 1u);
      }
      device::Groups(out, 0)[g] = v;
    } else {
      for (size_t j = 0; j < 8 && i0 + j < n; ++j) {
        out[i0 + j] = math::SignDecode(scale, (byte >> j) & 1u);
      }
    }
  }
}

// Four elements (half a byte of bits) per thread, adjacent threads on
// adjacent elements: a warp stores 512 contiguous bytes at once. `out` is
// 16-byte aligned; chunk / 4 and the quads fit 32 bits.
__global__ void SignDecodeQuadKernel(const float* __restrict__ scales,
                                     const uint8_t* __restrict__ bits, size_t n,
                                     uint32_t chunk_quads, float* __restrict__ out) {
  const size_t quads = (n + 3) / 4;
  for (size_t q = ThreadIndex(); q < quads; q += GridStride()) {
    const uint32_t q32 = static_cast<uint32_t>(q);
    const float scale = scales[q32 / chunk_quads];
    const uint32_t nibble = (static_cast<uint32_t>(bits[q / 2]) >> (4 * (q32 & 1u))) & 0xFu;
    const size_t i0 = 4 * q;
    if (i0 + 4 <= n) {
      float4 v;
      v.x = math::SignDecode(scale, nibble & 1u);
      v.y = math::SignDecode(scale, (nibble >> 1) & 1u);
      v.z = math::SignDecode(scale, (nibble >> 2) & 1u);
      v.w = math::SignDecode(scale, (nibble >> 3) & 1u);
      reinterpret_cast<float4*>(out)[q] = v;
    } else {
      for (size_t j = 0; i0 + j < n; ++j) out[i0 + j] = math::SignDecode(scale, (nibble >> j) & 1u);
    }
  }
}

// One warp per chunk: the norm, then the levels (and e_new when kEf).
template <bool kEf>
__global__ void QsgdEncodeKernel(const float* __restrict__ in, float* residual, bool has_residual,
                                 size_t n, size_t chunk, size_t num_chunks, int levels,
                                 uint64_t key, float* __restrict__ norms, int8_t* __restrict__ q) {
  const size_t c = ThreadIndex() / 32;
  if (c >= num_chunks) return;  // The whole warp.
  const unsigned int lane = threadIdx.x % 32;
  const size_t first = c * chunk;
  const size_t len = chunk < n - first ? chunk : n - first;
  uint32_t m = 0;
#pragma unroll 4
  for (size_t i = lane; i < len; i += 32) {
    const uint32_t k = math::MagnitudeKey(Input<kEf>(in, residual, has_residual, first + i));
    m = k > m ? k : m;
  }
  m = WarpMax(m);
  const float norm = math::BitsFloat(m);
  if (lane == 0) norms[c] = norm;
  const math::QsgdChunkPlan plan = math::PlanQsgdChunk(norm, levels);
  const float top = static_cast<float>(levels);
  const float step = math::QsgdStep(norm, levels);
#pragma unroll 4
  for (size_t i = lane; i < len; i += 32) {
    const float x = Input<kEf>(in, residual, has_residual, first + i);
    const int8_t level = math::QsgdLevel(x, plan, top, key, static_cast<uint32_t>(first + i));
    q[first + i] = level;
    if constexpr (kEf) {
      residual[first + i] = math::Sub(x, math::QsgdDecode(level, step));
    }
  }
}

__global__ void QsgdDecodeKernel(const float* __restrict__ norms, const int8_t* __restrict__ q,
                                 size_t n, size_t chunk, int levels, float* __restrict__ out,
                                 bool vector) {
  const size_t groups = (n + 7) / 8;
  for (size_t g = ThreadIndex(); g < groups; g += GridStride()) {
    const size_t i0 = 8 * g;
    const float step = math::QsgdStep(norms[i0 / chunk], levels);
    if (vector && i0 + 8 <= n) {
      const Pack8<int8_t> a = device::Groups(q, 0)[g];
      Pack8<float> v;
#pragma unroll
      for (int j = 0; j < 8; ++j) v.v[j] = math::QsgdDecode(a.v[j], step);
      device::Groups(out, 0)[g] = v;
    } else {
      for (size_t j = 0; j < 8 && i0 + j < n; ++j) {
        out[i0 + j] = math::QsgdDecode(q[i0 + j], step);
      }
    }
  }
}

size_t NumChunksOf(size_t n, size_t chunk) { return n / chunk + (n % chunk != 0); }

bool Aligned(const void* p, size_t align) { return reinterpret_cast<uintptr_t>(p) % align == 0; }

template <bool kEf>
Status LaunchSignEncode(const char* fn, const float* in, float* residual, bool has_residual,
                        size_t n, size_t chunk, float* scales, uint8_t* bits, cudaStream_t stream) {
  GS_RETURN_IF_ERROR(launch::CheckChunk(fn, chunk));
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(CheckPointers(fn, {{"in", in, 4}, {"scales", scales, 4}, {"bits", bits, 1}}));
  if constexpr (kEf) {
    GS_RETURN_IF_ERROR(CheckPointers(fn, {{"residual", residual, 4}}));
  }
  const size_t chunks = NumChunksOf(n, chunk);
  SignEncodeKernel<kEf>
      <<<Blocks(8 * chunks, launch::kThreads, ~size_t{0} >> 33), launch::kThreads, 0, stream>>>(
          in, residual, has_residual, n, chunk, chunks, scales, bits);
  return LaunchStatus(fn);
}

template <bool kEf>
Status LaunchQsgdEncode(const char* fn, const float* in, float* residual, bool has_residual,
                        size_t n, size_t chunk, int levels, uint64_t key, float* norms, int8_t* q,
                        cudaStream_t stream) {
  GS_RETURN_IF_ERROR(launch::CheckChunk(fn, chunk));
  GS_RETURN_IF_ERROR(launch::CheckLevels(fn, levels));
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(CheckPointers(fn, {{"in", in, 4}, {"norms", norms, 4}, {"q", q, 1}}));
  if constexpr (kEf) {
    GS_RETURN_IF_ERROR(CheckPointers(fn, {{"residual", residual, 4}}));
  }
  const size_t chunks = NumChunksOf(n, chunk);
  QsgdEncodeKernel<kEf>
      <<<Blocks(32 * chunks, launch::kThreads, ~size_t{0} >> 33), launch::kThreads, 0, stream>>>(
          in, residual, has_residual, n, chunk, chunks, levels, key, norms, q);
  return LaunchStatus(fn);
}

}  // namespace

Status SignEncodeCuda(const float* in, size_t n, size_t chunk, float* scales, uint8_t* bits,
                      cudaStream_t stream) {
  return LaunchSignEncode<false>("SignEncodeCuda", in, nullptr, false, n, chunk, scales, bits,
                                 stream);
}

Status SignDecodeCuda(const float* scales, const uint8_t* bits, size_t n, size_t chunk, float* out,
                      cudaStream_t stream) {
  constexpr char kFn[] = "SignDecodeCuda";
  GS_RETURN_IF_ERROR(launch::CheckChunk(kFn, chunk));
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(
      CheckPointers(kFn, {{"scales", scales, 4}, {"bits", bits, 1}, {"out", out, 4}}));
  if (Aligned(out, 16) && n / 4 <= 0xFFFFFFFFu && chunk <= 0xFFFFFFFFu) {
    SignDecodeQuadKernel<<<Blocks((n + 3) / 4), launch::kThreads, 0, stream>>>(
        scales, bits, n, static_cast<uint32_t>(chunk / 4), out);
  } else {
    SignDecodeKernel<<<Blocks((n + 7) / 8), launch::kThreads, 0, stream>>>(scales, bits, n, chunk,
                                                                           out, Aligned(out, 16));
  }
  return LaunchStatus(kFn);
}

Status QsgdEncodeCuda(const float* in, size_t n, size_t chunk, int levels, uint64_t key,
                      float* norms, int8_t* q, cudaStream_t stream) {
  return LaunchQsgdEncode<false>("QsgdEncodeCuda", in, nullptr, false, n, chunk, levels, key, norms,
                                 q, stream);
}

Status QsgdDecodeCuda(const float* norms, const int8_t* q, size_t n, size_t chunk, int levels,
                      float* out, cudaStream_t stream) {
  constexpr char kFn[] = "QsgdDecodeCuda";
  GS_RETURN_IF_ERROR(launch::CheckChunk(kFn, chunk));
  GS_RETURN_IF_ERROR(launch::CheckLevels(kFn, levels));
  if (n == 0) return OkStatus();
  GS_RETURN_IF_ERROR(CheckPointers(kFn, {{"norms", norms, 4}, {"q", q, 1}, {"out", out, 4}}));
  QsgdDecodeKernel<<<Blocks((n + 7) / 8), launch::kThreads, 0, stream>>>(
      norms, q, n, chunk, levels, out, Aligned(q, 8) && Aligned(out, 16));
  return LaunchStatus(kFn);
}

Status EfSignCuda(const float* g, float* residual, bool has_residual, size_t n, size_t chunk,
                  float* scales, uint8_t* bits, cudaStream_t stream) {
  return LaunchSignEncode<true>("EfSignCuda", g, residual, has_residual, n, chunk, scales, bits,
                                stream);
}

Status EfQsgdCuda(const float* g, float* residual, bool has_residual, size_t n, size_t chunk,
                  int levels, uint64_t key, float* norms, int8_t* q, cudaStream_t stream) {
  return LaunchQsgdEncode<true>("EfQsgdCuda", g, residual, has_residual, n, chunk, levels, key,
                                norms, q, stream);
}

}  // namespace gradsync::kernels
