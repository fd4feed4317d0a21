#include "client/ring_plan.h"

namespace gradsync::client {
namespace {

// splitmix64's finaliser: every input bit affects every output bit.
uint64_t Mix(uint64_t h, uint64_t v) {
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

const char* RingOpName(RingOpKind kind) {
  switch (kind) {
    case RingOpKind::kAllReduce:
      return "allreduce";
    case RingOpKind::kAllGather:
      return "allgather";
    case RingOpKind::kBroadcast:
      return "broadcast";
    case RingOpKind::kLayout:
      return "layout check";
  }
  return "unknown";
}

uint64_t RingFingerprint(RingOpKind kind, const OpTag& tag, DType dtype, uint64_t count,
                         uint64_t extra) {
  uint64_t h = Mix(0x6772616473796e63ULL, static_cast<uint64_t>(kind));
  for (uint64_t v : {tag.step, uint64_t{tag.bucket}, tag.seq, tag.names_hash, uint64_t{tag.epoch},
                     static_cast<uint64_t>(dtype), count, extra}) {
    h = Mix(h, v);
  }
  return h;
}

Span Segment(size_t count, int world, int seg) {
  const size_t n = static_cast<size_t>(world);
  const size_t s = static_cast<size_t>(seg);
  const size_t base = count / n;
  const size_t extra = count % n;  // the first `extra` segments hold one more
  Span span;
  span.begin = s * base + (s < extra ? s : extra);
  span.end = span.begin + base + (s < extra ? 1 : 0);
  return span;
}

size_t NumChunks(Span span, size_t chunk_elems) {
  return (span.size() + chunk_elems - 1) / chunk_elems;
}

Span Chunk(Span span, size_t chunk_elems, size_t j) {
  Span c;
  c.begin = span.begin + j * chunk_elems;
  c.end = c.begin + chunk_elems < span.end ? c.begin + chunk_elems : span.end;
  return c;
}

uint64_t HashName(const char* data, size_t size, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ULL ^ seed;
  for (size_t i = 0; i < size; ++i) {
    h ^= static_cast<uint8_t>(data[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace gradsync::client
