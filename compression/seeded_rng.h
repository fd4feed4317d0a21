// The seeded streams of the compressors (common/seeded_random.h) keyed by a
// CompressContext, so that every rank (and every run) that sees the same
// (seed, step, bucket_id) draws the same numbers.
//
// Internal to compression/. Thread-safety: as common/seeded_random.h.
#ifndef GRADSYNC_COMPRESSION_SEEDED_RNG_H_
#define GRADSYNC_COMPRESSION_SEEDED_RNG_H_

#include <cstdint>

#include "common/seeded_random.h"
#include "compression/compressor.h"

namespace gradsync::compression {

using ::gradsync::Xoshiro256;

inline uint64_t StreamKey(const CompressContext& ctx, uint64_t salt) {
  return ::gradsync::StreamKey(ctx.seed, ctx.step, ctx.bucket_id, salt);
}

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_SEEDED_RNG_H_
