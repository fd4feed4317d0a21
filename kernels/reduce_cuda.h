// CUDA launch wrappers for the element-wise reductions in reduce.h. Only
// built with --config=cuda.
//
// Blocking: the launches are asynchronous on `stream`; the result is ready
// once the stream is synchronised.
// Errors: the returned Status covers the arguments and the launch
// (cudaGetLastError); faults while the kernel runs show up at the next
// synchronisation of `stream`.
// Thread-safety: as for any launch on a stream; no state of its own.
// Ownership: dst and src are device (or managed) memory that must stay valid
// until the kernel has finished.
#ifndef GRADSYNC_KERNELS_REDUCE_CUDA_H_
#define GRADSYNC_KERNELS_REDUCE_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/status.h"

namespace gradsync::kernels {

// dst[i] += src[i] for i in [0, n) on the GPU; bit for bit equal to
// SumIntoCpu. dst and src either do not overlap or are the same pointer.
// Any 4-byte alignment works; 16-byte aligned buffers (or buffers with the
// same offset from 16 bytes) take the float4 path. n == 0 launches nothing.
// InvalidArgument for a null or misaligned pointer with n > 0; Internal for
// a failed launch.
Status SumIntoCuda(float* dst, const float* src, size_t n, cudaStream_t stream);

}  // namespace gradsync::kernels

#endif  // GRADSYNC_KERNELS_REDUCE_CUDA_H_
