#include "compression/compressor.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "compression/none_compressor.h"
#include "gtest/gtest.h"

namespace gradsync::compression {
namespace {

// n values that include the awkward ones: -0, infinities, a NaN with a
// payload, subnormals.
std::vector<float> Gradients(size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(n));
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  const float specials[] = {
      -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < n && i < 5; ++i) v[(i * 613) % n] = specials[i];
  return v;
}

// Bit-for-bit equality (NaN payloads and -0 included); safe for empty vectors.
bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

class NoneRoundTripTest : public ::testing::TestWithParam<size_t> {};

TEST_P(NoneRoundTripTest, IsBitExactThroughUnalignedBuffers) {
  const size_t n = GetParam();
  NoneCompressor c;
  const CompressContext ctx{/*seed=*/7, /*step=*/3, /*bucket_id=*/1};
  const std::vector<float> in = Gradients(n);
  const size_t bytes = c.WireBytes(n);
  ASSERT_EQ(bytes, n * sizeof(float));

  // Offset 1 so the wire bytes are not float-aligned; a sentinel byte after
  // them shows that exactly WireBytes(n) bytes are written.
  std::vector<uint8_t> storage(bytes + 2, 0xAB);
  uint8_t* wire = storage.data() + 1;
  ASSERT_TRUE(c.Compress(in.data(), n, ctx, wire, bytes + 1).ok());
  EXPECT_EQ(storage[bytes + 1], 0xAB);

  std::vector<float> out(n, 42.0f);
  ASSERT_TRUE(c.Decompress(wire, bytes, n, ctx, out.data()).ok());
  EXPECT_TRUE(BitEqual(in, out));
}

INSTANTIATE_TEST_SUITE_P(Sizes, NoneRoundTripTest, ::testing::Values(0, 1, 7, 4097));

TEST(NoneCompressorTest, DescribesItself) {
  NoneCompressor c;
  EXPECT_EQ(c.name(), "none");
  EXPECT_TRUE(c.summable());
  EXPECT_EQ(c.WireBytes(0), 0u);
  EXPECT_EQ(c.WireBytes(1000), 4000u);
}

TEST(NoneCompressorTest, CompressRejectsShortOutputAndWritesNothing) {
  NoneCompressor c;
  const std::vector<float> in = Gradients(7);
  std::vector<uint8_t> out(27, 0xAB);
  Status s = c.Compress(in.data(), 7, {}, out.data(), out.size());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("28"), std::string::npos) << s;
  EXPECT_NE(s.message().find("27"), std::string::npos) << s;
  EXPECT_EQ(out, std::vector<uint8_t>(27, 0xAB));
}

TEST(NoneCompressorTest, DecompressRejectsWrongInputSizeAndWritesNothing) {
  NoneCompressor c;
  std::vector<uint8_t> wire(29, 0);
  std::vector<float> out(7, 42.0f);
  for (size_t in_size : {27u, 29u}) {
    Status s = c.Decompress(wire.data(), in_size, 7, {}, out.data());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("28"), std::string::npos) << s;
    EXPECT_NE(s.message().find(std::to_string(in_size)), std::string::npos) << s;
  }
  EXPECT_EQ(out, std::vector<float>(7, 42.0f));
}

TEST(NoneCompressorTest, RejectsCountsWhoseByteSizeOverflows) {
  NoneCompressor c;
  // 2^62 + 1 elements would wrap around to 4 bytes.
  const size_t n = (std::numeric_limits<size_t>::max() / 4) + 2;
  uint8_t wire[4] = {};
  float out = 0.0f;
  EXPECT_EQ(c.Decompress(wire, c.WireBytes(n), n, {}, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Compress(&out, n, {}, wire, sizeof(wire)).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradsync::compression
