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
// Usage: device_pipeline_bench [--mb=100] [--tensors=64] [--reps=50]
// Prints a table and one JSON line, and the target (pack + fp16 + NCCL +
// unpack of a 100 MB bucket in under 1 ms of device time).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/nccl_comm.h"
#include "common/status.h"
#include "kernels/compress_cpu.h"
#include "kernels/compress_kernels.h"

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
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("bucket: %.1f MB of fp32 in %d tensors (%zu elements), fp16 on the wire\n\n", mb,
              tensors, elems);
  std::printf("%-34s %10s\n", "stage (median)", "ms");
  std::printf("%-34s %10.3f\n", "pack fp32 -> fp16 (fused)", p);
  std::printf("%-34s %10.3f\n", "ncclAllReduce fp16, world 1 (<=)", n);
  std::printf("%-34s %10.3f\n", "unpack fp16 -> fp32 (fused)", u);
  std::printf("%-34s %10.3f\n", "total device time (<=)", t);
  std::printf("%-34s %10.3f\n", "cudaMemcpy D2D of the fp32 bytes", c);
  std::printf(
      "\n{\"mb\":%.1f,\"tensors\":%d,\"pack_ms\":%.4f,\"nccl_ms\":%.4f,\"unpack_ms\":%.4f,"
      "\"total_ms\":%.4f,\"memcpy_ms\":%.4f,\"total_over_memcpy\":%.2f}\n",
      mb, tensors, p, n, u, t, c, t / c);
  std::printf(
      "\ntarget: pack + fp16 + NCCL + unpack of a 100 MB bucket < 1 ms device time: "
      "%.3f ms %s\n",
      t, t < 1.0 ? "met" : "NOT met");
  for (void* q : owned) cudaFree(q);
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
