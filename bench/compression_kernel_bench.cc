// Throughput of the CUDA compression kernels (kernels/compress_kernels.h),
// each beside a device-to-device cudaMemcpy that moves the same bytes,
// measured in the same run on the same GPU.
//
// Bytes are the fewest a kernel must move through device memory: every
// input read once plus every output written once (for top-k: the input
// once and the k pairs). GB/s = those bytes / time; the memcpy copies half
// as many bytes (it reads and writes each), so memcpy_gbps counts the same
// traffic and ratio = gbps / memcpy_gbps is the kernel's fraction of copy
// bandwidth. Times are the median over repetitions of CUDA-event timings,
// after warm-up. A table comes first, then one JSON line per kernel and
// size:
//   {"kernel","elements","gbps","memcpy_gbps","ratio"}
// and last the target for element-wise kernels (ratio >= 0.70).
//
// Usage: compression_kernel_bench [--quick] [--elements=N[,N...]]
//                                 [--reps=R] [--kernels=name,name...]
// Default: 2^20, 25 MiB (6553600) and 2^26 fp32 elements, 30 repetitions.
// --quick: 6553600 and 2^26 elements, 10 repetitions.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/config.h"
#include "common/status.h"
#include "kernels/compress_cpu.h"
#include "kernels/compress_kernels.h"
#include "kernels/compress_types.h"

namespace gradsync::kernels {
namespace {

constexpr double kTargetRatio = 0.70;

struct Flags {
  std::vector<size_t> elements = {size_t{1} << 20, 6553600, size_t{1} << 26};
  int reps = 30;
  std::vector<std::string> kernels;  // Empty: all.
};

struct Row {
  std::string kernel;
  size_t elements = 0;
  double gbps = 0;
  double memcpy_gbps = 0;
  bool elementwise = false;
};

StatusOr<Flags> ParseFlags(int argc, char** argv) {
  GS_ASSIGN_OR_RETURN(Config config, Config::FromArgs(argc, argv, nullptr));
  Flags flags;
  GS_ASSIGN_OR_RETURN(const bool quick, config.GetBool("quick", false));
  if (quick) flags.elements = {6553600, size_t{1} << 26};
  GS_ASSIGN_OR_RETURN(int64_t reps, config.GetInt("reps", quick ? 10 : flags.reps));
  flags.reps = static_cast<int>(std::clamp<int64_t>(reps, 1, 1000000));
  GS_ASSIGN_OR_RETURN(std::string elements, config.GetString("elements", ""));
  if (!elements.empty()) {
    GS_ASSIGN_OR_RETURN(flags.elements, bench::ParseSizes(elements));
  }
  GS_ASSIGN_OR_RETURN(std::string kernels, config.GetString("kernels", ""));
  flags.kernels = bench::Split(kernels);
  GS_RETURN_IF_ERROR(config.CheckKnownFlags());
  return flags;
}

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) bench::Die(std::string(what) + ": " + cudaGetErrorString(err));
}

void Check(const Status& s) {
  if (!s.ok()) bench::Die(s.ToString());
}

