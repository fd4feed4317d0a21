// Element types carried by gradients and parameters.
#ifndef GRADSYNC_COMMON_DTYPE_H_
#define GRADSYNC_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace gradsync {

// Values match the wire schema's DType enum.
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3, kU8 = 4 };
constexpr int kNumDTypes = 5;

// Bytes per element (4, 2, 2, 4, 1).
size_t DTypeSize(DType dtype);
// "f32", "f16", "bf16", "i32", "u8".
const char* DTypeName(DType dtype);
StatusOr<DType> ParseDType(const std::string& name);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_DTYPE_H_
