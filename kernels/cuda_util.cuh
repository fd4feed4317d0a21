// Helpers shared by the compression .cu files. Host side: argument checks
// that produce the errors compress_kernels.h promises, launch geometry, and
// where a vectorised loop over several buffers can start. Device side:
// thread indexing and 8-element vector accesses.
//
// Internal to kernels/; included only by .cu files.
#ifndef GRADSYNC_KERNELS_CUDA_UTIL_CUH_
#define GRADSYNC_KERNELS_CUDA_UTIL_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/status.h"
#include "kernels/compress_types.h"

namespace gradsync::kernels::launch {

constexpr int kThreads = 256;
// Enough blocks to fill an H100 several times over; grid-stride loops take
// the rest.
constexpr size_t kMaxBlocks = 4096;
constexpr size_t kNoVector = ~size_t{0};

inline unsigned int Blocks(size_t work, size_t per_block = kThreads,
                           size_t max_blocks = kMaxBlocks) {
  const size_t blocks = (work + per_block - 1) / per_block;
  if (blocks == 0) return 1;
  return static_cast<unsigned int>(blocks < max_blocks ? blocks : max_blocks);
}

// A device pointer argument: its name for messages and the alignment its
// element type needs.
struct Pointer {
  const char* name;
  const void* ptr;
  size_t align;
};

inline Status CheckPointers(const char* fn, std::initializer_list<Pointer> args) {
  for (const Pointer& a : args) {
    if (a.ptr == nullptr) {
      return InvalidArgumentError(std::string(fn) + ": " + a.name + " is null");
    }
    if (reinterpret_cast<uintptr_t>(a.ptr) % a.align != 0) {
      return InvalidArgumentError(std::string(fn) + ": " + a.name + " is not " +
                                  std::to_string(a.align) + "-byte aligned");
    }
  }
  return OkStatus();
}

inline Status CheckChunk(const char* fn, size_t chunk) {
  if (chunk > 0 && chunk % 8 == 0 && chunk <= (size_t{1} << 30)) {
    return OkStatus();
  }
  return InvalidArgumentError(std::string(fn) +
                              ": chunk must be a positive multiple of 8 up "
                              "to 2^30, got " +
                              std::to_string(chunk));
}

inline Status CheckLevels(const char* fn, int levels) {
  if (levels >= 1 && levels <= 127) return OkStatus();
  return InvalidArgumentError(std::string(fn) + ": levels must be in [1, 127], got " +
                              std::to_string(levels));
}

// Internal unless the last launch (or `err`) succeeded.
inline Status LaunchStatus(const char* fn, cudaError_t err = cudaSuccess) {
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err == cudaSuccess) return OkStatus();
  return InternalError(std::string(fn) + ": launch failed: " + cudaGetErrorString(err));
}

// A buffer walked in groups of 8 elements of `elem` bytes, each group loaded
// or stored as one `align`-byte aligned vector.
struct Stream8 {
  const void* ptr;
  size_t elem;
  size_t align;
};

// The first element h < 8 from which every buffer's group of 8 is aligned,
// or kNoVector if there is none.
inline size_t VectorHead(std::initializer_list<Stream8> buffers) {
  for (size_t h = 0; h < 8; ++h) {
    bool aligned = true;
    for (const Stream8& b : buffers) {
      aligned &= (reinterpret_cast<uintptr_t>(b.ptr) + h * b.elem) % b.align == 0;
    }
    if (aligned) return h;
  }
  return kNoVector;
}

// n elements split into a scalar head [0, head), `groups` vector groups of
// 8, and a scalar tail of fewer than 8.
struct VectorSplit {
  size_t head;
  size_t groups;
};

inline VectorSplit SplitForVectors(size_t n, size_t head) {
  if (head == kNoVector || head >= n) return {n, 0};
  return {head, (n - head) / 8};
}

// The argument checks of TopKCuda (topk_kernels.cu) for n elements, without
// the input pointer: k <= n < 2^31, outputs and workspace when k > 0.
Status CheckTopKArgs(const char* fn, size_t n, size_t k, SparseValueFormat format,
                     const int32_t* indices, const void* values, const void* workspace,
                     size_t workspace_bytes);

}  // namespace gradsync::kernels::launch

namespace gradsync::kernels::device {

constexpr unsigned int kFullMask = 0xFFFFFFFFu;

__device__ __forceinline__ size_t ThreadIndex() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t GridStride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

// 8 elements loaded or stored as one aligned vector (two 16-byte accesses
// for floats, one for 16-bit values, one 8-byte access for bytes).
template <typename T>
struct alignas(sizeof(T) * 8 < 16 ? sizeof(T) * 8 : 16) Pack8 {
  T v[8];
};

// The vector groups of a buffer, starting at element `head`.
template <typename T>
__device__ __forceinline__ const Pack8<T>* Groups(const T* p, size_t head) {
  return reinterpret_cast<const Pack8<T>*>(p + head);
}

template <typename T>
__device__ __forceinline__ Pack8<T>* Groups(T* p, size_t head) {
  return reinterpret_cast<Pack8<T>*>(p + head);
}

}  // namespace gradsync::kernels::device

#endif  // GRADSYNC_KERNELS_CUDA_UTIL_CUH_
