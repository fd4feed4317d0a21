#include <cstdint>
#include <string>

#include "kernels/reduce_cuda.h"

namespace gradsync::kernels {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H100 several times over; the loops stride over
// the rest.
constexpr size_t kMaxBlocks = 4096;

// dst[i] += src[i] for scalars, grid-stride.
__global__ void SumIntoScalar(float* dst, const float* src, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] += src[i];
  }
}

// The same with 16-byte loads and stores: dst and src are 16-byte aligned;
// n4 float4s followed by `tail` (< 4) floats.
__global__ void SumIntoVec4(float4* dst, const float4* src, size_t n4, int tail) {
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = first; i < n4; i += stride) {
    float4 d = dst[i];
    const float4 s = src[i];
    d.x += s.x;
    d.y += s.y;
    d.z += s.z;
    d.w += s.w;
    dst[i] = d;
  }
  if (first < static_cast<size_t>(tail)) {
    float* dst_tail = reinterpret_cast<float*>(dst + n4);
    const float* src_tail = reinterpret_cast<const float*>(src + n4);
    dst_tail[first] += src_tail[first];
  }
}

unsigned int Blocks(size_t work) {
  const size_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Floats before `p` reaches a 16-byte boundary (p is 4-byte aligned).
size_t HeadToAlign16(const float* p) {
  return ((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16) / sizeof(float);
}

}  // namespace

Status SumIntoCuda(float* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return OkStatus();
  if (dst == nullptr || src == nullptr) {
    return InvalidArgumentError("SumIntoCuda: null pointer with n = " + std::to_string(n));
  }
  if (reinterpret_cast<uintptr_t>(dst) % alignof(float) != 0 ||
      reinterpret_cast<uintptr_t>(src) % alignof(float) != 0) {
    return InvalidArgumentError("SumIntoCuda: pointers not 4-byte aligned");
  }
  const size_t head = HeadToAlign16(dst);
  if (head != HeadToAlign16(src) || n < head + 4) {
    // Different offsets from a 16-byte boundary (or tiny n): scalar loads.
    SumIntoScalar<<<Blocks(n), kThreads, 0, stream>>>(dst, src, n);
  } else {
    if (head > 0) SumIntoScalar<<<1, kThreads, 0, stream>>>(dst, src, head);
    const size_t n4 = (n - head) / 4;
    const int tail = static_cast<int>((n - head) % 4);
    SumIntoVec4<<<Blocks(n4), kThreads, 0, stream>>>(reinterpret_cast<float4*>(dst + head),
                                                     reinterpret_cast<const float4*>(src + head),
                                                     n4, tail);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return InternalError(std::string("SumIntoCuda: launch failed: ") + cudaGetErrorString(err));
  }
  return OkStatus();
}

}  // namespace gradsync::kernels
