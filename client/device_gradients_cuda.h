// CudaGradients: BucketMemory on CUDA (client/device_gradients.h), and
// what its two files share. device_gradients_cuda.cc holds the buckets'
// memory: allocation, staging on the staging stream, the copies back into
// the tensors, waits. device_exchange_cuda.cc averages a bucket: NCCL in
// place, a host backend through pinned copies, and the device compressors'
// wire bytes (encode, check a peer's bytes, decode, sum or gather). Internal
// to //client:device_gradients, built with --config=cuda only.
#ifndef GRADSYNC_CLIENT_DEVICE_GRADIENTS_CUDA_H_
#define GRADSYNC_CLIENT_DEVICE_GRADIENTS_CUDA_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "client/device_gradients.h"
#include "client/wire_reduce.h"
#include "kernels/compress_kernels.h"

namespace gradsync::client {

inline Status Cuda(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status();
  cudaGetLastError();  // clears a non-sticky error
  return InternalError(what + " failed: " + cudaGetErrorString(err));
}

// Bytes held by every Buffer of one kind in this process.
template <bool kDevice>
std::atomic<size_t>& HeldBytes() {
  static std::atomic<size_t> held{0};
  return held;
}

// The error of a failed allocation of `bytes` for `what`: for device memory
// what the GPU has free and what gradsync holds, so that a nearly full GPU
// says so.
inline Status AllocationError(cudaError_t err, size_t bytes, const char* what, bool device) {
  cudaGetLastError();  // clears a non-sticky error
  std::string m = "allocating " + std::to_string(bytes) + " bytes of " +
                  (device ? "GPU" : "pinned host") + " memory for " + what +
                  " failed: " + cudaGetErrorString(err);
  if (device) {
    size_t free_bytes = 0, total_bytes = 0;
    int dev = -1;
    cudaGetDevice(&dev);
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) cudaGetLastError();
    m += " (cuda:" + std::to_string(dev) + " has " + std::to_string(free_bytes >> 20) +
         " MiB free of " + std::to_string(total_bytes >> 20) + " MiB; gradsync holds " +
         std::to_string(HeldBytes<true>().load() >> 20) +
         " MiB of it in this process): free GPU memory first (a framework's cache "
         "too: torch.cuda.empty_cache()) or lower bucket_bytes";
  }
  return FailedPreconditionError(m);
}

// Device or pinned host memory, grown on demand, never shrunk; counted in
// HeldBytes.
template <cudaError_t (*Alloc)(void**, size_t), cudaError_t (*Free)(void*), bool kDevice>
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Release(); }
  Status Reserve(size_t bytes, const char* what) {
    if (bytes <= bytes_) return Status();
    Release();
    void* p = nullptr;
    const cudaError_t err = Alloc(&p, bytes);
    if (err != cudaSuccess) return AllocationError(err, bytes, what, kDevice);
    ptr_ = p;
    bytes_ = bytes;
    HeldBytes<kDevice>() += bytes;
    return Status();
  }
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }

 private:
  void Release() {
    if (ptr_ == nullptr) return;
    Free(ptr_);
    HeldBytes<kDevice>() -= bytes_;
    ptr_ = nullptr;
    bytes_ = 0;
  }

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

inline cudaError_t DeviceAlloc(void** p, size_t n) { return cudaMalloc(p, n); }
inline cudaError_t PinnedAlloc(void** p, size_t n) { return cudaMallocHost(p, n); }
using DeviceBuffer = Buffer<DeviceAlloc, cudaFree, true>;
using PinnedBuffer = Buffer<PinnedAlloc, cudaFreeHost, false>;

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
  // fp16 without error feedback divides as it casts, and its sum is the
  // result: widened from the wire into the tensors.
  bool ResultInWire() const {
    return kind == kHalf && half == kernels::Float16Format::kFp16 && !ef;
  }
};

class DeviceCodec;  // device_exchange_cuda.cc

class CudaGradients : public BucketMemory {
 public:
  explicit CudaGradients(int device) : device_(device) {}
  ~CudaGradients() override;

  Status Init();

  bool device() const override { return true; }

  Status CheckPointer(const void* data, const std::string& what) const override;

  Status Allocate(const std::vector<size_t>& bucket_bytes) override;

  Status Stage(int bucket, size_t offset, const void* data, size_t count, DType dtype, bool add,
               void* stream, Staging how) override;

  bool Reduces(int bucket, DType dtype, const std::string& spec,
               const Collectives& backend) override;

  Status Reduce(int bucket, size_t count, DType dtype, const std::string& spec,
                Collectives& backend, const OpTag& tag, uint64_t seed, Deadline deadline,
                WireTraffic* traffic) override;

  StatusOr<uint8_t*> HostView(int bucket, size_t bytes, bool copy_in, Deadline deadline) override;

  Status EndHostView(int bucket, size_t bytes) override;

  StatusOr<std::shared_ptr<std::vector<uint8_t>>> EncodePartition(
      int bucket, uint32_t partition, size_t offset, size_t count, const std::string& spec,
      const compression::CompressContext& ctx, Deadline deadline) override;

  Status Unstage(int bucket, const std::vector<Slice>& slices, DType dtype) override;

