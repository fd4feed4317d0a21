// A training process for the CUDA-gradient tests: it is a worker of two jobs
// at once, one whose gradients are host memory and one whose gradients are
// CUDA memory (gradient_device=cuda), with the same settings otherwise. Each
// step it hands the same gradients to both (to the CUDA one from a buffer
// filled on one of two trainer streams behind a 2 ms host callback, so
// that a missing stream dependency would read stale data; a bucket's
// tensors come from both) and checks that every
// synchronised gradient is bit-identical between the two. It also checks
// that host memory is refused by the CUDA job and a stream by the host job,
// and the direct collectives on device memory.
//
//   device_worker --rank=R --num_workers=N --host_scheduler=A
//       --device_scheduler=B [--steps=4] [--f32_only] [SETTING=...]
//
// Every other --name=value is a Communicator setting for both jobs
// (compression, backend, path, ...). --f32_only leaves out the f16 and bf16
// tensors (the parameter-server path averages f32 only). Prints "device path ok" and exits 0
// when every check passed, 1 on a mismatch, 3 on a gradsync error.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/half.h"
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

const Spec kSpecs[] = {{"embedding", 300000, DType::kF32}, {"fc1.weight", 1000003, DType::kF32},
                       {"fc1.bias", 1001, DType::kF32},    {"attn.f16", 5000, DType::kF16},
                       {"norm.bf16", 7777, DType::kBF16},  {"fc2.weight", 262147, DType::kF32},
                       {"head.bias", 1, DType::kF32}};

// Gradient-like values: mostly small with fractional bits, a few large.
float Value(int rank, int step, size_t tensor, size_t i) {
  uint64_t h = (static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(step) << 40) ^
               (static_cast<uint64_t>(tensor) << 32) ^ i;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  const float v = static_cast<float>(static_cast<int64_t>(h % 200001) - 100000) / 65536.0f;
  return (h >> 60) == 0 ? v * 40.0f : v;
}

std::vector<uint8_t> Fill(const Spec& s, size_t tensor, int rank, int step) {
  std::vector<float> f(s.count);
  for (size_t i = 0; i < s.count; ++i) f[i] = Value(rank, step, tensor, i);
  std::vector<uint8_t> bytes(s.count * DTypeSize(s.dtype));
  if (s.dtype == DType::kF32) std::memcpy(bytes.data(), f.data(), bytes.size());
  if (s.dtype == DType::kF16) FloatToHalf(f.data(), bytes.data(), s.count);
  if (s.dtype == DType::kBF16) FloatToBf16(f.data(), bytes.data(), s.count);
  return bytes;
}

