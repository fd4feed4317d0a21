#include "compression/error_feedback.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "compression/half_compressor.h"
#include "compression/qsgd_compressor.h"
#include "compression/randomk_compressor.h"
#include "compression/sign_compressor.h"
#include "compression/test_util.h"
#include "compression/topk_compressor.h"
#include "gtest/gtest.h"

namespace gradsync::compression {
namespace {

using testing_util::CompressUnaligned;
using testing_util::DecompressUnaligned;
using testing_util::Gaussian;
using testing_util::Laplace;

constexpr double kU = 5.9604644775390625e-08;  // 2^-24, float unit roundoff.

using Factory = std::function<std::unique_ptr<Compressor>()>;

std::vector<std::pair<std::string, Factory>> Inners() {
  return {
      {"topk",
       [] {
         return std::unique_ptr<Compressor>(
             TopKCompressor::Create(TopKMethod::kExact, TopKValues::kFp32, 0.05).value());
       }},
      {"topk_sampled_fp16",
       [] {
         return std::unique_ptr<Compressor>(
             TopKCompressor::Create(TopKMethod::kSampled, TopKValues::kFp16, 0.01).value());
       }},
      {"sign", [] { return std::unique_ptr<Compressor>(SignCompressor::Create(64).value()); }},
      {"qsgd", [] { return std::unique_ptr<Compressor>(QsgdCompressor::Create(64, 4).value()); }},
      {"randomk",
       [] { return std::unique_ptr<Compressor>(RandomKCompressor::Create(0.1).value()); }},
      {"fp16", [] { return std::make_unique<HalfCompressor>(HalfFormat::kFp16); }},
  };
}

// One step, checked against its definition: with c = fl(g + e_old) and
// d = Decompress(wire), e_new = fl(c - d), so d + e_new == c up to the one
// rounding of that subtraction: |d + e_new - c| <= u |e_new| (in double,
// where d + e_new is exact).
TEST(ErrorFeedbackTest, DecompressedPlusNewResidualIsTheCorrectedInput) {
  for (const auto& [name, make] : Inners()) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{70001}}) {
      ErrorFeedback ef(make());
      for (uint64_t step = 0; step < 4; ++step) {
        const CompressContext ctx{9, step, 2};
        const std::vector<float> g = Laplace(n, 1.0f, n + step);
        std::vector<float> c = g;
        if (const std::vector<float>* e = ef.Residual(2)) {
          for (size_t i = 0; i < n; ++i) c[i] = g[i] + (*e)[i];
        }
        const std::vector<uint8_t> wire = CompressUnaligned(ef, g, ctx);
        auto plain = make();
        const std::vector<float> d = DecompressUnaligned(*plain, wire, n, ctx);
        const std::vector<float>& e_new = *ef.Residual(2);
        ASSERT_EQ(e_new.size(), n);
        for (size_t i = 0; i < n; ++i) {
          const double lhs = double{d[i]} + e_new[i];
          ASSERT_LE(std::fabs(lhs - c[i]), kU * std::fabs(e_new[i]))
              << name << " n=" << n << " step=" << step << " i=" << i;
        }
      }
    }
  }
}

