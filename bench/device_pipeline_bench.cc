// One bucket of CUDA gradients through the device path of the NCCL backend:
// the fused fp16 pack of many tensors into one bucket, the NCCL all-reduce
// of the fp16 bucket in place (world size 1: one GPU admits one rank), and
// the fused unpack back into the tensors, beside a device-to-device
// cudaMemcpy of the same fp32 bytes, in the same run.
//
// Pack and unpack are timed with CUDA events around their kernels. The NCCL
// call blocks until its stream is idle (client/nccl_comm.h), so its events
// also hold the host's wake-up after the kernel: an upper bound on its device
// time. Medians over repetitions after warm-up.
//
// Then the same tensors through the SDK as a trainer drives it: an embedded
// scheduler and one worker (gradient_device=cuda, backend=nccl,
// compression=fp16, one bucket holding every tensor); each step marks every
// tensor ready on a stream and synchronises, timed on the host.
//
// Usage: device_pipeline_bench [--mb=100] [--tensors=64] [--reps=50]
// Prints a table and one JSON line, and the targets (pack + fp16 + NCCL +
// unpack of a 100 MB bucket in under 1 ms of device time; the SDK's step
// within 2x of that fused pipeline).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/nccl_comm.h"
#include "common/config.h"
#include "common/status.h"
#include "gradsync/communicator.h"
#include "kernels/compress_cpu.h"
#include "kernels/compress_kernels.h"
#include "scheduler/embedded_scheduler.h"

namespace gradsync {
namespace {

#define CHECK_CUDA(call)                                                                           \
  do {                                                                                             \
    cudaError_t err_ = (call);                                                                     \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

void CheckOk(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

float Ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

// Median host time (ms) of one SDK step over `tensors`: MarkReady of each on
// `stream`, then Synchronize (which returns with the averaged gradients in
// place).
double SdkStepMs(const std::vector<kernels::BucketSlice>& tensors, size_t elems, int reps,
                 cudaStream_t stream) {
  auto config = [](const std::vector<std::string>& args) {
    std::vector<const char*> argv = {"device_pipeline_bench"};
    for (const std::string& a : args) argv.push_back(a.c_str());
    auto c = Config::FromArgs(static_cast<int>(argv.size()), argv.data(), nullptr);
    CheckOk(c.status(), "settings");
    return *c;
  };
  auto scheduler = server::EmbeddedScheduler::Start(config({"--port=0", "--num_workers=1"}));
  CheckOk(scheduler.status(), "EmbeddedScheduler::Start");
  const std::string bucket = std::to_string(elems * sizeof(float));
  auto comm = client::Communicator::Create(
      config({"--scheduler=127.0.0.1:" + std::to_string((*scheduler)->port()), "--rank=0",
              "--num_workers=1", "--host=127.0.0.1", "--metrics_base_port=0",
              "--gradient_device=cuda", "--cuda_device=0", "--backend=nccl", "--compression=fp16",
              "--bucket_bytes=" + bucket, "--first_bucket_bytes=" + bucket}),
      Deadline::AfterMs(60000));
  CheckOk(comm.status(), "Communicator::Create");
  std::vector<client::TensorId> ids;
  for (size_t t = 0; t < tensors.size(); ++t) {
    auto id = (*comm)->RegisterTensor("t" + std::to_string(t), tensors[t].count, DType::kF32);
    CheckOk(id.status(), "RegisterTensor");
    ids.push_back(*id);
  }
  std::vector<double> steps;
  for (int rep = 0; rep < reps + 5; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t t = 0; t < tensors.size(); ++t) {
      CheckOk((*comm)->MarkReady(ids[t], tensors[t].tensor, nullptr, stream).status(), "MarkReady");
    }
    CheckOk((*comm)->Synchronize(Deadline::AfterMs(30000)), "Synchronize");
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (rep >= 5) steps.push_back(ms);
  }
  (*comm)->Shutdown();
  comm->reset();
  CheckOk((*scheduler)->Stop(Deadline::AfterMs(10000)), "the job");
  return Median(steps);
}

int Main(int argc, char** argv) {
  double mb = 100;
  int tensors = 64, reps = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--mb=", 0) == 0)
      mb = std::atof(a.c_str() + 5);
    else if (a.rfind("--tensors=", 0) == 0)
      tensors = std::atoi(a.c_str() + 10);
    else if (a.rfind("--reps=", 0) == 0)
      reps = std::atoi(a.c_str() + 7);
    else {
      std::fprintf(stderr, "usage: device_pipeline_bench [--mb=100] [--tensors=64] [--reps=50]\n");
      return 2;
    }
  }
  CHECK_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const size_t elems = static_cast<size_t>(mb * 1e6) / sizeof(float);

  // Tensors of unequal sizes (as layers are), summing to `elems`.
  std::vector<kernels::BucketSlice> slices;
  std::vector<void*> owned;
  size_t offset = 0;
  for (int t = 0; t < tensors; ++t) {
    const size_t left = elems - offset;
    const size_t count =
        t == tensors - 1 ? left : std::min(left, elems * (1 + t % 3) / (2 * tensors));
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(float)));
    CHECK_CUDA(cudaMemset(p, 0x3c, count * sizeof(float)));
    owned.push_back(p);
    slices.push_back({static_cast<float*>(p), offset, count});
    offset += count;
  }
  CheckOk(kernels::ValidateSlices(slices.data(), slices.size(), elems), "slices");
  void* dslices = nullptr;
  CHECK_CUDA(cudaMalloc(&dslices, slices.size() * sizeof(kernels::BucketSlice)));
  CHECK_CUDA(cudaMemcpy(dslices, slices.data(), slices.size() * sizeof(kernels::BucketSlice),
                        cudaMemcpyHostToDevice));
  void* bucket16 = nullptr;
  void* copy_src = nullptr;
  void* copy_dst = nullptr;
  CHECK_CUDA(cudaMalloc(&bucket16, elems * 2));
  CHECK_CUDA(cudaMalloc(&copy_src, elems * 4));
  CHECK_CUDA(cudaMalloc(&copy_dst, elems * 4));

