#include "examples/mlp.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync::examples {
namespace {

struct Batch {
  std::vector<float> inputs;
  std::vector<uint8_t> labels;
};

Batch RandomBatch(int inputs, int classes, int batch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Batch b;
  for (int i = 0; i < inputs * batch; ++i) b.inputs.push_back(normal(rng));
  for (int j = 0; j < batch; ++j) {
    b.labels.push_back(static_cast<uint8_t>(rng() % classes));
  }
  return b;
}

TEST(MlpTest, TensorsAreNamedAndSizedPerLayer) {
  Mlp mlp({784, 256, 128, 10}, 1);
  ASSERT_EQ(mlp.num_tensors(), 6u);
  EXPECT_EQ(mlp.tensor_name(0), "fc1.weight");
  EXPECT_EQ(mlp.tensor_name(5), "fc3.bias");
  EXPECT_EQ(mlp.tensor_size(0), 784u * 256u);
  EXPECT_EQ(mlp.tensor_size(3), 128u);
  EXPECT_EQ(mlp.num_parameters(), 784u * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
}

TEST(MlpTest, InitIsDeterministicInTheSeed) {
  Mlp a({20, 8, 3}, 7), b({20, 8, 3}, 7), c({20, 8, 3}, 8);
  for (size_t t = 0; t < a.num_tensors(); ++t) {
    for (size_t i = 0; i < a.tensor_size(t); ++i) {
      EXPECT_EQ(a.param(t)[i], b.param(t)[i]);
    }
  }
  EXPECT_NE(a.param(0)[0], c.param(0)[0]);
}

TEST(MlpTest, BackwardReportsGradientsLastLayerFirstBiasBeforeWeight) {
  Mlp mlp({6, 5, 4, 3}, 3);
  Batch b = RandomBatch(6, 3, 4, 11);
  mlp.Forward(b.inputs.data(), b.labels.data(), 4);
  std::vector<size_t> order;
  mlp.Backward([&](size_t t) { order.push_back(t); });
  EXPECT_EQ(order, (std::vector<size_t>{5, 4, 3, 2, 1, 0}));
}

// Every analytic gradient matches a central finite difference of the loss.
TEST(MlpTest, GradientsMatchFiniteDifferences) {
  constexpr int kBatch = 5;
  Mlp mlp({7, 6, 5, 4}, 5);
  for (size_t t = 1; t < mlp.num_tensors(); t += 2) {
    for (size_t i = 0; i < mlp.tensor_size(t); ++i) {
      mlp.param(t)[i] = 0.05f * (i % 3);
    }
  }
  Batch b = RandomBatch(7, 4, kBatch, 13);
  mlp.Forward(b.inputs.data(), b.labels.data(), kBatch);
  mlp.Backward(nullptr);
  std::vector<std::vector<float>> analytic;
  for (size_t t = 0; t < mlp.num_tensors(); ++t) {
    analytic.emplace_back(mlp.grad(t), mlp.grad(t) + mlp.tensor_size(t));
  }
  constexpr float kEps = 1e-3f;
  int checked = 0;
  for (size_t t = 0; t < mlp.num_tensors(); ++t) {
    for (size_t i = 0; i < mlp.tensor_size(t); ++i) {
      float& p = mlp.param(t)[i];
      const float saved = p;
      p = saved + kEps;
      const double up = mlp.Forward(b.inputs.data(), b.labels.data(), kBatch);
      p = saved - kEps;
      const double down = mlp.Forward(b.inputs.data(), b.labels.data(), kBatch);
      p = saved;
      const double numeric = (up - down) / (2 * kEps);
      EXPECT_NEAR(analytic[t][i], numeric, 2e-3 + 2e-2 * std::fabs(numeric))
          << mlp.tensor_name(t) << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(mlp.num_parameters()));
}

TEST(MlpTest, LossFallsOnAFixedBatch) {
  constexpr int kBatch = 32;
  Mlp mlp({784, 256, 128, 10}, 42);
  SgdMomentum sgd(mlp, 0.05f, 0.9f);
  Batch b = RandomBatch(784, 10, kBatch, 17);
  const float first = mlp.Forward(b.inputs.data(), b.labels.data(), kBatch);
  float last = first;
  for (int step = 0; step < 40; ++step) {
    mlp.Backward(nullptr);
    sgd.Step(&mlp);
    last = mlp.Forward(b.inputs.data(), b.labels.data(), kBatch);
  }
  EXPECT_LT(last, 0.1f * first) << "first " << first << ", last " << last;
  EXPECT_EQ(mlp.CountCorrect(b.inputs.data(), b.labels.data(), kBatch), kBatch);
}

TEST(MlpTest, SgdMomentumFollowsTheVelocityRule) {
  Mlp mlp({1, 1}, 0);
  mlp.param(0)[0] = 1.0f;
  SgdMomentum sgd(mlp, 0.5f, 0.9f);
  mlp.grad(0)[0] = 2.0f;
  sgd.Step(&mlp);  // v = 2, p = 1 - 1 = 0
  EXPECT_FLOAT_EQ(mlp.param(0)[0], 0.0f);
  mlp.grad(0)[0] = 1.0f;
  sgd.Step(&mlp);  // v = 0.9 * 2 + 1 = 2.8, p = -1.4
  EXPECT_FLOAT_EQ(mlp.param(0)[0], -1.4f);
}

}  // namespace
}  // namespace gradsync::examples
