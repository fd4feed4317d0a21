// Properties of the CPU references in compress_cpu.h, the agreement of the
// shared element arithmetic (compress_math.h, what the GPU runs) with
// common/half, and digests of the wire bytes the compression/ compressors
// produce for fixed inputs (WireDigestTest).
#include "kernels/compress_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "kernels/compress_math.h"
#include "kernels/compress_test_util.h"

namespace gradsync::kernels {
namespace {

using testing_util::Bits;
using testing_util::DescribeDifference;
using testing_util::FirstDifference;
using testing_util::TestSizes;
using testing_util::TestValues;

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Floats around every rounding boundary of fp16 and bf16: all 2^16 upper
// halves with low halves that sit on, just below and just above the
// halfway points of both formats.
std::vector<float> BoundaryFloats() {
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF,
                           0x2000, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  std::vector<float> v;
  v.reserve(65536 * std::size(lows));
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : lows) v.push_back(FromBits(hi << 16 | lo));
  }
  return v;
}

std::vector<float> SpecialFloats() {
  const float inf = std::numeric_limits<float>::infinity();
  return {0.0f,
          -0.0f,
          1e-45f,
          -1e-45f,
          5.96e-8f,
          2.98e-8f,
          2.9802326e-8f,
          2.9802322e-8f,
          6.1035156e-5f,
          6.1035152e-5f,
          65504.0f,
          -65504.0f,
          65505.0f,
          65519.996f,
          65520.0f,
          -65520.0f,
          65536.0f,
          3.4028235e38f,
          -3.4028235e38f,
          inf,
          -inf,
          FromBits(0x7FC00000),
          FromBits(0xFFC00001),
          FromBits(0x7F800001),
          FromBits(0x7FBFFFFF),
          FromBits(0xFF812345)};
}

TEST(Float16MathTest, FloatToHalfMatchesCommonHalf) {
  std::vector<float> in = BoundaryFloats();
  const std::vector<float> special = SpecialFloats();
  in.insert(in.end(), special.begin(), special.end());
  std::vector<uint16_t> bulk(in.size());
  FloatToHalfCpu(in.data(), bulk.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t want = FloatToHalf(in[i]);
    ASSERT_EQ(math::FloatToHalfBits(in[i]), want) << std::hex << Bits(in[i]);
    ASSERT_EQ(bulk[i], want) << std::hex << Bits(in[i]);
  }
}

TEST(Float16MathTest, FloatToBf16MatchesCommonHalf) {
  std::vector<float> in = BoundaryFloats();
  const std::vector<float> special = SpecialFloats();
  in.insert(in.end(), special.begin(), special.end());
  std::vector<uint16_t> bulk(in.size());
  FloatToBf16Cpu(in.data(), bulk.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t want = FloatToBf16(in[i]);
    ASSERT_EQ(math::FloatToBf16Bits(in[i]), want) << std::hex << Bits(in[i]);
    ASSERT_EQ(bulk[i], want) << std::hex << Bits(in[i]);
  }
}

TEST(Float16MathTest, EverySixteenBitPatternWidensLikeCommonHalf) {
  std::vector<uint16_t> all(65536);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> half(65536), bf16(65536);
  HalfToFloatCpu(all.data(), half.data(), all.size());
  Bf16ToFloatCpu(all.data(), bf16.data(), all.size());
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t p = static_cast<uint16_t>(h);
    ASSERT_EQ(Bits(math::HalfBitsToFloat(p)), Bits(HalfToFloat(p))) << h;
    ASSERT_EQ(Bits(half[h]), Bits(HalfToFloat(p))) << h;
    ASSERT_EQ(Bits(math::Bf16BitsToFloat(p)), Bits(Bf16ToFloat(p))) << h;
    ASSERT_EQ(Bits(bf16[h]), Bits(Bf16ToFloat(p))) << h;
  }
}

