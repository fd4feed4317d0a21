#include "compression/sign_compressor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "compression/quantize_kernels.h"
#include "compression/test_util.h"
#include "gtest/gtest.h"

namespace gradsync::compression {
namespace {

using testing_util::CompressUnaligned;
using testing_util::DecompressUnaligned;
using testing_util::Gaussian;
using testing_util::Laplace;
using testing_util::TestSizes;

std::unique_ptr<SignCompressor> Make(size_t chunk) {
  StatusOr<std::unique_ptr<SignCompressor>> c = SignCompressor::Create(chunk);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

TEST(SignCompressorTest, RejectsBadChunks) {
  for (size_t chunk : {0, 1, 7, 12}) {
    EXPECT_EQ(SignCompressor::Create(chunk).status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(SignCompressorTest, DescribesItselfAndWireBytes) {
  for (size_t chunk : {8, 64, 512}) {
    auto c = Make(chunk);
    EXPECT_EQ(c->name(), "sign");
    EXPECT_FALSE(c->summable());
    for (size_t n : TestSizes()) {
      EXPECT_EQ(c->WireBytes(n), 4 * ((n + chunk - 1) / chunk) + (n + 7) / 8);
    }
  }
  testing_util::ExpectSizeChecks(*Make(512), 1000);
  testing_util::ExpectSizeChecks(*Make(8), 9);
}

// Each element decodes to +-scale with its own sign, and the scale of its
// chunk is mean |x| over the chunk (to the rounding of an 8-lane sum).
TEST(SignCompressorTest, DecodesToSignTimesChunkMeanMagnitude) {
  for (size_t chunk : {8, 24, 512}) {
    auto c = Make(chunk);
    for (size_t n : TestSizes()) {
      const std::vector<float> in = Laplace(n, 0.01f, n + chunk);
      const std::vector<uint8_t> wire = CompressUnaligned(*c, in, {});
      const std::vector<float> out = DecompressUnaligned(*c, wire, n, {});
      for (size_t first = 0; first < n; first += chunk) {
        const size_t len = std::min(chunk, n - first);
        double sum = 0;
        for (size_t i = first; i < first + len; ++i) sum += std::fabs(in[i]);
        const double mean = sum / len;
        float scale;
        std::memcpy(&scale, wire.data() + 4 * (first / chunk), 4);
        // Pairwise-in-8-lanes summation: error <= (len / 8 + 4) u sum.
        ASSERT_NEAR(scale, mean, (len / 8.0 + 4) * std::ldexp(mean, -24));
        for (size_t i = first; i < first + len; ++i) {
          ASSERT_EQ(std::fabs(out[i]), scale);
          ASSERT_EQ(std::signbit(out[i]), std::signbit(in[i])) << i;
        }
      }
    }
  }
}

TEST(SignCompressorTest, BitLayoutIsLsbFirstWithZeroPadding) {
  auto c = Make(8);
  const std::vector<float> in = {-1, 2, -3, 4, 5, 6, 7, -8, -0.0f, 1, -1};
  const std::vector<uint8_t> wire = CompressUnaligned(*c, in, {});
  ASSERT_EQ(wire.size(), 2 * 4 + 2u);
  EXPECT_EQ(wire[8], 0b10000101);
  EXPECT_EQ(wire[9], 0b00000101);  // -0, +1, -1 and five zero pad bits.
}

// The AVX2 kernels and the scalar ones agree bit for bit.
TEST(SignKernelsTest, VectorMatchesScalar) {
  for (size_t len : {1, 7, 8, 9, 63, 64, 100, 512, 4099}) {
    std::vector<float> x = Gaussian(len, 3.0f, len);
    x[len / 2] = -0.0f;
    std::vector<uint8_t> a((len + 7) / 8, 0xEE), b((len + 7) / 8, 0x11);
    const float sa = SignEncodeChunk(x.data(), len, a.data());
    const float sb = SignEncodeChunkScalar(x.data(), len, b.data());
    ASSERT_EQ(std::memcmp(&sa, &sb, 4), 0) << len;
    ASSERT_EQ(a, b) << len;
    std::vector<float> da(len), db(len);
    SignDecodeChunk(a.data(), len, sa, da.data());
    SignDecodeChunkScalar(a.data(), len, sa, db.data());
    ASSERT_EQ(std::memcmp(da.data(), db.data(), 4 * len), 0) << len;
  }
}

TEST(SignCompressorTest, NonFiniteInputsGiveNonFiniteScaleOnlyInTheirChunk) {
  auto c = Make(8);
  std::vector<float> in = Gaussian(24, 1.0f, 3);
  in[9] = std::numeric_limits<float>::infinity();
  const std::vector<float> out = DecompressUnaligned(*c, CompressUnaligned(*c, in, {}), 24, {});
  for (size_t i = 0; i < 24; ++i) {
    EXPECT_EQ(std::isinf(out[i]), i >= 8 && i < 16) << i;
  }
}

}  // namespace
}  // namespace gradsync::compression
