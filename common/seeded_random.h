// Deterministic random bits from a seed, the same on every rank and on every
// device: the CPU compressors (compression/) and their CUDA kernels
// (kernels/) draw from these functions so that both produce the same bits.
//
// - SplitMix64: a 64-bit finaliser.
// - StreamKey: mixes (seed, step, bucket) with a per-use salt into a key.
// - RoundingHash: a keyed 32-bit hash of an element index (2 multiplies),
//   uniform enough for stochastic rounding and cheap in SIMD lanes.
// - Xoshiro256: a small sequential generator (xoshiro256**) seeded from a
//   key through SplitMix64 (host only).
// Nothing here reads global state or the clock.
//
// Thread-safety: pure functions; an Xoshiro256 must not be shared between
// threads.
#ifndef GRADSYNC_COMMON_SEEDED_RANDOM_H_
#define GRADSYNC_COMMON_SEEDED_RANDOM_H_

#include <cstdint>

#if defined(__CUDACC__)
#define GRADSYNC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GRADSYNC_HOST_DEVICE inline
#endif

namespace gradsync {

// Salts of the streams the compressors draw.
constexpr uint64_t kRandomKSalt = 0x72616E646F6D6B21ull;     // "randomk!": indices
constexpr uint64_t kQsgdSalt = 0x7173676452616E64ull;        // "qsgdRand": rounding
constexpr uint64_t kTopKSampleSalt = 0x746F706B53616D70ull;  // "topkSamp"

GRADSYNC_HOST_DEVICE uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Distinct salts give independent streams for the same (seed, step, bucket).
GRADSYNC_HOST_DEVICE uint64_t StreamKey(uint64_t seed, uint64_t step, uint32_t bucket_id,
                                        uint64_t salt) {
  uint64_t h = SplitMix64(seed ^ salt);
  h = SplitMix64(h ^ step);
  return SplitMix64(h ^ bucket_id);
}

GRADSYNC_HOST_DEVICE uint32_t RoundingHash(uint64_t key, uint32_t index) {
  uint32_t x = index ^ static_cast<uint32_t>(key);
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x ^ static_cast<uint32_t>(key >> 32);
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

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_SEEDED_RANDOM_H_
