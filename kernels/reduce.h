// Element-wise reduction of gradient buffers: dst[i] += src[i].
//
// SumIntoCpu is the reference that the CUDA kernel (reduce_cuda.h) is tested
// against, and the CPU path of the ring all-reduce. Both add in fp32 with
// round-to-nearest-even, one addition per element, so their results are bit
// for bit identical.
//
// Thread-safety: no shared state; concurrent calls on disjoint buffers are
// safe. Ownership: nothing is kept after the call returns.
#ifndef GRADSYNC_KERNELS_REDUCE_H_
#define GRADSYNC_KERNELS_REDUCE_H_

#include <cstddef>

namespace gradsync::kernels {

// dst[i] += src[i] for i in [0, n). dst and src either do not overlap or are
// the same pointer (then every element is doubled). Any alignment is fine;
// either pointer may be null when n == 0.
void SumIntoCpu(float* dst, const float* src, size_t n);

}  // namespace gradsync::kernels

#endif  // GRADSYNC_KERNELS_REDUCE_H_
