// A worker that trains logistic regression on synthetic data through the
// client SDK and prints its final loss: the convergence check for gradient
// compression. Every rank generates its own shard from a seed; the data is
// linearly separable up to label noise.
//
//   logreg_worker --scheduler=... --num_workers=4 [--compression=SPEC]
//       [--steps=300] [--lr=0.5]   (the rate decays linearly to lr / 10)
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "client/communicator.h"
#include "common/config.h"
#include "common/logging.h"

extern char** environ;

namespace gradsync {
namespace {

constexpr int kDim = 1024;
constexpr int kSamples = 2048;  // per rank
constexpr int kBatch = 32;

struct Data {
  std::vector<float> x;  // kSamples x kDim
  std::vector<float> y;  // 0 or 1
};

Data MakeData(int rank) {
  std::mt19937 truth_rng(1234);  // the same true weights on every rank
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> truth(kDim);
  for (float& t : truth) t = normal(truth_rng) / std::sqrt(static_cast<float>(kDim));
  std::mt19937 rng(99 + rank);
  std::uniform_real_distribution<float> noise(0.0f, 1.0f);
  Data d;
  d.x.resize(size_t{kSamples} * kDim);
  d.y.resize(kSamples);
  for (int i = 0; i < kSamples; ++i) {
    float dot = 0;
    for (int j = 0; j < kDim; ++j) {
      const float v = normal(rng);
      d.x[static_cast<size_t>(i) * kDim + j] = v;
      dot += v * truth[j];
    }
    const float p = 1.0f / (1.0f + std::exp(-2.0f * dot));
    d.y[i] = noise(rng) < p ? 1.0f : 0.0f;
  }
  return d;
}

// Mean log-loss over samples [begin, end); adds its gradient into g.
double LossAndGradient(const Data& d, const std::vector<float>& w, int begin, int end,
                       std::vector<float>* g) {
  double loss = 0;
  const float scale = 1.0f / static_cast<float>(end - begin);
  for (int i = begin; i < end; ++i) {
    const float* x = &d.x[static_cast<size_t>(i) * kDim];
    float z = 0;
    for (int j = 0; j < kDim; ++j) z += w[j] * x[j];
    const float p = 1.0f / (1.0f + std::exp(-z));
    loss -= d.y[i] > 0.5f ? std::log(std::max(p, 1e-7f)) : std::log(std::max(1 - p, 1e-7f));
    if (g) {
      for (int j = 0; j < kDim; ++j) (*g)[j] += scale * (p - d.y[i]) * x[j];
    }
  }
  return loss / (end - begin);
}

int Main(int argc, char** argv) {
  auto config = Config::FromArgs(argc, argv, environ);
  if (!config.ok()) return 2;
  const int64_t steps = config->GetInt("steps", 300).value();
  const double lr = config->GetDouble("lr", 0.5).value();
  SetLogTag("worker");
  auto comm = client::Communicator::Create(*config, Deadline::AfterMs(60000));
  if (!comm.ok()) {
    std::printf("create failed: %s\n", comm.status().ToString().c_str());
    return 3;
  }
  client::Communicator& c = **comm;
  auto id = c.RegisterTensor("logreg.weight", kDim, DType::kF32);
  if (!id.ok()) return 3;
  const Data data = MakeData(c.rank());
  std::vector<float> w(kDim, 0.0f), g(kDim);
  for (int64_t step = 0; step < steps; ++step) {
    std::fill(g.begin(), g.end(), 0.0f);
    const int begin = static_cast<int>((step * kBatch) % kSamples);
    LossAndGradient(data, w, begin, begin + kBatch, &g);
    auto h = c.MarkReady(*id, g.data());
    Status s = h.ok() ? c.Synchronize(Deadline::AfterMs(60000)) : h.status();
    if (!s.ok()) {
      std::printf("error: %s\n", s.ToString().c_str());
      return 3;
    }
    // Linear decay to a tenth of the rate, as training schedules do, so the
    // run ends near the optimum rather than at a noise floor.
    const double rate = lr * (1.0 - 0.9 * static_cast<double>(step) / static_cast<double>(steps));
    for (int j = 0; j < kDim; ++j) w[j] -= static_cast<float>(rate) * g[j];
  }
  // The loss over every rank's whole shard, averaged over ranks.
  float loss = static_cast<float>(LossAndGradient(data, w, 0, kSamples, nullptr));
  Status s = c.AllReduce(&loss, 1, DType::kF32, client::ReduceOp::kAverage,
                         Deadline::AfterMs(30000));
  if (!s.ok()) return 3;
  const auto stats = c.stats();
  std::printf("final loss %.6f wire bytes %llu raw bytes %llu\n", loss,
              static_cast<unsigned long long>(stats.wire_bytes),
              static_cast<unsigned long long>(stats.bytes_reduced));
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
