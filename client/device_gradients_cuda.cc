// DeviceGradients on CUDA (device_gradients.h).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <functional>
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

// A CUDA event without timing, destroyed with its owner.
class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  Status Create() {
    return Cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// What a compressor spec becomes on the device.
struct Codec {
  enum Kind { kNone, kHalf, kTopK, kRandomK, kSign, kQsgd, kHost } kind = kNone;
  kernels::Float16Format half = kernels::Float16Format::kFp16;
  kernels::SparseValueFormat values = kernels::SparseValueFormat::kF32;
  double ratio = 0;
  size_t chunk = 0;
  int levels = 0;
  bool ef = false;
};

StatusOr<Codec> CodecOf(const std::string& spec) {
  Codec c;
  if (spec == "none") return c;
  GS_ASSIGN_OR_RETURN(compression::CompressorSpec parsed, compression::ParseCompressorSpec(spec));
  const std::string& name = parsed.name;
  if (parsed.options.momentum != 0) {
    return UnimplementedError("\"" + spec +
                              "\": error feedback with momentum runs on host gradients only "
                              "(gradient_device=cpu)");
  }
  if (parsed.options.warmup != 0) {
    return UnimplementedError("\"" + spec +
                              "\": top-k's warm-up runs on host gradients only "
                              "(gradient_device=cpu)");
  }
  c.ef = parsed.options.error_feedback;
  c.ratio = parsed.options.ratio;
  c.chunk = parsed.options.chunk;
  c.levels = parsed.options.levels;
  if (name == "fp16" || name == "bf16") {
    c.kind = Codec::kHalf;
    c.half = name == "fp16" ? kernels::Float16Format::kFp16 : kernels::Float16Format::kBf16;
  } else if (name == "topk" || name == "topk_fp16" || name == "topk_sampled" ||
             name == "topk_sampled_fp16") {
    // The sampled selection picks exactly the top-k set: same wire bytes.
    c.kind = Codec::kTopK;
    c.values = name.size() > 5 && name.substr(name.size() - 5) == "_fp16"
                   ? kernels::SparseValueFormat::kF16
                   : kernels::SparseValueFormat::kF32;
  } else if (name == "randomk") {
    c.kind = Codec::kRandomK;
  } else if (name == "sign") {
    c.kind = Codec::kSign;
  } else if (name == "qsgd") {
    c.kind = Codec::kQsgd;
  } else {
    c.kind = Codec::kHost;  // powersgd
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
    for (cudaStream_t s : {stage_stream_, stream_}) {
      if (s != nullptr) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
      }
    }
    if (event_ != nullptr) cudaEventDestroy(event_);
    buckets_.clear();
    state_.clear();
    staged_.clear();
    reduced_.clear();
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
    GS_RETURN_IF_ERROR(
        Cuda(cudaStreamCreateWithFlags(&stage_stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    return Cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }

  int device() const override { return device_; }

  Status CheckPointer(const void* data, const std::string& what) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, data) != cudaSuccess) cudaGetLastError();
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
      return InvalidArgumentError(what +
                                  " is host memory; this communicator takes CUDA tensors "
                                  "(gradient_device=cuda) on cuda:" +
                                  std::to_string(device_));
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
    partitions_.clear();
    for (size_t i = 0; i < bucket_bytes.size(); ++i) {
      buckets_.push_back(std::make_unique<DeviceBuffer>());
      GS_RETURN_IF_ERROR(buckets_.back()->Reserve(bucket_bytes[i], "a gradient bucket"));
    }
    for (size_t i = 0; i < bucket_bytes.size(); ++i) state_.push_back(std::make_unique<State>());
    staged_.clear();
    reduced_.clear();
    for (size_t i = 0; i < bucket_bytes.size(); ++i) {
      staged_.push_back(std::make_unique<Event>());
      reduced_.push_back(std::make_unique<Event>());
      GS_RETURN_IF_ERROR(staged_.back()->Create());
      GS_RETURN_IF_ERROR(reduced_.back()->Create());
    }
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
                Collectives& backend, const OpTag& tag, uint64_t seed, Deadline deadline,
                BucketCompression::Traffic* traffic, const HostReduce& host) override {
    GS_RETURN_IF_ERROR(Select());
    GS_RETURN_IF_ERROR(AfterStaged(bucket));
    State& st = *state_.at(static_cast<size_t>(bucket));
    if (st.spec != spec) {
      GS_ASSIGN_OR_RETURN(st.codec, CodecOf(spec));
      st.spec = spec;
    }
    const Codec::Kind kind = dtype == DType::kF32 ? st.codec.kind : Codec::kNone;
    if (kind == Codec::kHost)
      return ViaHost(bucket, count * DTypeSize(dtype), deadline, traffic, host);
    const bool nccl = backend.takes_device_memory();
    if (kind == Codec::kNone) {
      const size_t bytes = count * DTypeSize(dtype);
      *traffic = BucketCompression::Traffic{bytes, bytes, false};
      if (!nccl) {
        return ViaHost(
            bucket, bytes, deadline, traffic, [&](uint8_t* h, BucketCompression::Traffic*) {
              return backend.AllReduce(h, count, dtype, ReduceOp::kAverage, tag, deadline);
            });
      }
      GS_RETURN_IF_ERROR(Wait(deadline));
      return backend.AllReduce(Bucket(bucket), count, dtype, ReduceOp::kAverage, tag, deadline);
    }
    auto* data = reinterpret_cast<float*>(Bucket(bucket));
    if (st.codec.ef) GS_RETURN_IF_ERROR(st.residual.Reserve(count * sizeof(float), "a residual"));
    const kernels::SeedContext ctx{seed, tag.step, tag.bucket};
    Status s = ReduceCompressed(st, data, count, ctx, backend, nccl, tag, deadline, traffic);
    if (st.codec.ef) st.has_residual = true;
    return s;
  }