TEST(Float16MathTest, OverflowAndNan) {
  EXPECT_EQ(math::FloatToHalfBits(65504.0f), 0x7BFF);
  EXPECT_EQ(math::FloatToHalfBits(65519.996f), 0x7BFF);
  EXPECT_EQ(math::FloatToHalfBits(65520.0f), 0x7C00);
  EXPECT_EQ(math::FloatToHalfBits(-65520.0f), 0xFC00);
  EXPECT_EQ(math::FloatToHalfBits(FromBits(0x7F800001)), 0x7E00);
  EXPECT_EQ(math::FloatToHalfBits(FromBits(0xFFC02000)), 0xFE01);
  EXPECT_EQ(math::FloatToBf16Bits(FromBits(0x7F800001)), 0x7FC0);
  EXPECT_EQ(math::FloatToBf16Bits(3.4028235e38f), 0x7F80);  // Rounds up.
}

// ---- Top-k ----

// The k largest by (magnitude key descending, index ascending), ascending.
std::vector<int32_t> BruteForceTopK(const std::vector<float>& in, size_t k) {
  std::vector<int32_t> order(in.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return math::MagnitudeKey(in[a]) > math::MagnitudeKey(in[b]);
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

TEST(TopKCpuTest, SelectsTheLargestWithLowerIndexTies) {
  for (size_t n : TestSizes()) {
    for (bool specials : {false, true}) {
      const std::vector<float> in = TestValues(n, 11 + n, specials);
      for (size_t k : {size_t{0}, size_t{1}, n / 100, n / 7, n / 2, n}) {
        if (k > n) continue;
        std::vector<int32_t> idx(k);
        std::vector<float> values(k);
        std::vector<uint16_t> halves(k);
        TopKCpu(in.data(), n, k, SparseValueFormat::kF32, idx.data(), values.data());
        ASSERT_EQ(idx, BruteForceTopK(in, k)) << "n=" << n << " k=" << k;
        for (size_t j = 0; j < k; ++j) {
          ASSERT_EQ(Bits(values[j]), Bits(in[idx[j]]));
        }
        TopKCpu(in.data(), n, k, SparseValueFormat::kF16, idx.data(), halves.data());
        for (size_t j = 0; j < k; ++j) {
          ASSERT_EQ(halves[j], FloatToHalf(in[idx[j]]));
        }
      }
    }
  }
}

TEST(TopKCpuTest, AllTiesKeepTheFirstK) {
  const std::vector<float> in(100, -2.5f);
  std::vector<int32_t> idx(10);
  std::vector<float> values(10);
  TopKCpu(in.data(), in.size(), 10, SparseValueFormat::kF32, idx.data(), values.data());
  for (int32_t j = 0; j < 10; ++j) EXPECT_EQ(idx[j], j);
}

TEST(TopKCpuTest, DecompressPlacesValuesAndZeros) {
  const std::vector<float> in = TestValues(1000, 5);
  const size_t k = SparseKeepCount(0.05, in.size());
  ASSERT_EQ(k, 50u);
  std::vector<int32_t> idx(k);
  std::vector<float> values(k), out(in.size(), 7.0f);
  TopKCpu(in.data(), in.size(), k, SparseValueFormat::kF32, idx.data(), values.data());
  SparseDecompressCpu(idx.data(), values.data(), SparseValueFormat::kF32, k, in.size(), out.data());
  std::set<int32_t> kept(idx.begin(), idx.end());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(Bits(out[i]), kept.count(static_cast<int32_t>(i)) ? Bits(in[i]) : 0u);
  }
}

TEST(SparseKeepCountTest, CeilOfRatioClamped) {
  EXPECT_EQ(SparseKeepCount(0.01, 0), 0u);
  EXPECT_EQ(SparseKeepCount(0.01, 1), 1u);
  EXPECT_EQ(SparseKeepCount(0.01, 100), 1u);
  EXPECT_EQ(SparseKeepCount(0.01, 101), 2u);
  EXPECT_EQ(SparseKeepCount(1.0, 77), 77u);
}

// ---- Random-k ----

TEST(RandomKCpuTest, IndicesAreADeterministicSubset) {
  const SeedContext ctx{42, 7, 3};
  for (size_t n : TestSizes()) {
    const size_t k = SparseKeepCount(0.05, n);
    const std::vector<uint32_t> idx = RandomKIndicesCpu(ctx, n, k);
    ASSERT_EQ(idx.size(), k);
    for (size_t j = 0; j < k; ++j) {
      ASSERT_LT(idx[j], n);
      if (j > 0) {
        ASSERT_LT(idx[j - 1], idx[j]);
      }
    }
    EXPECT_EQ(idx, RandomKIndicesCpu(ctx, n, k));
  }
  const SeedContext other{42, 8, 3};
  EXPECT_NE(RandomKIndicesCpu(ctx, 100000, 1000), RandomKIndicesCpu(other, 100000, 1000));
}

TEST(RandomKCpuTest, GatherScatterRoundTrip) {
  const size_t n = 4097;
  const std::vector<float> in = TestValues(n, 3);
  const std::vector<uint32_t> idx = RandomKIndicesCpu({1, 2, 3}, n, 400);
  std::vector<float> values(idx.size()), out(n, 5.0f);
  GatherCpu(in.data(), idx.data(), idx.size(), values.data());
  ScatterCpu(values.data(), idx.data(), idx.size(), 2.0f, n, out.data());
  std::vector<float> acc(n, 1.0f);
  ScatterAddCpu(values.data(), idx.data(), idx.size(), 0.5f, acc.data());
  std::set<uint32_t> kept(idx.begin(), idx.end());
  for (size_t i = 0; i < n; ++i) {
    const bool k = kept.count(static_cast<uint32_t>(i)) > 0;
    ASSERT_EQ(Bits(out[i]), Bits(k ? in[i] * 2.0f : 0.0f)) << i;
    ASSERT_EQ(Bits(acc[i]), Bits(k ? 1.0f + in[i] * 0.5f : 1.0f)) << i;
  }
  EXPECT_EQ(RandomKScale(1000, 10), 100.0f);
}

// ---- Sign ----

TEST(SignCpuTest, BitsAreSignBitsAndScaleIsMeanMagnitude) {
  for (size_t chunk : {size_t{8}, size_t{64}, size_t{512}}) {
    for (size_t n : TestSizes()) {
      const std::vector<float> in = TestValues(n, 17 + n);
      const size_t chunks = NumChunks(n, chunk);
      std::vector<float> scales(chunks), out(n);
      std::vector<uint8_t> bits((n + 7) / 8, 0xAA);
      SignEncodeCpu(in.data(), n, chunk, scales.data(), bits.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ((bits[i / 8] >> (i % 8)) & 1, Bits(in[i]) >> 31) << i;
      }
      if (n % 8 != 0) {
        ASSERT_EQ(bits.back() >> (n % 8), 0);
      }
      for (size_t c = 0; c < chunks; ++c) {
        const size_t len = std::min(chunk, n - c * chunk);
        double mean = 0;
        for (size_t i = c * chunk; i < c * chunk + len; ++i) {
          mean += std::fabs(in[i]);
        }
        mean /= static_cast<double>(len);
        ASSERT_NEAR(scales[c], mean, 1e-5 * mean + 1e-30) << c;
      }
      SignDecodeCpu(scales.data(), bits.data(), n, chunk, out.data());
      for (size_t i = 0; i < n; ++i) {
        const float s = scales[i / chunk];
        ASSERT_EQ(Bits(out[i]), Bits(std::signbit(in[i]) ? -s : s)) << i;
      }
    }
  }
}

// ---- QSGD ----

TEST(QsgdCpuTest, LevelsAreWithinOneStepAndDeterministic) {
  for (int levels : {1, 7, 127}) {
    for (size_t n : TestSizes()) {
      const std::vector<float> in = TestValues(n, 23 + n);
      const size_t chunks = NumChunks(n, 64);
      const uint64_t key = QsgdKey({9, 1, 2});
      std::vector<float> norms(chunks), out(n);
      std::vector<int8_t> q(n), again(n);
      QsgdEncodeCpu(in.data(), n, 64, levels, key, norms.data(), q.data());
      QsgdEncodeCpu(in.data(), n, 64, levels, key, norms.data(), again.data());
      ASSERT_EQ(q, again);
      QsgdDecodeCpu(norms.data(), q.data(), n, 64, levels, out.data());
      for (size_t i = 0; i < n; ++i) {
        const float norm = norms[i / 64];
        ASSERT_LE(std::abs(int{q[i]}), levels);
        ASSERT_LE(std::fabs(out[i] - in[i]), norm / levels * 1.0001f) << i;
        if (q[i] != 0) {
          ASSERT_EQ(q[i] < 0, std::signbit(in[i])) << i;
        }
      }
    }
  }
}

TEST(QsgdCpuTest, Unbiased) {
  const std::vector<float> in = {0.3f, -0.7f, 1.0f, 0.05f, -0.55f, 0.0f, 0.91f, -0.12f};
  std::vector<double> mean(in.size(), 0.0);
  const int trials = 20000;
  for (int t = 0; t < trials; ++t) {
    float norm;
    std::vector<int8_t> q(in.size());
    std::vector<float> out(in.size());
    const uint64_t key = QsgdKey({1, static_cast<uint64_t>(t), 0});
    QsgdEncodeCpu(in.data(), in.size(), 8, 3, key, &norm, q.data());
    QsgdDecodeCpu(&norm, q.data(), in.size(), 8, 3, out.data());
    for (size_t i = 0; i < in.size(); ++i) mean[i] += out[i] / trials;
  }
  for (size_t i = 0; i < in.size(); ++i) EXPECT_NEAR(mean[i], in[i], 0.01);
}

TEST(QsgdCpuTest, ZeroInfiniteAndTinyChunks) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {0.0f,   -0.0f,   0.0f,  0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
                                 1.0f,   inf,     -2.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
                                 1e-44f, -3e-45f, 0.0f,  0.0f, 0.0f, 0.0f, 0.0f, 1e-45f};
  std::vector<float> norms(3), out(in.size());
  std::vector<int8_t> q(in.size());
  QsgdEncodeCpu(in.data(), in.size(), 8, 127, 5, norms.data(), q.data());
  QsgdDecodeCpu(norms.data(), q.data(), in.size(), 8, 127, out.data());
  EXPECT_EQ(norms[0], 0.0f);
  EXPECT_TRUE(std::isinf(norms[1]));
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(q[i], 0) << i;
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(out[i], 0.0f);
  for (size_t i = 8; i < 16; ++i) EXPECT_TRUE(std::isnan(out[i]));
  // levels / 1e-44 overflows: the chunk is quantised scaled by 2^64.
  EXPECT_GE(q[16], 126);
  EXPECT_LT(q[17], 0);
}