  auto id = kernels::NcclComm::MakeUniqueId();
  CheckOk(id.status(), "ncclGetUniqueId");
  auto comm = kernels::NcclComm::Create(*id, 0, 1, 0, Deadline::AfterMs(60000));
  CheckOk(comm.status(), "NcclComm::Create");
  cudaStream_t stream = (*comm)->stream();
  const auto* s = static_cast<const kernels::BucketSlice*>(dslices);

  cudaEvent_t e[5];
  for (auto& ev : e) CHECK_CUDA(cudaEventCreate(&ev));
  std::vector<double> pack, nccl, unpack, total, copy;
  for (int rep = 0; rep < reps + 5; ++rep) {
    CHECK_CUDA(cudaEventRecord(e[0], stream));
    CheckOk(kernels::PackBucket16Cuda(kernels::Float16Format::kFp16, s, slices.size(), elems,
                                      static_cast<uint16_t*>(bucket16), stream),
            "PackBucket16Cuda");
    CHECK_CUDA(cudaEventRecord(e[1], stream));
    CheckOk((*comm)->AllReduce(bucket16, bucket16, elems, DType::kF16, kernels::NcclReduceOp::kSum,
                               Deadline::AfterMs(30000)),
            "ncclAllReduce");
    CHECK_CUDA(cudaEventRecord(e[2], stream));
    CheckOk(kernels::UnpackBucket16Cuda(kernels::Float16Format::kFp16, s, slices.size(), elems,
                                        static_cast<const uint16_t*>(bucket16), stream),
            "UnpackBucket16Cuda");
    CHECK_CUDA(cudaEventRecord(e[3], stream));
    CHECK_CUDA(cudaMemcpyAsync(copy_dst, copy_src, elems * 4, cudaMemcpyDeviceToDevice, stream));
    CHECK_CUDA(cudaEventRecord(e[4], stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (rep < 5) continue;
    pack.push_back(Ms(e[0], e[1]));
    nccl.push_back(Ms(e[1], e[2]));
    unpack.push_back(Ms(e[2], e[3]));
    total.push_back(Ms(e[0], e[1]) + Ms(e[1], e[2]) + Ms(e[2], e[3]));
    copy.push_back(Ms(e[3], e[4]));
  }
  const double p = Median(pack), n = Median(nccl), u = Median(unpack), t = Median(total),
               c = Median(copy);
  comm->reset();  // the SDK makes its own
  cudaStream_t trainer = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&trainer, cudaStreamNonBlocking));
  const double sdk = SdkStepMs(slices, elems, reps, trainer);
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("bucket: %.1f MB of fp32 in %d tensors (%zu elements), fp16 on the wire\n\n", mb,
              tensors, elems);
  std::printf("%-34s %10s\n", "stage (median)", "ms");
  std::printf("%-34s %10.3f\n", "pack fp32 -> fp16 (fused)", p);
  std::printf("%-34s %10.3f\n", "ncclAllReduce fp16, world 1 (<=)", n);
  std::printf("%-34s %10.3f\n", "unpack fp16 -> fp32 (fused)", u);
  std::printf("%-34s %10.3f\n", "total device time (<=)", t);
  std::printf("%-34s %10.3f\n", "cudaMemcpy D2D of the fp32 bytes", c);
  std::printf("%-34s %10.3f\n", "SDK step (host time)", sdk);
  std::printf(
      "\n{\"mb\":%.1f,\"tensors\":%d,\"pack_ms\":%.4f,\"nccl_ms\":%.4f,\"unpack_ms\":%.4f,"
      "\"total_ms\":%.4f,\"memcpy_ms\":%.4f,\"total_over_memcpy\":%.2f,\"sdk_step_ms\":%.4f,"
      "\"sdk_over_fused\":%.2f}\n",
      mb, tensors, p, n, u, t, c, t / c, sdk, sdk / t);
  std::printf(
      "\ntarget: pack + fp16 + NCCL + unpack of a 100 MB bucket < 1 ms device time: "
      "%.3f ms %s\n",
      t, t < 1.0 ? "met" : "NOT met");
  std::printf("target: the SDK's step <= 2x the fused pipeline: %.2fx %s\n", sdk / t,
              sdk <= 2 * t ? "met" : "NOT met");
  for (void* q : owned) cudaFree(q);
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
