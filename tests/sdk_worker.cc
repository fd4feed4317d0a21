// A training process for the all-reduce tests: links the client SDK
// (Communicator), registers tensors of mixed sizes and dtypes, and checks
// every synchronised gradient against the exact expected average. Prints one
// line per milestone; exits 0 when all checks pass, 3 when the Communicator
// reported an error (printed as "error after N ms: ..."), 1 on a wrong result.
//
//   sdk_worker --scheduler=host:port --num_workers=4
//       [--mode=train|mismatch|stall|protect|direct]
//       [--steps=5] [--victim=3] [--victim_step=2] [--bucket_bytes=...]
//       [--go_file=PATH] [--op_timeout_ms=...]
//
// mode=train: steps with exact checks, a broadcast, and gradient accumulation
// (NoSync) compared with the large-batch gradient.
// mode=mismatch: rank `victim` registers one tensor with a different size.
// mode=stall: after `victim_step` steps rank `victim` stops taking part (it
// sleeps; the test may kill it) and the others must fail naming it.
// mode=protect: after one direct all-reduce, rank `victim` stops itself
// (SIGSTOP; the test continues it); the others run a direct all-reduce of
// 64 MiB that must fail, then make its buffer inaccessible (PROT_NONE) and
// live on for 5 s: if anything still read the caller's buffer once the call
// had returned, the process would die of SIGSEGV.
// mode=direct: once `go_file` exists (at once without one), `steps` direct
// all-reduces of 256 KiB with a deadline of op_timeout_ms, each checked and
// reported as "allreduce K took N ms: <status>"; rank `victim` stops taking
// part (it sleeps) at all-reduce `victim_step`.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/half.h"
#include "common/logging.h"
#include "gradsync/communicator.h"

extern char** environ;

namespace gradsync {
namespace {

using client::Communicator;
using client::TensorId;

struct Spec {
  const char* name;
  size_t count;
  DType dtype;
};

// Mixed sizes and dtypes; with 2 MiB buckets they span several buckets.
const Spec kSpecs[] = {{"embedding", 300000, DType::kF32}, {"fc1.weight", 1000003, DType::kF32},
                       {"fc1.bias", 1001, DType::kF32},    {"attn.f16", 5000, DType::kF16},
                       {"norm.bf16", 7777, DType::kBF16},  {"head.bias", 1, DType::kF32}};

float Value(int rank, int64_t step, size_t tensor, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + step * 5 + tensor * 3) % 17) - 8);
}

std::vector<uint8_t> Fill(const Spec& s, size_t tensor, int rank, int64_t step) {
  std::vector<float> f(s.count);
  for (size_t i = 0; i < s.count; ++i) f[i] = Value(rank, step, tensor, i);
  std::vector<uint8_t> bytes(s.count * DTypeSize(s.dtype));
  if (s.dtype == DType::kF32) std::memcpy(bytes.data(), f.data(), bytes.size());
  if (s.dtype == DType::kF16) FloatToHalf(f.data(), bytes.data(), s.count);
  if (s.dtype == DType::kBF16) FloatToBf16(f.data(), bytes.data(), s.count);
  return bytes;
}

// The exact average over `world` ranks (sums of small integers divided by a
// power of two are exact in every dtype used here).
std::vector<uint8_t> Expected(const Spec& s, size_t tensor, int world, int64_t step) {
  std::vector<float> sum(s.count, 0.0f);
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < s.count; ++i) sum[i] += Value(r, step, tensor, i);
  }
  for (float& v : sum) v /= static_cast<float>(world);
  std::vector<uint8_t> bytes(s.count * DTypeSize(s.dtype));
  if (s.dtype == DType::kF32) std::memcpy(bytes.data(), sum.data(), bytes.size());
  if (s.dtype == DType::kF16) FloatToHalf(sum.data(), bytes.data(), s.count);
  if (s.dtype == DType::kBF16) FloatToBf16(sum.data(), bytes.data(), s.count);
  return bytes;
}