  Status WaitStaged(int bucket, Deadline deadline) override;

  Status Wait(Deadline deadline) override;

  // Polls `query` (cudaSuccess: done) so that a hung GPU fails the step at
  // its deadline.
  template <typename Query>
  Status Poll(Query query, const std::string& what, Deadline deadline);

  Status Copy(void* dst, const void* src, size_t bytes) override;

  StatusOr<uint8_t*> Scratch(size_t bytes) override;

  size_t DeviceBytes() const override { return HeldBytes<true>().load(); }

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
  // pass, is not in its way). Copies still gathered are packed first.
  Status AfterStaged(int bucket) {
    {
      std::lock_guard<std::mutex> lock(stage_mu_);
      GS_RETURN_IF_ERROR(FlushLocked(bucket));
    }
    return Cuda(cudaStreamWaitEvent(stream_, Staged(bucket), 0), "cudaStreamWaitEvent");
  }

  Status StageOn(int bucket, size_t offset, const void* data, size_t count, DType dtype, bool add,
                 cudaStream_t stream, Staging how);

  // The staging stream waits for the trainer's work on `stream` so far and
  // for the copies out of the bucket's last reduction.
  Status StageAfter(int bucket, cudaStream_t stream);

  // Packs the fp32 copies gathered for `bucket` (one kernel) and records
  // its staging event. Holds stage_mu_; the caller selected the device.
  Status FlushLocked(int bucket);

  // Per bucket: the fp32 copies gathered (their slices of the bucket and
  // the trainer's streams they came on), the unpack's slice table, and the
  // slice tables on their way to the device (pinned, then device memory).
  // A table is rewritten only once its last upload is done: the pack's in
  // the next step (a bucket is packed once a step, and its reduction waits
  // for the pack), the unpack's after the host waited for the copies out.
  struct Fused {
    std::vector<kernels::BucketSlice> gathered, unpack;
    std::vector<cudaStream_t> streams;
    PinnedBuffer pack_host, unpack_host;
    DeviceBuffer pack_slices, unpack_slices;
  };

  // Uploads `slices` (sorted by offset) into `host` and `dev` on `stream`;
  // the device table.
  StatusOr<const kernels::BucketSlice*> Upload(std::vector<kernels::BucketSlice>& slices,
                                               size_t elems, PinnedBuffer& host, DeviceBuffer& dev,
                                               cudaStream_t stream);

  Status StageCopy(int bucket, size_t offset, const void* data, size_t count, DType dtype,
                   bool add);

  // The bucket's state, its codec that of `spec`.
  StatusOr<State*> StateOf(int bucket, const std::string& spec);

  Status ToHost(uint8_t* host, const uint8_t* dev, size_t bytes, Deadline deadline);

  Status ToDevice(uint8_t* dev, const uint8_t* host, size_t bytes);

  // *code = what codec `c` makes of data[0, n) on this device
  // (client/wire_reduce.h).
  Status MakeCode(const Codec& c, float* data, size_t n, float* residual, bool has,
                  const kernels::SeedContext& ctx, DeviceCodec* code);

  Status ReduceCompressed(State& st, float* data, size_t n, const kernels::SeedContext& ctx,
                          Collectives& backend, const OpTag& tag, Deadline deadline,
                          WireTraffic* traffic, bool* in_wire);

  // The reducer's buffers on this device, and its arithmetic there.
  class Space : public ReduceSpace {
   public:
    explicit Space(CudaGradients* owner) : owner_(owner) {}
    bool device() const override { return true; }
    StatusOr<uint8_t*> Buffer(Slot slot, size_t bytes) override;
    Status Divide(float* data, size_t n, int divisor) override;
    Status SumInto(float* data, const float* add, size_t n) override;
    StatusOr<const uint8_t*> Aligned(const uint8_t* part, size_t bytes, uint8_t* aligned) override;
    Status ToHost(uint8_t* host, const uint8_t* mine, size_t bytes, Deadline deadline) override {
      return owner_->ToHost(host, mine, bytes, deadline);
    }
    Status ToDevice(uint8_t* mine, const uint8_t* host, size_t bytes) override {
      return owner_->ToDevice(mine, host, bytes);
    }
    Status Wait(Deadline deadline) override { return owner_->Wait(deadline); }

   private:
    CudaGradients* owner_;
  };

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
  std::vector<std::unique_ptr<Fused>> fused_;  // gathered, streams: under stage_mu_
  std::vector<std::unique_ptr<State>> state_;
  // The parameter-server path compresses each partition with its own state.
  std::map<std::pair<int, uint32_t>, std::unique_ptr<State>> partitions_;
  DeviceBuffer wire_, gathered_, workspace_, scratch_, indices_, direct_;
  // fp16 without error feedback (Codec::ResultInWire): the averaged values
  // stay in wire_ and Unstage widens them straight into the tensors (one
  // pass, not a widen into the bucket and a copy out). The bucket they are
  // of, or -1.
  int wire_result_ = -1;
  PinnedBuffer mirror_, wire_host_, gathered_host_;
  Space space_{this};
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_DEVICE_GRADIENTS_CUDA_H_
