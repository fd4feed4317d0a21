#include "client/elementwise.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/half.h"
#include "kernels/reduce.h"

namespace gradsync::client {

Status CheckReducible(DType dtype) {
  if (dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16) return Status();
  return InvalidArgumentError(std::string("allreduce supports f32, f16 and bf16, not ") +
                              DTypeName(dtype));
}

void AddInto(uint8_t* dst, const uint8_t* src, size_t n, DType dtype) {
  switch (dtype) {
    case DType::kF16:
      AddHalfInto(dst, src, n);
      return;
    case DType::kBF16:
      AddBf16Into(dst, src, n);
      return;
    default:
      break;
  }
  auto* out = reinterpret_cast<float*>(dst);
  if (reinterpret_cast<uintptr_t>(src) % alignof(float) == 0) {
    kernels::SumIntoCpu(out, reinterpret_cast<const float*>(src), n);
    return;
  }
  float tmp[1024];
  for (size_t i = 0; i < n; i += 1024) {
    const size_t m = std::min<size_t>(1024, n - i);
    std::memcpy(tmp, src + 4 * i, 4 * m);
    kernels::SumIntoCpu(out + i, tmp, m);
  }
}

void DivideBy(uint8_t* data, size_t n, DType dtype, int divisor) {
  const float d = static_cast<float>(divisor);
  switch (dtype) {
    case DType::kF16:
      ScaleHalf(data, 1.0f / d, n);
      return;
    case DType::kBF16:
      ScaleBf16(data, 1.0f / d, n);
      return;
    default:
      break;
  }
  auto* f = reinterpret_cast<float*>(data);
  for (size_t i = 0; i < n; ++i) f[i] /= d;
}

}  // namespace gradsync::client
