#include "wire/bulk_cipher.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync::wire {
namespace {

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + 31 * i + (i >> 8));
  return v;
}

// The engines this machine runs: OpenSSL always, intel-ipsec-mb where it is
// built in and the CPU has AES-NI.
std::vector<BulkCipherEngine> Engines() {
  std::vector<BulkCipherEngine> engines = {BulkCipherEngine::kOpenssl};
  if (BulkKey::Random(BulkCipherEngine::kIpsecMb) != nullptr) {
    engines.push_back(BulkCipherEngine::kIpsecMb);
  }
  return engines;
}

TEST(BulkCipherTest, TheBestEngineIsIpsecMbOnX86WithAesNi) {
  const BulkCipherEngine best = BestBulkCipherEngine();
#if defined(__x86_64__)
  if (__builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul") &&
      __builtin_cpu_supports("sse4.2")) {
    EXPECT_EQ(best, BulkCipherEngine::kIpsecMb) << BulkCipherEngineName(best);
  }
#endif
  auto key = BulkKey::Random();
  ASSERT_NE(key, nullptr);
  EXPECT_EQ(key->engine(), best);
  EXPECT_NE(BulkCipherEngineName(BulkCipherEngine::kOpenssl).find("OpenSSL"), std::string::npos);
  EXPECT_EQ(BulkCipherEngineName(BulkCipherEngine::kBest), BulkCipherEngineName(best));
}

// Every engine writes the standard's bytes: what one seals (with or without
// associated data) the other opens, and neither opens what was altered.
TEST(BulkCipherTest, EnginesOpenEachOthersFrames) {
  const std::vector<BulkCipherEngine> engines = Engines();
  if (engines.size() < 2) GTEST_SKIP() << "intel-ipsec-mb is not available here";
  auto a = BulkKey::Random(BulkCipherEngine::kOpenssl);
  ASSERT_NE(a, nullptr);
  auto b = BulkKey::FromBytes(a->bytes(), BulkCipherEngine::kIpsecMb);
  ASSERT_NE(b, nullptr);
  const std::vector<uint8_t> aad = Bytes(40, 3);
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{4099}, size_t{3} << 20}) {
    for (size_t aad_n : {size_t{0}, aad.size()}) {
      SCOPED_TRACE(testing::Message() << n << " bytes, " << aad_n << " of aad");
      const std::vector<uint8_t> plain = Bytes(n, 11);
      std::vector<uint8_t> by_a(kBulkTagBytes + n), by_b(kBulkTagBytes + n);
      ASSERT_TRUE(a->Seal(7, 2, plain.data(), n, by_a.data(), aad.data(), aad_n).ok());
      ASSERT_TRUE(b->Seal(7, 2, plain.data(), n, by_b.data(), aad.data(), aad_n).ok());
      EXPECT_EQ(by_a, by_b);
      for (auto [sealer, opener] : {std::pair{a.get(), b.get()}, std::pair{b.get(), a.get()}}) {
        std::vector<uint8_t> sealed(kBulkTagBytes + n);
        ASSERT_TRUE(sealer->Seal(9, 1, plain.data(), n, sealed.data(), aad.data(), aad_n).ok());
        std::vector<uint8_t> back(n + 1);
        ASSERT_TRUE(
            opener->Open(9, 1, sealed.data(), sealed.size(), back.data(), aad.data(), aad_n));
        EXPECT_TRUE(std::equal(plain.begin(), plain.end(), back.begin()));
        // In place, as the stream transport opens.
        std::vector<uint8_t> inplace = sealed;
        ASSERT_TRUE(opener->Open(9, 1, inplace.data(), inplace.size(),
                                 inplace.data() + kBulkTagBytes, aad.data(), aad_n));
        EXPECT_TRUE(std::equal(plain.begin(), plain.end(), inplace.begin() + kBulkTagBytes));
        sealed[sealed.size() / 2] ^= 0x80;
        EXPECT_FALSE(
            opener->Open(9, 1, sealed.data(), sealed.size(), back.data(), aad.data(), aad_n));
        if (aad_n > 0) {
          sealed[sealed.size() / 2] ^= 0x80;
          std::vector<uint8_t> other_aad = aad;
          other_aad[5] ^= 1;
          EXPECT_FALSE(opener->Open(9, 1, sealed.data(), sealed.size(), back.data(),
                                    other_aad.data(), aad_n));
          EXPECT_FALSE(opener->Open(9, 1, sealed.data(), sealed.size(), back.data()));
        }
      }
    }
  }
}

class BulkCipherEngineTest : public testing::TestWithParam<BulkCipherEngine> {};

TEST_P(BulkCipherEngineTest, SealedFramesOpenOnlyUnderTheirKeyCounterAndIndex) {
  const BulkCipherEngine engine = GetParam();
  auto key = BulkKey::Random(engine);
  if (key == nullptr && engine == BulkCipherEngine::kIpsecMb) {
    GTEST_SKIP() << BulkCipherEngineName(engine);
  }
  ASSERT_NE(key, nullptr);
  auto same = BulkKey::FromBytes(key->bytes(), engine);
  auto other = BulkKey::Random(engine);
  ASSERT_NE(same, nullptr);
  ASSERT_NE(other, nullptr);
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{4096}, size_t{1} << 20}) {
    SCOPED_TRACE(n);
    const std::vector<uint8_t> plain = Bytes(n, 7);
    std::vector<uint8_t> sealed(kBulkTagBytes + n);
    ASSERT_TRUE(key->Seal(42, 3, plain.data(), n, sealed.data()).ok());
    if (n >= 16) {
      EXPECT_NE(std::memcmp(sealed.data() + kBulkTagBytes, plain.data(), 16), 0);
    }
    std::vector<uint8_t> back(n + 1);
    ASSERT_TRUE(same->Open(42, 3, sealed.data(), sealed.size(), back.data()));
    EXPECT_TRUE(std::equal(plain.begin(), plain.end(), back.begin()));
    EXPECT_FALSE(other->Open(42, 3, sealed.data(), sealed.size(), back.data()));
    EXPECT_FALSE(same->Open(43, 3, sealed.data(), sealed.size(), back.data()));  // replayed later
    EXPECT_FALSE(same->Open(42, 4, sealed.data(), sealed.size(), back.data()));  // another frame
    for (size_t at : {size_t{0}, kBulkTagBytes - 1, sealed.size() - 1}) {
      std::vector<uint8_t> flipped = sealed;
      flipped[at] ^= 0x01;
      EXPECT_FALSE(same->Open(42, 3, flipped.data(), flipped.size(), back.data())) << at;
    }
    if (n > 0) {  // cut short
      EXPECT_FALSE(same->Open(42, 3, sealed.data(), sealed.size() - 1, back.data()));
    }
  }
  uint8_t tiny[kBulkTagBytes - 1] = {};
  uint8_t out[1];
  EXPECT_FALSE(key->Open(0, 0, tiny, sizeof(tiny), out));
}

INSTANTIATE_TEST_SUITE_P(Engines, BulkCipherEngineTest,
                         testing::Values(BulkCipherEngine::kOpenssl, BulkCipherEngine::kIpsecMb),
                         [](const testing::TestParamInfo<BulkCipherEngine>& info) {
                           return info.param == BulkCipherEngine::kOpenssl ? "OpenSSL" : "IpsecMb";
                         });

}  // namespace
}  // namespace gradsync::wire