// The new residual is fl(c - d) bit for bit, element by element, also
// where c is -0, subnormal or the largest float and where the compressor
// sent nothing (a sparse compressor subtracts only what it kept: c - 0 is
// c). Steps with inf or NaN keep the old residual
// (ANonFiniteGradientLeavesTheResidualUnchanged).
TEST(ErrorFeedbackTest, NewResidualIsTheRoundedDifferenceBitForBit) {
  auto bits = [](float x) {
    uint32_t b;
    std::memcpy(&b, &x, sizeof(b));
    return b;
  };
  for (const auto& [name, make] : Inners()) {
    const size_t n = 5003;
    ErrorFeedback ef(make());
    for (uint64_t step = 0; step < 3; ++step) {
      const CompressContext ctx{9, step, 4};
      std::vector<float> g = Gaussian(n, 1.0f, 31 + step);
      const float specials[] = {std::numeric_limits<float>::denorm_min(),
                                std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::lowest(), -0.0f, 0.0f};
      for (size_t j = 0; j < 5; ++j) g[(j * 977 + step * 13) % n] = specials[j];
      std::vector<float> c = g;
      if (const std::vector<float>* e = ef.Residual(4)) {
        for (size_t i = 0; i < n; ++i) {
          c[i] = g[i] + (*e)[i];
          if (c[i] != c[i]) c[i] = std::numeric_limits<float>::quiet_NaN();
        }
      }
      const std::vector<uint8_t> wire = CompressUnaligned(ef, g, ctx);
      auto plain = make();
      const std::vector<float> d = DecompressUnaligned(*plain, wire, n, ctx);
      const std::vector<float>& e_new = *ef.Residual(4);
      ASSERT_EQ(e_new.size(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(bits(e_new[i]), bits(c[i] - d[i]))
            << name << " step=" << step << " i=" << i << " c=" << c[i] << " d=" << d[i];
      }
    }
  }
}

// Over T steps the decompressed outputs plus the final residual add up to
// the inputs. Exactly, sum_t d_t + e_T = sum_t g_t telescopes; in floats
// each step rounds c_t = g_t + e_{t-1} and e_t = c_t - d_t once each, so
// the gap is at most u * sum_t (|c_t| + |e_t|) per element.
TEST(ErrorFeedbackTest, OutputsPlusFinalResidualSumToInputs) {
  constexpr int kSteps = 50;
  for (const auto& [name, make] : Inners()) {
    const size_t n = 5003;
    ErrorFeedback ef(make());
    auto plain = make();
    std::vector<double> sum_g(n, 0), sum_d(n, 0), bound(n, 0);
    std::vector<float> e_old(n, 0.0f);
    for (int t = 0; t < kSteps; ++t) {
      const CompressContext ctx{1, static_cast<uint64_t>(t), 7};
      const std::vector<float> g = Gaussian(n, 1.0f, 100 + t);
      const std::vector<uint8_t> wire = CompressUnaligned(ef, g, ctx);
      const std::vector<float> d = DecompressUnaligned(*plain, wire, n, ctx);
      const std::vector<float>& e = *ef.Residual(7);
      for (size_t i = 0; i < n; ++i) {
        const float c = g[i] + e_old[i];  // What the decorator compressed.
        sum_g[i] += g[i];
        sum_d[i] += d[i];
        bound[i] += std::fabs(c) + std::fabs(e[i]);
      }
      e_old = e;
    }
    const std::vector<float>& e_final = *ef.Residual(7);
    for (size_t i = 0; i < n; ++i) {
      const double gap = std::fabs(sum_d[i] + e_final[i] - sum_g[i]);
      // 1.01 and 1e-12 cover the double sums of this test (relative 2^-50).
      ASSERT_LE(gap, 1.01 * kU * bound[i] + 1e-12) << name << " i=" << i;
    }
  }
}

TEST(ErrorFeedbackTest, ResidualsArePerBucketAndResetOnSizeChange) {
  ErrorFeedback ef(SignCompressor::Create(8).value());
  const std::vector<float> g = Gaussian(64, 1.0f, 1);
  CompressUnaligned(ef, g, {0, 0, 1});
  const std::vector<float> e1 = *ef.Residual(1);
  EXPECT_EQ(ef.Residual(2), nullptr);
  CompressUnaligned(ef, Gaussian(32, 1.0f, 2), {0, 0, 2});
  EXPECT_EQ(*ef.Residual(1), e1);  // Bucket 1 untouched by bucket 2.

  // Bucket 1 at a new size starts from zero: same as a fresh instance.
  const std::vector<float> h = Gaussian(40, 1.0f, 3);
  CompressUnaligned(ef, h, {0, 1, 1});
  ErrorFeedback fresh(SignCompressor::Create(8).value());
  CompressUnaligned(fresh, h, {0, 1, 1});
  EXPECT_EQ(*ef.Residual(1), *fresh.Residual(1));

  ef.ClearResiduals();
  EXPECT_EQ(ef.Residual(1), nullptr);
}

// Buckets of different sizes keep buffers of their own size: a small
// bucket's residual does not end up in a large bucket's buffer.
TEST(ErrorFeedbackTest, ResidualBuffersStayWithTheirBucketsSize) {
  ErrorFeedback ef(TopKCompressor::Create(TopKMethod::kExact, TopKValues::kFp32, 0.05).value());
  for (uint64_t step = 0; step < 4; ++step) {
    for (uint32_t bucket : {1u, 2u}) {
      const size_t n = bucket == 1 ? 100 : 10000;
      CompressUnaligned(ef, Gaussian(n, 1.0f, step * 2 + bucket), {9, step, bucket});
    }
  }
  EXPECT_EQ(ef.Residual(1)->size(), 100u);
  EXPECT_LT(ef.Residual(1)->capacity(), 10000u);
  EXPECT_EQ(ef.Residual(2)->size(), 10000u);
}

TEST(ErrorFeedbackTest, ForwardsTheWrappedCompressorsDescription) {
  ErrorFeedback ef(RandomKCompressor::Create(0.5).value());
  EXPECT_EQ(ef.name(), "randomk");
  EXPECT_TRUE(ef.summable());
  EXPECT_EQ(ef.WireBytes(10), 20u);
  ErrorFeedback sign(SignCompressor::Create(8).value());
  EXPECT_FALSE(sign.summable());
}

TEST(ErrorFeedbackTest, FailedCompressLeavesTheResidualUnchanged) {
  ErrorFeedback ef(SignCompressor::Create(8).value());
  const std::vector<float> g = Gaussian(16, 1.0f, 1);
  CompressUnaligned(ef, g, {});
  const std::vector<float> before = *ef.Residual(0);
  std::vector<uint8_t> small(ef.WireBytes(16) - 1);
  Status s = ef.Compress(g.data(), 16, {}, small.data(), small.size());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*ef.Residual(0), before);
}