// ---- Buckets ----

TEST(BucketCpuTest, PackUnpackRoundTripLeavesGapsAlone) {
  std::vector<std::vector<float>> tensors = {TestValues(5, 1), TestValues(0, 2),
                                             TestValues(1000, 3), TestValues(33, 4)};
  const uint64_t offsets[] = {0, 5, 9, 1009};
  std::vector<BucketSlice> slices;
  for (size_t t = 0; t < tensors.size(); ++t) {
    slices.push_back({tensors[t].data(), offsets[t], tensors[t].size()});
  }
  const size_t bucket_elems = 1050;
  ASSERT_TRUE(ValidateSlices(slices.data(), slices.size(), bucket_elems).ok());
  std::vector<float> bucket(bucket_elems, -1.0f);
  PackBucketCpu(slices.data(), slices.size(), bucket.data());
  EXPECT_EQ(bucket[5], -1.0f);  // Gap [5, 9).
  EXPECT_EQ(bucket[1042], -1.0f);
  std::vector<uint16_t> halves(bucket_elems, 0xFFFF);
  PackBucket16Cpu(Float16Format::kFp16, slices.data(), slices.size(), halves.data());
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (size_t i = 0; i < tensors[t].size(); ++i) {
      ASSERT_EQ(Bits(bucket[offsets[t] + i]), Bits(tensors[t][i]));
      ASSERT_EQ(halves[offsets[t] + i], FloatToHalf(tensors[t][i]));
    }
  }
  const std::vector<std::vector<float>> original = tensors;
  for (auto& t : tensors) std::fill(t.begin(), t.end(), 0.0f);
  UnpackBucketCpu(slices.data(), slices.size(), bucket.data());
  EXPECT_EQ(tensors, original);
  UnpackBucket16Cpu(Float16Format::kFp16, slices.data(), slices.size(), halves.data());
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (size_t i = 0; i < tensors[t].size(); ++i) {
      ASSERT_EQ(Bits(tensors[t][i]), Bits(HalfToFloat(FloatToHalf(original[t][i]))));
    }
  }
}

