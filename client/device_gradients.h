// DeviceGradients: the gradient buckets of a Communicator whose tensors are
// CUDA memory (gradient_device=cuda). The buckets live on the GPU; gradients
// never pass through host memory except as the compressed bytes a host
// backend must carry.
//
// - Stage copies a tensor's gradient into its bucket (device to device) on
//   gradsync's staging stream, ordered after the work the trainer queued on
//   its stream (an event recorded there; the trainer's stream is never
//   synchronised, the call never waits). fp32 copies are gathered per
//   bucket and go in as one fused pack kernel when the bucket's last
//   tensor comes (or, at the latest, when the bucket is first used): a few
//   CUDA calls a bucket instead of several a tensor. Each bucket records an
//   event after its staging; the bucket's reduction, on gradsync's work
//   stream, waits for that event only, so it starts as soon as its own
//   gradients are staged, while the backward pass goes on for later
//   buckets.
// - Reduce averages a bucket over the ranks:
//   * NCCL takes the device bucket itself (in place, no host staging).
//   * A host backend (the CPU ring) gets only the bytes that travel: the
//     bucket, or what the device compressor made of it, copied to pinned
//     host memory and back; decompression happens on the device.
//   * Compression runs on the device with the kernels of
//     kernels/compress_kernels.h for fp16, bf16, top-k (also topk_sampled,
//     which selects the same set), random-k, sign and QSGD, each with or
//     without error feedback, with the same wire bytes and the same result
//     bits as the CPU compressors (BucketCompression). PowerSGD runs `host`
//     on a pinned copy of the bucket.
//   * The parameter-server path: each partition of a compressed bucket is
//     compressed on the device (EncodePartition) and only its bytes cross
//     to the host; the shards' replies come back into a pinned copy that
//     goes to the device.
// - Unstage copies the averaged bucket back into its tensors (fp32: one
//   fused unpack kernel); Wait waits for gradsync's stream, bounded by a
//   deadline.
//
// Errors: InvalidArgument for a pointer that is not memory of this device;
// FailedPrecondition when GPU (or pinned host) memory cannot be had, naming
// what the GPU has free and what gradsync holds;
// Internal naming the CUDA call that failed; DeadlineExceeded when the GPU
// work does not finish in time; the backend's errors.
// Thread-safety: Stage and CheckPointer may be called from any thread;
// everything else from the comm engine thread only.
#ifndef GRADSYNC_CLIENT_DEVICE_GRADIENTS_H_
#define GRADSYNC_CLIENT_DEVICE_GRADIENTS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/bucket_compression.h"
#include "client/collectives.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/time.h"

namespace gradsync::client {

class DeviceGradients {
 public:
  // Averages a bucket held in host memory: the parameter-server path and
  // the compressors without a device form.
  using HostReduce = std::function<Status(uint8_t* data, BucketCompression::Traffic* traffic)>;

  virtual ~DeviceGradients() = default;

  virtual int device() const = 0;
  // OK when `data` is memory of this device; InvalidArgument naming `what`
  // and where the memory is otherwise.
  virtual Status CheckPointer(const void* data, const std::string& what) const = 0;
  // One device buffer per bucket, bucket_bytes[i] long. Once.
  virtual Status Allocate(const std::vector<size_t>& bucket_bytes) = 0;
  // How Stage queues a copy (not an addition) of fp32: at once, or
  // gathered for the bucket's one pack kernel, which goes when the
  // bucket's last tensor comes (kGatherLast, the caller's hint), or at an
  // addition into the same bucket or the bucket's first use below,
  // whichever is first. A bucket is packed once a step: callers whose
  // copies may be waited for one by one (NoSync) copy at once.
  enum class Staging { kNow, kGather, kGatherLast };
  // bucket[offset, offset + count elements) = data (add: += data), after
  // the work queued on `stream` (a cudaStream_t; null is the default
  // stream). Never waits. A gathered copy comes after the trainer's work
  // on `stream` up to its pack, so `data` must hold the gradient,
  // unchanged, until then (it is written back into after the reduction
  // anyway).
  virtual Status Stage(int bucket, size_t offset_bytes, const void* data, size_t count, DType dtype,
                       bool add, void* stream, Staging how) = 0;
  // Averages bucket[0, count) over the ranks through `backend` with the
  // compressor `spec` (BucketCompression::SpecOf; "none" for f16 and bf16
  // buckets); `host` when the work cannot stay on the device. `seed` is the
  // compressors' job-wide seed (CompressContext::seed).
  virtual Status Reduce(int bucket, size_t count, DType dtype, const std::string& spec,
                        Collectives& backend, const OpTag& tag, uint64_t seed, Deadline deadline,
                        BucketCompression::Traffic* traffic, const HostReduce& host) = 0;
  // Averages bucket[0, bytes) through `host` on a pinned host copy, which
  // `host` leaves the result in. `copy_in`: the copy first receives the
  // bucket; otherwise `host` reads none of it (the parameter-server path
  // when every push comes from EncodePartition).
  virtual Status ReduceOnHost(int bucket, size_t bytes, bool copy_in, Deadline deadline,
                              BucketCompression::Traffic* traffic, const HostReduce& host) = 0;
  // Compresses elements [offset, offset + count) of bucket `bucket` (f32)
  // with `spec` and `ctx` on the device, with an error-feedback residual of
  // its own per (bucket, partition), and returns the compressed bytes in
  // host memory: what compression::PayloadEncoder makes of the same values.
  // InvalidArgument for a spec without a device form.
  virtual StatusOr<std::shared_ptr<std::vector<uint8_t>>> EncodePartition(
      int bucket, uint32_t partition, size_t offset, size_t count, const std::string& spec,
      const compression::CompressContext& ctx, Deadline deadline) = 0;
  // One tensor's place in a bucket, for Unstage.
  struct Slice {
    size_t offset_bytes = 0;
    void* data = nullptr;
    size_t bytes = 0;
  };
  // slice.data = bucket[offset, offset + bytes) for each slice (disjoint
  // regions of a bucket of `dtype`), queued on gradsync's stream.
  virtual Status Unstage(int bucket, const std::vector<Slice>& slices, DType dtype) = 0;
  // Waits until gradsync's work stream has done everything queued on it
  // (not the staging of buckets that no call above has taken up yet).
  virtual Status Wait(Deadline deadline) = 0;
  // Waits until everything staged into `bucket` so far is done: the tensors
  // handed to Stage are free again.
  virtual Status WaitStaged(int bucket, Deadline deadline) = 0;
  // dst = src for `bytes`, each host or device memory; returns when done.
  virtual Status Copy(void* dst, const void* src, size_t bytes) = 0;
  // Device memory of at least `bytes`, kept and reused by the next call
  // (the direct collectives' copy of the caller's data).
  virtual StatusOr<uint8_t*> Scratch(size_t bytes) = 0;
  // GPU memory gradsync holds in this process (buckets, compression and
  // copy buffers), in bytes. A failed allocation says it, beside what the
  // GPU has free.
  virtual size_t DeviceBytes() const = 0;
};

// The gradients of CUDA device `device`. FailedPrecondition when gradsync
// was built without CUDA; Internal when the device cannot be used.
StatusOr<std::unique_ptr<DeviceGradients>> MakeDeviceGradients(int device);
// How many CUDA devices this process sees (0 without CUDA or a driver).
int VisibleCudaDevices();

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_DEVICE_GRADIENTS_H_
