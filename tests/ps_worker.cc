// A training process for the parameter-server tests: links the client SDK
// (Communicator) and runs one of two loops. Prints one line per milestone;
// exits 0 when every check passed, 3 when the Communicator reported an error,
// 1 on a wrong result.
//
//   ps_worker --scheduler=host:port --num_workers=4 --path=ps|allreduce
//       [--mode=average|train] [--steps=4] [--slow_ms=0] [--size_divisor=1]
//       [--tensors=0 --name_bytes=100]
//
// size_divisor=d gives every tensor 1/d of its elements (at least one).
// tensors=N (N > 0) registers N small tensors of `name_bytes`-byte names
// instead (a large model's layout).
//
// mode=average: f32 tensors of mixed sizes (several buckets and partitions)
// carry integer-valued gradients; every step checks the exact average.
// Prints "checksum H", a hash of every result, equal on every path.
// mode=train: with a server-side optimizer. Step 0 hands in the initial
// parameters (worker 0's are used), every later step a gradient computed
// from the parameters the previous step returned. Rank r sleeps r x slow_ms
// per step. Prints "step s" after each step and "params H", a hash of the
// final parameters' bits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/logging.h"
#include "gradsync/communicator.h"

extern char** environ;

namespace gradsync {
namespace {

using client::Communicator;
using client::TensorId;

struct Spec {
  std::string name;
  size_t count;
};

struct BaseSpec {
  const char* name;
  size_t count;
};

const BaseSpec kSpecs[] = {
    {"embedding", 300000}, {"fc1.weight", 700001}, {"fc1.bias", 1001}, {"head.bias", 1}};

float Value(int rank, int64_t step, size_t tensor, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + step * 5 + tensor * 3) % 17) - 8);
}

uint64_t Hash(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

int Fail(const Status& s) {
  std::printf("error: %s\n", s.ToString().c_str());
  std::fflush(stdout);
  return 3;
}

// kSpecs with 1/divisor of their elements, or `tensors` tensors of
// `name_bytes`-byte names and 1 to 5 elements each.
std::vector<Spec> Specs(int64_t divisor, int64_t tensors, int64_t name_bytes) {
  std::vector<Spec> specs;
  for (int64_t t = 0; t < tensors; ++t) {
    std::string name = "model.layers." + std::to_string(t) + ".";
    name.resize(static_cast<size_t>(std::max<int64_t>(name_bytes, 24)), 'p');
    specs.push_back({name, 1 + static_cast<size_t>(t % 5)});
  }
  if (!specs.empty()) return specs;
  const size_t d = static_cast<size_t>(std::max<int64_t>(1, divisor));
  for (const BaseSpec& s : kSpecs) specs.push_back({s.name, std::max<size_t>(1, s.count / d)});
  return specs;
}

StatusOr<std::vector<TensorId>> RegisterAll(Communicator& comm, const std::vector<Spec>& specs) {
  std::vector<TensorId> ids;
  for (const Spec& s : specs) {
    GS_ASSIGN_OR_RETURN(TensorId id, comm.RegisterTensor(s.name, s.count, DType::kF32));
    ids.push_back(id);
  }
  return ids;
}

// Marks every tensor ready (last registered first) and synchronises.
Status SyncAll(Communicator& comm, const std::vector<TensorId>& ids,
               std::vector<std::vector<float>>& data) {
  for (size_t t = ids.size(); t-- > 0;) {
    auto h = comm.MarkReady(ids[t], data[t].data());
    if (!h.ok()) return h.status();
  }
  return comm.Synchronize(Deadline::AfterMs(60000));
}

int RunAverage(Communicator& comm, int64_t steps, const std::vector<Spec>& specs) {
  auto ids = RegisterAll(comm, specs);
  if (!ids.ok()) return Fail(ids.status());
  const int rank = comm.rank(), world = comm.world_size();
  uint64_t checksum = 1469598103934665603ULL;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> data;
    for (size_t t = 0; t < specs.size(); ++t) {
      data.emplace_back(specs[t].count);
      for (size_t i = 0; i < specs[t].count; ++i) data[t][i] = Value(rank, step, t, i);
    }
    Status s = SyncAll(comm, *ids, data);
    if (!s.ok()) return Fail(s);
    for (size_t t = 0; t < data.size(); ++t) {
      for (size_t i = 0; i < data[t].size(); ++i) {
        float want = 0;
        for (int r = 0; r < world; ++r) want += Value(r, step, t, i);
        if (data[t][i] != want / static_cast<float>(world)) {
          std::printf("worker %d WRONG %s[%zu] in step %lld\n", rank, specs[t].name.c_str(), i,
                      static_cast<long long>(step));
          return 1;
        }
      }
      checksum = Hash(checksum, data[t].data(), data[t].size() * sizeof(float));
    }
    std::printf("worker %d step %lld ok\n", rank, static_cast<long long>(step));
  }
  std::printf("worker %d checksum %016llx\n", rank, static_cast<unsigned long long>(checksum));
  return 0;
}

