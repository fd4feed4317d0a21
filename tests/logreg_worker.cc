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

#include "common/config.h"
#include "common/logging.h"
#include "gradsync/communicator.h"
#include "tests/test_worker.h"

extern char** environ;

namespace gradsync {
namespace {

constexpr int kDim = 1024;
constexpr int kSamples = 2048;  // per rank
constexpr int kBatch = 32;

int Main(int argc, char** argv) {
  auto config = Config::FromArgs(argc, argv, environ);
  if (!config.ok()) return 2;
  const int64_t steps = config->GetInt("steps", 300).value();
  const double lr = config->GetDouble("lr", 0.5).value();
  std::unique_ptr<client::Communicator> comm = JoinAsWorker(*config);
  if (comm == nullptr) return 3;
  client::Communicator& c = *comm;
  auto id = c.RegisterTensor("logreg.weight", kDim, DType::kF32);
  if (!id.ok()) return 3;
  const LogregData data = MakeLogregData(kDim, kSamples, 99u + static_cast<unsigned>(c.rank()));
  std::vector<float> w(kDim, 0.0f), g(kDim);
  for (int64_t step = 0; step < steps; ++step) {
    std::fill(g.begin(), g.end(), 0.0f);
    const int begin = static_cast<int>((step * kBatch) % kSamples);
    LogregLossAndGradient(data, w, begin, begin + kBatch, &g);
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
  float loss = static_cast<float>(LogregLossAndGradient(data, w, 0, kSamples, nullptr));
  Status s =
      c.AllReduce(&loss, 1, DType::kF32, client::ReduceOp::kAverage, Deadline::AfterMs(30000));
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