template <typename T>
T* DeviceAlloc(size_t count) {
  void* p = nullptr;
  Check(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

template <typename T>
void Upload(T* dst, const std::vector<T>& src) {
  Check(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
}

// Median milliseconds of `launch` over reps (after 3 warm-up runs); each
// sample times `inner` back-to-back launches, so small sizes are not
// dominated by event resolution.
double TimeMs(const std::function<void()>& launch, int reps, int inner, cudaStream_t stream) {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int w = 0; w < 3; ++w) launch();
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    Check(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int i = 0; i < inner; ++i) launch();
    Check(cudaEventRecord(stop, stream), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    samples.push_back(static_cast<double>(ms) / inner);
  }
  Check(cudaGetLastError(), "kernel");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Device buffers for one size, shared by all kernels.
struct Buffers {
  size_t n = 0;
  size_t k = 0;  // Kept by the sparsifiers: 1%.
  float* in = nullptr;
  float* out = nullptr;
  float* residual = nullptr;
  uint16_t* half = nullptr;
  uint8_t* bytes = nullptr;       // Sign bits, QSGD levels.
  float* chunk_floats = nullptr;  // Scales, norms.
  int32_t* topk_idx = nullptr;
  float* topk_values = nullptr;
  uint32_t* randomk_idx = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  BucketSlice* slices = nullptr;
  size_t num_slices = 0;
  char* copy_src = nullptr;  // For the memcpy beside each kernel.
  char* copy_dst = nullptr;
  size_t copy_capacity = 0;
};

// About 100 tensors of mixed sizes (a few large, many small) laid out
// back to back in `in`, as a bucket of n elements.
std::vector<BucketSlice> MakeSlices(float* tensors, size_t n) {
  std::vector<BucketSlice> slices;
  uint64_t offset = 0;
  for (size_t t = 0; offset < n; ++t) {
    size_t size = t % 10 == 0 ? n / 16 : (t % 3 == 0 ? 1000 : n / 400 + 7);
    size = std::min<size_t>(std::max<size_t>(size, 1), n - offset);
    slices.push_back({tensors + offset, offset, size});
    offset += size;
  }
  return slices;
}

Buffers Allocate(size_t n, cudaStream_t stream) {
  Buffers b;
  b.n = n;
  b.k = SparseKeepCount(0.01, n);
  b.in = DeviceAlloc<float>(n);
  b.out = DeviceAlloc<float>(n);
  b.residual = DeviceAlloc<float>(n);
  b.half = DeviceAlloc<uint16_t>(n);
  b.bytes = DeviceAlloc<uint8_t>(n);
  b.chunk_floats = DeviceAlloc<float>(n / 8 + 1);
  b.topk_idx = DeviceAlloc<int32_t>(b.k);
  b.topk_values = DeviceAlloc<float>(b.k);
  b.randomk_idx = DeviceAlloc<uint32_t>(b.k);
  b.workspace_bytes = TopKWorkspaceBytes(n);
  b.workspace = DeviceAlloc<uint8_t>(b.workspace_bytes);
  b.copy_capacity = 8 * n + 64;
  b.copy_src = DeviceAlloc<char>(b.copy_capacity);
  b.copy_dst = DeviceAlloc<char>(b.copy_capacity);

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> host(n);
  for (float& x : host) x = normal(rng);
  Upload(b.in, host);
  for (float& x : host) x = normal(rng);
  Upload(b.residual, host);
  Upload(b.randomk_idx, RandomKIndicesCpu({42, 1, 3}, n, b.k));
  // Valid indices for sparse_decompress, whichever kernels run.
  Check(TopKCuda(b.in, n, b.k, SparseValueFormat::kF32, b.topk_idx, b.topk_values, b.workspace,
                 b.workspace_bytes, stream));
  const std::vector<BucketSlice> slices = MakeSlices(b.in, n);
  Check(ValidateSlices(slices.data(), slices.size(), n));
  b.num_slices = slices.size();
  b.slices = DeviceAlloc<BucketSlice>(slices.size());
  Upload(b.slices, slices);
  Check(cudaMemsetAsync(b.copy_src, 1, b.copy_capacity, stream), "memset");
  Check(cudaStreamSynchronize(stream), "sync");
  return b;
}

void Free(Buffers* b) {
  for (void* p : {static_cast<void*>(b->in), static_cast<void*>(b->out),
                  static_cast<void*>(b->residual), static_cast<void*>(b->half),
                  static_cast<void*>(b->bytes), static_cast<void*>(b->chunk_floats),
                  static_cast<void*>(b->topk_idx), static_cast<void*>(b->topk_values),
                  static_cast<void*>(b->randomk_idx), b->workspace, static_cast<void*>(b->slices),
                  static_cast<void*>(b->copy_src), static_cast<void*>(b->copy_dst)}) {
    cudaFree(p);
  }
}

struct Kernel {
  std::string name;
  bool elementwise;
  double bytes;  // Read plus written.
  std::function<Status()> run;
};

std::vector<Kernel> Kernels(Buffers& b, cudaStream_t s) {
  const size_t n = b.n;
  const size_t k = b.k;
  const double f = 4.0 * n;  // One fp32 pass.
  const double h = 2.0 * n;  // One 16-bit pass.
  const double chunks = static_cast<double>(NumChunks(n, 512));
  const uint64_t key = QsgdKey({42, 1, 3});
  const auto f32 = SparseValueFormat::kF32;
  const auto fp16 = Float16Format::kFp16;
  return {
      {"f32_to_f16", true, f + h, [&b, n, s] { return FloatToHalfCuda(b.in, b.half, n, s); }},
      {"f16_to_f32", true, h + f, [&b, n, s] { return HalfToFloatCuda(b.half, b.out, n, s); }},
      {"f32_to_bf16", true, f + h, [&b, n, s] { return FloatToBf16Cuda(b.in, b.half, n, s); }},
      {"bf16_to_f32", true, h + f, [&b, n, s] { return Bf16ToFloatCuda(b.half, b.out, n, s); }},
      {"pack", true, f + f,
       [&b, n, s] { return PackBucketCuda(b.slices, b.num_slices, n, b.out, s); }},
      {"pack_f16", true, f + h,
       [&b, n, s, fp16] { return PackBucket16Cuda(fp16, b.slices, b.num_slices, n, b.half, s); }},
      {"unpack", true, f + f,
       [&b, n, s] { return UnpackBucketCuda(b.slices, b.num_slices, n, b.out, s); }},
      {"unpack_f16", true, h + f,
       [&b, n, s, fp16] { return UnpackBucket16Cuda(fp16, b.slices, b.num_slices, n, b.half, s); }},
      {"ef_fp16", true, f + f + f + h,
       [&b, n, s, fp16] { return EfFloat16Cuda(fp16, b.in, b.residual, true, n, b.half, s); }},
      {"sign_encode", true, f + n / 8.0 + 4 * chunks,
       [&b, n, s] { return SignEncodeCuda(b.in, n, 512, b.chunk_floats, b.bytes, s); }},
      {"sign_decode", true, n / 8.0 + 4 * chunks + f,
       [&b, n, s] { return SignDecodeCuda(b.chunk_floats, b.bytes, n, 512, b.out, s); }},
      {"ef_sign", true, 3 * f + n / 8.0 + 4 * chunks,
       [&b, n, s] {
         return EfSignCuda(b.in, b.residual, true, n, 512, b.chunk_floats, b.bytes, s);
       }},
      {"qsgd_encode", true, f + n + 4 * chunks,
       [&b, n, s, key] {
         return QsgdEncodeCuda(b.in, n, 512, 127, key, b.chunk_floats,
                               reinterpret_cast<int8_t*>(b.bytes), s);
       }},
      {"qsgd_decode", true, n + 4 * chunks + f,
       [&b, n, s] {
         return QsgdDecodeCuda(b.chunk_floats, reinterpret_cast<int8_t*>(b.bytes), n, 512, 127,
                               b.out, s);
       }},
      {"ef_qsgd", true, 3 * f + n + 4 * chunks,
       [&b, n, s, key] {
         return EfQsgdCuda(b.in, b.residual, true, n, 512, 127, key, b.chunk_floats,
                           reinterpret_cast<int8_t*>(b.bytes), s);
       }},
      {"topk_1pct", false, f + 8.0 * k,
       [&b, n, k, s, f32] {
         return TopKCuda(b.in, n, k, f32, b.topk_idx, b.topk_values, b.workspace, b.workspace_bytes,
                         s);
       }},
      {"ef_topk_1pct", false, 3 * f + 8.0 * k,
       [&b, n, k, s, f32] {
         return EfTopKCuda(b.in, b.residual, true, n, k, f32, b.topk_idx, b.topk_values,
                           b.workspace, b.workspace_bytes, s);
       }},
      {"sparse_decompress_1pct", false, f + 8.0 * k,
       [&b, n, k, s, f32] {
         return SparseDecompressCuda(b.topk_idx, b.topk_values, f32, k, n, b.out, s);
       }},
      {"randomk_gather_1pct", false, 12.0 * k,
       [&b, k, s] { return GatherCuda(b.in, b.randomk_idx, k, b.topk_values, s); }},
      {"randomk_scatter_1pct", false, f + 8.0 * k,
       [&b, n, k, s] { return ScatterCuda(b.topk_values, b.randomk_idx, k, 100.0f, n, b.out, s); }},
      {"ef_randomk_1pct", false, 3 * f + 12.0 * k,
       [&b, n, k, s] {
         return EfRandomKCuda(b.in, b.residual, true, n, b.randomk_idx, k, 100.0f, b.topk_values,
                              s);
       }},
  };
}

bool Wanted(const Flags& flags, const std::string& name) {
  return flags.kernels.empty() ||
         std::find(flags.kernels.begin(), flags.kernels.end(), name) != flags.kernels.end();
}

std::vector<Row> BenchSize(size_t n, const Flags& flags, cudaStream_t stream) {
  Buffers b = Allocate(n, stream);
  // Small sizes: several launches per sample (up to 64).
  const int inner =
      static_cast<int>(std::clamp<size_t>((size_t{1} << 24) / std::max<size_t>(n, 1), 1, 64));
  std::vector<Row> rows;
  for (const Kernel& kernel : Kernels(b, stream)) {
    if (!Wanted(flags, kernel.name)) continue;
    Check(kernel.run());  // Arguments and launch, once.
    const double kernel_ms = TimeMs([&] { Check(kernel.run()); }, flags.reps, inner, stream);
    const size_t copy = std::min(static_cast<size_t>(kernel.bytes / 2), b.copy_capacity);
    const double copy_ms = TimeMs(
        [&] {
          Check(cudaMemcpyAsync(b.copy_dst, b.copy_src, copy, cudaMemcpyDeviceToDevice, stream),
                "cudaMemcpyAsync");
        },
        flags.reps, inner, stream);
    Row r;
    r.kernel = kernel.name;
    r.elements = n;
    r.gbps = kernel.bytes / (kernel_ms * 1e-3) / 1e9;
    r.memcpy_gbps = 2.0 * copy / (copy_ms * 1e-3) / 1e9;
    r.elementwise = kernel.elementwise;
    rows.push_back(r);
  }
  Free(&b);
  return rows;
}

void PrintTable(const std::vector<Row>& rows) {
  std::printf("%-24s %12s %10s %12s %7s\n", "kernel", "elements", "GB/s", "memcpy GB/s", "ratio");
  for (const Row& r : rows) {
    std::printf("%-24s %12zu %10.1f %12.1f %7.2f\n", r.kernel.c_str(), r.elements, r.gbps,
                r.memcpy_gbps, r.gbps / r.memcpy_gbps);
  }
  std::printf("\n");
}

void PrintJson(const std::vector<Row>& rows) {
  for (const Row& r : rows) {
    std::printf(
        "{\"kernel\":\"%s\",\"elements\":%zu,\"gbps\":%.2f,"
        "\"memcpy_gbps\":%.2f,\"ratio\":%.3f}\n",
        r.kernel.c_str(), r.elements, r.gbps, r.memcpy_gbps, r.gbps / r.memcpy_gbps);
  }
}

// Element-wise kernels at the largest size: ratio >= kTargetRatio.
void PrintTargets(const std::vector<Row>& rows, size_t largest) {
  std::printf(
      "\ntarget: element-wise kernels >= %.0f%% of memcpy bandwidth "
      "at %zu elements\n",
      100 * kTargetRatio, largest);
  for (const Row& r : rows) {
    if (!r.elementwise || r.elements != largest) continue;
    const double ratio = r.gbps / r.memcpy_gbps;
    std::printf("  %-22s %5.2f %s\n", r.kernel.c_str(), ratio,
                ratio >= kTargetRatio ? "met" : "NOT met");
  }
}

int Main(int argc, char** argv) {
  StatusOr<Flags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "compression_kernel_bench: %s\n", parsed.status().message().c_str());
    return 2;
  }
  Flags flags = *parsed;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    bench::Die("no usable CUDA device");
  }
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs, L2 %d MiB\n\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  std::vector<Row> all;
  for (size_t n : flags.elements) {
    std::vector<Row> rows = BenchSize(n, flags, stream);
    all.insert(all.end(), rows.begin(), rows.end());
  }
  PrintTable(all);
  PrintJson(all);
  PrintTargets(all, *std::max_element(flags.elements.begin(), flags.elements.end()));
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace gradsync::kernels

int main(int argc, char** argv) { return gradsync::kernels::Main(argc, argv); }
