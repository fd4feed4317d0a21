// Helpers for the compressor tests: gradient-like random inputs, the sizes
// every property is checked at, and a round trip through an unaligned wire
// buffer that checks the compressor wrote exactly WireBytes(n) bytes.
#ifndef GRADSYNC_COMPRESSION_TEST_UTIL_H_
#define GRADSYNC_COMPRESSION_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "compression/compressor.h"
#include "gtest/gtest.h"

namespace gradsync::compression::testing_util {

// 0, 1, odd, chunk-boundary and large sizes.
inline std::vector<size_t> TestSizes() {
  return {0, 1, 2, 7, 8, 9, 31, 63, 511, 512, 513, 1000, 4097, 65537, (1u << 20) + 3};
}

inline std::vector<float> Gaussian(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> Laplace(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::exponential_distribution<float> dist(1.0f / scale);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> v(n);
  for (float& x : v) x = sign(rng) ? dist(rng) : -dist(rng);
  return v;
}

// Magnitudes 2^U(lo_exp, hi_exp) with random signs: spans many binades.
inline std::vector<float> LogUniform(size_t n, float lo_exp, float hi_exp, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(lo_exp, hi_exp);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> v(n);
  for (float& x : v) x = (sign(rng) ? 1.0f : -1.0f) * std::exp2(exponent(rng));
  return v;
}

inline std::vector<float> Uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Compresses `in` into a buffer that starts one byte past an aligned address
// and ends with a sentinel, checks the sentinel survived, and returns the
// wire bytes (exactly WireBytes(n) of them).
inline std::vector<uint8_t> CompressUnaligned(Compressor& c, const std::vector<float>& in,
                                              const CompressContext& ctx) {
  const size_t bytes = c.WireBytes(in.size());
  std::vector<uint8_t> storage(bytes + 2, 0xA5);
  Status s = c.Compress(in.data(), in.size(), ctx, storage.data() + 1, bytes + 1);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(storage[bytes + 1], 0xA5) << "wrote past WireBytes(n)";
  return std::vector<uint8_t>(storage.begin() + 1, storage.end() - 1);
}

// Decompresses `wire` from an unaligned copy into n floats.
inline std::vector<float> DecompressUnaligned(Compressor& c, const std::vector<uint8_t>& wire,
                                              size_t n, const CompressContext& ctx) {
  std::vector<uint8_t> storage(wire.size() + 1);
  if (!wire.empty()) std::copy(wire.begin(), wire.end(), storage.begin() + 1);
  std::vector<float> out(n, std::nanf(""));
  Status s = c.Decompress(storage.data() + 1, wire.size(), n, ctx, out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

inline std::vector<float> RoundTrip(Compressor& c, const std::vector<float>& in,
                                    const CompressContext& ctx) {
  return DecompressUnaligned(c, CompressUnaligned(c, in, ctx), in.size(), ctx);
}

// The size checks every compressor promises: short output and wrong-sized
// input are InvalidArgument naming both sizes, and nothing is written.
inline void ExpectSizeChecks(Compressor& c, size_t n) {
  const std::vector<float> in = Gaussian(n, 1.0f, 99);
  const size_t bytes = c.WireBytes(n);
  if (bytes > 0) {
    std::vector<uint8_t> out(bytes - 1, 0x5A);
    Status s = c.Compress(in.data(), n, {}, out.data(), out.size());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(std::to_string(bytes)), std::string::npos) << s;
    EXPECT_EQ(out, std::vector<uint8_t>(bytes - 1, 0x5A));
  }
  for (size_t wrong : {bytes + 1, bytes == 0 ? size_t{3} : bytes - 1}) {
    std::vector<uint8_t> wire(wrong, 0);
    std::vector<float> out(n, 7.0f);
    Status s = c.Decompress(wire.data(), wire.size(), n, {}, out.data());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(std::to_string(bytes)), std::string::npos) << s;
    EXPECT_NE(s.message().find(std::to_string(wrong)), std::string::npos) << s;
    EXPECT_EQ(out, std::vector<float>(n, 7.0f));
  }
}

}  // namespace gradsync::compression::testing_util

#endif  // GRADSYNC_COMPRESSION_TEST_UTIL_H_