bool CudaOk(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::printf("CUDA error in %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

void CUDART_CB Delay(void*) { usleep(2000); }

class Worker {
 public:
  Worker(Communicator* host, Communicator* dev, int rank, bool f32_only)
      : host_(host), dev_(dev), rank_(rank) {
    for (const Spec& s : kSpecs) {
      if (!f32_only || s.dtype == DType::kF32) specs_.push_back(s);
    }
  }

  int Run(int steps) {
    if (!CudaOk(cudaStreamCreate(&stream_), "cudaStreamCreate") ||
        !CudaOk(cudaStreamCreate(&other_stream_), "cudaStreamCreate")) {
      return 1;
    }
    for (size_t t = 0; t < specs_.size(); ++t) {
      const Spec& s = specs_[t];
      auto a = host_->RegisterTensor(s.name, s.count, s.dtype);
      auto b = dev_->RegisterTensor(s.name, s.count, s.dtype);
      if (!a.ok() || !b.ok()) return Error(a.ok() ? b.status() : a.status());
      void* d = nullptr;
      void* p = nullptr;
      const size_t bytes = s.count * DTypeSize(s.dtype);
      if (!CudaOk(cudaMalloc(&d, bytes), "cudaMalloc") ||
          !CudaOk(cudaMallocHost(&p, bytes), "cudaMallocHost")) {
        return 1;
      }
      host_ids_.push_back(*a);
      dev_ids_.push_back(*b);
      device_.push_back(d);
      pinned_.push_back(static_cast<uint8_t*>(p));
    }
    if (int rc = CheckRefusals(); rc != 0) return rc;
    for (int step = 0; step < steps; ++step) {
      if (step == 1) {
        // A micro-step under NoSync on both, then the step itself.
        auto a = host_->StartNoSync();
        auto b = dev_->StartNoSync();
        if (int rc = Step(step * 100 + 50, false, /*no_sync=*/true); rc != 0) return rc;
      }
      if (int rc = Step(step, true); rc != 0) return rc;
      std::printf("worker %d: step %d bit-identical\n", rank_, step);
      std::fflush(stdout);
    }
    if (int rc = CheckDirect(); rc != 0) return rc;
    std::printf("worker %d: device path ok\n", rank_);
    return 0;
  }

 private:
  int Error(const Status& s) {
    std::printf("worker %d: error: %s\n", rank_, s.ToString().c_str());
    return 3;
  }

  // One (micro-)step: backward order, the last tensor first.
  // `no_sync`: a micro-step under NoSync; each CUDA handle must complete
  // only once its tensor was added into the bucket (the trainer's work
  // that produced it is done), and the tensor is overwritten right after.
  int Step(int step, bool compare, bool no_sync = false) {
    std::vector<std::vector<uint8_t>> host(specs_.size());
    for (size_t i = specs_.size(); i-- > 0;) {
      const Spec& s = specs_[i];
      host[i] = Fill(s, i, rank_, step);
      // The CUDA gradient is produced on a trainer's stream, late.
      const cudaStream_t stream = i % 2 == 0 ? stream_ : other_stream_;
      std::memcpy(pinned_[i], host[i].data(), host[i].size());
      if (!CudaOk(cudaLaunchHostFunc(stream, Delay, nullptr), "cudaLaunchHostFunc") ||
          !CudaOk(cudaMemcpyAsync(device_[i], pinned_[i], host[i].size(), cudaMemcpyHostToDevice,
                                  stream),
                  "cudaMemcpyAsync")) {
        return 1;
      }
      cudaEvent_t produced = nullptr;
      if (no_sync && (!CudaOk(cudaEventCreate(&produced), "cudaEventCreate") ||
                      !CudaOk(cudaEventRecord(produced, stream), "cudaEventRecord"))) {
        return 1;
      }
      auto b = dev_->MarkReady(dev_ids_[i], device_[i], nullptr, stream);
      if (!b.ok()) return Error(b.status());
      if (no_sync) {
        Status waited = b->Wait(Deadline::AfterMs(60000));
        if (!waited.ok()) return Error(waited);
        const cudaError_t done = cudaEventQuery(produced);
        cudaEventDestroy(produced);
        if (done != cudaSuccess) {
          std::printf(
              "worker %d: a NoSync handle of %s completed before the gradient was "
              "produced (%s)\n",
              rank_, s.name, cudaGetErrorString(done));
          return 1;
        }
        // The caller's buffer is its own again: garbage now must not reach
        // the sum.
        if (!CudaOk(cudaMemset(device_[i], 0x7F, host[i].size()), "cudaMemset")) return 1;
      }
      auto a = host_->MarkReady(host_ids_[i], host[i].data());
      if (!a.ok()) return Error(a.status());
    }
    const Deadline deadline = Deadline::AfterMs(60000);
    Status s = host_->Synchronize(deadline);
    if (s.ok()) s = dev_->Synchronize(deadline);
    if (!s.ok()) return Error(s);
    if (!CudaOk(cudaStreamSynchronize(stream_), "cudaStreamSynchronize") ||
        !CudaOk(cudaStreamSynchronize(other_stream_), "cudaStreamSynchronize")) {
      return 1;
    }
    if (!compare) return 0;
    for (size_t i = 0; i < specs_.size(); ++i) {
      std::vector<uint8_t> got(host[i].size());
      if (!CudaOk(cudaMemcpy(got.data(), device_[i], got.size(), cudaMemcpyDeviceToHost),
                  "cudaMemcpy")) {
        return 1;
      }
      if (int rc = Compare(specs_[i], host[i], got, "step " + std::to_string(step)); rc != 0) {
        return rc;
      }
    }
    return 0;
  }

  int Compare(const Spec& s, const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
              const std::string& where) {
    if (want == got) return 0;
    const size_t es = DTypeSize(s.dtype);
    for (size_t e = 0; e < s.count; ++e) {
      if (std::memcmp(want.data() + e * es, got.data() + e * es, es) != 0) {
        uint32_t w = 0, g = 0;
        std::memcpy(&w, want.data() + e * es, es);
        std::memcpy(&g, got.data() + e * es, es);
        std::printf(
            "worker %d: MISMATCH %s tensor %s element %zu of %zu: host 0x%08x, "
            "cuda 0x%08x\n",
            rank_, where.c_str(), s.name, e, s.count, w, g);
        break;
      }
    }
    return 1;
  }

  int CheckRefusals() {
    std::vector<uint8_t> host(4 * specs_[0].count);
    auto a = dev_->MarkReady(dev_ids_[0], host.data());
    if (a.ok() || a.status().code() != StatusCode::kInvalidArgument ||
        a.status().message().find("host memory") == std::string::npos) {
      std::printf("worker %d: host memory was not refused: %s\n", rank_,
                  a.ok() ? "OK" : a.status().ToString().c_str());
      return 1;
    }
    auto b = host_->MarkReady(host_ids_[0], host.data(), nullptr, stream_);
    if (b.ok() || b.status().code() != StatusCode::kInvalidArgument) {
      std::printf("worker %d: a stream on host gradients was not refused\n", rank_);
      return 1;
    }
    std::printf("worker %d: refused: %s\n", rank_, a.status().message().c_str());
    return 0;
  }

  // AllReduce and Broadcast on device memory.
  int CheckDirect() {
    const int n = dev_->world_size();
    std::vector<float> v(1000), got(1000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rank_ * 1000 + i);
    void* mem = nullptr;
    if (!CudaOk(cudaMalloc(&mem, 4 * v.size()), "cudaMalloc")) return 1;
    auto* d = static_cast<float*>(mem);
    if (!CudaOk(cudaMemcpy(d, v.data(), 4 * v.size(), cudaMemcpyHostToDevice), "cudaMemcpy")) {
      return 1;
    }
    Status s =
        dev_->AllReduce(d, v.size(), DType::kF32, client::ReduceOp::kSum, Deadline::AfterMs(30000));
    if (!s.ok()) return Error(s);
    cudaMemcpy(got.data(), d, 4 * v.size(), cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < v.size(); ++i) {
      const float want = static_cast<float>(1000 * n * (n - 1) / 2 + n * static_cast<int>(i));
      if (got[i] != want) {
        std::printf("worker %d: device AllReduce element %zu: %g, want %g\n", rank_, i, got[i],
                    want);
        return 1;
      }
    }
    if (!CudaOk(cudaMemcpy(d, v.data(), 4 * v.size(), cudaMemcpyHostToDevice), "cudaMemcpy")) {
      return 1;
    }
    s = dev_->Broadcast(d, v.size(), DType::kF32, n - 1, Deadline::AfterMs(30000));
    if (!s.ok()) return Error(s);
    cudaMemcpy(got.data(), d, 4 * v.size(), cudaMemcpyDeviceToHost);
    if (got[7] != static_cast<float>((n - 1) * 1000 + 7)) {
      std::printf("worker %d: device Broadcast: %g\n", rank_, got[7]);
      return 1;
    }
    cudaFree(d);
    std::printf("worker %d: device collectives ok\n", rank_);
    return 0;
  }

  Communicator* host_;
  Communicator* dev_;
  const int rank_;
  std::vector<Spec> specs_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t other_stream_ = nullptr;
  std::vector<TensorId> host_ids_, dev_ids_;
  std::vector<void*> device_;
  std::vector<uint8_t*> pinned_;
};

int Main(int argc, char** argv) {
  std::map<std::string, std::string> own;
  std::vector<std::string> shared;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = eq == std::string::npos ? arg : arg.substr(0, eq);
    if (key == "--host_scheduler" || key == "--device_scheduler" || key == "--steps" ||
        key == "--f32_only") {
      own[key] = arg.substr(eq + 1);
    } else {
      shared.push_back(arg);
    }
  }
  auto make = [&](const std::string& scheduler,
                  bool cuda) -> StatusOr<std::unique_ptr<Communicator>> {
    std::vector<std::string> args = shared;
    args.push_back("--scheduler=" + scheduler);
    if (cuda) args.push_back("--gradient_device=cuda");
    std::vector<const char*> ptrs = {"device_worker"};
    for (const std::string& a : args) ptrs.push_back(a.c_str());
    GS_ASSIGN_OR_RETURN(Config config,
                        Config::FromArgs(static_cast<int>(ptrs.size()), ptrs.data(), environ));
    return Communicator::Create(config, Deadline::AfterMs(60000));
  };
  auto host = make(own["--host_scheduler"], false);
  if (!host.ok()) {
    std::printf("error: host job: %s\n", host.status().ToString().c_str());
    return 3;
  }
  auto dev = make(own["--device_scheduler"], true);
  if (!dev.ok()) {
    std::printf("error: cuda job: %s\n", dev.status().ToString().c_str());
    return 3;
  }
  const int rank = (*dev)->rank();
  std::printf("worker %d: backend %s, %d workers\n", rank, (*dev)->backend(), (*dev)->world_size());
  const int steps = own.count("--steps") ? std::atoi(own["--steps"].c_str()) : 4;
  Worker worker(host->get(), dev->get(), rank, own.count("--f32_only") > 0);
  return worker.Run(steps);
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  const int rc = gradsync::Main(argc, argv);
  std::fflush(stdout);
  return rc;
}