void Say(const char* fmt, int rank, const std::string& what) {
  std::printf(fmt, rank, what.c_str());
  std::printf("\n");
  std::fflush(stdout);
}

class Worker {
 public:
  Worker(Communicator* comm, const Config& config) : comm_(comm) {
    mode_ = config.GetString("mode", "train").value();
    steps_ = config.GetInt("steps", 5).value();
    victim_ = static_cast<int>(config.GetInt("victim", 3).value());
    victim_step_ = config.GetInt("victim_step", 2).value();
    go_file_ = config.GetString("go_file", "").value();
    op_timeout_ms_ = config.GetInt("op_timeout_ms", 60000).value();
  }

  int Run() {
    start_ = std::chrono::steady_clock::now();
    if (mode_ == "protect") return Protect();
    if (mode_ == "direct") return Direct();
    for (size_t t = 0; t < std::size(kSpecs); ++t) {
      Spec s = kSpecs[t];
      if (mode_ == "mismatch" && comm_->rank() == victim_ && t == 2) s.count += 1;
      auto id = comm_->RegisterTensor(s.name, s.count, s.dtype);
      if (!id.ok()) return Fail(id.status());
      ids_.push_back(*id);
      specs_.push_back(s);
    }
    for (int64_t step = 0; step < steps_; ++step) {
      if (mode_ == "stall" && comm_->rank() == victim_ && step == victim_step_) {
        Say("worker %d %s", comm_->rank(), "stops contributing");
        std::this_thread::sleep_for(std::chrono::seconds(120));
        return 0;
      }
      start_ = std::chrono::steady_clock::now();
      if (int rc = Step(step); rc != 0) return rc;
      Say("worker %d %s", comm_->rank(), "finished step " + std::to_string(step));
    }
    if (mode_ != "train") return 0;
    if (int rc = CheckBroadcast(); rc != 0) return rc;
    return CheckAccumulation();
  }

 private:
  int Direct() {
    for (Deadline d = Deadline::AfterMs(60000); !go_file_.empty() && !d.Expired();) {
      if (access(go_file_.c_str(), F_OK) == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const int world = comm_->world_size();
    std::vector<float> data(size_t{64} << 10);  // 256 KiB
    for (int64_t k = 0; k < steps_; ++k) {
      if (comm_->rank() == victim_ && k == victim_step_) {
        Say("worker %d %s", comm_->rank(), "stops contributing");
        std::this_thread::sleep_for(std::chrono::seconds(120));
        return 0;
      }
      for (size_t i = 0; i < data.size(); ++i) {
        data[i] = static_cast<float>(comm_->rank() + k + static_cast<int64_t>(i % 3));
      }
      start_ = std::chrono::steady_clock::now();
      Status s = comm_->AllReduce(data.data(), data.size(), DType::kF32, client::ReduceOp::kSum,
                                  Deadline::AfterMs(op_timeout_ms_));
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start_)
                          .count();
      Say("worker %d %s", comm_->rank(),
          "allreduce " + std::to_string(k) + " took " + std::to_string(ms) +
              " ms: " + s.ToString());
      if (!s.ok()) return Fail(s);
      for (size_t i = 0; i < data.size(); ++i) {
        const int64_t sum = world * (world - 1) / 2 + world * (k + static_cast<int64_t>(i % 3));
        if (data[i] != static_cast<float>(sum)) {
          Say("worker %d %s", comm_->rank(), "WRONG direct all-reduce result");
          return 1;
        }
      }
    }
    return 0;
  }

  int Protect() {
    const size_t count = size_t{16} << 20;
    void* mem = mmap(nullptr, count * sizeof(float), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return 1;
    auto* data = static_cast<float*>(mem);
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(i % 7);
    float one = 1;
    Status s =
        comm_->AllReduce(&one, 1, DType::kF32, client::ReduceOp::kSum, Deadline::AfterMs(30000));
    if (s.ok()) s = comm_->Barrier(Deadline::AfterMs(30000));  // every rank is past the first
    if (!s.ok()) return Fail(s);
    if (comm_->rank() == victim_) {
      Say("worker %d %s", comm_->rank(), "stops itself");
      raise(SIGSTOP);
      std::this_thread::sleep_for(std::chrono::seconds(10));
      return 0;
    }
    // The victim has stopped; the scheduler names it dead about a second later.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    s = comm_->AllReduce(data, count, DType::kF32, client::ReduceOp::kSum, Deadline::AfterMs(3000));
    if (s.ok()) {
      Say("worker %d %s", comm_->rank(), "WRONG: the all-reduce succeeded without the victim");
      return 1;
    }
    if (mprotect(mem, count * sizeof(float), PROT_NONE) != 0) return 1;
    Say("worker %d %s", comm_->rank(), "buffer protected after: " + s.ToString());
    std::this_thread::sleep_for(std::chrono::seconds(5));
    Say("worker %d %s", comm_->rank(), "lived on");
    return 0;
  }

  int Fail(const Status& s) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start_)
                        .count();
    std::printf("worker %d error after %lld ms: %s\n", comm_ ? comm_->rank() : -1,
                static_cast<long long>(ms), s.ToString().c_str());
    std::fflush(stdout);
    return 3;
  }

