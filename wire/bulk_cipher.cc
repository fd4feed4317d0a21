#include "wire/bulk_cipher.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#ifdef GRADSYNC_HAVE_IPSEC_MB
#include <intel-ipsec-mb.h>
#endif

namespace gradsync::wire {
namespace {

constexpr size_t kNonceBytes = 12;

#ifdef GRADSYNC_HAVE_IPSEC_MB
// intel-ipsec-mb's functions for this CPU, chosen once; nullptr where the
// CPU has no AES-NI (the library's own code would then be slower than
// OpenSSL's). The code path is chosen here, from what the CPU has and the
// kernel saves (libgcc's checks read XCR0; the library's own detection
// reads only CPUID, and an AVX-512 path where the kernel does not save the
// registers would fault). Only the manager's function pointers are read
// after set-up (the GCM calls take their state as arguments), so threads
// share it.
struct IpsecMb {
  IMB_MGR* mgr = nullptr;
  IMB_ARCH arch = IMB_ARCH_NONE;
};
IMB_ARCH UsableArch() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("aes") || !__builtin_cpu_supports("pclmul") ||
      !__builtin_cpu_supports("sse4.2")) {
    return IMB_ARCH_NONE;
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return IMB_ARCH_AVX512;
  }
  if (__builtin_cpu_supports("avx2")) return IMB_ARCH_AVX2;
  if (__builtin_cpu_supports("avx")) return IMB_ARCH_AVX;
  return IMB_ARCH_SSE;
}
const IpsecMb& Ipsec() {
  static const IpsecMb ipsec = [] {
    IpsecMb m;
    m.arch = UsableArch();
    if (m.arch == IMB_ARCH_NONE) return m;
    m.mgr = alloc_mb_mgr(0);
    if (m.mgr == nullptr) return m;
    switch (m.arch) {
      case IMB_ARCH_AVX512:
        init_mb_mgr_avx512(m.mgr);
        break;
      case IMB_ARCH_AVX2:
        init_mb_mgr_avx2(m.mgr);
        break;
      case IMB_ARCH_AVX:
        init_mb_mgr_avx(m.mgr);
        break;
      default:
        init_mb_mgr_sse(m.mgr);
        break;
    }
    if (imb_get_errno(m.mgr) != 0) {
      free_mb_mgr(m.mgr);
      m.mgr = nullptr;
    }
    return m;
  }();
  return ipsec;
}
gcm_key_data* Schedule(void* p) { return static_cast<gcm_key_data*>(p); }
constexpr size_t kScheduleBytes = (sizeof(gcm_key_data) + 63) / 64 * 64;
// What an empty span points at: the library checks its arguments (in every
// build of it) and reports a bad one only through a process-wide error
// word, so every call here passes valid ones by construction (no null
// pointer, even for an empty span; a 16-byte tag; lengths under INT_MAX)
// and none can fail.
const uint8_t kNothing = 0;
#endif

void MakeNonce(uint64_t counter, uint32_t index, uint8_t* nonce) {
  for (int i = 0; i < 8; ++i) nonce[i] = static_cast<uint8_t>(counter >> (8 * i));
  for (int i = 0; i < 4; ++i) nonce[8 + i] = static_cast<uint8_t>(index >> (8 * i));
}

EVP_CIPHER_CTX* Ctx(void* p) { return static_cast<EVP_CIPHER_CTX*>(p); }

}  // namespace

BulkCipherEngine BestBulkCipherEngine() {
#ifdef GRADSYNC_HAVE_IPSEC_MB
  if (Ipsec().mgr != nullptr) return BulkCipherEngine::kIpsecMb;
#endif
  return BulkCipherEngine::kOpenssl;
}

std::optional<BulkCipherEngine> ParseBulkCipherSetting(const std::string& value) {
  if (value == "auto") return BulkCipherEngine::kBest;
  if (value == "openssl") return BulkCipherEngine::kOpenssl;
  return std::nullopt;
}

