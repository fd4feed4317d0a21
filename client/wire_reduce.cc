#include "client/wire_reduce.h"

#include <cstring>

#include "client/elementwise.h"

namespace gradsync::client {
namespace {

using Slot = ReduceSpace::Slot;

// Sums the code's values at `wire` over the ranks, through host copies
// where the collectives cannot take the space's memory.
Status SumWire(const BucketCodec::Shape& shape, uint8_t* wire, size_t wb, ReduceSpace& space,
               Collectives& backend, const OpTag& tag, Deadline deadline) {
  if (!space.device() || backend.takes_device_memory()) {
    GS_RETURN_IF_ERROR(space.Wait(deadline));
    return backend.AllReduce(wire, shape.elems, shape.dtype, ReduceOp::kSum, tag, deadline);
  }
  GS_ASSIGN_OR_RETURN(uint8_t * host, space.Buffer(Slot::kHostWire, wb + 4));
  GS_RETURN_IF_ERROR(space.ToHost(host, wire, wb, deadline));
  GS_RETURN_IF_ERROR(
      backend.AllReduce(host, shape.elems, shape.dtype, ReduceOp::kSum, tag, deadline));
  return space.ToDevice(wire, host, wb);
}

// gathered[r * wb, (r + 1) * wb) = rank r's code, for every rank; each
// checked on the host before a device space gets it.
Status GatherWire(const BucketCodec& code, const uint8_t* wire, size_t wb, uint8_t* gathered,
                  ReduceSpace& space, Collectives& backend, const OpTag& tag, Deadline deadline) {
  const size_t world = static_cast<size_t>(backend.world_size());
  const bool direct = !space.device() || backend.takes_device_memory();
  if (direct) {
    GS_RETURN_IF_ERROR(space.Wait(deadline));
    GS_RETURN_IF_ERROR(backend.AllGather(wire, wb, gathered, tag, deadline));
    if (space.device()) return Status();  // a device collective: the peers' own checks
    for (size_t r = 0; r < world; ++r) {
      GS_RETURN_IF_ERROR(code.Check(gathered + r * wb, static_cast<int>(r)));
    }
    return Status();
  }
  GS_ASSIGN_OR_RETURN(uint8_t * host, space.Buffer(Slot::kHostWire, wb + 4));
  GS_ASSIGN_OR_RETURN(uint8_t * host_gathered, space.Buffer(Slot::kHostGathered, wb * world + 4));
  GS_RETURN_IF_ERROR(space.ToHost(host, wire, wb, deadline));
  GS_RETURN_IF_ERROR(backend.AllGather(host, wb, host_gathered, tag, deadline));
  for (size_t r = 0; r < world; ++r) {
    GS_RETURN_IF_ERROR(code.Check(host_gathered + r * wb, static_cast<int>(r)));
  }
  return space.ToDevice(gathered, host_gathered, wb * world);
}

Status ReduceSummable(BucketCodec& code, float* data, size_t n, ReduceSpace& space,
                      Collectives& backend, const OpTag& tag, Deadline deadline,
                      WireTraffic* traffic, bool* in_wire) {
  const BucketCodec::Shape& shape = code.shape();
  const size_t wb = shape.elems * DTypeSize(shape.dtype);
  const int world = backend.world_size();
  GS_ASSIGN_OR_RETURN(uint8_t * wire, space.Buffer(Slot::kWire, wb + 4));
  const bool divided = DividesBeforeSum(shape.dtype);
  const bool result_in_wire = divided && code.EncodesDivided();
  if (result_in_wire) {
    GS_RETURN_IF_ERROR(code.EncodeDivided(wire, static_cast<float>(world)));
  } else {
    if (divided) GS_RETURN_IF_ERROR(space.Divide(data, n, world));
    GS_RETURN_IF_ERROR(code.Encode(wire));
  }
  *traffic = WireTraffic{wb, wb, false};
  GS_RETURN_IF_ERROR(SumWire(shape, wire, wb, space, backend, tag, deadline));
  if (result_in_wire) {
    *in_wire = true;
    return Status();
  }
  GS_RETURN_IF_ERROR(code.Decode(wire, data));
  return divided ? Status() : space.Divide(data, n, world);
}

Status ReduceGathered(BucketCodec& code, float* data, size_t n, ReduceSpace& space,
                      Collectives& backend, const OpTag& tag, Deadline deadline,
                      WireTraffic* traffic) {
  const size_t wb = code.shape().wire_bytes;
  const int world = backend.world_size();
  const size_t ranks = static_cast<size_t>(world);
  GS_ASSIGN_OR_RETURN(uint8_t * wire, space.Buffer(Slot::kWire, wb + 4));
  GS_ASSIGN_OR_RETURN(uint8_t * gathered, space.Buffer(Slot::kGathered, wb * ranks + 4));
  // One rank's values, then (4-byte aligned: n floats) realigned bytes.
  GS_ASSIGN_OR_RETURN(uint8_t * scratch, space.Buffer(Slot::kScratch, n * sizeof(float) + wb + 16));
  GS_RETURN_IF_ERROR(code.Encode(wire));
  *traffic = WireTraffic{wb, wb * (ranks - 1), true};
  GS_RETURN_IF_ERROR(GatherWire(code, wire, wb, gathered, space, backend, tag, deadline));
  // Rank 0's values land in `data`, the others are added in rank order.
  auto* values = reinterpret_cast<float*>(scratch);
  for (size_t r = 0; r < ranks; ++r) {
    GS_ASSIGN_OR_RETURN(const uint8_t* part,
                        space.Aligned(gathered + r * wb, wb, scratch + n * sizeof(float)));
    GS_RETURN_IF_ERROR(code.Decode(part, r == 0 ? data : values));
    if (r > 0) GS_RETURN_IF_ERROR(space.SumInto(data, values, n));
  }
  return space.Divide(data, n, world);
}

}  // namespace

Status ReduceWire(BucketCodec& code, float* data, size_t n, ReduceSpace& space,
                  Collectives& backend, const OpTag& tag, Deadline deadline, WireTraffic* traffic,
                  bool* in_wire) {
  *in_wire = false;
  if (code.shape().summable) {
    return ReduceSummable(code, data, n, space, backend, tag, deadline, traffic, in_wire);
  }
  return ReduceGathered(code, data, n, space, backend, tag, deadline, traffic);
}

StatusOr<uint8_t*> HostReduceSpace::Buffer(Slot slot, size_t bytes) {
  std::vector<uint8_t>& b = buffers_[static_cast<size_t>(slot)];
  if (b.size() < bytes) b.resize(bytes);
  return b.data();
}

Status HostReduceSpace::Divide(float* data, size_t n, int divisor) {
  DivideBy(reinterpret_cast<uint8_t*>(data), n, DType::kF32, divisor);
  return Status();
}

Status HostReduceSpace::SumInto(float* data, const float* add, size_t n) {
  AddInto(reinterpret_cast<uint8_t*>(data), reinterpret_cast<const uint8_t*>(add), n, DType::kF32);
  return Status();
}

Status HostReduceSpace::ToHost(uint8_t*, const uint8_t*, size_t, Deadline) {
  return InternalError("host memory has no device copy to make");
}

Status HostReduceSpace::ToDevice(uint8_t*, const uint8_t*, size_t) {
  return InternalError("host memory has no device copy to make");
}

}  // namespace gradsync::client
