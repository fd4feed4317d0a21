// The Noise Protocol Framework (revision 34, noiseprotocol.org/noise.html)
// for one protocol: Noise_KK_25519_AESGCM_BLAKE2b, the handshake of sealed
// TCP streams (docs/design/tcp_streams.md#sealed-streams-curve). Both sides
// know each other's static X25519 key from the plan before they connect
// (KK), so no key and no identity crosses the wire in clear:
//
//   -> s            (pre-message: the initiator's static key, known)
//   <- s            (pre-message: the responder's static key, known)
//   -> e, es, ss    (message 1, payload sealed)
//   <- e, ee, se    (message 2, payload sealed)
//
// Split then gives one AES-256-GCM key a direction. The primitives are
// libsodium's X25519 and BLAKE2b and OpenSSL's AES-256-GCM; HMAC and HKDF
// are the spec's, over BLAKE2b (HASHLEN 64, BLOCKLEN 128). Checked against
// the published test vectors (wire/noise_test.cc).
//
// Secrets (static and ephemeral keys, the chaining key, cipher keys) live in
// SecretBytes: sodium_malloc memory, locked where RLIMIT_MEMLOCK allows, out
// of core dumps (MADV_DONTDUMP), wiped when freed.
//
// Thread-safety: none; one object per handshake, used by one thread.
#ifndef GRADSYNC_WIRE_NOISE_H_
#define GRADSYNC_WIRE_NOISE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace gradsync::wire::noise {

inline constexpr char kProtocolName[] = "Noise_KK_25519_AESGCM_BLAKE2b";
constexpr size_t kDhBytes = 32;    // DHLEN: an X25519 key, public or secret
constexpr size_t kKeyBytes = 32;   // a cipher key
constexpr size_t kHashBytes = 64;  // HASHLEN (BLAKE2b)
constexpr size_t kTagBytes = 16;   // AES-GCM's tag
// A handshake message is the sender's ephemeral key, its sealed payload and
// the tag: kMessageOverhead bytes more than the payload.
constexpr size_t kMessageOverhead = kDhBytes + kTagBytes;

// Bytes in memory of their own (sodium_malloc): guard pages around, locked
// where the limit allows, left out of core dumps, wiped when freed. data()
// is null only if the allocation failed.
class SecretBytes {
 public:
  explicit SecretBytes(size_t n);
  ~SecretBytes();
  SecretBytes(const SecretBytes&) = delete;
  SecretBytes& operator=(const SecretBytes&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_;
  size_t size_;
};

// ENCRYPT(k, n, ad, plaintext) of AESGCM: out[0, n + kTagBytes) is the
// ciphertext and then the tag; the nonce is 32 zero bits and n big-endian.
// False only if OpenSSL fails.
bool Encrypt(const uint8_t* key, uint64_t nonce, const uint8_t* ad, size_t ad_n, const uint8_t* in,
             size_t n, uint8_t* out);
// DECRYPT: in[0, n) is ciphertext and tag (n >= kTagBytes); out gets n -
// kTagBytes bytes. False when the tag does not verify.
bool Decrypt(const uint8_t* key, uint64_t nonce, const uint8_t* ad, size_t ad_n, const uint8_t* in,
             size_t n, uint8_t* out);
// REKEY(k), in place: the first 32 bytes of ENCRYPT(k, 2^64 - 1, "", 32
// zeros).
bool Rekey(uint8_t* key);

// A CipherState (spec section 5.1): a key (maybe none) and a nonce.
class CipherState {
 public:
  CipherState();
  void InitializeKey(const uint8_t* key);  // nonce 0
  bool HasKey() const { return has_key_; }
  const uint8_t* key() const { return key_.data(); }
  uint64_t nonce() const { return nonce_; }
  // Appends to `out` the sealed `in` (or `in` itself without a key); false
  // when the nonce is spent or OpenSSL fails.
  bool EncryptWithAd(const uint8_t* ad, size_t ad_n, const uint8_t* in, size_t n,
                     std::vector<uint8_t>* out);
  // Appends to `out` what `in` opens to; false (nonce unchanged) when it
  // does not open.
  bool DecryptWithAd(const uint8_t* ad, size_t ad_n, const uint8_t* in, size_t n,
                     std::vector<uint8_t>* out);
  bool Rekey();

 private:
  SecretBytes key_;
  bool has_key_ = false;
  uint64_t nonce_ = 0;
};

// A SymmetricState (spec section 5.2) over BLAKE2b.
class SymmetricState {
 public:
  explicit SymmetricState(const char* protocol_name);
  void MixKey(const uint8_t* input, size_t n);
  void MixHash(const uint8_t* data, size_t n);
  bool EncryptAndHash(const uint8_t* in, size_t n, std::vector<uint8_t>* out);
  bool DecryptAndHash(const uint8_t* in, size_t n, std::vector<uint8_t>* out);
  // The two transport keys (kKeyBytes each): initiator to responder, then
  // responder to initiator.
  void Split(uint8_t* first, uint8_t* second);
  const uint8_t* h() const { return h_; }

 private:
  SecretBytes ck_;
  // HKDF's temporary key and two outputs: made once, not per MixKey.
  SecretBytes scratch_;
  uint8_t h_[kHashBytes];
  CipherState cipher_;
};

// One side of a Noise_KK_25519_AESGCM_BLAKE2b handshake.
class HandshakeKK {
 public:
  // `static_secret`: this side's static X25519 secret key; `remote_static`:
  // the peer's public key; `prologue`: what both sides must agree on.
  // `ephemeral_secret` fixes this side's ephemeral key (the test vectors);
  // null: a fresh one.
  HandshakeKK(bool initiator, const uint8_t* static_secret, const uint8_t* remote_static,
              const uint8_t* prologue, size_t prologue_n,
              const uint8_t* ephemeral_secret = nullptr);

  // Writes this side's next message with `payload` (appended to `out`);
  // false when it is not this side's turn or a Diffie-Hellman result is
  // zero (a key of low order).
  bool WriteMessage(const uint8_t* payload, size_t n, std::vector<uint8_t>* out);
  // Reads the peer's next message (its payload appended to `payload`); false
  // when it is not the peer's turn, it is short, or it does not open (other
  // keys, another prologue, altered).
  bool ReadMessage(const uint8_t* message, size_t n, std::vector<uint8_t>* payload);
  // Both messages are done: Split and HandshakeHash may be called.
  bool Finished() const { return step_ == 2; }
  // The transport keys (kKeyBytes each).
  void Split(uint8_t* initiator_to_responder, uint8_t* responder_to_initiator);
  const uint8_t* HandshakeHash() const { return symmetric_.h(); }

 private:
  bool Dh(const uint8_t* secret, const uint8_t* pub);  // MixKey(DH(secret, pub))

  const bool initiator_;
  int step_ = 0;  // messages done
  SymmetricState symmetric_;
  SecretBytes s_, e_, dh_;  // secrets, and a DH result's room
  uint8_t e_pub_[kDhBytes], rs_[kDhBytes], re_[kDhBytes];
  bool fixed_ephemeral_ = false;
};

}  // namespace gradsync::wire::noise

#endif  // GRADSYNC_WIRE_NOISE_H_
