#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reduce.h"

namespace gradsync::kernels {
namespace {

// Values of mixed magnitude, so that most additions round.
std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng));
  return v;
}

void ScalarSum(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    volatile float sum = dst[i] + src[i];  // One IEEE addition, not vectorised.
    dst[i] = sum;
  }
}

// Bit-for-bit equality (NaN payloads and -0 included); safe for empty vectors.
bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

class SumIntoCpuTest : public ::testing::TestWithParam<size_t> {};

TEST_P(SumIntoCpuTest, MatchesScalarLoopBitForBit) {
  const size_t n = GetParam();
  const std::vector<float> src = Values(n, 1);
  std::vector<float> dst = Values(n, 2);
  std::vector<float> want = dst;
  ScalarSum(want.data(), src.data(), n);
  SumIntoCpu(dst.data(), src.data(), n);
  EXPECT_TRUE(BitEqual(dst, want));
}

TEST_P(SumIntoCpuTest, HandlesUnalignedOffsetsAndSelfSum) {
  const size_t n = GetParam();
  std::vector<float> src = Values(n + 3, 3);
  std::vector<float> dst = Values(n + 1, 4);
  std::vector<float> want = dst;
  ScalarSum(want.data() + 1, src.data() + 3, n);
  SumIntoCpu(dst.data() + 1, src.data() + 3, n);
  EXPECT_TRUE(BitEqual(dst, want));

  ScalarSum(want.data(), want.data(), want.size());
  SumIntoCpu(dst.data(), dst.data(), dst.size());
  EXPECT_TRUE(BitEqual(dst, want));
}

INSTANTIATE_TEST_SUITE_P(Sizes, SumIntoCpuTest, ::testing::Values(0, 1, 3, 7, 1000, 4097));

TEST(SumIntoCpuSpecialsTest, FollowsIeeeRules) {
  const float inf = std::numeric_limits<float>::infinity();
  const float min = std::numeric_limits<float>::denorm_min();
  std::vector<float> dst = {1.0f, -0.0f, inf, inf, min, 1.0f};
  const std::vector<float> src = {2.0f, -0.0f, 1.0f, -inf, min, 0x1p-24f};
  SumIntoCpu(dst.data(), src.data(), dst.size());
  EXPECT_EQ(dst[0], 3.0f);
  EXPECT_TRUE(dst[1] == 0.0f && std::signbit(dst[1]));
  EXPECT_EQ(dst[2], inf);
  EXPECT_TRUE(std::isnan(dst[3]));
  EXPECT_EQ(dst[4], 2 * min);
  EXPECT_EQ(dst[5], 1.0f);  // Ties round to even.
}

}  // namespace
}  // namespace gradsync::kernels
