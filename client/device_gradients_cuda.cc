// CudaGradients (client/device_gradients_cuda.h): the buckets' memory,
// staging, the copies back and the waits.
#include "client/device_gradients_cuda.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "kernels/compress_cpu.h"
#include "kernels/reduce_cuda.h"

namespace gradsync::client {

template <typename Query>
Status CudaGradients::Poll(Query query, const std::string& what, Deadline deadline) {
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

CudaGradients::~CudaGradients() {
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
  fused_.clear();
  staged_.clear();
  reduced_.clear();
  cudaSetDevice(previous);
}

Status CudaGradients::Init() {
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

Status CudaGradients::CheckPointer(const void* data, const std::string& what) const {
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

Status CudaGradients::Allocate(const std::vector<size_t>& bucket_bytes) {
  GS_RETURN_IF_ERROR(Select());
  buckets_.clear();
  state_.clear();
  partitions_.clear();
  wire_result_ = -1;
  for (size_t i = 0; i < bucket_bytes.size(); ++i) {
    buckets_.push_back(std::make_unique<DeviceBuffer>());
    GS_RETURN_IF_ERROR(buckets_.back()->Reserve(bucket_bytes[i], "a gradient bucket"));
  }
  for (size_t i = 0; i < bucket_bytes.size(); ++i) state_.push_back(std::make_unique<State>());
  {
    std::lock_guard<std::mutex> lock(stage_mu_);
    fused_.clear();
    for (size_t i = 0; i < bucket_bytes.size(); ++i) fused_.push_back(std::make_unique<Fused>());
  }
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

Status CudaGradients::Stage(int bucket, size_t offset, const void* data, size_t count, DType dtype,
                            bool add, void* stream, Staging how) {
  std::lock_guard<std::mutex> lock(stage_mu_);
  int previous = 0;
  GS_RETURN_IF_ERROR(Cuda(cudaGetDevice(&previous), "cudaGetDevice"));
  GS_RETURN_IF_ERROR(Select());
  Status s =
      StageOn(bucket, offset, data, count, dtype, add, static_cast<cudaStream_t>(stream), how);
  cudaSetDevice(previous);  // the trainer's thread keeps its device
  return s;
}

Status CudaGradients::StageOn(int bucket, size_t offset, const void* data, size_t count,
                              DType dtype, bool add, cudaStream_t stream, Staging how) {
  if (!add && dtype == DType::kF32 && how != Staging::kNow) {
    Fused& f = *fused_.at(static_cast<size_t>(bucket));
    // The pack kernel reads `tensor` only.
    f.gathered.push_back(
        {static_cast<float*>(const_cast<void*>(data)), offset / sizeof(float), count});
    if (std::find(f.streams.begin(), f.streams.end(), stream) == f.streams.end()) {
      f.streams.push_back(stream);
    }
    return how == Staging::kGatherLast ? FlushLocked(bucket) : Status();
  }
  // An addition comes after the bucket's copies gathered so far.
  GS_RETURN_IF_ERROR(FlushLocked(bucket));
  GS_RETURN_IF_ERROR(StageAfter(bucket, stream));
  GS_RETURN_IF_ERROR(StageCopy(bucket, offset, data, count, dtype, add));
  return Cuda(cudaEventRecord(Staged(bucket), stage_stream_), "cudaEventRecord");
}

Status CudaGradients::StageAfter(int bucket, cudaStream_t stream) {
  // The staging stream waits for the trainer's work so far (the backward
  // kernel that produced the gradient) and for the copies out of the
  // bucket's last reduction; the trainer's stream does not wait.
  GS_RETURN_IF_ERROR(
      Cuda(cudaEventRecord(event_, stream), "cudaEventRecord on the trainer's stream"));
  GS_RETURN_IF_ERROR(Cuda(cudaStreamWaitEvent(stage_stream_, event_, 0), "cudaStreamWaitEvent"));
  return Cuda(cudaStreamWaitEvent(stage_stream_, Reduced(bucket), 0), "cudaStreamWaitEvent");
}

Status CudaGradients::FlushLocked(int bucket) {
  Fused& f = *fused_.at(static_cast<size_t>(bucket));
  if (f.gathered.empty()) return Status();
  // After the trainer's work on each stream the copies came from.
  for (cudaStream_t stream : f.streams) GS_RETURN_IF_ERROR(StageAfter(bucket, stream));
  size_t elems = 0;
  for (const kernels::BucketSlice& g : f.gathered) elems = std::max(elems, g.offset + g.count);
  GS_ASSIGN_OR_RETURN(const kernels::BucketSlice* table,
                      Upload(f.gathered, elems, f.pack_host, f.pack_slices, stage_stream_));
  const size_t n = f.gathered.size();
  f.gathered.clear();
  f.streams.clear();
  GS_RETURN_IF_ERROR(kernels::PackBucketCuda(
      table, n, elems, reinterpret_cast<float*>(Bucket(bucket)), stage_stream_));
  return Cuda(cudaEventRecord(Staged(bucket), stage_stream_), "cudaEventRecord");
}

StatusOr<const kernels::BucketSlice*> CudaGradients::Upload(
    std::vector<kernels::BucketSlice>& slices, size_t elems, PinnedBuffer& host, DeviceBuffer& dev,
    cudaStream_t stream) {
  std::sort(slices.begin(), slices.end(),
            [](const kernels::BucketSlice& a, const kernels::BucketSlice& b) {
              return a.offset < b.offset;
            });
  GS_RETURN_IF_ERROR(kernels::ValidateSlices(slices.data(), slices.size(), elems));
  const size_t bytes = slices.size() * sizeof(kernels::BucketSlice);
  GS_RETURN_IF_ERROR(host.Reserve(bytes, "a bucket's slice table"));
  GS_RETURN_IF_ERROR(dev.Reserve(bytes, "a bucket's slice table"));
  std::memcpy(host.get(), slices.data(), bytes);
  GS_RETURN_IF_ERROR(
      Cuda(cudaMemcpyAsync(dev.get(), host.get(), bytes, cudaMemcpyHostToDevice, stream),
           "copying a bucket's slice table to the device"));
  return reinterpret_cast<const kernels::BucketSlice*>(dev.get());
}

Status CudaGradients::StageCopy(int bucket, size_t offset, const void* data, size_t count,
                                DType dtype, bool add) {
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

Status CudaGradients::Unstage(int bucket, const std::vector<Slice>& slices, DType dtype) {
  GS_RETURN_IF_ERROR(Select());
  const bool widen = bucket == wire_result_;
  wire_result_ = -1;
  if (dtype == DType::kF32 && (slices.size() > 1 || widen)) {
    Fused& f = *fused_.at(static_cast<size_t>(bucket));
    std::vector<kernels::BucketSlice>& table = f.unpack;
    table.clear();
    size_t elems = 0;
    for (const Slice& s : slices) {
      table.push_back(
          {static_cast<float*>(s.data), s.offset_bytes / sizeof(float), s.bytes / sizeof(float)});
      elems = std::max(elems, table.back().offset + table.back().count);
    }
    GS_ASSIGN_OR_RETURN(const kernels::BucketSlice* dev,
                        Upload(table, elems, f.unpack_host, f.unpack_slices, stream_));
    if (widen) {
      GS_RETURN_IF_ERROR(
          kernels::UnpackBucket16Cuda(kernels::Float16Format::kFp16, dev, table.size(), elems,
                                      reinterpret_cast<const uint16_t*>(wire_.get()), stream_));
    } else {
      GS_RETURN_IF_ERROR(kernels::UnpackBucketCuda(
          dev, table.size(), elems, reinterpret_cast<const float*>(Bucket(bucket)), stream_));
    }
  } else {
    for (const Slice& s : slices) {
      GS_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(s.data, Bucket(bucket) + s.offset_bytes, s.bytes,
                                              cudaMemcpyDeviceToDevice, stream_),
                              "copying a synchronised gradient back to its tensor"));
    }
  }
  // The next staging into this bucket waits for the copies out of it.
  return Cuda(cudaEventRecord(Reduced(bucket), stream_), "cudaEventRecord");
}

Status CudaGradients::WaitStaged(int bucket, Deadline deadline) {
  GS_RETURN_IF_ERROR(Select());
  {
    std::lock_guard<std::mutex> lock(stage_mu_);
    GS_RETURN_IF_ERROR(FlushLocked(bucket));
  }
  return Poll([&] { return cudaEventQuery(Staged(bucket)); },
              "the staging of bucket " + std::to_string(bucket), deadline);
}

Status CudaGradients::Wait(Deadline deadline) {
  return Poll([&] { return cudaStreamQuery(stream_); }, "gradsync's stream", deadline);
}

Status CudaGradients::Copy(void* dst, const void* src, size_t bytes) {
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

StatusOr<uint8_t*> CudaGradients::Scratch(size_t bytes) {
  GS_RETURN_IF_ERROR(Select());
  GS_RETURN_IF_ERROR(direct_.Reserve(bytes, "a collective's device copy"));
  return direct_.get();
}

int VisibleCudaDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky error
    return 0;
  }
  return count;
}

StatusOr<std::unique_ptr<BucketMemory>> MakeDeviceGradients(int device) {
  auto g = std::make_unique<CudaGradients>(device);
  GS_RETURN_IF_ERROR(g->Init());
  return std::unique_ptr<BucketMemory>(std::move(g));
}

}  // namespace gradsync::client
