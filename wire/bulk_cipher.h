// AES-256-GCM for the sealed TCP streams (wire/tcp_stream_transport.h,
// docs/design/tcp_streams.md): the key type and the choice of the library
// that runs it (the setting bulk_cipher).
//
// Thread-safety: a BulkKey is used by one thread at a time.
#ifndef GRADSYNC_WIRE_BULK_CIPHER_H_
#define GRADSYNC_WIRE_BULK_CIPHER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"

namespace gradsync::wire {

constexpr size_t kBulkKeyBytes = 32;
constexpr size_t kBulkTagBytes = 16;

// The library that runs AES-256-GCM. Both write the standard's bytes, so
// peers that use different ones read each other.
enum class BulkCipherEngine {
  kBest,     // intel-ipsec-mb where it is built in and the CPU has AES-NI
  kOpenssl,  // OpenSSL's EVP (AES-NI and PCLMULQDQ on 128-bit registers)
  kIpsecMb,  // intel-ipsec-mb (VAES and VPCLMULQDQ on AVX-512 where the CPU
             // has them: about 4x OpenSSL 3.0 there)
};
// What kBest is on this machine (kOpenssl or kIpsecMb).
BulkCipherEngine BestBulkCipherEngine();
// The setting bulk_cipher: "auto" (kBest) or "openssl" (kOpenssl); nullopt
// for anything else.
std::optional<BulkCipherEngine> ParseBulkCipherSetting(const std::string& value);
// "intel-ipsec-mb 1.3.0 on AVX-512", "OpenSSL 3.0.19 ...": for logs.
std::string BulkCipherEngineName(BulkCipherEngine engine);

// AES-256-GCM under one key.
class BulkKey {
 public:
  // A new random key; nullptr only if OpenSSL's generator fails or
  // `engine` is not available here (kIpsecMb on a CPU without AES-NI or a
  // build without the library).
  static std::unique_ptr<BulkKey> Random(BulkCipherEngine engine = BulkCipherEngine::kBest);
  // The key of `bytes` (kBulkKeyBytes of them).
  static std::unique_ptr<BulkKey> FromBytes(const uint8_t* bytes,
                                            BulkCipherEngine engine = BulkCipherEngine::kBest);
  ~BulkKey();
  BulkKey(const BulkKey&) = delete;
  BulkKey& operator=(const BulkKey&) = delete;

  const uint8_t* bytes() const { return key_.data(); }
  BulkCipherEngine engine() const {
    return schedule_ != nullptr ? BulkCipherEngine::kIpsecMb : BulkCipherEngine::kOpenssl;
  }

  // Seals in[0, n) into out[0, kBulkTagBytes + n): tag, then ciphertext,
  // under nonce (counter, index), the tag also covering aad[0, aad_n)
  // (sent apart). `out` must not overlap `in`.
  Status Seal(uint64_t counter, uint32_t index, const uint8_t* in, size_t n, uint8_t* out,
              const uint8_t* aad = nullptr, size_t aad_n = 0);
  // Opens in[0, n) (tag, then ciphertext; n >= kBulkTagBytes) into
  // out[0, n - kBulkTagBytes); `out` may be in + kBulkTagBytes (in place).
  // False when the tag does not verify over the ciphertext and aad[0,
  // aad_n) (what was written to `out` is then garbage).
  bool Open(uint64_t counter, uint32_t index, const uint8_t* in, size_t n, uint8_t* out,
            const uint8_t* aad = nullptr, size_t aad_n = 0);

 private:
  BulkKey();
  std::array<uint8_t, kBulkKeyBytes> key_{};
  void* encrypt_ = nullptr;  // EVP_CIPHER_CTX* (kOpenssl)
  void* decrypt_ = nullptr;
  void* schedule_ = nullptr;  // gcm_key_data*, 64-byte aligned (kIpsecMb)
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_BULK_CIPHER_H_
