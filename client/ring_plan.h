// The arithmetic of the ring collectives, shared by every rank: how a buffer
// is cut into segments and chunks, and the fingerprint that ranks compare.
// Pure functions, so each rank derives the same plan from the same inputs.
#ifndef GRADSYNC_CLIENT_RING_PLAN_H_
#define GRADSYNC_CLIENT_RING_PLAN_H_

#include <cstddef>
#include <cstdint>

#include "client/collectives.h"
#include "common/dtype.h"

namespace gradsync::client {

enum class RingOpKind : uint8_t { kAllReduce = 1, kAllGather = 2, kBroadcast = 3, kLayout = 4 };

// "allreduce", "allgather", "broadcast", "layout check".
const char* RingOpName(RingOpKind kind);

// A 64-bit digest of everything ranks must agree on. `extra` holds what is
// specific to the operation (the broadcast root).
uint64_t RingFingerprint(RingOpKind kind, const OpTag& tag, DType dtype, uint64_t count,
                         uint64_t extra);

// A half-open range of elements.
struct Span {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};

// Segment `seg` of `count` elements cut into `world` nearly equal parts.
Span Segment(size_t count, int world, int seg);
// The chunks of a span, each at most `chunk_elems` (> 0) elements.
size_t NumChunks(Span span, size_t chunk_elems);
Span Chunk(Span span, size_t chunk_elems, size_t j);

// (a mod n) for possibly negative a.
inline int RingIndex(int a, int n) { return ((a % n) + n) % n; }

// 64-bit FNV-1a of a string, for hashing tensor names.
uint64_t HashName(const char* data, size_t size, uint64_t seed);

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_RING_PLAN_H_
