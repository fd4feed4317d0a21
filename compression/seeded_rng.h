// Deterministic random numbers derived from a CompressContext, so that every
// rank (and every run) that sees the same (seed, step, bucket_id) draws the
// same numbers. Nothing here reads global state or the clock.
//
// - StreamKey mixes the context with a per-use salt into a 64-bit key.
// - Xoshiro256 is a small sequential generator (xoshiro256**), seeded from a
//   key through SplitMix64.
//
// Internal to compression/. Thread-safety: values; an Xoshiro256 instance
// must not be shared between threads.
#ifndef GRADSYNC_COMPRESSION_SEEDED_RNG_H_
#define GRADSYNC_COMPRESSION_SEEDED_RNG_H_

#include <cstdint>

#include "compression/compressor.h"

namespace gradsync {
namespace compression {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Distinct salts give independent streams for the same context.
inline uint64_t StreamKey(const CompressContext& ctx, uint64_t salt) {
  uint64_t h = SplitMix64(ctx.seed ^ salt);
  h = SplitMix64(h ^ ctx.step);
  return SplitMix64(h ^ ctx.bucket_id);
}

class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t key) {
    for (uint64_t& word : s_) {
      key = SplitMix64(key);
      word = key;
    }
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, bound), bound > 0, exactly (Lemire's multiply-shift with
  // rejection).
  uint64_t Below(uint64_t bound) {
    __uint128_t m = static_cast<__uint128_t>(Next()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<__uint128_t>(Next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // Nearly uniform in [0, bound) for bound < 2^32 (bias below 2^-32 per
  // value); for sampling, where exactness does not matter.
  uint32_t FastBelow(uint32_t bound) {
    return static_cast<uint32_t>(((Next() >> 32) * bound) >> 32);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace compression
}  // namespace gradsync

#endif  // GRADSYNC_COMPRESSION_SEEDED_RNG_H_
