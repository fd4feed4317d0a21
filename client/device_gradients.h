// The gradient buckets of a Communicator whose tensors are CUDA memory
// (gradient_device=cuda): BucketMemory (client/bucket_memory.h) on a GPU. The buckets live on the
// GPU; gradients never pass through host memory except as the compressed bytes a host backend must
// carry.
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
// - Reduce averages a bucket over the ranks (the one reducer of
//   client/wire_reduce.h, with the device codes):
//   * NCCL takes the device bucket itself (in place, no host staging).
//   * A host backend (the CPU ring) gets only the bytes that travel: what
//     the device compressor made of the bucket, copied to pinned host
//     memory and back; decompression happens on the device. An
//     uncompressed bucket for a host backend goes through HostView.
//   * Compression runs on the device with the kernels of
//     kernels/compress_kernels.h for fp16, bf16, top-k (also topk_sampled,
//     which selects the same set), random-k, sign and QSGD, each with or
//     without error feedback, with the same wire bytes and the same result
//     bits as the CPU compressors (BucketCompression). PowerSGD has no
//     device form: its bucket is averaged through HostView, a pinned copy.
//   * The parameter-server path: each partition of a compressed bucket is
//     compressed on the device (EncodePartition) and only its bytes cross
//     to the host; the shards' replies come back into the pinned HostView
//     that goes to the device.
// - Unstage copies the averaged bucket back into its tensors (fp32: one
//   fused unpack kernel); Wait waits for gradsync's stream, bounded by a
//   deadline.
//
// Errors and thread-safety: as BucketMemory.
#ifndef GRADSYNC_CLIENT_DEVICE_GRADIENTS_H_
#define GRADSYNC_CLIENT_DEVICE_GRADIENTS_H_

#include <memory>

#include "client/bucket_memory.h"
#include "common/status.h"

namespace gradsync::client {

// The buckets of CUDA device `device`. FailedPrecondition when gradsync
// was built without CUDA; Internal when the device cannot be used.
StatusOr<std::unique_ptr<BucketMemory>> MakeDeviceGradients(int device);
// How many CUDA devices this process sees (0 without CUDA or a driver).
int VisibleCudaDevices();

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_DEVICE_GRADIENTS_H_
