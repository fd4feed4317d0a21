// Element-wise arithmetic on gradient buffers of any reducible dtype, shared
// by the ring and the Communicator. f32 uses kernels::SumIntoCpu; f16 and
// bf16 are computed in fp32 and rounded once (common/half.h).
//
// `src` may be unaligned (a wire frame); `dst` is a bucket or user buffer.
// Thread-safety: pure functions.
#ifndef GRADSYNC_CLIENT_ELEMENTWISE_H_
#define GRADSYNC_CLIENT_ELEMENTWISE_H_

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"

namespace gradsync::client {

// OK when AddInto and DivideBy take `dtype` (f32, f16, bf16); an
// InvalidArgument naming it otherwise.
Status CheckReducible(DType dtype);
// dst[i] += src[i] for i < n.
void AddInto(uint8_t* dst, const uint8_t* src, size_t n, DType dtype);
// data[i] /= divisor for i < n.
void DivideBy(uint8_t* data, size_t n, DType dtype, int divisor);

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_ELEMENTWISE_H_
