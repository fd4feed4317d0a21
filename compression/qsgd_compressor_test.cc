#include "compression/qsgd_compressor.h"

#include <algorithm>
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

std::unique_ptr<QsgdCompressor> Make(size_t chunk, int levels) {
  StatusOr<std::unique_ptr<QsgdCompressor>> c = QsgdCompressor::Create(chunk, levels);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

float NormOf(const std::vector<uint8_t>& wire, size_t chunk_index) {
  float norm;
  std::memcpy(&norm, wire.data() + 4 * chunk_index, 4);
  return norm;
}

TEST(QsgdCompressorTest, RejectsBadOptions) {
  EXPECT_FALSE(QsgdCompressor::Create(0, 127).ok());
  EXPECT_FALSE(QsgdCompressor::Create(12, 127).ok());
  EXPECT_FALSE(QsgdCompressor::Create(512, 0).ok());
  EXPECT_FALSE(QsgdCompressor::Create(512, 128).ok());
}

TEST(QsgdCompressorTest, DescribesItselfAndWireBytes) {
  for (size_t chunk : {8, 512}) {
    auto c = Make(chunk, 127);
    EXPECT_EQ(c->name(), "qsgd");
    EXPECT_FALSE(c->summable());
    for (size_t n : TestSizes()) {
      EXPECT_EQ(c->WireBytes(n), 4 * ((n + chunk - 1) / chunk) + n);
    }
  }
  testing_util::ExpectSizeChecks(*Make(512, 127), 1000);
}

// Every decoded value is k * (M / s) for an integer |k| <= s, with M the
// chunk's max |x| as sent, and has the sign of its input.
TEST(QsgdCompressorTest, DecodedValuesLieOnTheLevelGrid) {
  for (int s : {1, 4, 127}) {
    for (size_t chunk : {8, 512}) {
      auto c = Make(chunk, s);
      for (size_t n : TestSizes()) {
        const std::vector<float> in = Laplace(n, 0.1f, n + s);
        const CompressContext ctx{5, n, 2};
        const std::vector<uint8_t> wire = CompressUnaligned(*c, in, ctx);
        const std::vector<float> out = DecompressUnaligned(*c, wire, n, ctx);
        for (size_t i = 0; i < n; ++i) {
          const size_t chunk_index = i / chunk;
          const size_t first = chunk_index * chunk;
          const size_t len = std::min(chunk, n - first);
          float max = 0;
          for (size_t j = first; j < first + len; ++j) {
            max = std::max(max, std::fabs(in[j]));
          }
          ASSERT_EQ(NormOf(wire, chunk_index), max);
          const float step = max / static_cast<float>(s);
          const float k = std::round(out[i] / step);
          ASSERT_LE(std::fabs(k), s);
          ASSERT_EQ(out[i], k * step) << "i=" << i;
          ASSERT_TRUE(out[i] == 0 || std::signbit(out[i]) == std::signbit(in[i]));
        }
      }
    }
  }
}

// Monte Carlo over many contexts: the mean decoded value is within 5 sigma
// of the input (sigma from the exact per-element variance), and the mean
// squared error per chunk obeys Lemma 3.1: <= min(d/s^2, sqrt(d)/s)||x||^2.
TEST(QsgdCompressorTest, UnbiasedAndWithinTheVarianceBound) {
  constexpr int kTrials = 3000;
  for (int s : {1, 2, 16, 127}) {
    const size_t chunk = 64, n = 200;
    auto c = Make(chunk, s);
    const std::vector<float> in = Gaussian(n, 1.0f, s);
    std::vector<double> sum(n, 0), sq_err(n, 0);
    for (int t = 0; t < kTrials; ++t) {
      const CompressContext ctx{static_cast<uint64_t>(t) * 7919, 3, 1};
      const std::vector<float> out =
          DecompressUnaligned(*c, CompressUnaligned(*c, in, ctx), n, ctx);
      for (size_t i = 0; i < n; ++i) {
        sum[i] += out[i];
        sq_err[i] += (out[i] - double{in[i]}) * (out[i] - double{in[i]});
      }
    }
    for (size_t first = 0; first < n; first += chunk) {
      const size_t d = std::min(chunk, n - first);
      double max = 0, norm2 = 0, err = 0;
      for (size_t i = first; i < first + d; ++i) {
        max = std::max(max, std::fabs(double{in[i]}));
        norm2 += double{in[i]} * in[i];
        err += sq_err[i] / kTrials;
      }
      const double step = max / s;
      for (size_t i = first; i < first + d; ++i) {
        const double r = std::fabs(in[i]) / step;
        const double p = r - std::floor(r);
        const double sigma = step * std::sqrt(p * (1 - p) / kTrials);
        ASSERT_NEAR(sum[i] / kTrials, in[i], 5 * sigma + 1e-6 * max) << "s=" << s << " i=" << i;
      }
      const double bound = std::min(d / double(s * s), std::sqrt(double(d)) / s) * norm2;
      EXPECT_LE(err, bound) << "s=" << s << " chunk at " << first;
    }
  }
}

TEST(QsgdCompressorTest, DeterministicPerContext) {
  auto a = Make(512, 127), b = Make(512, 127);
  const std::vector<float> in = Gaussian(5000, 1.0f, 1);
  const CompressContext ctx{1, 2, 3}, other{1, 3, 3};
  EXPECT_EQ(CompressUnaligned(*a, in, ctx), CompressUnaligned(*b, in, ctx));
  EXPECT_NE(CompressUnaligned(*a, in, ctx), CompressUnaligned(*a, in, other));
}

TEST(QsgdCompressorTest, ZeroTinyAndNonFiniteChunks) {
  auto c = Make(8, 127);
  std::vector<float> in(32, 0.0f);
  // max |x| = 2.4e-37: 127 / max overflows float, the rescaled path.
  for (size_t i = 8; i < 16; ++i) in[i] = 3e-38f * static_cast<float>(i - 7);
  in[17] = std::numeric_limits<float>::infinity();
  in[25] = std::nanf("");
  const std::vector<float> out = DecompressUnaligned(*c, CompressUnaligned(*c, in, {}), 32, {});
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(out[i], 0.0f);
  for (size_t i = 8; i < 16; ++i) {  // Still within one level step.
    EXPECT_LE(std::fabs(out[i] - in[i]), 1.01f * 2.4e-37f / 127) << i;
  }
  for (size_t i = 16; i < 32; ++i) EXPECT_TRUE(std::isnan(out[i])) << i;
}

TEST(QsgdCompressorTest, DecompressRejectsLevelsOutsideTheGrid) {
  for (int s : {4, 127}) {
    auto c = Make(8, s);
    std::vector<int8_t> bad_levels = {-128};
    if (s < 127) bad_levels.push_back(static_cast<int8_t>(s + 1));
    for (int8_t bad : bad_levels) {
      std::vector<uint8_t> wire(c->WireBytes(16), 0);
      wire[8 + 11] = static_cast<uint8_t>(bad);
      std::vector<float> out(16, 3.0f);
      Status st = c->Decompress(wire.data(), wire.size(), 16, {}, out.data());
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << int{bad};
      EXPECT_EQ(out, std::vector<float>(16, 3.0f));
    }
  }
}

TEST(QsgdKernelsTest, VectorMatchesScalar) {
  for (size_t len : {1, 7, 8, 9, 63, 64, 100, 512, 4099}) {
    std::vector<float> x = Gaussian(len, 2.0f, len);
    x[len / 2] = -0.0f;
    const uint32_t key_a = MaxMagnitudeKey(x.data(), len);
    ASSERT_EQ(key_a, MaxMagnitudeKeyScalar(x.data(), len));
    float max;
    std::memcpy(&max, &key_a, 4);
    for (int s : {1, 127}) {
      const float inv = s / max;
      std::vector<int8_t> a(len), b(len);
      QsgdEncodeChunk(x.data(), len, inv, s, 0x1234567890ull, 77, a.data());
      QsgdEncodeChunkScalar(x.data(), len, inv, s, 0x1234567890ull, 77, b.data());
      ASSERT_EQ(a, b) << len;
      ASSERT_EQ(MaxAbsLevel(a.data(), len), MaxAbsLevelScalar(a.data(), len));
      std::vector<float> da(len), db(len);
      QsgdDecodeChunk(a.data(), len, max / s, da.data());
      QsgdDecodeChunkScalar(a.data(), len, max / s, db.data());
      ASSERT_EQ(std::memcmp(da.data(), db.data(), 4 * len), 0);
    }
  }
  std::vector<int8_t> q(100, 3);
  q[77] = -128;
  EXPECT_EQ(MaxAbsLevel(q.data(), q.size()), 128);
  EXPECT_EQ(MaxAbsLevelScalar(q.data(), q.size()), 128);
}

}  // namespace
}  // namespace gradsync::compression
