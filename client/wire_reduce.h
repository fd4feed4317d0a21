// The one reducer of compressed buckets: compress, then all-reduce (the
// summable codes) or all-gather and decode each rank's bytes in rank order,
// then divide by the world size. Host buckets (BucketCompression, with the
// CPU compressors) and CUDA buckets (CudaGradients, with the device
// kernels) both run it; they differ only in their BucketCodec (what the
// bytes are) and their ReduceSpace (where the buffers live and how they are
// added, divided and copied).
//
// A space whose memory the collectives cannot take (GPU memory and the CPU
// ring) crosses through host buffers of the space: the wire bytes go to the
// host, through the collective, and back; gathered bytes are checked
// (BucketCodec::Check) on the host before the device reads them.
//
// Thread-safety: none; one reduction at a time per space.
#ifndef GRADSYNC_CLIENT_WIRE_REDUCE_H_
#define GRADSYNC_CLIENT_WIRE_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "client/collectives.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/time.h"

namespace gradsync::client {

// What one reduction moved, in compressed form.
struct WireTraffic {
  size_t sent = 0;        // the bytes this rank contributed
  size_t received = 0;    // the bytes of the result it received: as much as it
                          // sent through an all-reduce, the other ranks'
                          // contributions through an all-gather
  bool gathered = false;  // all-gather, not all-reduce
};

// What a codec makes of one bucket's values, data[0, n): the bytes that
// travel and how they are combined and decoded. Made once per reduction by
// whoever holds the bucket (its compressor's host form, or the device
// kernels); the reducer only calls it. The methods read and write memory of
// the space the reduction runs in.
class BucketCodec {
 public:
  // Summable: `elems` values of `dtype` travel and the collective sums them;
  // otherwise `wire_bytes` opaque bytes are gathered from every rank.
  struct Shape {
    bool summable = false;
    DType dtype = DType::kU8;
    size_t elems = 0;
    size_t wire_bytes = 0;
  };
  virtual ~BucketCodec() = default;
  const Shape& shape() const { return shape_; }
  // wire[0, wire_bytes) = the code of data (and of the residual, with error
  // feedback).
  virtual Status Encode(uint8_t* wire) = 0;
  // Whether EncodeDivided is there (summable codes only).
  virtual bool EncodesDivided() const { return false; }
  // The code of data / divisor, data unchanged, in one pass; the reduced
  // wire values are then the result (ReduceWire leaves them in the wire
  // buffer, *in_wire says so).
  virtual Status EncodeDivided(uint8_t*, float) {
    return InternalError("this codec does not divide as it encodes");
  }
  // Vets rank `rank`'s bytes in host memory before the space's memory gets
  // them. OK by default: the codec's Decode checks them itself.
  virtual Status Check(const uint8_t*, int) const { return Status(); }
  // out[0, n) = the values `wire` encodes.
  virtual Status Decode(const uint8_t* wire, float* out) = 0;

 protected:
  Shape shape_;  // set by the codec before the reducer gets it
};

// Whether a summable code whose wire values are `summed` has the bucket
// divided by the world size before it encodes, so that the sum is the
// average: fp16, whose sums overflow past 65504.
inline bool DividesBeforeSum(DType summed) { return summed == DType::kF16; }

// Where a reduction's buffers live, and the element-wise work on them.
class ReduceSpace {
 public:
  enum class Slot {
    kWire,          // this rank's code (and the sum of a summable one)
    kGathered,      // every rank's code, in rank order
    kScratch,       // one rank's decoded values, and realigned bytes
    kHostWire,      // host copies for collectives that take host memory
    kHostGathered,  // only (device spaces)
  };
  static constexpr size_t kSlots = 5;
  virtual ~ReduceSpace() = default;
  // Whether the buffers are device memory.
  virtual bool device() const = 0;
  // A buffer of at least `bytes` for `slot`, kept and reused.
  virtual StatusOr<uint8_t*> Buffer(Slot slot, size_t bytes) = 0;
  // data[i] /= divisor for i < n.
  virtual Status Divide(float* data, size_t n, int divisor) = 0;
  // data[i] += add[i] for i < n.
  virtual Status SumInto(float* data, const float* add, size_t n) = 0;
  // Bytes of this space for a decoder that reads 4-byte values: `part`
  // itself where it is aligned, else a copy in `aligned`.
  virtual StatusOr<const uint8_t*> Aligned(const uint8_t* part, size_t bytes, uint8_t* aligned) = 0;
  // Copies between host memory and this space's (device spaces only); ToHost
  // returns when the bytes are there, ToDevice queues the copy.
  virtual Status ToHost(uint8_t* host, const uint8_t* mine, size_t bytes, Deadline deadline) = 0;
  virtual Status ToDevice(uint8_t* mine, const uint8_t* host, size_t bytes) = 0;
  // Waits until the work queued on this space is done (before a collective
  // reads its memory).
  virtual Status Wait(Deadline deadline) = 0;
};

// Averages data[0, n) (f32, memory of `space`) over the ranks of `backend`
// with `code`. `*in_wire`: the result was left in the kWire buffer as
// `code.shape().dtype` values (BucketCodec::EncodeDivided) rather than in `data`.
Status ReduceWire(BucketCodec& code, float* data, size_t n, ReduceSpace& space,
                  Collectives& backend, const OpTag& tag, Deadline deadline, WireTraffic* traffic,
                  bool* in_wire);

// The host-memory space: buffers of its own, the CPU's arithmetic.
class HostReduceSpace : public ReduceSpace {
 public:
  bool device() const override { return false; }
  StatusOr<uint8_t*> Buffer(Slot slot, size_t bytes) override;
  Status Divide(float* data, size_t n, int divisor) override;
  Status SumInto(float* data, const float* add, size_t n) override;
  StatusOr<const uint8_t*> Aligned(const uint8_t* part, size_t, uint8_t*) override {
    return part;  // the CPU decoders read unaligned bytes
  }
  Status ToHost(uint8_t*, const uint8_t*, size_t, Deadline) override;
  Status ToDevice(uint8_t*, const uint8_t*, size_t) override;
  Status Wait(Deadline) override { return Status(); }

 private:
  std::vector<uint8_t> buffers_[kSlots];
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_WIRE_REDUCE_H_
