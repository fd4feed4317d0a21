#include "common/dtype.h"

namespace gradsync {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kU8:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kU8:
      return "u8";
  }
  return "invalid";
}

StatusOr<DType> ParseDType(const std::string& name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType d = static_cast<DType>(i);
    if (name == DTypeName(d)) return d;
  }
  return InvalidArgumentError("unknown dtype '" + name + "' (want f32, f16, bf16, i32 or u8)");
}

}  // namespace gradsync
