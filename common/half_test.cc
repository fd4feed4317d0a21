#include "common/half.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Float bit patterns spread over the whole space, plus the edges that matter.
std::vector<float> SampleFloats() {
  std::vector<float> v;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4099)
    v.push_back(FromBits(static_cast<uint32_t>(u)));
  for (float f :
       {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e-8f, 2.98e-8f, 6.1e-5f, 5.96e-8f,
        std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
        1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048}) {
    v.push_back(f);
  }
  return v;
}

uint16_t Get16(const std::vector<uint16_t>& v, size_t i) { return v[i]; }

TEST(HalfTest, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(((h >> 10) & 0x1F) == 31 && (h & 0x3FF) != 0) << h;
      EXPECT_EQ(FloatToHalf(f) & 0x7C00, 0x7C00) << h;
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(HalfTest, RoundsToNearestEvenAndOverflowsToInfinity) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);  // below the halfway point to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // halfway: ties to even, i.e. infinity
  EXPECT_EQ(FloatToHalf(-1e6f), 0xFC00);
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3C00);     // tie -> even mantissa (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3C02);     // tie -> even mantissa (up)
  EXPECT_EQ(FloatToHalf(5.960464477539063e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(2.98e-8f), 0x0000);               // just below half of it
  EXPECT_EQ(FloatToBf16(1.0f + 1.0f / 256), 0x3F80);      // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + 3.0f / 256), 0x3F82);
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(3.4e38f))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(HalfTest, RelativeErrorWithinHalfAnUlp) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-60000.0f, 60000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float f = dist(rng);
    if (std::fabs(f) < 6.2e-5f) continue;  // normal range only
    EXPECT_LE(std::fabs(HalfToFloat(FloatToHalf(f)) - f), std::fabs(f) * 0.00048828125f) << f;
    EXPECT_LE(std::fabs(Bf16ToFloat(FloatToBf16(f)) - f), std::fabs(f) * 0.00390625f) << f;
  }
}

// The bulk functions (vector path for groups of 8, scalar tail) give the
// same bits as the scalar conversions.
TEST(HalfTest, BulkEqualsScalarBitForBit) {
  const std::vector<float> in = SampleFloats();
  const size_t n = in.size();
  std::vector<uint16_t> h(n), b(n);
  FloatToHalf(in.data(), h.data(), n);
  FloatToBf16(in.data(), b.data(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(Get16(h, i), FloatToHalf(in[i])) << "fp16 of bits " << std::hex << i;
    ASSERT_EQ(Get16(b, i), FloatToBf16(in[i])) << "bf16 of element " << i;
  }
  std::vector<float> back(n), back_scalar(n);
  HalfToFloat(h.data(), back.data(), n);
  for (size_t i = 0; i < n; ++i) back_scalar[i] = HalfToFloat(h[i]);
  ASSERT_EQ(std::memcmp(back.data(), back_scalar.data(), 4 * n), 0);
  Bf16ToFloat(b.data(), back.data(), n);
  for (size_t i = 0; i < n; ++i) back_scalar[i] = Bf16ToFloat(b[i]);
  ASSERT_EQ(std::memcmp(back.data(), back_scalar.data(), 4 * n), 0);
}

TEST(HalfTest, AddIntoSumsInFloatAndRoundsOnce) {
  const size_t n = 1003;  // not a multiple of 8: the scalar tail runs too
  std::vector<uint16_t> a(n), b(n), a16(n), b16(n);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  for (size_t i = 0; i < n; ++i) {
    a[i] = FloatToHalf(dist(rng));
    b[i] = FloatToHalf(dist(rng));
    a16[i] = FloatToBf16(dist(rng));
    b16[i] = FloatToBf16(dist(rng));
  }
  std::vector<uint16_t> want(n), want16(n);
  for (size_t i = 0; i < n; ++i) {
    want[i] = FloatToHalf(HalfToFloat(a[i]) + HalfToFloat(b[i]));
    want16[i] = FloatToBf16(Bf16ToFloat(a16[i]) + Bf16ToFloat(b16[i]));
  }
  AddHalfInto(a.data(), b.data(), n);
  AddBf16Into(a16.data(), b16.data(), n);
  EXPECT_EQ(a, want);
  EXPECT_EQ(a16, want16);
}

TEST(HalfTest, ScaleRoundsEachElementOnce) {
  const size_t n = 1303;  // several blocks and a tail
  std::vector<uint16_t> h(n), b(n);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  for (size_t i = 0; i < n; ++i) {
    h[i] = FloatToHalf(dist(rng));
    b[i] = FloatToBf16(dist(rng));
  }
  std::vector<uint16_t> want_h(n), want_b(n);
  for (size_t i = 0; i < n; ++i) {
    want_h[i] = FloatToHalf(HalfToFloat(h[i]) * 0.25f);
    want_b[i] = FloatToBf16(Bf16ToFloat(b[i]) * (1.0f / 3));
  }
  ScaleHalf(h.data(), 0.25f, n);
  ScaleBf16(b.data(), 1.0f / 3, n);
  EXPECT_EQ(h, want_h);
  EXPECT_EQ(b, want_b);
}

// Unaligned 16-bit buffers, as wire frames are.
TEST(HalfTest, UnalignedBuffers) {
  const size_t n = 37;
  std::vector<float> in(n);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i) - 18.5f;
  std::vector<uint8_t> raw(2 * n + 1);
  FloatToHalf(in.data(), raw.data() + 1, n);
  std::vector<float> out(n);
  HalfToFloat(raw.data() + 1, out.data(), n);
  EXPECT_EQ(out, in);
  FloatToBf16(in.data(), raw.data() + 1, n);
  Bf16ToFloat(raw.data() + 1, out.data(), n);
  EXPECT_EQ(out, in);
}

}  // namespace
}  // namespace gradsync