// The gradient of 0.5 * |p - target|^2 plus a rank-dependent wobble.
void Gradient(const std::vector<float>& p, int rank, int64_t step, size_t t,
              std::vector<float>* g) {
  for (size_t i = 0; i < p.size(); ++i) {
    const float target = std::sin(0.01f * static_cast<float>(i + t));
    (*g)[i] = p[i] - target + 0.01f * std::cos(0.1f * static_cast<float>(rank + step) + i);
  }
}

int RunTrain(Communicator& comm, int64_t steps, int64_t slow_ms, const std::vector<Spec>& specs) {
  auto ids = RegisterAll(comm, specs);
  if (!ids.ok()) return Fail(ids.status());
  const int rank = comm.rank();
  std::vector<std::vector<float>> params, buf;
  for (const Spec& spec : specs) params.emplace_back(spec.count, rank == 0 ? 0.5f : -7.0f);
  buf = params;
  Status s = SyncAll(comm, *ids, buf);  // initial parameters: worker 0's
  if (!s.ok()) return Fail(s);
  for (size_t t = 0; t < buf.size(); ++t) {
    if (buf[t] != std::vector<float>(specs[t].count, 0.5f)) {
      std::printf("worker %d WRONG initial parameters\n", rank);
      return 1;
    }
  }
  params = buf;
  for (int64_t step = 1; step <= steps; ++step) {
    for (size_t t = 0; t < params.size(); ++t) Gradient(params[t], rank, step, t, &buf[t]);
    s = SyncAll(comm, *ids, buf);  // buf receives the new parameters
    if (!s.ok()) return Fail(s);
    params = buf;
    std::printf("worker %d step %lld\n", rank, static_cast<long long>(step));
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms * rank));
  }
  uint64_t h = 1469598103934665603ULL;
  for (const auto& p : params) h = Hash(h, p.data(), p.size() * sizeof(float));
  std::printf("worker %d params %016llx\n", rank, static_cast<unsigned long long>(h));
  return 0;
}

int Main(int argc, char** argv) {
  auto config = Config::FromArgs(argc, argv, environ);
  if (!config.ok()) return 2;
  SetLogTag("worker");
  const std::string mode = config->GetString("mode", "average").value();
  const int64_t steps = config->GetInt("steps", 4).value();
  const int64_t slow_ms = config->GetInt("slow_ms", 0).value();
  const std::vector<Spec> specs =
      Specs(config->GetInt("size_divisor", 1).value(), config->GetInt("tensors", 0).value(),
            config->GetInt("name_bytes", 100).value());
  auto comm = Communicator::Create(*config, Deadline::AfterMs(60000));
  if (!comm.ok()) return Fail(comm.status());
  std::printf("worker %d joined, backend %s\n", (*comm)->rank(), (*comm)->backend());
  std::fflush(stdout);
  const int rc =
      mode == "train" ? RunTrain(**comm, steps, slow_ms, specs) : RunAverage(**comm, steps, specs);
  std::fflush(stdout);
  return rc;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
