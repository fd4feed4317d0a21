// DeviceGradients on CUDA (device_gradients.h).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "client/device_gradients.h"
#include "compression/registry.h"
#include "kernels/compress_cpu.h"
#include "kernels/compress_kernels.h"
#include "kernels/reduce_cuda.h"

namespace gradsync::client {
namespace {

Status Cuda(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status();
  cudaGetLastError();  // clears a non-sticky error
  return InternalError(what + " failed: " + cudaGetErrorString(err));
}

// Device or pinned host memory, grown on demand, never shrunk.
template <cudaError_t (*Alloc)(void**, size_t), cudaError_t (*Free)(void*)>
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (ptr_ != nullptr) Free(ptr_);
  }
  Status Reserve(size_t bytes, const char* what) {
    if (bytes <= bytes_) return Status();
    if (ptr_ != nullptr) Free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    GS_RETURN_IF_ERROR(Cuda(Alloc(&ptr_, bytes), std::string("allocating ") +
                                                   std::to_string(bytes) + " bytes for " + what));
    bytes_ = bytes;
    return Status();
  }
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

cudaError_t DeviceAlloc(void** p, size_t n) { return cudaMalloc(p, n); }
cudaError_t PinnedAlloc(void** p, size_t n) { return cudaMallocHost(p, n); }
using DeviceBuffer = Buffer<DeviceAlloc, cudaFree>;
using PinnedBuffer = Buffer<PinnedAlloc, cudaFreeHost>;

// What a compressor spec becomes on the device.
struct Codec {
  enum Kind { kNone, kHalf, kTopK, kHost } kind = kNone;
  kernels::Float16Format half = kernels::Float16Format::kFp16;
  kernels::SparseValueFormat values = kernels::SparseValueFormat::kF32;
  double ratio = 0;
  bool ef = false;
};

StatusOr<Codec> CodecOf(const std::string& spec) {
  Codec c;
  if (spec == "none") return c;
  GS_ASSIGN_OR_RETURN(compression::CompressorSpec parsed, compression::ParseCompressorSpec(spec));
  c.ef = parsed.options.error_feedback;
  c.ratio = parsed.options.ratio;
  if (parsed.name == "fp16" || parsed.name == "bf16") {
    c.kind = Codec::kHalf;
    c.half = parsed.name == "fp16" ? kernels::Float16Format::kFp16 : kernels::Float16Format::kBf16;
  } else if (parsed.name == "topk" || parsed.name == "topk_fp16") {
    c.kind = Codec::kTopK;
    c.values = parsed.name == "topk" ? kernels::SparseValueFormat::kF32
                                     : kernels::SparseValueFormat::kF16;
  } else {
    c.kind = Codec::kHost;
  }
  return c;
}

// Top-k wire bytes of one rank, as the CPU decompressor checks them: k
// indices strictly ascending and below n.
Status CheckSparse(const uint8_t* wire, size_t k, size_t n, int rank) {
  int64_t last = -1;
  for (size_t j = 0; j < k; ++j) {
    int32_t index;
    std::memcpy(&index, wire + 4 * j, 4);
    if (index <= last || static_cast<size_t>(index) >= n) {
      return InvalidArgumentError("top-k bytes of rank " + std::to_string(rank) + ": index " +
                                  std::to_string(index) + " at " + std::to_string(j) +
                                  " is out of range or not ascending (n = " + std::to_string(n) +
                                  ")");
    }
    last = index;
  }
  return Status();
}

class CudaGradients : public DeviceGradients {
 public:
  explicit CudaGradients(int device) : device_(device) {}
  ~CudaGradients() override {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (event_ != nullptr) cudaEventDestroy(event_);
    buckets_.clear();
    state_.clear();
    cudaSetDevice(previous);
  }