// A step whose gradient holds inf or NaN (an fp16 overflow the trainer
// skips, as GradScaler does) is still compressed, so every rank sees the
// overflow, but leaves each residual as it was: one such step must not
// poison every later one.
TEST(ErrorFeedbackTest, ANonFiniteGradientLeavesTheResidualUnchanged) {
  for (const auto& [name, make] : Inners()) {
    SCOPED_TRACE(name);
    for (float bad :
         {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN()}) {
      ErrorFeedback ef(make());
      CompressUnaligned(ef, Gaussian(256, 1.0f, 1), {0, 0, 3});
      const std::vector<float> before = *ef.Residual(3);
      std::vector<float> g = Gaussian(256, 1.0f, 2);
      g[77] = bad;
      CompressUnaligned(ef, g, {0, 1, 3});
      EXPECT_EQ(0,
                std::memcmp(before.data(), ef.Residual(3)->data(), before.size() * sizeof(float)));
      CompressUnaligned(ef, Gaussian(256, 1.0f, 3), {0, 2, 3});
      for (float e : *ef.Residual(3)) ASSERT_TRUE(std::isfinite(e));
    }
  }
}

// What error feedback is for: with top-k, every coordinate is eventually
// sent and the residual stays bounded instead of growing with the steps.
TEST(ErrorFeedbackTest, TopKWithFeedbackSendsEveryCoordinateEventually) {
  ErrorFeedback ef(TopKCompressor::Create(TopKMethod::kExact, TopKValues::kFp32, 0.1).value());
  const size_t n = 200;
  const std::vector<float> g = Gaussian(n, 1.0f, 5);  // The same every step.
  float g_max = 0;
  for (float x : g) g_max = std::max(g_max, std::fabs(x));
  std::vector<bool> sent(n, false);
  for (int t = 0; t < 400; ++t) {
    const CompressContext ctx{0, static_cast<uint64_t>(t), 0};
    const std::vector<float> d = testing_util::RoundTrip(ef, g, ctx);
    for (size_t i = 0; i < n; ++i) sent[i] = sent[i] || d[i] != 0;
  }
  for (size_t i = 0; i < n; ++i) {
    // A coordinate is sent once its residual is among the top 10%, which
    // takes about (threshold / |g_i|) steps: every one but the tiniest has
    // been sent, and no residual has grown past a few gradients.
    if (std::fabs(g[i]) > 0.05f * g_max) {
      EXPECT_TRUE(sent[i]) << i;
    }
    EXPECT_LE(std::fabs((*ef.Residual(0))[i]), 10 * g_max) << i;
  }
}

// Deep gradient compression's recurrence, written out: u = m u + g,
// c = u + e, send the k largest |c|, e = c where not sent (0 where sent),
// u = 0 where sent.
TEST(ErrorFeedbackTest, MomentumFollowsTheDgcRecurrenceBitForBit) {
  const size_t n = 64, k = 4;  // ratio 1/16
  const float m = 0.9f;
  ErrorFeedback ef(TopKCompressor::Create(TopKMethod::kExact, TopKValues::kFp32, 1.0 / 16).value(),
                   m);
  std::unique_ptr<TopKCompressor> plain =
      TopKCompressor::Create(TopKMethod::kExact, TopKValues::kFp32, 1.0 / 16).value();
  std::vector<float> u(n, 0.0f), e(n, 0.0f);
  CompressContext ctx;
  ctx.bucket_id = 3;
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(step);
    const std::vector<float> g = Gaussian(n, 1.0f, 100 + step);
    std::vector<float> c(n);
    for (size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + g[i];
      c[i] = u[i] + e[i];
    }
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](size_t a, size_t b) { return std::fabs(c[a]) > std::fabs(c[b]); });
    std::vector<float> want(n, 0.0f);
    for (size_t j = 0; j < k; ++j) want[order[j]] = c[order[j]];
    for (size_t i = 0; i < n; ++i) {
      e[i] = c[i] - want[i];
      if (want[i] != 0.0f) u[i] = 0.0f;
    }
    std::vector<uint8_t> wire(ef.WireBytes(n));
    ASSERT_TRUE(ef.Compress(g.data(), n, ctx, wire.data(), wire.size()).ok());
    std::vector<float> got(n);
    ASSERT_TRUE(plain->Decompress(wire.data(), wire.size(), n, ctx, got.data()).ok());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), n * sizeof(float)));
    ASSERT_NE(ef.Residual(3), nullptr);
    EXPECT_EQ(0, std::memcmp(ef.Residual(3)->data(), e.data(), n * sizeof(float)));
    std::vector<float> velocity(n), zero(n, 0.0f);
    ef.Velocity(zero.data(), n, 3, velocity.data());  // m u + 0
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(velocity[i], m * u[i]) << i;
  }
}

