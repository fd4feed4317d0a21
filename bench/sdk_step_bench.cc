// sdk_step_bench: the host time of one training step through the SDK with
// host gradients and nothing to move: an embedded scheduler, one worker
// (world 1), T tensors in one bucket; each step marks every tensor ready and
// calls Synchronize. What it measures is the Communicator's own machinery
// per step and per tensor (locks, the hand-over to the comm engine, handle
// completion), which the CUDA path pays as well.
//
//   bazel run --config=opt //bench:sdk_step_bench -- [--tensors=64,1000] [--reps=200]
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/config.h"
#include "common/status.h"
#include "gradsync/communicator.h"
#include "scheduler/embedded_scheduler.h"

extern char** environ;

namespace gradsync {
namespace {

void Check(const Status& s, const std::string& what) {
  if (!s.ok()) bench::Die(what + ": " + s.ToString());
}

// Median host microseconds of a step of `tensors` tensors of 16 floats.
double StepMicros(size_t tensors, int reps) {
  auto scheduler = bench::OrDie(
      server::EmbeddedScheduler::Start(Config::FromMap({{"port", "0"}, {"num_workers", "1"}})),
      "EmbeddedScheduler::Start");
  auto comm = bench::OrDie(
      client::Communicator::Create(
          Config::FromMap({{"scheduler", "127.0.0.1:" + std::to_string(scheduler->port())},
                           {"rank", "0"},
                           {"num_workers", "1"},
                           {"host", "127.0.0.1"},
                           {"metrics_base_port", "0"}}),
          Deadline::AfterMs(60000)),
      "Communicator::Create");
  std::vector<client::TensorId> ids;
  std::vector<std::vector<float>> grads(tensors, std::vector<float>(16, 1.0f));
  for (size_t t = 0; t < tensors; ++t) {
    ids.push_back(
        bench::OrDie(comm->RegisterTensor("t" + std::to_string(t), 16, DType::kF32), "Register"));
  }
  std::vector<double> steps;
  for (int rep = 0; rep < reps + 10; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t t = tensors; t-- > 0;) {  // backward order
      Check(comm->MarkReady(ids[t], grads[t].data()).status(), "MarkReady");
    }
    Check(comm->Synchronize(Deadline::AfterMs(30000)), "Synchronize");
    if (rep >= 10) {
      steps.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count());
    }
  }
  comm->Shutdown();
  comm.reset();
  Check(scheduler->Stop(Deadline::AfterMs(10000)), "the job");
  return bench::Quantile(steps, 0.5);
}

int Main(int argc, char** argv) {
  const Config config = bench::OrDie(Config::FromArgs(argc, argv, environ), "flags");
  const std::vector<size_t> counts = bench::OrDie(
      bench::ParseSizes(bench::OrDie(config.GetString("tensors", "64,1000"), "--tensors")),
      "--tensors");
  const int reps = static_cast<int>(bench::OrDie(config.GetInt("reps", 200), "--reps"));
  std::printf("%8s %12s %14s\n", "tensors", "step_us", "us_per_tensor");
  for (size_t t : counts) {
    const double us = StepMicros(t, reps);
    const double per = us / static_cast<double>(t);
    std::printf("%8zu %12.1f %14.2f\n", t, us, per);
    std::printf("{\"tensors\":%zu,\"step_us\":%.1f,\"us_per_tensor\":%.3f}\n", t, us, per);
  }
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
