#include "compression/half_compressor.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/half.h"
#include "compression/test_util.h"
#include "gtest/gtest.h"

namespace gradsync::compression {
namespace {

using testing_util::CompressUnaligned;
using testing_util::DecompressUnaligned;
using testing_util::LogUniform;
using testing_util::RoundTrip;
using testing_util::TestSizes;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kFp16Max = 65504.0f;
constexpr float kFp16MinNormal = 6.103515625e-05f;  // 2^-14

// Inputs that cover fp16's normal range and a little beyond on both ends.
std::vector<float> HalfRangeInputs(size_t n, uint32_t seed) {
  return LogUniform(n, -16.0f, 16.5f, seed);
}

TEST(HalfCompressorTest, DescribesItself) {
  HalfCompressor fp16(HalfFormat::kFp16), bf16(HalfFormat::kBf16);
  EXPECT_EQ(fp16.name(), "fp16");
  EXPECT_EQ(bf16.name(), "bf16");
  EXPECT_TRUE(fp16.summable());
  EXPECT_TRUE(bf16.summable());
  for (size_t n : TestSizes()) {
    EXPECT_EQ(fp16.WireBytes(n), 2 * n);
    EXPECT_EQ(bf16.WireBytes(n), 2 * n);
  }
}

TEST(HalfCompressorTest, SizeChecks) {
  for (HalfFormat f : {HalfFormat::kFp16, HalfFormat::kBf16}) {
    HalfCompressor c(f);
    for (size_t n : {size_t{0}, size_t{1}, size_t{9}, size_t{1000}}) {
      testing_util::ExpectSizeChecks(c, n);
    }
  }
}

// fp16: relative error <= 2^-11 in the normal range, absolute <= 2^-25
// below it, +-65504 up to the rounding boundary 65520 and +-inf from there.
TEST(HalfCompressorTest, Fp16RoundTripErrorBounds) {
  HalfCompressor c(HalfFormat::kFp16);
  for (size_t n : TestSizes()) {
    const std::vector<float> in = HalfRangeInputs(n, static_cast<uint32_t>(n));
    const std::vector<float> out = RoundTrip(c, in, {});
    for (size_t i = 0; i < n; ++i) {
      const float x = in[i], a = std::fabs(x);
      SCOPED_TRACE(testing::Message() << "n=" << n << " x=" << x);
      if (a >= 65520.0f) {
        ASSERT_EQ(out[i], std::copysign(kInf, x));
      } else if (a > kFp16Max) {
        ASSERT_EQ(out[i], std::copysign(kFp16Max, x));
      } else if (a >= kFp16MinNormal) {
        ASSERT_LE(std::fabs(out[i] - x), std::ldexp(a, -11));
        ASSERT_EQ(std::signbit(out[i]), std::signbit(x));
      } else {
        ASSERT_LE(std::fabs(out[i] - x), std::ldexp(1.0f, -25));
      }
    }
  }
}

TEST(HalfCompressorTest, Bf16RoundTripRelativeErrorAtMost2ToMinus8) {
  HalfCompressor c(HalfFormat::kBf16);
  for (size_t n : TestSizes()) {
    const std::vector<float> in = LogUniform(n, -126.0f, 127.0f, n + 1);
    const std::vector<float> out = RoundTrip(c, in, {});
    for (size_t i = 0; i < n; ++i) {
      ASSERT_LE(std::fabs(out[i] - in[i]), std::ldexp(std::fabs(in[i]), -8))
          << "n=" << n << " x=" << in[i];
    }
  }
}

TEST(HalfCompressorTest, Fp16OverflowBoundaryAndSpecials) {
  HalfCompressor c(HalfFormat::kFp16);
  const std::vector<float> in = {65504.0f, 65519.99f, 65520.0f, -65520.0f,     1e30f,
                                 -1e30f,   kInf,      -kInf,    std::nanf(""), -0.0f};
  const std::vector<float> out = RoundTrip(c, in, {});
  EXPECT_EQ(out[0], 65504.0f);
  EXPECT_EQ(out[1], 65504.0f);
  EXPECT_EQ(out[2], kInf);
  EXPECT_EQ(out[3], -kInf);
  EXPECT_EQ(out[4], kInf);
  EXPECT_EQ(out[5], -kInf);
  EXPECT_EQ(out[6], kInf);
  EXPECT_EQ(out[7], -kInf);
  EXPECT_TRUE(std::isnan(out[8]));
  EXPECT_TRUE(out[9] == 0.0f && std::signbit(out[9]));
}

// The wire is exactly the common/half.h encoding, element i at byte 2i.
TEST(HalfCompressorTest, WireIsTheScalarEncodingInOrder) {
  for (HalfFormat f : {HalfFormat::kFp16, HalfFormat::kBf16}) {
    HalfCompressor c(f);
    for (size_t n : TestSizes()) {
      const std::vector<float> in = HalfRangeInputs(n, 7 * n + 1);
      const std::vector<uint8_t> wire = CompressUnaligned(c, in, {});
      ASSERT_EQ(wire.size(), 2 * n);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, wire.data() + 2 * i, 2);
        ASSERT_EQ(h, f == HalfFormat::kFp16 ? FloatToHalf(in[i]) : FloatToBf16(in[i]));
      }
    }
  }
}

// Summable: adding two wire buffers in place decompresses to a + b within
// the rounding of three conversions: |err| <= u(|a| + |b| + |a' + b'|).
TEST(HalfCompressorTest, SumOfWireBuffersDecompressesToSumOfInputs) {
  for (HalfFormat f : {HalfFormat::kFp16, HalfFormat::kBf16}) {
    HalfCompressor c(f);
    const int u_exp = f == HalfFormat::kFp16 ? -11 : -8;
    for (size_t n : TestSizes()) {
      const std::vector<float> a = LogUniform(n, -10.0f, 12.0f, n + 3);
      const std::vector<float> b = LogUniform(n, -10.0f, 12.0f, n + 4);
      std::vector<uint8_t> wa = CompressUnaligned(c, a, {});
      const std::vector<uint8_t> wb = CompressUnaligned(c, b, {});
      if (f == HalfFormat::kFp16) {
        AddHalfInto(wa.data(), wb.data(), n);
      } else {
        AddBf16Into(wa.data(), wb.data(), n);
      }
      const std::vector<float> sum = DecompressUnaligned(c, wa, n, {});
      for (size_t i = 0; i < n; ++i) {
        const double exact = static_cast<double>(a[i]) + b[i];
        const double bound =
            std::ldexp(std::fabs(a[i]) + std::fabs(b[i]) + std::fabs(sum[i]), u_exp);
        ASSERT_LE(std::fabs(sum[i] - exact), bound) << "n=" << n << " i=" << i;
      }
    }
  }
}

}  // namespace
}  // namespace gradsync::compression
