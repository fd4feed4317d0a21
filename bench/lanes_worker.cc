// lanes_worker: one worker of ring_lanes_bench. Joins the job from its
// settings (flags or GRADSYNC_*), checks one exact all-reduce of --bytes,
// then times --iters all-reduces (f32) after --warmup, and prints one JSON
// line: {"rank","workers","bytes","lanes","p50_ms","p10_ms","p90_ms"}.
// The all-reduces are the Communicator's direct ones (a sum, over the ring's
// lanes) or, with --bucketed, one registered tensor's gradient marked ready
// and synchronised (an average, through the job's path: with path=ps over
// the parameter-server client's lanes, ps_lanes).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "common/config.h"
#include "common/logging.h"
#include "gradsync/communicator.h"

namespace gradsync {
namespace {

int Main(int argc, char** argv) {
  SetLogTag("worker");
  auto config = Config::FromArgs(argc, argv, environ);
  if (!config.ok()) {
    std::fprintf(stderr, "lanes_worker: %s\n", config.status().ToString().c_str());
    return 2;
  }
  const int64_t bytes = config->GetInt("bytes", int64_t{64} << 20).value();
  const int64_t iters = config->GetInt("iters", 20).value();
  const int64_t warmup = config->GetInt("warmup", 3).value();
  const bool bucketed = config->GetBool("bucketed", false).value();
  const std::string path = config->GetString("path", "allreduce").value();
  // A count, or "auto" (ring_lanes): printed as given.
  std::string lanes = config->GetString(path == "ps" ? "ps_lanes" : "ring_lanes", "1").value();
  if (lanes.find_first_not_of("0123456789") != std::string::npos) lanes = "\"" + lanes + "\"";
  auto comm = client::Communicator::Create(*config, Deadline::AfterMs(60000));
  if (!comm.ok()) {
    std::fprintf(stderr, "lanes_worker: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  if (Status known = config->CheckKnownFlags(); !known.ok()) {
    std::fprintf(stderr, "lanes_worker: %s\n", known.ToString().c_str());
    return 2;
  }
  const int rank = (*comm)->rank();
  const int world = (*comm)->world_size();
  const size_t count = static_cast<size_t>(bytes) / sizeof(float);
  std::vector<float> data(count);
  auto fill = [&] {
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>((i + rank) % 5);
  };
  client::TensorId id{};
  if (bucketed) {
    // One bucket of the whole tensor.
    auto registered = (*comm)->RegisterTensor("grad", count, DType::kF32);
    if (!registered.ok()) {
      std::fprintf(stderr, "lanes_worker: %s\n", registered.status().ToString().c_str());
      return 1;
    }
    id = *registered;
  }
  auto reduce = [&]() -> Status {
    const Deadline deadline = Deadline::AfterMs(120000);
    if (!bucketed) {
      return (*comm)->AllReduce(data.data(), count, DType::kF32, client::ReduceOp::kSum, deadline);
    }
    GS_RETURN_IF_ERROR((*comm)->MarkReady(id, data.data()).status());
    return (*comm)->Synchronize(deadline);
  };
  fill();
  Status s = reduce();
  for (size_t i = 0; s.ok() && i < count; ++i) {
    float want = 0;
    for (int r = 0; r < world; ++r) want += static_cast<float>((i + r) % 5);
    if (bucketed) want /= static_cast<float>(world);
    if (data[i] != want) {
      std::fprintf(stderr, "lanes_worker: element %zu is %g, not %g\n", i, data[i], want);
      return 1;
    }
  }
  std::vector<double> ms;
  for (int64_t it = 0; s.ok() && it < warmup + iters; ++it) {
    fill();
    const auto start = std::chrono::steady_clock::now();
    s = reduce();
    const double took =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (it >= warmup) ms.push_back(took);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "lanes_worker: %s\n", s.ToString().c_str());
    return 1;
  }
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) {
    return ms[static_cast<size_t>(q * static_cast<double>(ms.size() - 1))];
  };
  std::printf(
      "{\"rank\":%d,\"workers\":%d,\"bytes\":%lld,\"lanes\":%s,\"p50_ms\":%.3f,\"p10_ms\":%.3f,"
      "\"p90_ms\":%.3f}\n",
      rank, world, static_cast<long long>(bytes), lanes.c_str(), at(0.5), at(0.1), at(0.9));
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
