#include "ps/optimizer.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync::server {
namespace {

constexpr size_t kN = 257;
constexpr int kSteps = 100;

float Grad(int step, size_t i) {
  return std::sin(0.1f * static_cast<float>(step) + 0.37f * static_cast<float>(i));
}

std::vector<float> Initial() {
  std::vector<float> p(kN);
  for (size_t i = 0; i < kN; ++i) p[i] = 0.01f * static_cast<float>(i) - 1.0f;
  return p;
}

// Runs `kSteps` steps of `options` through the Optimizer.
std::vector<float> RunOptimizer(const OptimizerOptions& options) {
  auto opt = MakeOptimizer(options);
  std::vector<float> p = Initial(), g(kN);
  OptimizerSlots slots;
  for (int s = 0; s < kSteps; ++s) {
    for (size_t i = 0; i < kN; ++i) g[i] = Grad(s, i);
    opt->Step(p.data(), g.data(), kN, &slots, 1.0f);
  }
  EXPECT_EQ(slots.steps, static_cast<uint64_t>(kSteps));
  return p;
}

void ExpectBitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "at " << i;
}

TEST(OptimizerTest, SgdMatchesTheTextbookLoopBitForBit) {
  OptimizerOptions o{OptimizerKind::kSgd, 0.05f};
  std::vector<float> p = Initial();
  for (int s = 0; s < kSteps; ++s) {
    for (size_t i = 0; i < kN; ++i) p[i] = p[i] - o.lr * Grad(s, i);
  }
  ExpectBitEqual(RunOptimizer(o), p);
}

TEST(OptimizerTest, MomentumMatchesTheTextbookLoopBitForBit) {
  OptimizerOptions o{OptimizerKind::kMomentum, 0.05f, 0.8f};
  std::vector<float> p = Initial(), v(kN, 0.0f);
  for (int s = 0; s < kSteps; ++s) {
    for (size_t i = 0; i < kN; ++i) {
      v[i] = o.momentum * v[i] + Grad(s, i);
      p[i] = p[i] - o.lr * v[i];
    }
  }
  ExpectBitEqual(RunOptimizer(o), p);
}

TEST(OptimizerTest, AdamMatchesTheTextbookLoopBitForBit) {
  OptimizerOptions o{OptimizerKind::kAdam, 0.01f};
  o.beta1 = 0.9f;
  o.beta2 = 0.99f;
  o.eps = 1e-6f;
  std::vector<float> p = Initial(), m(kN, 0.0f), v(kN, 0.0f);
  for (int s = 0; s < kSteps; ++s) {
    const float t = static_cast<float>(s + 1);
    for (size_t i = 0; i < kN; ++i) {
      const float g = Grad(s, i);
      m[i] = o.beta1 * m[i] + (1.0f - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1.0f - o.beta2) * g * g;
      const float m_hat = m[i] / (1.0f - std::pow(o.beta1, t));
      const float v_hat = v[i] / (1.0f - std::pow(o.beta2, t));
      p[i] = p[i] - o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  }
  ExpectBitEqual(RunOptimizer(o), p);
}

TEST(OptimizerTest, AdamAgreesWithADoublePrecisionReference) {
  OptimizerOptions o{OptimizerKind::kAdam, 0.01f};
  std::vector<double> p(kN), m(kN, 0.0), v(kN, 0.0);
  for (size_t i = 0; i < kN; ++i) p[i] = Initial()[i];
  for (int s = 0; s < kSteps; ++s) {
    for (size_t i = 0; i < kN; ++i) {
      const double g = Grad(s, i);
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const double m_hat = m[i] / (1 - std::pow(0.9, s + 1));
      const double v_hat = v[i] / (1 - std::pow(0.999, s + 1));
      p[i] -= 0.01 * m_hat / (std::sqrt(v_hat) + 1e-8);
    }
  }
  std::vector<float> got = RunOptimizer(o);
  for (size_t i = 0; i < kN; ++i) EXPECT_NEAR(got[i], p[i], 1e-4) << "at " << i;
}

TEST(OptimizerTest, LrScaleScalesTheStep) {
  auto opt = MakeOptimizer({OptimizerKind::kSgd, 0.5f});
  std::vector<float> p = {1.0f}, g = {1.0f};
  OptimizerSlots slots;
  opt->Step(p.data(), g.data(), 1, &slots, 0.5f);
  EXPECT_EQ(p[0], 0.75f);
}

TEST(OptimizerTest, NoneMakesNoOptimizer) {
  EXPECT_EQ(MakeOptimizer({OptimizerKind::kNone}), nullptr);
}

TEST(OptimizerOptionsTest, ReadsTheSettingsAndRefusesBadOnes) {
  auto o = OptimizerOptions::FromConfig(
      Config::FromMap({{"optimizer", "adam"}, {"lr", "0.5"}, {"beta1", "0.8"}, {"eps", "0.001"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->kind, OptimizerKind::kAdam);
  EXPECT_EQ(o->lr, 0.5f);
  EXPECT_EQ(o->beta1, 0.8f);
  EXPECT_EQ(o->eps, 0.001f);
  auto bad = OptimizerOptions::FromConfig(Config::FromMap({{"optimizer", "lamb"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'lamb'"), std::string::npos);
  EXPECT_FALSE(OptimizerOptions::FromConfig(Config::FromMap({{"lr", "-1"}})).ok());
  EXPECT_FALSE(OptimizerOptions::FromConfig(Config::FromMap({{"momentum", "1"}})).ok());
}

}  // namespace
}  // namespace gradsync::server