TEST(BucketCpuTest, ValidateSlicesRejectsBadLayouts) {
  float x[4] = {};
  const BucketSlice overlap[] = {{x, 0, 4}, {x, 3, 1}};
  EXPECT_EQ(ValidateSlices(overlap, 2, 10).code(), StatusCode::kInvalidArgument);
  const BucketSlice past[] = {{x, 8, 4}};
  EXPECT_EQ(ValidateSlices(past, 1, 10).code(), StatusCode::kInvalidArgument);
  const BucketSlice null_tensor[] = {{nullptr, 0, 1}};
  EXPECT_EQ(ValidateSlices(null_tensor, 1, 10).code(), StatusCode::kInvalidArgument);
  const BucketSlice huge[] = {{x, ~uint64_t{0}, 2}};
  EXPECT_EQ(ValidateSlices(huge, 1, 10).code(), StatusCode::kInvalidArgument);
  const BucketSlice fine[] = {{x, 0, 4}, {nullptr, 4, 0}, {x, 6, 4}};
  EXPECT_TRUE(ValidateSlices(fine, 3, 10).ok());
}

// ---- Error feedback ----

// decompress(C(c)) + e_new reproduces c = g + e_old: exactly where the
// subtraction c - d was exact, else within one rounding.
void ExpectIdentity(const std::vector<float>& c, const std::vector<float>& d,
                    const std::vector<float>& e, bool exact) {
  for (size_t i = 0; i < c.size(); ++i) {
    if (!std::isfinite(c[i]) || !std::isfinite(d[i])) continue;
    const float back = d[i] + e[i];
    if (exact) {
      ASSERT_EQ(back, c[i]) << i;
    } else {
      ASSERT_NEAR(back, c[i], 1.2e-7f * (std::fabs(c[i]) + std::fabs(d[i]))) << i;
    }
  }
}