  Status Init() {
    int count = 0;
    GS_RETURN_IF_ERROR(Cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
    if (device_ < 0 || device_ >= count) {
      return InvalidArgumentError("cuda_device " + std::to_string(device_) + " does not exist (" +
                                  std::to_string(count) + " CUDA devices)");
    }
    GS_RETURN_IF_ERROR(Select());
    GS_RETURN_IF_ERROR(
        Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    return Cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }

  int device() const override { return device_; }

  Status CheckPointer(const void* data, const std::string& what) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, data) != cudaSuccess) cudaGetLastError();
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
      return InvalidArgumentError(what + " is host memory; this communicator takes CUDA tensors "
                                  "(gradient_device=cuda) on cuda:" + std::to_string(device_));
    }
    if (a.device != device_) {
      return InvalidArgumentError(what + " is on cuda:" + std::to_string(a.device) +
                                  "; this communicator's gradients are on cuda:" +
                                  std::to_string(device_) + " (cuda_device)");
    }
    return Status();
  }

  Status Allocate(const std::vector<size_t>& bucket_bytes) override {
    GS_RETURN_IF_ERROR(Select());
    buckets_.clear();
    state_.clear();
    for (size_t i = 0; i < bucket_bytes.size(); ++i) {
      buckets_.push_back(std::make_unique<DeviceBuffer>());
      GS_RETURN_IF_ERROR(buckets_.back()->Reserve(bucket_bytes[i], "a gradient bucket"));
    }
    for (size_t i = 0; i < bucket_bytes.size(); ++i) state_.push_back(std::make_unique<State>());
    return Status();
  }

  Status Stage(int bucket, size_t offset, const void* data, size_t count, DType dtype, bool add,
               void* stream) override {
    std::lock_guard<std::mutex> lock(stage_mu_);
    int previous = 0;
    GS_RETURN_IF_ERROR(Cuda(cudaGetDevice(&previous), "cudaGetDevice"));
    GS_RETURN_IF_ERROR(Select());
    Status s = StageOn(bucket, offset, data, count, dtype, add, static_cast<cudaStream_t>(stream));
    cudaSetDevice(previous);  // the trainer's thread keeps its device
    return s;
  }

  Status Reduce(int bucket, size_t count, DType dtype, const std::string& spec,
                Collectives& backend, const OpTag& tag, Deadline deadline,
                BucketCompression::Traffic* traffic, const HostReduce& host) override {
    GS_RETURN_IF_ERROR(Select());
    State& st = *state_.at(static_cast<size_t>(bucket));
    if (st.spec != spec) {
      GS_ASSIGN_OR_RETURN(st.codec, CodecOf(spec));
      st.spec = spec;
    }
    const Codec::Kind kind = dtype == DType::kF32 ? st.codec.kind : Codec::kNone;
    if (kind == Codec::kHost) return ViaHost(bucket, count * DTypeSize(dtype), deadline, traffic, host);
    const bool nccl = std::strcmp(backend.name(), "nccl") == 0;
    if (kind == Codec::kNone) {
      const size_t bytes = count * DTypeSize(dtype);
      *traffic = BucketCompression::Traffic{bytes, bytes, false};
      if (!nccl) {
        return ViaHost(bucket, bytes, deadline, traffic,
                       [&](uint8_t* h, BucketCompression::Traffic*) {
                         return backend.AllReduce(h, count, dtype, ReduceOp::kAverage, tag, deadline);
                       });
      }
      GS_RETURN_IF_ERROR(Wait(deadline));
      return backend.AllReduce(Bucket(bucket), count, dtype, ReduceOp::kAverage, tag, deadline);
    }
    auto* data = reinterpret_cast<float*>(Bucket(bucket));
    if (st.codec.ef) GS_RETURN_IF_ERROR(st.residual.Reserve(count * sizeof(float), "a residual"));
    Status s = kind == Codec::kHalf ? ReduceHalf(st, data, count, backend, nccl, tag, deadline, traffic)
                                    : ReduceTopK(st, data, count, backend, nccl, tag, deadline, traffic);
    if (st.codec.ef) st.has_residual = true;
    return s;
  }

  Status Unstage(int bucket, size_t offset, void* data, size_t bytes) override {
    GS_RETURN_IF_ERROR(Select());
    return Cuda(cudaMemcpyAsync(data, Bucket(bucket) + offset, bytes, cudaMemcpyDeviceToDevice,
                                stream_),
                "copying a synchronised gradient back to its tensor");
  }

  Status Wait(Deadline deadline) override {
    // Polled, so that a hung GPU fails the step at its deadline.
    for (int spins = 0;; ++spins) {
      const cudaError_t err = cudaStreamQuery(stream_);
      if (err == cudaSuccess) return Status();
      if (err != cudaErrorNotReady) return Cuda(err, "gradsync's CUDA stream");
      if (deadline.Expired()) {
        return DeadlineExceededError("the GPU work of gradsync's stream on cuda:" +
                                     std::to_string(device_) + " did not finish in time");
      }
      if (spins < 200) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return Status();
    int previous = 0;
    GS_RETURN_IF_ERROR(Cuda(cudaGetDevice(&previous), "cudaGetDevice"));
    GS_RETURN_IF_ERROR(Select());
    Status s = Cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
    cudaSetDevice(previous);
    return s;
  }

 private:
  struct State {
    std::string spec;
    Codec codec;
    DeviceBuffer residual;
    bool has_residual = false;
  };

  Status Select() const {
    return Cuda(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) + ")");
  }

  uint8_t* Bucket(int bucket) const { return buckets_.at(static_cast<size_t>(bucket))->get(); }

  Status StageOn(int bucket, size_t offset, const void* data, size_t count, DType dtype, bool add,
                 cudaStream_t stream) {
    // gradsync's stream waits for the trainer's work so far (the backward
    // kernel that produced the gradient); the trainer's stream does not wait.
    GS_RETURN_IF_ERROR(Cuda(cudaEventRecord(event_, stream), "cudaEventRecord on the trainer's stream"));
    GS_RETURN_IF_ERROR(Cuda(cudaStreamWaitEvent(stream_, event_, 0), "cudaStreamWaitEvent"));
    uint8_t* dst = Bucket(bucket) + offset;
    if (!add) {
      return Cuda(cudaMemcpyAsync(dst, data, count * DTypeSize(dtype), cudaMemcpyDeviceToDevice,
                                  stream_),
                  "copying a gradient into its bucket");
    }
    switch (dtype) {
      case DType::kF32:
        return kernels::SumIntoCuda(reinterpret_cast<float*>(dst), static_cast<const float*>(data),
                                    count, stream_);
      case DType::kF16:
      case DType::kBF16:
        return kernels::Add16IntoCuda(
            dtype == DType::kF16 ? kernels::Float16Format::kFp16 : kernels::Float16Format::kBf16,
            reinterpret_cast<uint16_t*>(dst), static_cast<const uint16_t*>(data), count, stream_);
      default:
        return InvalidArgumentError(std::string("gradients of dtype ") + DTypeName(dtype));
    }
  }

  // The bucket goes to `host` as a pinned copy and comes back.
  Status ViaHost(int bucket, size_t bytes, Deadline deadline, BucketCompression::Traffic* traffic,
                 const HostReduce& host) {
    GS_RETURN_IF_ERROR(mirror_.Reserve(bytes, "the host copy of a bucket"));
    GS_RETURN_IF_ERROR(ToHost(mirror_.get(), Bucket(bucket), bytes, deadline));
    GS_RETURN_IF_ERROR(host(mirror_.get(), traffic));
    return ToDevice(Bucket(bucket), mirror_.get(), bytes);
  }

  Status ToHost(uint8_t* host, const uint8_t* dev, size_t bytes, Deadline deadline) {
    GS_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_),
                            "copying to the host"));
    return Wait(deadline);
  }

  Status ToDevice(uint8_t* dev, const uint8_t* host, size_t bytes) {
    return Cuda(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_),
                "copying to the GPU");
  }

  // fp16 / bf16: summable; the 16-bit values are summed by the backend.
  Status ReduceHalf(State& st, float* data, size_t n, Collectives& backend, bool nccl,
                    const OpTag& tag, Deadline deadline, BucketCompression::Traffic* traffic) {
    const size_t wb = 2 * n;
    GS_RETURN_IF_ERROR(wire_.Reserve(wb, "compressed bytes"));
    auto* wire = reinterpret_cast<uint16_t*>(wire_.get());
    const kernels::Float16Format f = st.codec.half;
    if (st.codec.ef) {
      GS_RETURN_IF_ERROR(kernels::EfFloat16Cuda(f, data, reinterpret_cast<float*>(st.residual.get()),
                                                st.has_residual, n, wire, stream_));
    } else if (f == kernels::Float16Format::kFp16) {
      GS_RETURN_IF_ERROR(kernels::FloatToHalfCuda(data, wire, n, stream_));
    } else {
      GS_RETURN_IF_ERROR(kernels::FloatToBf16Cuda(data, wire, n, stream_));
    }
    *traffic = BucketCompression::Traffic{wb, wb, false};
    const DType wd = f == kernels::Float16Format::kFp16 ? DType::kF16 : DType::kBF16;
    if (nccl) {
      GS_RETURN_IF_ERROR(Wait(deadline));
      GS_RETURN_IF_ERROR(backend.AllReduce(wire, n, wd, ReduceOp::kSum, tag, deadline));
    } else {
      GS_RETURN_IF_ERROR(wire_host_.Reserve(wb, "compressed bytes"));
      GS_RETURN_IF_ERROR(ToHost(wire_host_.get(), wire_.get(), wb, deadline));
      GS_RETURN_IF_ERROR(backend.AllReduce(wire_host_.get(), n, wd, ReduceOp::kSum, tag, deadline));
      GS_RETURN_IF_ERROR(ToDevice(wire_.get(), wire_host_.get(), wb));
    }
    if (f == kernels::Float16Format::kFp16) {
      GS_RETURN_IF_ERROR(kernels::HalfToFloatCuda(wire, data, n, stream_));
    } else {
      GS_RETURN_IF_ERROR(kernels::Bf16ToFloatCuda(wire, data, n, stream_));
    }
    return kernels::DivideFloatCuda(data, n, static_cast<float>(backend.world_size()), stream_);
  }

  // Top-k: every rank's k (index, value) pairs are gathered, decompressed
  // and summed in rank order, as the CPU path does.
  Status ReduceTopK(State& st, float* data, size_t n, Collectives& backend, bool nccl,
                    const OpTag& tag, Deadline deadline, BucketCompression::Traffic* traffic) {
    const size_t k = kernels::SparseKeepCount(st.codec.ratio, n);
    const size_t vb = st.codec.values == kernels::SparseValueFormat::kF16 ? 2 : 4;
    const size_t wb = k * (4 + vb);
    const size_t world = static_cast<size_t>(backend.world_size());
    const size_t ws = kernels::TopKWorkspaceBytes(n);
    GS_RETURN_IF_ERROR(wire_.Reserve(wb, "compressed bytes"));
    GS_RETURN_IF_ERROR(workspace_.Reserve(ws, "the top-k workspace"));
    GS_RETURN_IF_ERROR(gathered_.Reserve(wb * world, "gathered compressed bytes"));
    GS_RETURN_IF_ERROR(scratch_.Reserve(n * sizeof(float) + wb + 16, "decompression scratch"));
    auto* indices = reinterpret_cast<int32_t*>(wire_.get());
    void* values = wire_.get() + 4 * k;
    if (st.codec.ef) {
      GS_RETURN_IF_ERROR(kernels::EfTopKCuda(data, reinterpret_cast<float*>(st.residual.get()),
                                             st.has_residual, n, k, st.codec.values, indices,
                                             values, workspace_.get(), ws, stream_));
    } else {
      GS_RETURN_IF_ERROR(kernels::TopKCuda(data, n, k, st.codec.values, indices, values,
                                           workspace_.get(), ws, stream_));
    }
    *traffic = BucketCompression::Traffic{wb, wb * (world - 1), true};
    if (nccl) {
      GS_RETURN_IF_ERROR(Wait(deadline));
      GS_RETURN_IF_ERROR(backend.AllGather(wire_.get(), wb, gathered_.get(), tag, deadline));
    } else {
      GS_RETURN_IF_ERROR(wire_host_.Reserve(wb, "compressed bytes"));
      GS_RETURN_IF_ERROR(gathered_host_.Reserve(wb * world, "gathered compressed bytes"));
      GS_RETURN_IF_ERROR(ToHost(wire_host_.get(), wire_.get(), wb, deadline));
      GS_RETURN_IF_ERROR(
          backend.AllGather(wire_host_.get(), wb, gathered_host_.get(), tag, deadline));
      // Peers' indices are checked before the GPU writes through them.
      for (size_t r = 0; r < world; ++r) {
        GS_RETURN_IF_ERROR(CheckSparse(gathered_host_.get() + r * wb, k, n, static_cast<int>(r)));
      }
      GS_RETURN_IF_ERROR(ToDevice(gathered_.get(), gathered_host_.get(), wb * world));
    }
    auto* scratch = reinterpret_cast<float*>(scratch_.get());
    uint8_t* aligned = scratch_.get() + n * sizeof(float);  // 4-byte aligned: n floats
    for (size_t r = 0; r < world; ++r) {
      const uint8_t* part = gathered_.get() + r * wb;
      if ((r * wb) % 4 != 0) {  // fp16 values with odd k: realign the indices
        GS_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(aligned, part, wb, cudaMemcpyDeviceToDevice, stream_),
                                "realigning top-k bytes"));
        part = aligned;
      }
      GS_RETURN_IF_ERROR(kernels::SparseDecompressCuda(
          reinterpret_cast<const int32_t*>(part), part + 4 * k, st.codec.values, k, n,
          r == 0 ? data : scratch, stream_));
      if (r > 0) GS_RETURN_IF_ERROR(kernels::SumIntoCuda(data, scratch, n, stream_));
    }
    return kernels::DivideFloatCuda(data, n, static_cast<float>(world), stream_);
  }

  const int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  std::mutex stage_mu_;  // Stage: event_ is recorded and waited on as one
  std::vector<std::unique_ptr<DeviceBuffer>> buckets_;
  std::vector<std::unique_ptr<State>> state_;
  DeviceBuffer wire_, gathered_, workspace_, scratch_;
  PinnedBuffer mirror_, wire_host_, gathered_host_;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceGradients>> MakeDeviceGradients(int device) {
  auto g = std::make_unique<CudaGradients>(device);
  GS_RETURN_IF_ERROR(g->Init());
  return std::unique_ptr<DeviceGradients>(std::move(g));
}

}  // namespace gradsync::client
