// What the SDK test workers (tests/*_worker.cc) share: joining the job as
// a worker process's main does it, and a logistic-regression problem on
// synthetic data (linearly separable up to label noise).
#ifndef GRADSYNC_TESTS_TEST_WORKER_H_
#define GRADSYNC_TESTS_TEST_WORKER_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "common/config.h"
#include "common/logging.h"
#include "gradsync/communicator.h"

namespace gradsync {

// Tags the log lines "worker" and creates the Communicator; null, with the
// reason printed, when that fails.
inline std::unique_ptr<client::Communicator> JoinAsWorker(const Config& config) {
  SetLogTag("worker");
  auto comm = client::Communicator::Create(config, Deadline::AfterMs(60000));
  if (!comm.ok()) {
    std::printf("create failed: %s\n", comm.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*comm);
}

struct LogregData {
  int dim = 0;
  std::vector<float> x;  // samples x dim
  std::vector<float> y;  // 0 or 1
};

// `samples` samples drawn with `sample_seed` around true weights that are
// the same for every seed.
inline LogregData MakeLogregData(int dim, int samples, unsigned sample_seed) {
  std::mt19937 truth_rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> truth(static_cast<size_t>(dim));
  for (float& t : truth) t = normal(truth_rng) / std::sqrt(static_cast<float>(dim));
  std::mt19937 rng(sample_seed);
  std::uniform_real_distribution<float> noise(0.0f, 1.0f);
  LogregData d;
  d.dim = dim;
  d.x.resize(static_cast<size_t>(samples) * static_cast<size_t>(dim));
  d.y.resize(static_cast<size_t>(samples));
  for (int i = 0; i < samples; ++i) {
    float dot = 0;
    for (int j = 0; j < dim; ++j) {
      const float v = normal(rng);
      d.x[static_cast<size_t>(i) * dim + j] = v;
      dot += v * truth[j];
    }
    const float p = 1.0f / (1.0f + std::exp(-2.0f * dot));
    d.y[i] = noise(rng) < p ? 1.0f : 0.0f;
  }
  return d;
}

// Mean log-loss over samples [begin, end); adds its gradient into g.
inline double LogregLossAndGradient(const LogregData& d, const std::vector<float>& w, int begin,
                                    int end, std::vector<float>* g) {
  double loss = 0;
  const int dim = d.dim;
  const float scale = 1.0f / static_cast<float>(end - begin);
  for (int i = begin; i < end; ++i) {
    const float* x = &d.x[static_cast<size_t>(i) * dim];
    float z = 0;
    for (int j = 0; j < dim; ++j) z += w[j] * x[j];
    const float p = 1.0f / (1.0f + std::exp(-z));
    loss -= d.y[i] > 0.5f ? std::log(std::max(p, 1e-7f)) : std::log(std::max(1 - p, 1e-7f));
    if (g) {
      for (int j = 0; j < dim; ++j) (*g)[j] += scale * (p - d.y[i]) * x[j];
    }
  }
  return loss / (end - begin);
}

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_TEST_WORKER_H_
