#include "compression/randomk_compressor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "compression/test_util.h"
#include "gtest/gtest.h"

namespace gradsync::compression {
namespace {

using testing_util::CompressUnaligned;
using testing_util::DecompressUnaligned;
using testing_util::Gaussian;
using testing_util::TestSizes;

std::unique_ptr<RandomKCompressor> Make(double ratio) {
  StatusOr<std::unique_ptr<RandomKCompressor>> c = RandomKCompressor::Create(ratio);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

TEST(RandomKCompressorTest, DescribesItselfAndWireBytes) {
  EXPECT_FALSE(RandomKCompressor::Create(0).ok());
  EXPECT_FALSE(RandomKCompressor::Create(1.01).ok());
  auto c = Make(0.01);
  EXPECT_EQ(c->name(), "randomk");
  EXPECT_TRUE(c->summable());
  EXPECT_EQ(c->WireBytes(0), 0u);
  EXPECT_EQ(c->WireBytes(1), 4u);
  EXPECT_EQ(c->WireBytes(1000), 40u);
  EXPECT_EQ(c->WireBytes(1001), 44u);
  testing_util::ExpectSizeChecks(*c, 1000);
}

// k distinct indices in [0, n), ascending; the same for the same context in
// different instances; different for another step or bucket.
TEST(RandomKCompressorTest, IndicesDependOnlyOnTheContext) {
  for (double ratio : {0.01, 0.3, 1.0}) {
    for (size_t n : TestSizes()) {
      auto a = Make(ratio), b = Make(ratio);
      const CompressContext ctx{11, 5, 3};
      const std::vector<uint32_t> ia = a->Indices(ctx, n);
      a->Indices({11, 6, 3}, n);  // Another context in between.
      EXPECT_EQ(b->Indices(ctx, n), ia);
      EXPECT_EQ(a->Indices(ctx, n), ia);
      ASSERT_EQ(ia.size(), a->KeepCount(n));
      for (size_t j = 0; j < ia.size(); ++j) {
        ASSERT_LT(ia[j], n);
        if (j > 0) {
          ASSERT_LT(ia[j - 1], ia[j]);
        }
      }
      const std::vector<float> in = Gaussian(n, 1.0f, n);
      EXPECT_EQ(CompressUnaligned(*a, in, ctx), CompressUnaligned(*b, in, ctx));
      if (n >= 1000 && ratio < 1.0) {
        EXPECT_NE(a->Indices({11, 6, 3}, n), ia);
        EXPECT_NE(a->Indices({11, 5, 4}, n), ia);
        EXPECT_NE(a->Indices({12, 5, 3}, n), ia);
      }
    }
  }
}

TEST(RandomKCompressorTest, DecodesKeptValuesScaledByNOverK) {
  auto c = Make(0.1);
  const size_t n = 1001, k = 101;
  const std::vector<float> in = Gaussian(n, 1.0f, 4);
  const CompressContext ctx{1, 2, 3};
  const std::vector<float> out = testing_util::RoundTrip(*c, in, ctx);
  const std::vector<uint32_t>& idx = c->Indices(ctx, n);
  std::set<uint32_t> kept(idx.begin(), idx.end());
  const float scale = static_cast<float>(double(n) / k);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], kept.count(i) ? in[i] * scale : 0.0f) << i;
  }
}

// Monte Carlo over seeds: each element's mean is within 5 sigma of x_i
// (Var = (n/k - 1) x_i^2 per trial), and each index is kept close to
// T * k / n times (binomial, 5 sigma).
TEST(RandomKCompressorTest, UnbiasedAndUniform) {
  constexpr int kTrials = 4000;
  const size_t n = 97;
  for (double ratio : {0.05, 0.25}) {
    auto c = Make(ratio);
    const size_t k = c->KeepCount(n);
    const std::vector<float> in = Gaussian(n, 1.0f, 9);
    std::vector<double> sum(n, 0);
    std::vector<int> hits(n, 0);
    for (int t = 0; t < kTrials; ++t) {
      const CompressContext ctx{static_cast<uint64_t>(t), 1, 0};
      const std::vector<float> out = testing_util::RoundTrip(*c, in, ctx);
      for (size_t i = 0; i < n; ++i) {
        sum[i] += out[i];
        hits[i] += out[i] != 0;
      }
    }
    const double p = double(k) / n;
    for (size_t i = 0; i < n; ++i) {
      const double sigma = std::fabs(in[i]) * std::sqrt((1 / p - 1) / kTrials);
      EXPECT_NEAR(sum[i] / kTrials, in[i], 5 * sigma + 1e-6) << i;
      EXPECT_NEAR(hits[i], kTrials * p, 5 * std::sqrt(kTrials * p * (1 - p)));
    }
  }
}

// Summable: adding wire buffers of two ranks (same context) decodes to the
// sum of their decodings.
TEST(RandomKCompressorTest, SumOfWireBuffersDecodesToSumOfDecodings) {
  auto c = Make(0.02);
  for (size_t n : TestSizes()) {
    const CompressContext ctx{3, 4, 5};
    const std::vector<float> a = Gaussian(n, 1.0f, 1), b = Gaussian(n, 1.0f, 2);
    const std::vector<uint8_t> wa = CompressUnaligned(*c, a, ctx);
    const std::vector<uint8_t> wb = CompressUnaligned(*c, b, ctx);
    std::vector<uint8_t> sum(wa.size());
    for (size_t j = 0; j < wa.size() / 4; ++j) {
      float x, y;
      std::memcpy(&x, wa.data() + 4 * j, 4);
      std::memcpy(&y, wb.data() + 4 * j, 4);
      x += y;
      std::memcpy(sum.data() + 4 * j, &x, 4);
    }
    const std::vector<float> da = DecompressUnaligned(*c, wa, n, ctx);
    const std::vector<float> db = DecompressUnaligned(*c, wb, n, ctx);
    const std::vector<float> ds = DecompressUnaligned(*c, sum, n, ctx);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(ds[i], da[i] + db[i], std::ldexp(std::fabs(da[i]) + std::fabs(db[i]), -22));
    }
  }
}

}  // namespace
}  // namespace gradsync::compression
