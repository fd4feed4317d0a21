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
// With error feedback the kernels encode c = g + e_old and write
// e_new = c - decoded in a second pass.
//
// Both encoders have a shared-memory form, used when a block's chunks fit
// in 48 KiB: the block loads its chunks once, coalesced (16-byte vectors
// when the buffers allow), into shared memory, and both passes read them
// there, so each input crosses device memory once. Larger chunks take the
// two-pass kernels, which read the inputs again in the second pass. Both
// forms compute the same bits.
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

// Shared-memory encoders: at most this many bytes of chunks per block (under
// the 48 KiB a block gets without opting in, with room for the sign
// kernel's scales), and at most this many chunks (sign: 8 threads each;
// QSGD: 32 each).
constexpr size_t kSharedBytes = 46 << 10;
constexpr uint32_t kSignBlockChunks = 16;
constexpr uint32_t kQsgdBlockChunks = 8;

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

// Loads the `region` elements from `first` (c, or g + e_old with a
// residual) into shared memory, element j of chunk j / chunk at
// j / chunk * stride + j % chunk; `vector`: in (and residual) are 16-byte
// aligned, so whole float4s are loaded (chunk and stride are multiples of 4).
template <bool kEf>
__device__ __forceinline__ void LoadChunks(const float* __restrict__ in, const float* residual,
                                           bool has_residual, size_t first, uint32_t region,
                                           uint32_t chunk, uint32_t stride, bool vector, float* x) {
  uint32_t j0 = 0;
  if (vector) {
    const auto* g4 = reinterpret_cast<const float4*>(in + first);
#pragma unroll 4
    for (uint32_t v = threadIdx.x; v < region / 4; v += blockDim.x) {
      float4 c = g4[v];
      if (kEf && has_residual) {
        const float4 e = reinterpret_cast<const float4*>(residual + first)[v];
        c.x = math::Corrected(c.x, e.x);
        c.y = math::Corrected(c.y, e.y);
        c.z = math::Corrected(c.z, e.z);
        c.w = math::Corrected(c.w, e.w);
      }
      const uint32_t j = 4 * v;
      const uint32_t k = j / chunk;
      *reinterpret_cast<float4*>(x + k * stride + (j - k * chunk)) = c;
    }
    j0 = region / 4 * 4;
  }
  for (uint32_t j = j0 + threadIdx.x; j < region; j += blockDim.x) {
    const uint32_t k = j / chunk;
    x[k * stride + (j - k * chunk)] = Input<kEf>(in, residual, has_residual, first + j);
  }
}

