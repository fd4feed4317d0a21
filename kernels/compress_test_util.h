// Inputs and comparisons shared by the compression kernel tests: a
// deterministic value generator (defined here bit for bit, so the expected
// digests in compress_cpu_test.cc can be recomputed with the compression/
// compressors), the sizes every property is checked at, and a NaN-aware
// bitwise comparison.
#ifndef GRADSYNC_KERNELS_COMPRESS_TEST_UTIL_H_
#define GRADSYNC_KERNELS_COMPRESS_TEST_UTIL_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace gradsync::kernels::testing_util {

inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Gradient-like values over 2^-20 .. 2^12 with random signs, about 1 in 32
// each of +0, -0 and a repeated magnitude (+-0.375, for ties); with
// `specials` also +-inf and NaN, about 1 in 256 each.
inline std::vector<float> TestValues(size_t n, uint64_t seed, bool specials = false) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = Mix64(seed * 0x100000001B3ull + i);
    const uint32_t kind = static_cast<uint32_t>(r & 0xFF);
    if (specials && kind == 0) {
      v[i] = (r >> 8) & 1 ? std::numeric_limits<float>::infinity()
                          : -std::numeric_limits<float>::infinity();
    } else if (specials && kind == 1) {
      v[i] = std::numeric_limits<float>::quiet_NaN();
    } else if (kind < 10) {
      v[i] = 0.0f;
    } else if (kind < 18) {
      v[i] = -0.0f;
    } else if (kind < 26) {
      v[i] = (r >> 8) & 1 ? 0.375f : -0.375f;
    } else {
      const int32_t mantissa =
          static_cast<int32_t>((r >> 8) & 0xFFFFFF) - 0x800000;  // [-2^23, 2^23)
      const int exponent = static_cast<int>((r >> 40) % 32) - 20;
      v[i] = std::ldexp(static_cast<float>(mantissa) / 8388608.0f, exponent);
    }
  }
  return v;
}

// 0, 1, around warps, bytes, chunks and tiles, and a few large ones.
inline std::vector<size_t> TestSizes() {
  return {0, 1, 7, 8, 9, 31, 32, 33, 63, 511, 512, 513, 1000, 1023, 4097, 65537};
}

inline uint64_t Fnv1a(const void* data, size_t bytes, uint64_t h = 14695981039346656037ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Index of the first element where a and b differ bitwise (two NaNs count
// as equal whatever their payloads), or -1 if none.
inline long FirstDifference(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (Bits(a[i]) != Bits(b[i]) && !(std::isnan(a[i]) && std::isnan(b[i]))) {
      return static_cast<long>(i);
    }
  }
  return -1;
}

inline std::string DescribeDifference(const float* got, const float* want, size_t n) {
  const long i = FirstDifference(got, want, n);
  if (i < 0) return "equal";
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "first difference at %ld of %zu: got %.9g (0x%08x), want %.9g (0x%08x)", i, n,
                got[i], Bits(got[i]), want[i], Bits(want[i]));
  return buf;
}

}  // namespace gradsync::kernels::testing_util

#endif  // GRADSYNC_KERNELS_COMPRESS_TEST_UTIL_H_