  // Marks every tensor ready, half of them from a second thread, in the
  // order a backward pass produces them (last registered first).
  int Step(int64_t step) {
    const int rank = comm_->rank();
    std::vector<std::vector<uint8_t>> grads;
    for (size_t t = 0; t < ids_.size(); ++t) grads.push_back(Fill(specs_[t], t, rank, step));
    std::atomic<int> callbacks{0};
    Status other;
    std::thread helper([&] {
      for (size_t t = ids_.size(); t-- > 0;) {
        if (t % 2 == 1) continue;
        auto h = comm_->MarkReady(ids_[t], grads[t].data(), [&](const Status&) { ++callbacks; });
        if (!h.ok()) other = h.status();
      }
    });
    Status mine;
    for (size_t t = ids_.size(); t-- > 0;) {
      if (t % 2 == 0) continue;
      auto h = comm_->MarkReady(ids_[t], grads[t].data(), [&](const Status&) { ++callbacks; });
      if (!h.ok()) mine = h.status();
    }
    helper.join();
    if (!mine.ok()) return Fail(mine);
    if (!other.ok()) return Fail(other);
    Status s = comm_->Synchronize(Deadline::AfterMs(60000));
    if (!s.ok()) return Fail(s);
    if (callbacks != static_cast<int>(ids_.size())) {
      Say("worker %d %s", rank, "WRONG: not every callback ran");
      return 1;
    }
    for (size_t t = 0; t < ids_.size(); ++t) {
      if (grads[t] != Expected(kSpecs[t], t, comm_->world_size(), step)) {
        Say("worker %d %s", rank, std::string("WRONG result for ") + kSpecs[t].name);
        return 1;
      }
    }
    return 0;
  }

  int CheckBroadcast() {
    std::vector<float> params(12345);
    for (size_t i = 0; i < params.size(); ++i) {
      params[i] = comm_->rank() == 0 ? static_cast<float>(i) * 0.5f : -1.0f;
    }
    Status s =
        comm_->Broadcast(params.data(), params.size(), DType::kF32, 0, Deadline::AfterMs(30000));
    if (!s.ok()) return Fail(s);
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i] != static_cast<float>(i) * 0.5f) {
        Say("worker %d %s", comm_->rank(), "WRONG broadcast");
        return 1;
      }
    }
    Say("worker %d %s", comm_->rank(), "broadcast ok");
    return 0;
  }

  int CheckAccumulation();

  Communicator* comm_;
  std::string mode_;
  int64_t steps_ = 0;
  int victim_ = 0;
  int64_t victim_step_ = 0;
  std::string go_file_;
  int64_t op_timeout_ms_ = 0;
  std::vector<TensorId> ids_;
  std::vector<Spec> specs_;  // as registered
  std::chrono::steady_clock::time_point start_;
};