// SignEncodeKernel with the block's chunks in shared memory (8 threads per
// chunk, blockDim.x / 8 chunks, `stride` floats apart: a multiple of 32 plus
// 8, so the 4 chunks of a warp fall in different banks).
template <bool kEf>
__global__ void SignEncodeSharedKernel(const float* __restrict__ in, float* residual,
                                       bool has_residual, size_t n, uint32_t chunk,
                                       size_t num_chunks, uint32_t stride, bool vector,
                                       float* __restrict__ scales, uint8_t* __restrict__ bits) {
  extern __shared__ float x[];
  __shared__ float block_scales[kSignBlockChunks];
  const uint32_t block_chunks = blockDim.x / 8;
  const size_t first_chunk = static_cast<size_t>(blockIdx.x) * block_chunks;
  const size_t first = first_chunk * chunk;
  const size_t left = n - first;
  const uint32_t region = static_cast<uint32_t>(
      left < static_cast<size_t>(block_chunks) * chunk ? left : block_chunks * chunk);
  LoadChunks<kEf>(in, residual, has_residual, first, region, chunk, stride, vector, x);
  __syncthreads();

  const uint32_t mine = threadIdx.x / 8;
  const unsigned int lane = threadIdx.x % 8;
  const unsigned int byte_shift = threadIdx.x % 32 / 8 * 8;
  const size_t c = first_chunk + mine;
  const size_t chunk_first = c * chunk;
  const uint32_t len =
      c < num_chunks ? (chunk < n - chunk_first ? chunk : static_cast<uint32_t>(n - chunk_first))
                     : 0;
  const float* xs = x + mine * stride;
  const uint32_t rounds = chunk / 8;
  float sum = 0.0f;
#pragma unroll 4
  for (uint32_t r = 0; r < rounds; ++r) {
    const uint32_t i = 8 * r + lane;
    bool negative = false;
    if (i < len) {
      const float v = xs[i];
      sum = math::Add(sum, math::Abs(v));
      negative = math::SignBit(v);
    }
    const unsigned int ballot = __ballot_sync(kFullMask, negative);
    if (lane == 0 && 8 * r < len) {
      bits[chunk_first / 8 + r] = static_cast<uint8_t>(ballot >> byte_shift);
    }
  }
  sum = math::Add(sum, __shfl_down_sync(kFullMask, sum, 4, 8));
  sum = math::Add(sum, __shfl_down_sync(kFullMask, sum, 2, 8));
  sum = math::Add(sum, __shfl_down_sync(kFullMask, sum, 1, 8));
  const float scale = __shfl_sync(kFullMask, math::Div(sum, static_cast<float>(len)), 0, 8);
  if (lane == 0 && len > 0) scales[c] = scale;
  if constexpr (kEf) {
    if (lane == 0) block_scales[mine] = scale;
    __syncthreads();
    uint32_t j0 = 0;
    if (vector) {
      auto* e4 = reinterpret_cast<float4*>(residual + first);
#pragma unroll 4
      for (uint32_t v = threadIdx.x; v < region / 4; v += blockDim.x) {
        const uint32_t j = 4 * v;
        const uint32_t k = j / chunk;
        const float4 cv = *reinterpret_cast<const float4*>(x + k * stride + (j - k * chunk));
        const float s = block_scales[k];
        float4 e;
        e.x = math::Sub(cv.x, math::SignDecode(s, math::SignBit(cv.x) ? 1u : 0u));
        e.y = math::Sub(cv.y, math::SignDecode(s, math::SignBit(cv.y) ? 1u : 0u));
        e.z = math::Sub(cv.z, math::SignDecode(s, math::SignBit(cv.z) ? 1u : 0u));
        e.w = math::Sub(cv.w, math::SignDecode(s, math::SignBit(cv.w) ? 1u : 0u));
        e4[v] = e;
      }
      j0 = region / 4 * 4;
    }
    for (uint32_t j = j0 + threadIdx.x; j < region; j += blockDim.x) {
      const uint32_t k = j / chunk;
      const float cv = x[k * stride + (j - k * chunk)];
      residual[first + j] =
          math::Sub(cv, math::SignDecode(block_scales[k], math::SignBit(cv) ? 1u : 0u));
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

// QsgdEncodeKernel with the block's chunks in shared memory (one warp per
// chunk, blockDim.x / 32 chunks, contiguous). `vector`: the levels of 4
// elements go out as one 32-bit store (and their residuals as one float4).
template <bool kEf>
__global__ void QsgdEncodeSharedKernel(const float* __restrict__ in, float* residual,
                                       bool has_residual, size_t n, uint32_t chunk,
                                       size_t num_chunks, int levels, uint64_t key, bool vector,
                                       float* __restrict__ norms, int8_t* __restrict__ q) {
  extern __shared__ float x[];
  const uint32_t block_chunks = blockDim.x / 32;
  const size_t first_chunk = static_cast<size_t>(blockIdx.x) * block_chunks;
  const size_t first = first_chunk * chunk;
  const size_t left = n - first;
  const uint32_t region = static_cast<uint32_t>(
      left < static_cast<size_t>(block_chunks) * chunk ? left : block_chunks * chunk);
  LoadChunks<kEf>(in, residual, has_residual, first, region, chunk, chunk, vector, x);
  __syncthreads();

  const uint32_t mine = threadIdx.x / 32;
  const size_t c = first_chunk + mine;
  if (c >= num_chunks) return;  // The whole warp.
  const unsigned int lane = threadIdx.x % 32;
  const size_t chunk_first = c * chunk;
  const uint32_t len = chunk < n - chunk_first ? chunk : static_cast<uint32_t>(n - chunk_first);
  const float* xs = x + mine * chunk;
  uint32_t m = 0;
  for (uint32_t i = lane; i < len; i += 32) {
    const uint32_t k = math::MagnitudeKey(xs[i]);
    m = k > m ? k : m;
  }
  m = WarpMax(m);
  const float norm = math::BitsFloat(m);
  if (lane == 0) norms[c] = norm;
  const math::QsgdChunkPlan plan = math::PlanQsgdChunk(norm, levels);
  const float top = static_cast<float>(levels);
  const float step = math::QsgdStep(norm, levels);
  const auto index = [&](uint32_t i) { return static_cast<uint32_t>(chunk_first + i); };
  uint32_t i0 = 0;
  if (vector) {
    for (uint32_t v = lane; v < len / 4; v += 32) {
      const uint32_t i = 4 * v;
      const float4 cv = *reinterpret_cast<const float4*>(xs + i);
      const int8_t l0 = math::QsgdLevel(cv.x, plan, top, key, index(i));
      const int8_t l1 = math::QsgdLevel(cv.y, plan, top, key, index(i + 1));
      const int8_t l2 = math::QsgdLevel(cv.z, plan, top, key, index(i + 2));
      const int8_t l3 = math::QsgdLevel(cv.w, plan, top, key, index(i + 3));
      char4 packed;
      packed.x = l0;
      packed.y = l1;
      packed.z = l2;
      packed.w = l3;
      reinterpret_cast<char4*>(q + chunk_first)[v] = packed;
      if constexpr (kEf) {
        float4 e;
        e.x = math::Sub(cv.x, math::QsgdDecode(l0, step));
        e.y = math::Sub(cv.y, math::QsgdDecode(l1, step));
        e.z = math::Sub(cv.z, math::QsgdDecode(l2, step));
        e.w = math::Sub(cv.w, math::QsgdDecode(l3, step));
        reinterpret_cast<float4*>(residual + chunk_first)[v] = e;
      }
    }
    i0 = len / 4 * 4;
  }
  for (uint32_t i = i0 + lane; i < len; i += 32) {
    const float cv = xs[i];
    const int8_t level = math::QsgdLevel(cv, plan, top, key, index(i));
    q[chunk_first + i] = level;
    if constexpr (kEf) residual[chunk_first + i] = math::Sub(cv, math::QsgdDecode(level, step));
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
  const size_t stride = (chunk + 31) / 32 * 32 + 8;
  uint32_t block_chunks = kSignBlockChunks;  // a multiple of 4: whole warps
  while (block_chunks > 4 && block_chunks * stride * sizeof(float) > kSharedBytes) {
    block_chunks /= 2;
  }
  const size_t shared = block_chunks * stride * sizeof(float);
  if (shared <= kSharedBytes) {
    const bool vector = Aligned(in, 16) && (!kEf || Aligned(residual, 16));
    SignEncodeSharedKernel<kEf>
        <<<Blocks(chunks, block_chunks, ~size_t{0} >> 33), 8 * block_chunks, shared, stream>>>(
            in, residual, has_residual, n, static_cast<uint32_t>(chunk), chunks,
            static_cast<uint32_t>(stride), vector, scales, bits);
    return LaunchStatus(fn);
  }
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
  uint32_t block_chunks = kQsgdBlockChunks;
  while (block_chunks > 1 && block_chunks * chunk * sizeof(float) > kSharedBytes) {
    block_chunks /= 2;
  }
  const size_t shared = block_chunks * chunk * sizeof(float);
  if (shared <= kSharedBytes) {
    const bool vector = Aligned(in, 16) && Aligned(q, 4) && (!kEf || Aligned(residual, 16));
    QsgdEncodeSharedKernel<kEf>
        <<<Blocks(chunks, block_chunks, ~size_t{0} >> 33), 32 * block_chunks, shared, stream>>>(
            in, residual, has_residual, n, static_cast<uint32_t>(chunk), chunks, levels, key,
            vector, norms, q);
    return LaunchStatus(fn);
  }
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