std::vector<float> Plus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> c(a.size());
  for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
  return c;
}

TEST(ErrorFeedbackCpuTest, ResidualIsWhatTheCompressorDropped) {
  const size_t n = 4097;
  const std::vector<float> g = TestValues(n, 31);
  const std::vector<float> e_old = TestValues(n, 32);
  const std::vector<float> c = Plus(g, e_old);
  std::vector<float> d(n), e;
  const size_t chunks = NumChunks(n, 512);

  e = e_old;
  std::vector<uint16_t> wire(n);
  EfFloat16Cpu(Float16Format::kFp16, g.data(), e.data(), true, n, wire.data());
  HalfToFloatCpu(wire.data(), d.data(), n);
  ExpectIdentity(c, d, e, true);

  e = e_old;
  std::vector<float> scales(chunks);
  std::vector<uint8_t> bits((n + 7) / 8);
  EfSignCpu(g.data(), e.data(), true, n, 512, scales.data(), bits.data());
  SignDecodeCpu(scales.data(), bits.data(), n, 512, d.data());
  ExpectIdentity(c, d, e, false);

  e = e_old;
  std::vector<float> norms(chunks);
  std::vector<int8_t> q(n);
  EfQsgdCpu(g.data(), e.data(), true, n, 512, 127, 77, norms.data(), q.data());
  QsgdDecodeCpu(norms.data(), q.data(), n, 512, 127, d.data());
  ExpectIdentity(c, d, e, false);

  e = e_old;
  const size_t k = SparseKeepCount(0.05, n);
  std::vector<int32_t> idx(k);
  std::vector<float> values(k);
  EfTopKCpu(g.data(), e.data(), true, n, k, SparseValueFormat::kF32, idx.data(), values.data());
  SparseDecompressCpu(idx.data(), values.data(), SparseValueFormat::kF32, k, n, d.data());
  ExpectIdentity(c, d, e, true);

  e = e_old;
  const std::vector<uint32_t> ridx = RandomKIndicesCpu({4, 5, 6}, n, k);
  EfRandomKCpu(g.data(), e.data(), true, n, ridx.data(), k, RandomKScale(n, k), values.data());
  ScatterCpu(values.data(), ridx.data(), k, RandomKScale(n, k), n, d.data());
  ExpectIdentity(c, d, e, false);
}