// CompressedValues(g) is what Compress(g) hands the wrapped compressor:
// the wrapped one's bytes of it are Compress's, step after step (momentum,
// residuals, a NaN step that skips the velocity), and nothing changes.
TEST(ErrorFeedbackTest, CompressedValuesAreWhatCompressCompresses) {
  const size_t n = 256;
  ErrorFeedback ef(TopKCompressor::Create(TopKMethod::kExact, TopKValues::kFp32, 0.05).value(),
                   0.9f);
  std::unique_ptr<TopKCompressor> plain =
      TopKCompressor::Create(TopKMethod::kExact, TopKValues::kFp32, 0.05).value();
  CompressContext ctx;
  ctx.bucket_id = 7;
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE(step);
    std::vector<float> g = Gaussian(n, 1.0f, 200 + step);
    if (step == 3) g[5] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> scratch, again_scratch;
    const float* values = ef.CompressedValues(g.data(), n, ctx.bucket_id, &scratch);
    const float* again = ef.CompressedValues(g.data(), n, ctx.bucket_id, &again_scratch);
    EXPECT_EQ(0, std::memcmp(values, again, n * sizeof(float)));
    std::vector<uint8_t> want(plain->WireBytes(n)), got(ef.WireBytes(n));
    ASSERT_TRUE(plain->Compress(values, n, ctx, want.data(), want.size()).ok());
    ASSERT_TRUE(ef.Compress(g.data(), n, ctx, got.data(), got.size()).ok());
    EXPECT_EQ(got, want);
  }
}

// The kept fraction of top-k is reachable through the wrapper; other
// compressors have none.
TEST(ErrorFeedbackTest, TheKeptFractionIsTheWrappedTopKs) {
  ErrorFeedback topk(TopKCompressor::Create(TopKMethod::kExact, TopKValues::kFp32, 0.25).value());
  ASSERT_NE(topk.keep_ratio(), nullptr);
  EXPECT_EQ(topk.keep_ratio(), topk.inner().keep_ratio());
  ASSERT_TRUE(topk.keep_ratio()->SetRatio(0.5).ok());
  EXPECT_EQ(topk.WireBytes(16), topk.inner().WireBytes(16));
  EXPECT_EQ(topk.keep_ratio()->ratio(), 0.5);
  ErrorFeedback sign(SignCompressor::Create(64).value());
  EXPECT_EQ(sign.keep_ratio(), nullptr);
}

TEST(ErrorFeedbackTest, AnOverflowedGradientLeavesTheVelocityAsItWas) {
  const size_t n = 16;
  ErrorFeedback ef(TopKCompressor::Create(TopKMethod::kExact, TopKValues::kFp32, 0.25).value(),
                   0.5f);
  CompressContext ctx;
  std::vector<uint8_t> wire(ef.WireBytes(n));
  const std::vector<float> g = Gaussian(n, 1.0f, 7);
  ASSERT_TRUE(ef.Compress(g.data(), n, ctx, wire.data(), wire.size()).ok());
  std::vector<float> zero(n, 0.0f), before(n), after(n);
  ef.Velocity(zero.data(), n, 0, before.data());
  std::vector<float> bad = g;
  bad[5] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(ef.Compress(bad.data(), n, ctx, wire.data(), wire.size()).ok());
  ef.Velocity(zero.data(), n, 0, after.data());
  EXPECT_EQ(0, std::memcmp(before.data(), after.data(), n * sizeof(float)));
}

}  // namespace
}  // namespace gradsync::compression
