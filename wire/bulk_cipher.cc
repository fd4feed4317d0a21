#include "wire/bulk_cipher.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <climits>
#include <cstring>

namespace gradsync::wire {
namespace {

constexpr size_t kNonceBytes = 12;

void MakeNonce(uint64_t counter, uint32_t index, uint8_t* nonce) {
  for (int i = 0; i < 8; ++i) nonce[i] = static_cast<uint8_t>(counter >> (8 * i));
  for (int i = 0; i < 4; ++i) nonce[8 + i] = static_cast<uint8_t>(index >> (8 * i));
}

EVP_CIPHER_CTX* Ctx(void* p) { return static_cast<EVP_CIPHER_CTX*>(p); }

}  // namespace

BulkKey::BulkKey() = default;

BulkKey::~BulkKey() {
  EVP_CIPHER_CTX_free(Ctx(encrypt_));
  EVP_CIPHER_CTX_free(Ctx(decrypt_));
  OPENSSL_cleanse(key_.data(), key_.size());
}

std::unique_ptr<BulkKey> BulkKey::FromBytes(const uint8_t* bytes) {
  std::unique_ptr<BulkKey> k(new BulkKey());
  std::memcpy(k->key_.data(), bytes, kBulkKeyBytes);
  k->encrypt_ = EVP_CIPHER_CTX_new();
  k->decrypt_ = EVP_CIPHER_CTX_new();
  if (k->encrypt_ == nullptr || k->decrypt_ == nullptr ||
      EVP_EncryptInit_ex(Ctx(k->encrypt_), EVP_aes_256_gcm(), nullptr, k->key_.data(), nullptr) !=
          1 ||
      EVP_DecryptInit_ex(Ctx(k->decrypt_), EVP_aes_256_gcm(), nullptr, k->key_.data(), nullptr) !=
          1) {
    return nullptr;
  }
  return k;
}

std::unique_ptr<BulkKey> BulkKey::Random() {
  std::array<uint8_t, kBulkKeyBytes> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) return nullptr;
  auto k = FromBytes(bytes.data());
  OPENSSL_cleanse(bytes.data(), bytes.size());
  return k;
}

Status BulkKey::Seal(uint64_t counter, uint32_t index, const uint8_t* in, size_t n, uint8_t* out,
                     const uint8_t* aad, size_t aad_n) {
  if (n > static_cast<size_t>(INT_MAX) || aad_n > static_cast<size_t>(INT_MAX)) {
    return InvalidArgumentError("bulk frame too large");
  }
  uint8_t nonce[kNonceBytes];
  MakeNonce(counter, index, nonce);
  int len = 0;
  EVP_CIPHER_CTX* c = Ctx(encrypt_);
  if (EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, nonce) != 1 ||
      (aad_n > 0 && EVP_EncryptUpdate(c, nullptr, &len, aad, static_cast<int>(aad_n)) != 1) ||
      EVP_EncryptUpdate(c, out + kBulkTagBytes, &len, in, static_cast<int>(n)) != 1 ||
      EVP_EncryptFinal_ex(c, out + kBulkTagBytes + len, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, kBulkTagBytes, out) != 1) {
    return InternalError("AES-256-GCM sealing failed");
  }
  return OkStatus();
}

bool BulkKey::Open(uint64_t counter, uint32_t index, const uint8_t* in, size_t n, uint8_t* out,
                   const uint8_t* aad, size_t aad_n) {
  if (n < kBulkTagBytes || n - kBulkTagBytes > static_cast<size_t>(INT_MAX) ||
      aad_n > static_cast<size_t>(INT_MAX)) {
    return false;
  }
  uint8_t nonce[kNonceBytes];
  MakeNonce(counter, index, nonce);
  uint8_t tag[kBulkTagBytes];
  std::memcpy(tag, in, kBulkTagBytes);  // read once
  int len = 0;
  EVP_CIPHER_CTX* c = Ctx(decrypt_);
  return EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, nonce) == 1 &&
         (aad_n == 0 || EVP_DecryptUpdate(c, nullptr, &len, aad, static_cast<int>(aad_n)) == 1) &&
         EVP_DecryptUpdate(c, out, &len, in + kBulkTagBytes, static_cast<int>(n - kBulkTagBytes)) ==
             1 &&
         EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, kBulkTagBytes, tag) == 1 &&
         EVP_DecryptFinal_ex(c, out + len, &len) == 1;
}

std::shared_ptr<BulkKeyPool> BulkKeyPool::Of(const uint8_t* bytes) {
  std::unique_ptr<BulkKey> first = BulkKey::FromBytes(bytes);
  if (first == nullptr) return nullptr;
  return std::shared_ptr<BulkKeyPool>(new BulkKeyPool(std::move(first)));
}

std::shared_ptr<BulkKeyPool> BulkKeyPool::Random() {
  std::unique_ptr<BulkKey> first = BulkKey::Random();
  if (first == nullptr) return nullptr;
  return std::shared_ptr<BulkKeyPool>(new BulkKeyPool(std::move(first)));
}

BulkKeyPool::Lease BulkKeyPool::Take() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      std::unique_ptr<BulkKey> key = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(key));
    }
  }
  return Lease(this, BulkKey::FromBytes(first_->bytes()));
}

BulkKeyPool::Lease::~Lease() {
  if (key_ == nullptr) return;
  std::lock_guard<std::mutex> lock(pool_->mu_);
  pool_->idle_.push_back(std::move(key_));
}

std::optional<BulkToken> RandomBulkToken() {
  BulkToken t{};
  if (RAND_bytes(t.data(), static_cast<int>(t.size())) != 1) return std::nullopt;
  return t;
}

std::string BulkRoutingId(const BulkToken& token) {
  static const char kHex[] = "0123456789abcdef";
  std::string id = "bulk-";
  for (uint8_t b : token) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

std::string EncodeBulkControl(const BulkControl& c) {
  std::string out(1, c.kind);
  out.append(reinterpret_cast<const char*>(c.token.data()), c.token.size());
  if (c.kind == 'H') out.append(reinterpret_cast<const char*>(c.key.data()), c.key.size());
  if (c.kind == 'A') {
    out += static_cast<char>(c.port & 0xff);
    out += static_cast<char>(c.port >> 8);
  }
  return out;
}

std::optional<BulkControl> ParseBulkControl(const uint8_t* data, size_t size) {
  if (size < 1 + kBulkTokenBytes) return std::nullopt;
  BulkControl c;
  c.kind = static_cast<char>(data[0]);
  std::memcpy(c.token.data(), data + 1, kBulkTokenBytes);
  const uint8_t* rest = data + 1 + kBulkTokenBytes;
  const size_t left = size - 1 - kBulkTokenBytes;
  switch (c.kind) {
    case 'H':
      if (left != kBulkKeyBytes) return std::nullopt;
      std::memcpy(c.key.data(), rest, kBulkKeyBytes);
      return c;
    case 'A':
      if (left != 2) return std::nullopt;
      c.port = static_cast<uint16_t>(rest[0] | (rest[1] << 8));
      if (c.port == 0) return std::nullopt;
      return c;
    case 'S':
    case 'R':
      if (left != 0) return std::nullopt;
      return c;
    default:
      return std::nullopt;
  }
}

}  // namespace gradsync::wire