TEST(ErrorFeedbackCpuTest, WithoutResidualCompressesG) {
  const size_t n = 1000;
  const std::vector<float> g = TestValues(n, 41);
  std::vector<float> e(n, std::numeric_limits<float>::quiet_NaN());
  std::vector<uint16_t> wire(n), want(n);
  EfFloat16Cpu(Float16Format::kBf16, g.data(), e.data(), false, n, wire.data());
  FloatToBf16Cpu(g.data(), want.data(), n);
  EXPECT_EQ(wire, want);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(e[i], g[i] - Bf16ToFloat(want[i]));
  }
}

// ---- Wire digests ----
//
// The expected values are the FNV-1a digests of what the compression/
// compressors write for the same inputs (Compress, then Decompress; for
// error feedback, ErrorFeedback's wire and residual over four steps, the
// third with infinities and NaNs), with context {seed 42, step 7, bucket 3}.
// A NaN corrected gradient c is the canonical quiet NaN on both sides
// (kernels/compress_math.h: Corrected).
// The references must produce the same bytes: a change to either side's
// wire format fails here.

struct Coded {
  std::vector<uint8_t> wire;
  std::vector<float> out;
};

template <typename T>
void Append(const std::vector<T>& v, std::vector<uint8_t>* wire) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  wire->insert(wire->end(), p, p + v.size() * sizeof(T));
}

const SeedContext kDigestContext{42, 7, 3};

Coded Float16Coded(Float16Format format, const std::vector<float>& in) {
  const size_t n = in.size();
  std::vector<uint16_t> w(n);
  Coded c{{}, std::vector<float>(n)};
  FloatTo16Cpu(format, in.data(), w.data(), n);
  Float16ToFloatCpu(format, w.data(), c.out.data(), n);
  Append(w, &c.wire);
  return c;
}

// Top-k with ratio 0.05: indices, then values.
Coded TopKCoded(SparseValueFormat format, const std::vector<float>& in) {
  const size_t n = in.size();
  const size_t k = SparseKeepCount(0.05, n);
  std::vector<int32_t> idx(k);
  std::vector<float> v32(k);
  std::vector<uint16_t> v16(k);
  const bool f16 = format == SparseValueFormat::kF16;
  void* values = f16 ? static_cast<void*>(v16.data()) : v32.data();
  Coded c{{}, std::vector<float>(n)};
  TopKCpu(in.data(), n, k, format, idx.data(), values);
  SparseDecompressCpu(idx.data(), values, format, k, n, c.out.data());
  Append(idx, &c.wire);
  if (f16) {
    Append(v16, &c.wire);
  } else {
    Append(v32, &c.wire);
  }
  return c;
}