std::string BulkCipherEngineName(BulkCipherEngine engine) {
  if (engine == BulkCipherEngine::kBest) engine = BestBulkCipherEngine();
  if (engine == BulkCipherEngine::kOpenssl) return OpenSSL_version(OPENSSL_VERSION);
#ifdef GRADSYNC_HAVE_IPSEC_MB
  const std::string name = std::string("intel-ipsec-mb ") + imb_get_version_str();
  if (Ipsec().mgr == nullptr) return name + " (not usable on this CPU)";
  static const char* const kArch[IMB_ARCH_NUM] = {"", "", "SSE", "AVX", "AVX2", "AVX-512"};
  return name + " on " + kArch[Ipsec().arch];
#else
  return "intel-ipsec-mb (not built in)";
#endif
}

BulkKey::BulkKey() = default;

BulkKey::~BulkKey() {
  EVP_CIPHER_CTX_free(Ctx(encrypt_));
  EVP_CIPHER_CTX_free(Ctx(decrypt_));
  if (schedule_ != nullptr) {
#ifdef GRADSYNC_HAVE_IPSEC_MB
    OPENSSL_cleanse(schedule_, kScheduleBytes);
#endif
    std::free(schedule_);
  }
  OPENSSL_cleanse(key_.data(), key_.size());
}

std::unique_ptr<BulkKey> BulkKey::FromBytes(const uint8_t* bytes, BulkCipherEngine engine) {
  if (engine == BulkCipherEngine::kBest) engine = BestBulkCipherEngine();
  std::unique_ptr<BulkKey> k(new BulkKey());
  std::memcpy(k->key_.data(), bytes, kBulkKeyBytes);
  if (engine == BulkCipherEngine::kIpsecMb) {
#ifdef GRADSYNC_HAVE_IPSEC_MB
    if (Ipsec().mgr == nullptr) return nullptr;
    k->schedule_ = std::aligned_alloc(64, kScheduleBytes);
    if (k->schedule_ == nullptr) return nullptr;
    IMB_AES256_GCM_PRE(Ipsec().mgr, k->key_.data(), Schedule(k->schedule_));
    return k;
#else
    return nullptr;
#endif
  }
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

std::unique_ptr<BulkKey> BulkKey::Random(BulkCipherEngine engine) {
  std::array<uint8_t, kBulkKeyBytes> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) return nullptr;
  auto k = FromBytes(bytes.data(), engine);
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
#ifdef GRADSYNC_HAVE_IPSEC_MB
  if (schedule_ != nullptr) {
    gcm_context_data ctx;
    IMB_AES256_GCM_ENC(Ipsec().mgr, Schedule(schedule_), &ctx, out + kBulkTagBytes,
                       n > 0 ? in : &kNothing, n, nonce, aad_n > 0 ? aad : &kNothing, aad_n, out,
                       kBulkTagBytes);
    OPENSSL_cleanse(&ctx, sizeof(ctx));
    return OkStatus();
  }
#endif
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
#ifdef GRADSYNC_HAVE_IPSEC_MB
  if (schedule_ != nullptr) {
    uint8_t computed[kBulkTagBytes];
    gcm_context_data ctx;
    const size_t c = n - kBulkTagBytes;
    IMB_AES256_GCM_DEC(Ipsec().mgr, Schedule(schedule_), &ctx, c > 0 ? out : computed,
                       c > 0 ? in + kBulkTagBytes : &kNothing, c, nonce,
                       aad_n > 0 ? aad : &kNothing, aad_n, computed, kBulkTagBytes);
    OPENSSL_cleanse(&ctx, sizeof(ctx));
    return CRYPTO_memcmp(computed, tag, kBulkTagBytes) == 0;
  }
#endif
  int len = 0;
  EVP_CIPHER_CTX* c = Ctx(decrypt_);
  return EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, nonce) == 1 &&
         (aad_n == 0 || EVP_DecryptUpdate(c, nullptr, &len, aad, static_cast<int>(aad_n)) == 1) &&
         EVP_DecryptUpdate(c, out, &len, in + kBulkTagBytes, static_cast<int>(n - kBulkTagBytes)) ==
             1 &&
         EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, kBulkTagBytes, tag) == 1 &&
         EVP_DecryptFinal_ex(c, out + len, &len) == 1;
}

}  // namespace gradsync::wire
