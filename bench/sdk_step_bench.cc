// sdk_step_bench: the host time of one training step through the SDK with
// host gradients and nothing to move: an embedded scheduler, one worker
// (world 1), T tensors in one bucket; each step marks every tensor ready and
// calls Synchronize. What it measures is the Communicator's own machinery
// per step and per tensor (locks, the hand-over to the comm engine, handle
// completion), which the CUDA path pays as well.
//
//   bazel run --config=opt //bench:sdk_step_bench -- [--tensors=64,1000] [--reps=200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "gradsync/communicator.h"
#include "scheduler/embedded_scheduler.h"

namespace gradsync {
namespace {

void CheckOk(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "sdk_step_bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

Config Settings(const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"sdk_step_bench"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  auto c = Config::FromArgs(static_cast<int>(argv.size()), argv.data(), nullptr);
  CheckOk(c.status(), "settings");
  return *c;
}

// Median host microseconds of a step of `tensors` tensors of 16 floats.
double StepMicros(int tensors, int reps) {
  auto scheduler = server::EmbeddedScheduler::Start(Settings({"--port=0", "--num_workers=1"}));
  CheckOk(scheduler.status(), "EmbeddedScheduler::Start");
  auto comm = client::Communicator::Create(
      Settings({"--scheduler=127.0.0.1:" + std::to_string((*scheduler)->port()), "--rank=0",
                "--num_workers=1", "--host=127.0.0.1", "--metrics_base_port=0"}),
      Deadline::AfterMs(60000));
  CheckOk(comm.status(), "Communicator::Create");
  std::vector<client::TensorId> ids;
  std::vector<std::vector<float>> grads(static_cast<size_t>(tensors), std::vector<float>(16, 1.0f));
  for (int t = 0; t < tensors; ++t) {
    auto id = (*comm)->RegisterTensor("t" + std::to_string(t), 16, DType::kF32);
    CheckOk(id.status(), "RegisterTensor");
    ids.push_back(*id);
  }
  std::vector<double> steps;
  for (int rep = 0; rep < reps + 10; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for (int t = tensors; t-- > 0;) {  // backward order
      CheckOk((*comm)
                  ->MarkReady(ids[static_cast<size_t>(t)], grads[static_cast<size_t>(t)].data())
                  .status(),
              "MarkReady");
    }
    CheckOk((*comm)->Synchronize(Deadline::AfterMs(30000)), "Synchronize");
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (rep >= 10) steps.push_back(us);
  }
  (*comm)->Shutdown();
  comm->reset();
  CheckOk((*scheduler)->Stop(Deadline::AfterMs(10000)), "the job");
  std::sort(steps.begin(), steps.end());
  return steps[steps.size() / 2];
}

int Main(int argc, char** argv) {
  std::vector<int> counts = {64, 1000};
  int reps = 200;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--tensors=", 0) == 0) {
      counts.clear();
      std::stringstream list(a.substr(10));
      for (std::string item; std::getline(list, item, ',');)
        counts.push_back(std::atoi(item.c_str()));
    } else if (a.rfind("--reps=", 0) == 0) {
      reps = std::atoi(a.c_str() + 7);
    } else {
      std::fprintf(stderr, "usage: sdk_step_bench [--tensors=64,1000] [--reps=200]\n");
      return 2;
    }
  }
  std::printf("%8s %12s %14s\n", "tensors", "step_us", "us_per_tensor");
  for (int t : counts) {
    const double us = StepMicros(t, reps);
    std::printf("%8d %12.1f %14.2f\n", t, us, us / t);
    std::printf("{\"tensors\":%d,\"step_us\":%.1f,\"us_per_tensor\":%.3f}\n", t, us, us / t);
  }
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