Coded RandomKCoded(const std::vector<float>& in, const SeedContext& ctx) {
  const size_t n = in.size();
  const size_t k = SparseKeepCount(0.05, n);
  const std::vector<uint32_t> idx = RandomKIndicesCpu(ctx, n, k);
  std::vector<float> v(k);
  Coded c{{}, std::vector<float>(n)};
  GatherCpu(in.data(), idx.data(), k, v.data());
  ScatterCpu(v.data(), idx.data(), k, RandomKScale(n, k), n, c.out.data());
  Append(v, &c.wire);
  return c;
}

Coded SignCoded(size_t chunk, const std::vector<float>& in) {
  const size_t n = in.size();
  std::vector<float> scales(NumChunks(n, chunk));
  std::vector<uint8_t> bits((n + 7) / 8);
  Coded c{{}, std::vector<float>(n)};
  SignEncodeCpu(in.data(), n, chunk, scales.data(), bits.data());
  SignDecodeCpu(scales.data(), bits.data(), n, chunk, c.out.data());
  Append(scales, &c.wire);
  Append(bits, &c.wire);
  return c;
}

Coded QsgdCoded(size_t chunk, int levels, const std::vector<float>& in, const SeedContext& ctx) {
  const size_t n = in.size();
  std::vector<float> norms(NumChunks(n, chunk));
  std::vector<int8_t> q(n);
  Coded c{{}, std::vector<float>(n)};
  QsgdEncodeCpu(in.data(), n, chunk, levels, QsgdKey(ctx), norms.data(), q.data());
  QsgdDecodeCpu(norms.data(), q.data(), n, chunk, levels, c.out.data());
  Append(norms, &c.wire);
  Append(q, &c.wire);
  return c;
}

template <typename Code>
uint64_t Digest(Code code) {
  uint64_t h = 14695981039346656037ull;
  for (uint64_t seed : {1, 2}) {
    for (size_t n : TestSizes()) {
      const Coded c = code(TestValues(n, seed, seed == 2));
      h = testing_util::Fnv1a(c.wire.data(), c.wire.size(), h);
      h = testing_util::Fnv1a(c.out.data(), c.out.size() * sizeof(float), h);
    }
  }
  return h;
}

TEST(WireDigestTest, ReferencesWriteWhatTheCompressorsWrite) {
  using V = const std::vector<float>&;
  EXPECT_EQ(Digest([](V in) { return Float16Coded(Float16Format::kFp16, in); }),
            0x70271abcefcc14d0ull);
  EXPECT_EQ(Digest([](V in) { return Float16Coded(Float16Format::kBf16, in); }),
            0xbef45a2a45a57ef5ull);
  EXPECT_EQ(Digest([](V in) { return TopKCoded(SparseValueFormat::kF32, in); }),
            0xad11b594171da068ull);
  // From the sampled-threshold fp16 top-k: the same set as the exact one.
  EXPECT_EQ(Digest([](V in) { return TopKCoded(SparseValueFormat::kF16, in); }),
            0x1e16ac16f7f14334ull);
  EXPECT_EQ(Digest([](V in) { return RandomKCoded(in, kDigestContext); }), 0x8a0d21989af51ceeull);
  EXPECT_EQ(Digest([](V in) { return SignCoded(512, in); }), 0x6d0e8c0bf8a72173ull);
  EXPECT_EQ(Digest([](V in) { return SignCoded(8, in); }), 0xf5eec925f1a21e91ull);
  EXPECT_EQ(Digest([](V in) { return QsgdCoded(512, 127, in, kDigestContext); }),
            0xb9a7f8a6623cd1aaull);
  EXPECT_EQ(Digest([](V in) { return QsgdCoded(64, 7, in, kDigestContext); }),
            0x3a8b75c0c7984a26ull);
}