// Linear regression y = w.x: the gradient of the mean squared error over a
// batch. Every rank can compute every rank's samples (seeded), so each
// checks the accumulated, synchronised gradient against the gradient over
// the whole global batch computed locally.
constexpr int kDim = 16, kBatch = 32, kMicro = 4;

void Sample(int rank, int i, float* x, float* y) {
  for (int d = 0; d < kDim; ++d) x[d] = std::sin(0.37f * (rank * kBatch + i) + 1.3f * d);
  *y = std::cos(0.11f * (rank * kBatch + i));
}

// d/dw of (1/count) sum (w.x - y)^2 over samples [begin, end) of `rank`.
void Gradient(const std::vector<float>& w, int rank, int begin, int end, float scale,
              std::vector<float>* g) {
  float x[kDim], y;
  for (int i = begin; i < end; ++i) {
    Sample(rank, i, x, &y);
    float err = -y;
    for (int d = 0; d < kDim; ++d) err += w[d] * x[d];
    for (int d = 0; d < kDim; ++d) (*g)[d] += scale * 2.0f * err * x[d] / (end - begin);
  }
}

int Worker::CheckAccumulation() {
  // A second communicator is not needed: a fresh tensor set would require
  // re-registration, so the gradient rides in "fc1.bias" (first kDim values).
  std::vector<float> w(kDim);
  for (int d = 0; d < kDim; ++d) w[d] = 0.1f * d - 0.5f;
  const int per_micro = kBatch / kMicro;
  std::vector<std::vector<uint8_t>> grads;
  for (size_t t = 0; t < ids_.size(); ++t) grads.push_back(Fill(specs_[t], t, 0, 0));
  for (int m = 0; m < kMicro; ++m) {
    std::vector<float> g(kSpecs[2].count, 0.0f);
    Gradient(w, comm_->rank(), m * per_micro, (m + 1) * per_micro, 1.0f / kMicro, &g);
    std::memcpy(grads[2].data(), g.data(), g.size() * 4);
    auto scope = m + 1 < kMicro ? std::optional(comm_->StartNoSync()) : std::nullopt;
    for (size_t t = ids_.size(); t-- > 0;) {
      auto h = comm_->MarkReady(ids_[t], grads[t].data());
      if (!h.ok()) return Fail(h.status());
    }
    Status s = comm_->Synchronize(Deadline::AfterMs(60000));
    if (!s.ok()) return Fail(s);
  }
  std::vector<float> want(kDim, 0.0f);
  for (int r = 0; r < comm_->world_size(); ++r) {
    Gradient(w, r, 0, kBatch, 1.0f / comm_->world_size(), &want);
  }
  std::vector<float> got(kDim);
  std::memcpy(got.data(), grads[2].data(), kDim * 4);
  for (int d = 0; d < kDim; ++d) {
    if (std::fabs(got[d] - want[d]) > 1e-5f * (1.0f + std::fabs(want[d]))) {
      std::printf("worker %d WRONG accumulated gradient [%d]: %g, large batch %g\n", comm_->rank(),
                  d, got[d], want[d]);
      return 1;
    }
  }
  Say("worker %d %s", comm_->rank(), "accumulation ok");
  return 0;
}

int Main(int argc, char** argv) {
  auto config = Config::FromArgs(argc, argv, environ);
  if (!config.ok()) return 2;
  SetLogTag("worker");
  auto comm = Communicator::Create(*config, Deadline::AfterMs(60000));
  if (!comm.ok()) {
    std::printf("create failed: %s\n", comm.status().ToString().c_str());
    return 3;
  }
  Say("worker %d %s", (*comm)->rank(), std::string("joined, backend ") + (*comm)->backend());
  Worker worker(comm->get(), *config);
  return worker.Run();
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