  Status ReduceOnHost(int bucket, size_t bytes, bool copy_in, Deadline deadline,
                      BucketCompression::Traffic* traffic, const HostReduce& host) override {
    GS_RETURN_IF_ERROR(Select());
    GS_RETURN_IF_ERROR(AfterStaged(bucket));
    return ViaHost(bucket, bytes, deadline, traffic, host, copy_in);
  }

  StatusOr<std::shared_ptr<std::vector<uint8_t>>> EncodePartition(
      int bucket, uint32_t partition, size_t offset, size_t count, const std::string& spec,
      const compression::CompressContext& ctx, Deadline deadline) override {
    GS_RETURN_IF_ERROR(Select());
    GS_RETURN_IF_ERROR(AfterStaged(bucket));
    std::unique_ptr<State>& slot = partitions_[{bucket, partition}];
    if (slot == nullptr) slot = std::make_unique<State>();
    State& st = *slot;
    if (st.spec != spec) {
      GS_ASSIGN_OR_RETURN(st.codec, CodecOf(spec));
      st.spec = spec;
    }
    if (st.codec.kind == Codec::kNone || st.codec.kind == Codec::kHost) {
      return InvalidArgumentError("compression \"" + spec + "\" has no device form");
    }
    if (st.codec.ef) GS_RETURN_IF_ERROR(st.residual.Reserve(count * sizeof(float), "a residual"));
    auto* data = reinterpret_cast<float*>(Bucket(bucket)) + offset;
    GS_ASSIGN_OR_RETURN(
        Code code,
        MakeCode(st.codec, data, count, reinterpret_cast<float*>(st.residual.get()),
                 st.has_residual, kernels::SeedContext{ctx.seed, ctx.step, ctx.bucket_id}));
    GS_RETURN_IF_ERROR(wire_.Reserve(code.wire_bytes + 4, "compressed bytes"));
    GS_RETURN_IF_ERROR(code.encode(wire_.get()));
    if (st.codec.ef) st.has_residual = true;
    auto bytes = std::make_shared<std::vector<uint8_t>>(code.wire_bytes);
    GS_RETURN_IF_ERROR(wire_host_.Reserve(code.wire_bytes + 4, "compressed bytes"));
    GS_RETURN_IF_ERROR(ToHost(wire_host_.get(), wire_.get(), code.wire_bytes, deadline));
    if (!bytes->empty()) std::memcpy(bytes->data(), wire_host_.get(), bytes->size());
    return bytes;
  }

