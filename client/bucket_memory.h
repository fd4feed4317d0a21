// BucketMemory: where a Communicator's gradient buckets live, behind one
// interface. Two implementations: host memory (HostBuckets, below) and
// CUDA memory (client/device_gradients.h, gradient_device=cuda). The
// Communicator stages tensors into buckets, has its backend average each
// bucket and unstages the result, the same calls for both; the backend
// either lets the memory average the bucket itself (Reduces: the device
// codes, NCCL in place) or averages a host view of it (HostView: the bucket
// itself for host memory, a pinned copy for a GPU). Nothing calls back up.
//
// Errors: InvalidArgument for a pointer that is not memory of this kind;
// FailedPrecondition when memory cannot be had; Internal naming a failed
// CUDA call; DeadlineExceeded when device work does not finish in time.
// Thread-safety: Stage and CheckPointer may be called from any thread;
// everything else from the comm engine thread only.
#ifndef GRADSYNC_CLIENT_BUCKET_MEMORY_H_
#define GRADSYNC_CLIENT_BUCKET_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/collectives.h"
#include "client/wire_reduce.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/time.h"
#include "compression/compressor.h"

namespace gradsync::client {

class BucketMemory {
 public:
  virtual ~BucketMemory() = default;

  // Whether the buckets are device memory (the tensors too, and staging
  // and unstaging are queued on a stream rather than done in the call).
  virtual bool device() const = 0;
  // OK when `data` is memory of this kind; InvalidArgument naming `what`
  // and where the memory is otherwise.
  virtual Status CheckPointer(const void* data, const std::string& what) const = 0;
  // One buffer per bucket, bucket_bytes[i] long. Once.
  virtual Status Allocate(const std::vector<size_t>& bucket_bytes) = 0;
  // How Stage queues a copy (not an addition) of fp32 on a device: at
  // once, or gathered for the bucket's one pack kernel, which goes when the
  // bucket's last tensor comes (kGatherLast, the caller's hint), or at an
  // addition into the same bucket or the bucket's first use below,
  // whichever is first. A bucket is packed once a step: callers whose
  // copies may be waited for one by one (NoSync) copy at once. Host memory
  // copies at once, always.
  enum class Staging { kNow, kGather, kGatherLast };
  // bucket[offset, offset + count elements) = data (add: += data). On a
  // device, after the work queued on `stream` (a cudaStream_t; null is the
  // default stream), and never waiting; a gathered copy comes after the
  // trainer's work on `stream` up to its pack, so `data` must hold the
  // gradient, unchanged, until then. Host memory takes no stream.
  virtual Status Stage(int bucket, size_t offset_bytes, const void* data, size_t count, DType dtype,
                       bool add, void* stream, Staging how) = 0;
  // Whether Reduce averages bucket `bucket` (of `dtype`, compressor `spec`,
  // BucketCompression::SpecOf) over `backend` itself; otherwise the caller
  // averages HostView. A device: yes unless the compressor has no device
  // form (PowerSGD) or an uncompressed bucket would cross to a host
  // backend anyway. Host memory: never.
  virtual bool Reduces(int bucket, DType dtype, const std::string& spec,
                       const Collectives& backend) = 0;
  // Averages bucket[0, count) over the ranks through `backend` (see
  // Reduces). `seed` is the compressors' job-wide seed.
  virtual Status Reduce(int bucket, size_t count, DType dtype, const std::string& spec,
                        Collectives& backend, const OpTag& tag, uint64_t seed, Deadline deadline,
                        WireTraffic* traffic) = 0;
  // Host memory holding bucket[0, bytes) until EndHostView: the bucket
  // itself, or a pinned copy. `copy_in`: the copy gets the bucket's values
  // (otherwise the caller reads none of it: the parameter-server path when
  // every push comes from EncodePartition). EndHostView makes what the
  // caller left there the bucket's values.
  virtual StatusOr<uint8_t*> HostView(int bucket, size_t bytes, bool copy_in,
                                      Deadline deadline) = 0;
  virtual Status EndHostView(int bucket, size_t bytes) = 0;
  // Compresses elements [offset, offset + count) of bucket `bucket` (f32)
  // with `spec` and `ctx` where the bucket is, with an error-feedback
  // residual of its own per (bucket, partition), and returns the compressed
  // bytes in host memory: what compression::PayloadEncoder makes of the
  // same values. Unimplemented for host memory (the PS client compresses
  // its host view itself); InvalidArgument for a spec without a device form.
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
  // regions of a bucket of `dtype`); on a device queued, done after Wait.
  virtual Status Unstage(int bucket, const std::vector<Slice>& slices, DType dtype) = 0;
  // Waits until everything queued on the buckets is done (not the staging
  // of buckets that no call above has taken up yet).
  virtual Status Wait(Deadline deadline) = 0;
  // Waits until everything staged into `bucket` so far is done: the tensors
  // handed to Stage are free again.
  virtual Status WaitStaged(int bucket, Deadline deadline) = 0;
  // dst = src for `bytes`, each memory of this kind or host memory;
  // returns when done.
  virtual Status Copy(void* dst, const void* src, size_t bytes) = 0;
  // Memory of this kind of at least `bytes`, kept and reused by the next
  // call (the direct collectives' copy of the caller's data, for a backend
  // that takes device memory).
  virtual StatusOr<uint8_t*> Scratch(size_t bytes) = 0;
  // GPU memory gradsync holds in this process (buckets, compression and
  // copy buffers), in bytes; 0 for host memory.
  virtual size_t DeviceBytes() const = 0;
};

// Buckets in host memory, 64-byte aligned.
std::unique_ptr<BucketMemory> MakeHostBuckets();

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_BUCKET_MEMORY_H_
