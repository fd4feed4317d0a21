// Sealed bulk messages (docs/design/bulk_encryption.md): with
// ZmqOptions::bulk_encryption, a data transport of a CURVE job hands each
// outgoing connection to a plan node a fresh AES-256-GCM key over the CURVE
// connection, and from then on sends that connection's messages over a
// second, plain connection, every frame sealed under the key. This file
// holds the cipher and the control messages; the transport's use of them is
// in wire/zmq_transport.h.
//
// Frames of a sealed message (one ZeroMQ multipart message on the bulk
// connection, after the receiver's routing-id frame):
//   frame 0:  counter (8 bytes, little endian) | tag (16) | sealed header
//   frame i:  tag (16) | sealed payload i-1
// Frame i is sealed with the 96-bit nonce counter (8, LE) | i (4, LE); a
// reply going back on the bulk connection has its own counter and the top
// bit of i set, so no two frames under one key share a nonce while each
// counter only grows.
//
// Control messages travel over the CURVE connection as two frames, an empty
// one (which no gradsync header is) and one of:
//   'H' token (16) key (32)       sender -> receiver: hello
//   'A' token (16) port (2, LE)   receiver -> sender: the bulk port, on the
//                                 host the sender reached it at
//   'S' token (16)                sender -> receiver: what follows is sealed
//   'R' token (16)                receiver -> sender: replies that follow
//                                 come sealed on the bulk connection
//
// Thread-safety: a BulkKey is used by one thread at a time; a BulkKeyPool
// by any number.
#ifndef GRADSYNC_WIRE_BULK_CIPHER_H_
#define GRADSYNC_WIRE_BULK_CIPHER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace gradsync::wire {

constexpr size_t kBulkKeyBytes = 32;
constexpr size_t kBulkTokenBytes = 16;
constexpr size_t kBulkTagBytes = 16;
constexpr size_t kBulkCounterBytes = 8;

// Set in the nonce's frame index of a reply (going back on the bulk
// connection, from its receiver to its sender): no nonce of one direction is
// one of the other's.
constexpr uint32_t kBulkReplyDirection = 0x80000000u;

using BulkToken = std::array<uint8_t, kBulkTokenBytes>;

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

// One key's cipher contexts for the threads that seal and open under it:
// each takes a context for as long as it seals or opens a message, and it
// goes back to the pool afterwards (a context holds the key's schedule, so
// taking one costs a lock, not a key setup).
class BulkKeyPool {
 public:
  // A pool of the key `bytes` (kBulkKeyBytes) on `engine`; nullptr only if
  // the engine fails or is not available here.
  static std::shared_ptr<BulkKeyPool> Of(const uint8_t* bytes,
                                         BulkCipherEngine engine = BulkCipherEngine::kBest);
  // A pool of a new random key.
  static std::shared_ptr<BulkKeyPool> Random(BulkCipherEngine engine = BulkCipherEngine::kBest);

  const uint8_t* bytes() const { return first_->bytes(); }

  // A context of the key, back in the pool when the lease ends. The pool
  // must outlive its leases.
  class Lease {
   public:
    Lease(BulkKeyPool* pool, std::unique_ptr<BulkKey> key) : pool_(pool), key_(std::move(key)) {}
    Lease(Lease&&) = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    // False only if the engine could not make a context.
    explicit operator bool() const { return key_ != nullptr; }
    BulkKey& operator*() const { return *key_; }
    BulkKey* operator->() const { return key_.get(); }

   private:
    BulkKeyPool* pool_;
    std::unique_ptr<BulkKey> key_;
  };
  Lease Take();

 private:
  explicit BulkKeyPool(std::unique_ptr<BulkKey> first) : first_(std::move(first)) {}
  std::unique_ptr<BulkKey> first_;  // the key's bytes; never leased
  std::mutex mu_;
  std::vector<std::unique_ptr<BulkKey>> idle_;  // guarded by mu_
};

// A random token (the bulk connection's routing id, in hex); nullopt only
// if OpenSSL's generator fails.
std::optional<BulkToken> RandomBulkToken();
std::string BulkRoutingId(const BulkToken& token);

// Control messages (the second frame).
struct BulkControl {
  char kind = 0;  // 'H', 'A', 'S' or 'R'
  BulkToken token{};
  std::array<uint8_t, kBulkKeyBytes> key{};  // 'H'
  uint16_t port = 0;                         // 'A'
};
std::string EncodeBulkControl(const BulkControl& c);
// nullopt for anything but a well-formed control message (an 'A' port is
// not 0).
std::optional<BulkControl> ParseBulkControl(const uint8_t* data, size_t size);

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_BULK_CIPHER_H_
