#include "common/dtype.h"

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(DTypeTest, SizesAndNamesRoundTrip) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  for (int i = 0; i < kNumDTypes; ++i) {
    DType d = static_cast<DType>(i);
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(ParseDType("f64").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradsync
