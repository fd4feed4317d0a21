#include "wire/noise.h"

#include <openssl/evp.h>
#include <sodium.h>

#include <cstring>
#include <limits>

namespace gradsync::wire::noise {
namespace {

constexpr size_t kBlockBytes = 128;  // BLOCKLEN of BLAKE2b
constexpr size_t kNonceBytes = 12;

void NonceOf(uint64_t n, uint8_t* out) {
  std::memset(out, 0, 4);
  for (int i = 0; i < 8; ++i) out[4 + i] = static_cast<uint8_t>(n >> (8 * (7 - i)));
}

// HMAC-HASH(key, data...) of RFC 2104 with BLAKE2b-512; `key` is kHashBytes.
void Hmac(const uint8_t* key, const uint8_t* a, size_t a_n, const uint8_t* b, size_t b_n,
          uint8_t* out) {
  uint8_t pad[kBlockBytes], inner[kHashBytes];
  crypto_generichash_state st;
  std::memset(pad, 0x36, sizeof(pad));
  for (size_t i = 0; i < kHashBytes; ++i) pad[i] ^= key[i];
  crypto_generichash_init(&st, nullptr, 0, kHashBytes);
  crypto_generichash_update(&st, pad, sizeof(pad));
  if (a_n > 0) crypto_generichash_update(&st, a, a_n);
  if (b_n > 0) crypto_generichash_update(&st, b, b_n);
  crypto_generichash_final(&st, inner, sizeof(inner));
  std::memset(pad, 0x5c, sizeof(pad));
  for (size_t i = 0; i < kHashBytes; ++i) pad[i] ^= key[i];
  crypto_generichash_init(&st, nullptr, 0, kHashBytes);
  crypto_generichash_update(&st, pad, sizeof(pad));
  crypto_generichash_update(&st, inner, sizeof(inner));
  crypto_generichash_final(&st, out, kHashBytes);
  sodium_memzero(pad, sizeof(pad));
  sodium_memzero(inner, sizeof(inner));
  sodium_memzero(&st, sizeof(st));
}

bool Gcm(bool seal, const uint8_t* key, uint64_t nonce, const uint8_t* ad, size_t ad_n,
         const uint8_t* in, size_t n, uint8_t* out) {
  if (n > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      ad_n > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return false;
  }
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  if (ctx == nullptr) return false;
  uint8_t iv[kNonceBytes];
  NonceOf(nonce, iv);
  int len = 0;
  bool ok = EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), nullptr, key, iv, seal ? 1 : 0) == 1;
  if (ok && ad_n > 0) ok = EVP_CipherUpdate(ctx, nullptr, &len, ad, static_cast<int>(ad_n)) == 1;
  if (ok && !seal) {
    ok = EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kTagBytes, const_cast<uint8_t*>(in + n)) ==
         1;
  }
  if (ok && n > 0) ok = EVP_CipherUpdate(ctx, out, &len, in, static_cast<int>(n)) == 1;
  if (ok) ok = EVP_CipherFinal_ex(ctx, out + n, &len) == 1;
  if (ok && seal) ok = EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kTagBytes, out + n) == 1;
  EVP_CIPHER_CTX_free(ctx);
  return ok;
}

// HKDF(chaining_key, input, 2) of the spec with HMAC-BLAKE2b: out[0, 64)
// and out[64, 128), the temporary key in out[128, 192).
void Hkdf2(const uint8_t* chaining_key, const uint8_t* input, size_t n, uint8_t* out) {
  uint8_t* temp = out + 2 * kHashBytes;
  const uint8_t one = 1, two = 2;
  Hmac(chaining_key, input, n, nullptr, 0, temp);
  Hmac(temp, &one, 1, nullptr, 0, out);
  Hmac(temp, out, kHashBytes, &two, 1, out + kHashBytes);
}

}  // namespace

SecretBytes::SecretBytes(size_t n) : size_(n) {
  if (sodium_init() < 0) {
    data_ = nullptr;
    return;
  }
  data_ = static_cast<uint8_t*>(sodium_malloc(n));
  if (data_ != nullptr) sodium_memzero(data_, n);
}

SecretBytes::~SecretBytes() {
  if (data_ != nullptr) sodium_free(data_);  // wipes
}

bool Encrypt(const uint8_t* key, uint64_t nonce, const uint8_t* ad, size_t ad_n, const uint8_t* in,
             size_t n, uint8_t* out) {
  return Gcm(true, key, nonce, ad, ad_n, in, n, out);
}

bool Decrypt(const uint8_t* key, uint64_t nonce, const uint8_t* ad, size_t ad_n, const uint8_t* in,
             size_t n, uint8_t* out) {
  if (n < kTagBytes) return false;
  return Gcm(false, key, nonce, ad, ad_n, in, n - kTagBytes, out);
}

bool Rekey(uint8_t* key) {
  SecretBytes out(kKeyBytes + kTagBytes);
  const uint8_t zeros[kKeyBytes] = {};
  if (out.data() == nullptr || !Encrypt(key, std::numeric_limits<uint64_t>::max(), nullptr, 0,
                                        zeros, kKeyBytes, out.data())) {
    return false;
  }
  std::memcpy(key, out.data(), kKeyBytes);
  return true;
}

CipherState::CipherState() : key_(kKeyBytes) {}

void CipherState::InitializeKey(const uint8_t* key) {
  std::memcpy(key_.data(), key, kKeyBytes);
  has_key_ = true;
  nonce_ = 0;
}

bool CipherState::EncryptWithAd(const uint8_t* ad, size_t ad_n, const uint8_t* in, size_t n,
                                std::vector<uint8_t>* out) {
  const size_t at = out->size();
  if (!has_key_) {
    out->insert(out->end(), in, in + n);
    return true;
  }
  // 2^64 - 1 is reserved (Rekey).
  if (nonce_ == std::numeric_limits<uint64_t>::max()) return false;
  out->resize(at + n + kTagBytes);
  if (!Encrypt(key_.data(), nonce_, ad, ad_n, in, n, out->data() + at)) {
    out->resize(at);
    return false;
  }
  ++nonce_;
  return true;
}

bool CipherState::DecryptWithAd(const uint8_t* ad, size_t ad_n, const uint8_t* in, size_t n,
                                std::vector<uint8_t>* out) {
  const size_t at = out->size();
  if (!has_key_) {
    out->insert(out->end(), in, in + n);
    return true;
  }
  if (n < kTagBytes || nonce_ == std::numeric_limits<uint64_t>::max()) return false;
  out->resize(at + n - kTagBytes);
  if (!Decrypt(key_.data(), nonce_, ad, ad_n, in, n, out->data() + at)) {
    sodium_memzero(out->data() + at, n - kTagBytes);
    out->resize(at);
    return false;
  }
  ++nonce_;
  return true;
}

bool CipherState::Rekey() { return has_key_ && noise::Rekey(key_.data()); }

SymmetricState::SymmetricState(const char* protocol_name)
    : ck_(kHashBytes), scratch_(3 * kHashBytes) {
  const size_t n = std::strlen(protocol_name);
  std::memset(h_, 0, sizeof(h_));
  if (n <= kHashBytes) {
    std::memcpy(h_, protocol_name, n);
  } else {
    crypto_generichash(h_, kHashBytes, reinterpret_cast<const uint8_t*>(protocol_name), n, nullptr,
                       0);
  }
  std::memcpy(ck_.data(), h_, kHashBytes);
}

void SymmetricState::MixKey(const uint8_t* input, size_t n) {
  Hkdf2(ck_.data(), input, n, scratch_.data());
  std::memcpy(ck_.data(), scratch_.data(), kHashBytes);
  cipher_.InitializeKey(scratch_.data() + kHashBytes);  // its first 32 bytes (HASHLEN 64)
}

void SymmetricState::MixHash(const uint8_t* data, size_t n) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, kHashBytes);
  crypto_generichash_update(&st, h_, kHashBytes);
  if (n > 0) crypto_generichash_update(&st, data, n);
  crypto_generichash_final(&st, h_, kHashBytes);
}

bool SymmetricState::EncryptAndHash(const uint8_t* in, size_t n, std::vector<uint8_t>* out) {
  const size_t at = out->size();
  if (!cipher_.EncryptWithAd(h_, kHashBytes, in, n, out)) return false;
  MixHash(out->data() + at, out->size() - at);
  return true;
}

bool SymmetricState::DecryptAndHash(const uint8_t* in, size_t n, std::vector<uint8_t>* out) {
  if (!cipher_.DecryptWithAd(h_, kHashBytes, in, n, out)) return false;
  MixHash(in, n);
  return true;
}

void SymmetricState::Split(uint8_t* first, uint8_t* second) {
  Hkdf2(ck_.data(), nullptr, 0, scratch_.data());
  std::memcpy(first, scratch_.data(), kKeyBytes);
  std::memcpy(second, scratch_.data() + kHashBytes, kKeyBytes);
}

HandshakeKK::HandshakeKK(bool initiator, const uint8_t* static_secret, const uint8_t* remote_static,
                         const uint8_t* prologue, size_t prologue_n,
                         const uint8_t* ephemeral_secret)
    : initiator_(initiator), symmetric_(kProtocolName), s_(kDhBytes), e_(kDhBytes), dh_(kDhBytes) {
  std::memcpy(s_.data(), static_secret, kDhBytes);
  std::memcpy(rs_, remote_static, kDhBytes);
  std::memset(re_, 0, sizeof(re_));
  if (ephemeral_secret != nullptr) {
    std::memcpy(e_.data(), ephemeral_secret, kDhBytes);
    crypto_scalarmult_base(e_pub_, e_.data());
    fixed_ephemeral_ = true;
  }
  uint8_t s_pub[kDhBytes];
  crypto_scalarmult_base(s_pub, s_.data());
  symmetric_.MixHash(prologue, prologue_n);
  // Pre-messages: "-> s" then "<- s".
  symmetric_.MixHash(initiator ? s_pub : rs_, kDhBytes);
  symmetric_.MixHash(initiator ? rs_ : s_pub, kDhBytes);
}

bool HandshakeKK::Dh(const uint8_t* secret, const uint8_t* pub) {
  if (crypto_scalarmult(dh_.data(), secret, pub) != 0) return false;  // all zero
  symmetric_.MixKey(dh_.data(), kDhBytes);
  return true;
}

bool HandshakeKK::WriteMessage(const uint8_t* payload, size_t n, std::vector<uint8_t>* out) {
  // Message 1 is the initiator's, message 2 the responder's.
  if (step_ >= 2 || (step_ == 0) != initiator_) return false;
  if (!fixed_ephemeral_) {
    crypto_box_keypair(e_pub_, e_.data());
  }
  out->insert(out->end(), e_pub_, e_pub_ + kDhBytes);
  symmetric_.MixHash(e_pub_, kDhBytes);
  bool ok;
  if (step_ == 0) {
    ok = Dh(e_.data(), rs_) && Dh(s_.data(), rs_);  // es, ss
  } else {
    ok = Dh(e_.data(), re_) && Dh(e_.data(), rs_);  // ee, se (responder: DH(e, rs))
  }
  if (!ok || !symmetric_.EncryptAndHash(payload, n, out)) return false;
  ++step_;
  return true;
}

bool HandshakeKK::ReadMessage(const uint8_t* message, size_t n, std::vector<uint8_t>* payload) {
  if (step_ >= 2 || (step_ == 0) == initiator_ || n < kMessageOverhead) return false;
  std::memcpy(re_, message, kDhBytes);
  symmetric_.MixHash(re_, kDhBytes);
  bool ok;
  if (step_ == 0) {
    ok = Dh(s_.data(), re_) && Dh(s_.data(), rs_);  // es (responder: DH(s, re)), ss
  } else {
    ok = Dh(e_.data(), re_) && Dh(s_.data(), re_);  // ee, se (initiator: DH(s, re))
  }
  if (!ok || !symmetric_.DecryptAndHash(message + kDhBytes, n - kDhBytes, payload)) return false;
  ++step_;
  return true;
}

void HandshakeKK::Split(uint8_t* initiator_to_responder, uint8_t* responder_to_initiator) {
  symmetric_.Split(initiator_to_responder, responder_to_initiator);
}

}  // namespace gradsync::wire::noise