  Status Unstage(int bucket, size_t offset, void* data, size_t bytes) override {
    GS_RETURN_IF_ERROR(Select());
    GS_RETURN_IF_ERROR(Cuda(
        cudaMemcpyAsync(data, Bucket(bucket) + offset, bytes, cudaMemcpyDeviceToDevice, stream_),
        "copying a synchronised gradient back to its tensor"));
    // The next staging into this bucket waits for the copies out of it.
    return Cuda(cudaEventRecord(Reduced(bucket), stream_), "cudaEventRecord");
  }

  Status WaitStaged(int bucket, Deadline deadline) override {
    return Poll([&] { return cudaEventQuery(Staged(bucket)); },
                "the staging of bucket " + std::to_string(bucket), deadline);
  }

  Status Wait(Deadline deadline) override {
    return Poll([&] { return cudaStreamQuery(stream_); }, "gradsync's stream", deadline);
  }

  // Polls `query` (cudaSuccess: done) so that a hung GPU fails the step at
  // its deadline.
  template <typename Query>
  Status Poll(Query query, const std::string& what, Deadline deadline) {
    for (int spins = 0;; ++spins) {
      const cudaError_t err = query();
      if (err == cudaSuccess) return Status();
      if (err != cudaErrorNotReady) return Cuda(err, what);
      if (deadline.Expired()) {
        return DeadlineExceededError("the GPU work of " + what + " on cuda:" +
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
    // On the legacy default stream, as cudaMemcpy is: after the caller's
    // work on blocking streams. A copy between device buffers may return
    // before it is done: waited for, so that another stream (NCCL's) reads
    // the result.
    Status s = Cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
    if (s.ok()) s = Cuda(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
    cudaSetDevice(previous);
    return s;
  }

  StatusOr<uint8_t*> Scratch(size_t bytes) override {
    GS_RETURN_IF_ERROR(Select());
    GS_RETURN_IF_ERROR(direct_.Reserve(bytes, "a collective's device copy"));
    return direct_.get();
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
  cudaEvent_t Staged(int bucket) const { return staged_.at(static_cast<size_t>(bucket))->get(); }
  cudaEvent_t Reduced(int bucket) const { return reduced_.at(static_cast<size_t>(bucket))->get(); }

  // The work stream's next work on `bucket` waits for the bucket's staging
  // (only: later buckets' staging, which waits on the trainer's backward
  // pass, is not in its way).
  Status AfterStaged(int bucket) {
    return Cuda(cudaStreamWaitEvent(stream_, Staged(bucket), 0), "cudaStreamWaitEvent");
  }

  Status StageOn(int bucket, size_t offset, const void* data, size_t count, DType dtype, bool add,
                 cudaStream_t stream) {
    // The staging stream waits for the trainer's work so far (the backward
    // kernel that produced the gradient) and for the copies out of the
    // bucket's last reduction; the trainer's stream does not wait.
    GS_RETURN_IF_ERROR(
        Cuda(cudaEventRecord(event_, stream), "cudaEventRecord on the trainer's stream"));
    GS_RETURN_IF_ERROR(Cuda(cudaStreamWaitEvent(stage_stream_, event_, 0), "cudaStreamWaitEvent"));
    GS_RETURN_IF_ERROR(
        Cuda(cudaStreamWaitEvent(stage_stream_, Reduced(bucket), 0), "cudaStreamWaitEvent"));
    GS_RETURN_IF_ERROR(StageCopy(bucket, offset, data, count, dtype, add));
    return Cuda(cudaEventRecord(Staged(bucket), stage_stream_), "cudaEventRecord");
  }

  Status StageCopy(int bucket, size_t offset, const void* data, size_t count, DType dtype,
                   bool add) {
    uint8_t* dst = Bucket(bucket) + offset;
    if (!add) {
      return Cuda(cudaMemcpyAsync(dst, data, count * DTypeSize(dtype), cudaMemcpyDeviceToDevice,
                                  stage_stream_),
                  "copying a gradient into its bucket");
    }
    switch (dtype) {
      case DType::kF32:
        return kernels::SumIntoCuda(reinterpret_cast<float*>(dst), static_cast<const float*>(data),
                                    count, stage_stream_);
      case DType::kF16:
      case DType::kBF16:
        return kernels::Add16IntoCuda(
            dtype == DType::kF16 ? kernels::Float16Format::kFp16 : kernels::Float16Format::kBf16,
            reinterpret_cast<uint16_t*>(dst), static_cast<const uint16_t*>(data), count,
            stage_stream_);
      default:
        return InvalidArgumentError(std::string("gradients of dtype ") + DTypeName(dtype));
    }
  }

  // The bucket goes to `host` as a pinned copy and comes back.
  Status ViaHost(int bucket, size_t bytes, Deadline deadline, BucketCompression::Traffic* traffic,
                 const HostReduce& host, bool copy_in = true) {
    GS_RETURN_IF_ERROR(mirror_.Reserve(bytes, "the host copy of a bucket"));
    if (copy_in) {
      GS_RETURN_IF_ERROR(ToHost(mirror_.get(), Bucket(bucket), bytes, deadline));
    } else {
      GS_RETURN_IF_ERROR(Wait(deadline));  // earlier results still being copied from mirror_
    }
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

  // What a codec makes of data[0, n): the bytes that travel, how they are
  // combined (summed by the backend, or gathered and decoded rank by rank,
  // as the CPU path does), and how they decode. `check` vets a peer's bytes
  // on the host before the GPU reads them.
  struct Code {
    bool summable = false;
    DType dtype = DType::kU8;  // summable: `elems` values of it travel
    size_t elems = 0;
    size_t wire_bytes = 0;
    std::function<Status(uint8_t* wire)> encode;
    std::function<Status(const uint8_t* host_wire, int rank)> check;
    std::function<Status(const uint8_t* wire, float* out)> decode;
  };

  StatusOr<Code> MakeCode(const Codec& c, float* data, size_t n, float* residual, bool has,
                          const kernels::SeedContext& ctx) {
    const size_t chunks = c.chunk > 0 ? kernels::NumChunks(n, c.chunk) : 0;
    const cudaStream_t stream = stream_;
    Code code;
    code.check = [](const uint8_t*, int) { return Status(); };
    switch (c.kind) {
      case Codec::kHalf: {
        const bool fp16 = c.half == kernels::Float16Format::kFp16;
        code.summable = true;
        code.dtype = fp16 ? DType::kF16 : DType::kBF16;
        code.elems = n;
        code.wire_bytes = 2 * n;
        code.encode = [=](uint8_t* w) {
          auto* wire = reinterpret_cast<uint16_t*>(w);
          if (c.ef) return kernels::EfFloat16Cuda(c.half, data, residual, has, n, wire, stream);
          return fp16 ? kernels::FloatToHalfCuda(data, wire, n, stream)
                      : kernels::FloatToBf16Cuda(data, wire, n, stream);
        };
        code.decode = [=](const uint8_t* w, float* out) {
          auto* wire = reinterpret_cast<const uint16_t*>(w);
          return fp16 ? kernels::HalfToFloatCuda(wire, out, n, stream)
                      : kernels::Bf16ToFloatCuda(wire, out, n, stream);
        };
        return code;
      }
      case Codec::kRandomK: {
        // Every rank draws the same indices from the context, on the host.
        // Unbiased (n / k) alone; with error feedback the dropped part is
        // carried instead (compression/registry.cc), so the scale is 1.
        const size_t k = kernels::SparseKeepCount(c.ratio, n);
        const std::vector<uint32_t> indices = kernels::RandomKIndicesCpu(ctx, n, k);
        const float scale = c.ef ? 1.0f : kernels::RandomKScale(n, k);
        GS_RETURN_IF_ERROR(indices_.Reserve(4 * k + 4, "random-k indices"));
        auto* idx = reinterpret_cast<uint32_t*>(indices_.get());
        // From pageable memory: staged before the call returns.
        GS_RETURN_IF_ERROR(
            Cuda(cudaMemcpyAsync(idx, indices.data(), 4 * k, cudaMemcpyHostToDevice, stream),
                 "copying random-k indices to the GPU"));
        code.summable = true;
        code.dtype = DType::kF32;
        code.elems = k;
        code.wire_bytes = 4 * k;
        code.encode = [=](uint8_t* w) {
          auto* values = reinterpret_cast<float*>(w);
          if (c.ef)
            return kernels::EfRandomKCuda(data, residual, has, n, idx, k, scale, values, stream);
          return kernels::GatherCuda(data, idx, k, values, stream);
        };
        code.decode = [=](const uint8_t* w, float* out) {
          return kernels::ScatterCuda(reinterpret_cast<const float*>(w), idx, k, scale, n, out,
                                      stream);
        };
        return code;
      }
      case Codec::kTopK: {
        const size_t k = kernels::SparseKeepCount(c.ratio, n);
        const size_t vb = c.values == kernels::SparseValueFormat::kF16 ? 2 : 4;
        const size_t ws = kernels::TopKWorkspaceBytes(n);
        GS_RETURN_IF_ERROR(workspace_.Reserve(ws, "the top-k workspace"));
        uint8_t* workspace = workspace_.get();
        code.wire_bytes = k * (4 + vb);
        code.encode = [=](uint8_t* w) {
          auto* idx = reinterpret_cast<int32_t*>(w);
          if (c.ef) {
            return kernels::EfTopKCuda(data, residual, has, n, k, c.values, idx, w + 4 * k,
                                       workspace, ws, stream);
          }
          return kernels::TopKCuda(data, n, k, c.values, idx, w + 4 * k, workspace, ws, stream);
        };
        code.check = [=](const uint8_t* w, int rank) { return CheckSparse(w, k, n, rank); };
        code.decode = [=](const uint8_t* w, float* out) {
          return kernels::SparseDecompressCuda(reinterpret_cast<const int32_t*>(w), w + 4 * k,
                                               c.values, k, n, out, stream);
        };
        return code;
      }
      case Codec::kSign: {
        code.wire_bytes = 4 * chunks + (n + 7) / 8;  // every bit pattern decodes
        code.encode = [=](uint8_t* w) {
          auto* scales = reinterpret_cast<float*>(w);
          uint8_t* bits = w + 4 * chunks;
          if (c.ef)
            return kernels::EfSignCuda(data, residual, has, n, c.chunk, scales, bits, stream);
          return kernels::SignEncodeCuda(data, n, c.chunk, scales, bits, stream);
        };
        code.decode = [=](const uint8_t* w, float* out) {
          return kernels::SignDecodeCuda(reinterpret_cast<const float*>(w), w + 4 * chunks, n,
                                         c.chunk, out, stream);
        };
        return code;
      }
      case Codec::kQsgd: {
        const uint64_t key = kernels::QsgdKey(ctx);
        code.wire_bytes = 4 * chunks + n;
        code.encode = [=](uint8_t* w) {
          auto* norms = reinterpret_cast<float*>(w);
          auto* q = reinterpret_cast<int8_t*>(w + 4 * chunks);
          if (c.ef) {
            return kernels::EfQsgdCuda(data, residual, has, n, c.chunk, c.levels, key, norms, q,
                                       stream);
          }
          return kernels::QsgdEncodeCuda(data, n, c.chunk, c.levels, key, norms, q, stream);
        };
        code.check = [=](const uint8_t* w, int rank) -> Status {
          const auto* q = reinterpret_cast<const int8_t*>(w + 4 * chunks);
          for (size_t i = 0; i < n; ++i) {
            if (q[i] > c.levels || q[i] < -c.levels) {
              return InvalidArgumentError(
                  "qsgd bytes of rank " + std::to_string(rank) + ": level " + std::to_string(q[i]) +
                  " at " + std::to_string(i) + " exceeds " + std::to_string(c.levels));
            }
          }
          return Status();
        };
        code.decode = [=](const uint8_t* w, float* out) {
          return kernels::QsgdDecodeCuda(reinterpret_cast<const float*>(w),
                                         reinterpret_cast<const int8_t*>(w + 4 * chunks), n,
                                         c.chunk, c.levels, out, stream);
        };
        return code;
      }
      default:
        return InternalError("no device form for this compressor");
    }
  }

  Status ReduceCompressed(State& st, float* data, size_t n, const kernels::SeedContext& ctx,
                          Collectives& backend, bool nccl, const OpTag& tag, Deadline deadline,
                          BucketCompression::Traffic* traffic) {
    GS_ASSIGN_OR_RETURN(Code code,
                        MakeCode(st.codec, data, n, reinterpret_cast<float*>(st.residual.get()),
                                 st.has_residual, ctx));
    if (code.summable) return ReduceSummable(data, n, code, backend, nccl, tag, deadline, traffic);
    return ReduceGathered(data, n, code, backend, nccl, tag, deadline, traffic);
  }

  Status ReduceSummable(float* data, size_t n, const Code& code, Collectives& backend, bool nccl,
                        const OpTag& tag, Deadline deadline, BucketCompression::Traffic* traffic) {
    const size_t wb = code.elems * DTypeSize(code.dtype);
    GS_RETURN_IF_ERROR(wire_.Reserve(wb + 4, "compressed bytes"));
    // The rule of the host path (a sum of fp16 overflows past 65504).
    const bool divided = BucketCompression::DividesBeforeSum(code.dtype);
    const auto world = static_cast<float>(backend.world_size());
    if (divided) GS_RETURN_IF_ERROR(kernels::DivideFloatCuda(data, n, world, stream_));
    GS_RETURN_IF_ERROR(code.encode(wire_.get()));
    *traffic = BucketCompression::Traffic{wb, wb, false};
    if (nccl) {
      GS_RETURN_IF_ERROR(Wait(deadline));
      GS_RETURN_IF_ERROR(
          backend.AllReduce(wire_.get(), code.elems, code.dtype, ReduceOp::kSum, tag, deadline));
    } else {
      GS_RETURN_IF_ERROR(wire_host_.Reserve(wb + 4, "compressed bytes"));
      GS_RETURN_IF_ERROR(ToHost(wire_host_.get(), wire_.get(), wb, deadline));
      GS_RETURN_IF_ERROR(backend.AllReduce(wire_host_.get(), code.elems, code.dtype, ReduceOp::kSum,
                                           tag, deadline));
      GS_RETURN_IF_ERROR(ToDevice(wire_.get(), wire_host_.get(), wb));
    }
    GS_RETURN_IF_ERROR(code.decode(wire_.get(), data));
    if (divided) return Status();
    return kernels::DivideFloatCuda(data, n, world, stream_);
  }

  Status ReduceGathered(float* data, size_t n, const Code& code, Collectives& backend, bool nccl,
                        const OpTag& tag, Deadline deadline, BucketCompression::Traffic* traffic) {
    const size_t wb = code.wire_bytes;
    const size_t world = static_cast<size_t>(backend.world_size());
    GS_RETURN_IF_ERROR(wire_.Reserve(wb + 4, "compressed bytes"));
    GS_RETURN_IF_ERROR(gathered_.Reserve(wb * world + 4, "gathered compressed bytes"));
    GS_RETURN_IF_ERROR(scratch_.Reserve(n * sizeof(float) + wb + 16, "decompression scratch"));
    GS_RETURN_IF_ERROR(code.encode(wire_.get()));
    *traffic = BucketCompression::Traffic{wb, wb * (world - 1), true};
    if (nccl) {
      GS_RETURN_IF_ERROR(Wait(deadline));
      GS_RETURN_IF_ERROR(backend.AllGather(wire_.get(), wb, gathered_.get(), tag, deadline));
    } else {
      GS_RETURN_IF_ERROR(wire_host_.Reserve(wb + 4, "compressed bytes"));
      GS_RETURN_IF_ERROR(gathered_host_.Reserve(wb * world + 4, "gathered compressed bytes"));
      GS_RETURN_IF_ERROR(ToHost(wire_host_.get(), wire_.get(), wb, deadline));
      GS_RETURN_IF_ERROR(
          backend.AllGather(wire_host_.get(), wb, gathered_host_.get(), tag, deadline));
      // Peers' bytes are checked before the GPU reads them.
      for (size_t r = 0; r < world; ++r) {
        GS_RETURN_IF_ERROR(code.check(gathered_host_.get() + r * wb, static_cast<int>(r)));
      }
      GS_RETURN_IF_ERROR(ToDevice(gathered_.get(), gathered_host_.get(), wb * world));
    }
    auto* scratch = reinterpret_cast<float*>(scratch_.get());
    uint8_t* aligned = scratch_.get() + n * sizeof(float);  // 4-byte aligned: n floats
    for (size_t r = 0; r < world; ++r) {
      const uint8_t* part = gathered_.get() + r * wb;
      if ((r * wb) % 4 != 0) {  // the 4-byte parts of this rank's bytes: realign
        GS_RETURN_IF_ERROR(
            Cuda(cudaMemcpyAsync(aligned, part, wb, cudaMemcpyDeviceToDevice, stream_),
                 "realigning compressed bytes"));
        part = aligned;
      }
      GS_RETURN_IF_ERROR(code.decode(part, r == 0 ? data : scratch));
      if (r > 0) GS_RETURN_IF_ERROR(kernels::SumIntoCuda(data, scratch, n, stream_));
    }
    return kernels::DivideFloatCuda(data, n, static_cast<float>(world), stream_);
  }

  const int device_;
  // Two streams: staging (after the trainer's work) and the rest (reduction,
  // copies to and from the host, copies back into the tensors). Per bucket,
  // `staged_` marks the end of its staging so far and `reduced_` the end of
  // the copies out of it.
  cudaStream_t stream_ = nullptr;
  cudaStream_t stage_stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  std::mutex stage_mu_;  // Stage: event_ is recorded and waited on as one
  std::vector<std::unique_ptr<Event>> staged_, reduced_;
  std::vector<std::unique_ptr<DeviceBuffer>> buckets_;
  std::vector<std::unique_ptr<State>> state_;
  // The parameter-server path compresses each partition with its own state.
  std::map<std::pair<int, uint32_t>, std::unique_ptr<State>> partitions_;
  DeviceBuffer wire_, gathered_, workspace_, scratch_, indices_, direct_;
  PinnedBuffer mirror_, wire_host_, gathered_host_;
};

}  // namespace

int VisibleCudaDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky error
    return 0;
  }
  return count;
}

StatusOr<std::unique_ptr<DeviceGradients>> MakeDeviceGradients(int device) {
  auto g = std::make_unique<CudaGradients>(device);
  GS_RETURN_IF_ERROR(g->Init());
  return std::unique_ptr<DeviceGradients>(std::move(g));
}

}  // namespace gradsync::client