// One error-feedback step: compresses g into `wire` and updates `residual`.
using EfStep = void (*)(const std::vector<float>& g, std::vector<float>* residual,
                        bool has_residual, const SeedContext& ctx, std::vector<uint8_t>* wire);

uint64_t EfDigest(EfStep step_fn) {
  uint64_t h = 14695981039346656037ull;
  for (size_t n : {size_t{1}, size_t{513}, size_t{4097}}) {
    std::vector<float> residual(n);
    for (uint64_t step = 1; step <= 4; ++step) {
      const std::vector<float> g = TestValues(n, 500 + step + n, step == 3);
      std::vector<uint8_t> wire;
      step_fn(g, &residual, step > 1, {42, step, 3}, &wire);
      h = testing_util::Fnv1a(wire.data(), wire.size(), h);
      h = testing_util::Fnv1a(residual.data(), n * sizeof(float), h);
    }
  }
  return h;
}

TEST(WireDigestTest, ErrorFeedbackMatchesTheDecorator) {
  using G = const std::vector<float>&;
  using R = std::vector<float>*;
  using W = std::vector<uint8_t>*;
  EXPECT_EQ(EfDigest([](G g, R e, bool has, const SeedContext&, W wire) {
              std::vector<uint16_t> w(g.size());
              EfFloat16Cpu(Float16Format::kFp16, g.data(), e->data(), has, g.size(), w.data());
              Append(w, wire);
            }),
            0xd02b860509cbd9a2ull);
  EXPECT_EQ(EfDigest([](G g, R e, bool has, const SeedContext&, W wire) {
              std::vector<float> scales(NumChunks(g.size(), 64));
              std::vector<uint8_t> bits((g.size() + 7) / 8);
              EfSignCpu(g.data(), e->data(), has, g.size(), 64, scales.data(), bits.data());
              Append(scales, wire);
              Append(bits, wire);
            }),
            0x2add03088f9db098ull);
  EXPECT_EQ(EfDigest([](G g, R e, bool has, const SeedContext& ctx, W wire) {
              std::vector<float> norms(NumChunks(g.size(), 64));
              std::vector<int8_t> q(g.size());
              EfQsgdCpu(g.data(), e->data(), has, g.size(), 64, 7, QsgdKey(ctx), norms.data(),
                        q.data());
              Append(norms, wire);
              Append(q, wire);
            }),
            0xb7c711838e848d88ull);
  EXPECT_EQ(EfDigest([](G g, R e, bool has, const SeedContext&, W wire) {
              const size_t k = SparseKeepCount(0.05, g.size());
              std::vector<int32_t> idx(k);
              std::vector<float> values(k);
              EfTopKCpu(g.data(), e->data(), has, g.size(), k, SparseValueFormat::kF32, idx.data(),
                        values.data());
              Append(idx, wire);
              Append(values, wire);
            }),
            0xf0cf2ce7b353ba41ull);
  EXPECT_EQ(EfDigest([](G g, R e, bool has, const SeedContext& ctx, W wire) {
              const size_t n = g.size();
              const size_t k = SparseKeepCount(0.05, n);
              const std::vector<uint32_t> idx = RandomKIndicesCpu(ctx, n, k);
              std::vector<float> values(k);
              // Error feedback takes random-k unscaled (compression/
              // registry.cc: unbiased scaling and error feedback do not mix).
              EfRandomKCpu(g.data(), e->data(), has, n, idx.data(), k, 1.0f, values.data());
              Append(values, wire);
            }),
            0x0abf9c842ada11d4ull);
}

}  // namespace
}  // namespace gradsync::kernels
