// What sealing bulk bytes costs on one core, per cipher, beside memcpy of
// the same bytes in the same run: the primitive CurveZMQ seals every frame
// with (XSalsa20-Poly1305, libsodium's crypto_secretbox, which is what
// crypto_box_afternm runs) against the AEADs a bulk-frame scheme could use
// (docs/design/tcp_streams.md): libsodium's ChaCha20-Poly1305 (IETF)
// and AES-256-GCM, OpenSSL's AES-256-GCM (EVP; AES-NI and carry-less
// multiply on 128-bit registers in OpenSSL 3.0) and intel-ipsec-mb's (the
// engine sealed links use where the CPU has AES-NI: vector AES and
// carry-less multiply on AVX-512 where the CPU has them).
//
// Each round runs every cipher once on the same buffer (interleaved, so
// that noise hits all alike): seal in place with a fresh nonce, then open
// in place. A round's time per cipher is seal + open, the work one byte
// costs on a link (sealed by its sender, opened by its receiver); memcpy
// is counted twice to match (a copy on each side). The table shows the
// median over rounds in GB/s of plaintext (1 GB = 1e9 bytes) and each
// cipher's speed over CURVE's. Before timing, every cipher must open what
// it sealed to the same bytes and refuse a copy with one flipped bit, or
// the bench stops naming it. Then one JSON line per (cipher, bytes).
//
// Then the same over a link: a ZeroMQ PUSH socket sends --link_mib MiB in
// messages of each size to a PULL socket over loopback TCP (two threads of
// one process, each socket with its own context and I/O thread), and the
// receiver puts every message into its destination buffer, as the ring
// does. Four links, interleaved per round: plain (the receiver copies);
// CurveZMQ (ZeroMQ seals and opens every frame; the receiver copies);
// and plain ZeroMQ carrying frames that the sender seals out of place into
// a fresh buffer (sent zero-copy) and the receiver opens into its
// destination (no copy of its own), with XSalsa20-Poly1305 and with
// OpenSSL's AES-256-GCM. The last is the data path of the bulk-frame
// scheme; its handshake is not part of it. Goodput is bytes / (last
// message in its destination - first send), median over rounds, and each
// link's over plain's.
//
//   bazel run --config=opt //bench:cipher_bench -- --quick
//   flags: --quick (5 rounds, else 21) --rounds=N --sizes=65536,1048576,...
//          --link_mib=64 (0: no link table)
#include <openssl/evp.h>
#include <sodium.h>
#ifdef GRADSYNC_HAVE_IPSEC_MB
#include <intel-ipsec-mb.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench/bench_util.h"
#include "common/config.h"

namespace gradsync::bench {
namespace {

struct Flags {
  int rounds = 21;
  size_t link_mib = 64;
  std::vector<size_t> sizes = {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20};
};

StatusOr<Flags> ParseFlags(int argc, char** argv) {
  GS_ASSIGN_OR_RETURN(Config config, Config::FromArgs(argc, argv, nullptr));
  Flags flags;
  GS_ASSIGN_OR_RETURN(bool quick, config.GetBool("quick", false));
  GS_ASSIGN_OR_RETURN(int64_t rounds, config.GetInt("rounds", quick ? 5 : flags.rounds));
  flags.rounds = static_cast<int>(std::clamp<int64_t>(rounds, 1, 100000));
  GS_ASSIGN_OR_RETURN(int64_t link_mib, config.GetInt("link_mib", 64));
  flags.link_mib = static_cast<size_t>(std::clamp<int64_t>(link_mib, 0, 4096));
  GS_ASSIGN_OR_RETURN(std::string sizes, config.GetString("sizes", ""));
  if (!sizes.empty()) {
    GS_ASSIGN_OR_RETURN(flags.sizes, ParseSizes(sizes));
  }
  GS_RETURN_IF_ERROR(config.CheckKnownFlags());
  return flags;
}

constexpr size_t kTag = 16;

// One cipher: seals in[0, n) into out[0, n) (tag to `tag`) under nonce
// number `counter`; opens it back; false when the tag does not verify.
// `out` may be `in`.
struct Cipher {
  std::string name;
  std::function<void(uint8_t* out, const uint8_t* in, size_t n, uint8_t* tag, uint64_t counter)>
      seal;
  std::function<bool(uint8_t* out, const uint8_t* in, size_t n, const uint8_t* tag,
                     uint64_t counter)>
      open;
};

template <size_t N>
void Nonce(uint64_t counter, uint8_t (&nonce)[N]) {
  std::memset(nonce, 0, N);
  std::memcpy(nonce, &counter, sizeof(counter));
}

Cipher Secretbox(const uint8_t* key) {
  // CurveZMQ's per-frame cipher (crypto_box_afternm is crypto_secretbox
  // under the precomputed key).
  return {"xsalsa20poly1305 (CURVE)",
          [key](uint8_t* out, const uint8_t* in, size_t n, uint8_t* tag, uint64_t c) {
            uint8_t nonce[crypto_secretbox_NONCEBYTES];
            Nonce(c, nonce);
            crypto_secretbox_detached(out, tag, in, n, nonce, key);
          },
          [key](uint8_t* out, const uint8_t* in, size_t n, const uint8_t* tag, uint64_t c) {
            uint8_t nonce[crypto_secretbox_NONCEBYTES];
            Nonce(c, nonce);
            return crypto_secretbox_open_detached(out, in, tag, n, nonce, key) == 0;
          }};
}

// A libsodium AEAD (detached, no additional data) under `key`: a key's
// bytes or a precomputed state.
template <auto Encrypt, auto Decrypt, size_t kNonceBytes, typename Key>
Cipher SodiumAead(std::string name, const Key* key) {
  return {std::move(name),
          [key](uint8_t* out, const uint8_t* in, size_t n, uint8_t* tag, uint64_t c) {
            uint8_t nonce[kNonceBytes];
            Nonce(c, nonce);
            Encrypt(out, tag, nullptr, in, n, nullptr, 0, nullptr, nonce, key);
          },
          [key](uint8_t* out, const uint8_t* in, size_t n, const uint8_t* tag, uint64_t c) {
            uint8_t nonce[kNonceBytes];
            Nonce(c, nonce);
            return Decrypt(out, nullptr, in, n, tag, nullptr, 0, nonce, key) == 0;
          }};
}

// OpenSSL's EVP AES-256-GCM with a 12-byte nonce; one context each way,
// keyed once, as a link would keep them.
class OpensslGcm {
 public:
  explicit OpensslGcm(const uint8_t* key) : enc_(EVP_CIPHER_CTX_new()), dec_(EVP_CIPHER_CTX_new()) {
    if (enc_ == nullptr || dec_ == nullptr ||
        EVP_EncryptInit_ex(enc_, EVP_aes_256_gcm(), nullptr, key, nullptr) != 1 ||
        EVP_DecryptInit_ex(dec_, EVP_aes_256_gcm(), nullptr, key, nullptr) != 1) {
      Die("OpenSSL cannot set up AES-256-GCM");
    }
  }
  ~OpensslGcm() {
    EVP_CIPHER_CTX_free(enc_);
    EVP_CIPHER_CTX_free(dec_);
  }
  OpensslGcm(const OpensslGcm&) = delete;
  OpensslGcm& operator=(const OpensslGcm&) = delete;

  void Seal(uint8_t* out, const uint8_t* in, size_t n, uint8_t* tag, uint64_t c) {
    uint8_t nonce[12];
    Nonce(c, nonce);
    int len = 0;
    if (EVP_EncryptInit_ex(enc_, nullptr, nullptr, nullptr, nonce) != 1 ||
        EVP_EncryptUpdate(enc_, out, &len, in, static_cast<int>(n)) != 1 ||
        EVP_EncryptFinal_ex(enc_, out + len, &len) != 1 ||
        EVP_CIPHER_CTX_ctrl(enc_, EVP_CTRL_GCM_GET_TAG, kTag, tag) != 1) {
      Die("OpenSSL AES-256-GCM seal failed");
    }
  }
  bool Open(uint8_t* out, const uint8_t* in, size_t n, const uint8_t* tag, uint64_t c) {
    uint8_t nonce[12];
    Nonce(c, nonce);
    int len = 0;
    uint8_t expected[kTag];
    std::memcpy(expected, tag, kTag);
    return EVP_DecryptInit_ex(dec_, nullptr, nullptr, nullptr, nonce) == 1 &&
           EVP_DecryptUpdate(dec_, out, &len, in, static_cast<int>(n)) == 1 &&
           EVP_CIPHER_CTX_ctrl(dec_, EVP_CTRL_GCM_SET_TAG, kTag, expected) == 1 &&
           EVP_DecryptFinal_ex(dec_, out + len, &len) == 1;
  }

 private:
  EVP_CIPHER_CTX* enc_;
  EVP_CIPHER_CTX* dec_;
};

#ifdef GRADSYNC_HAVE_IPSEC_MB
// intel-ipsec-mb's AES-256-GCM (12-byte nonce), the key expanded once.
class IpsecMbGcm {
 public:
  explicit IpsecMbGcm(const uint8_t* key) : mgr_(alloc_mb_mgr(0)) {
    if (mgr_ == nullptr) Die("intel-ipsec-mb cannot allocate a manager");
    init_mb_mgr_auto(mgr_, &arch_);
    IMB_AES256_GCM_PRE(mgr_, key, &key_);
  }
  ~IpsecMbGcm() { free_mb_mgr(mgr_); }
  IpsecMbGcm(const IpsecMbGcm&) = delete;
  IpsecMbGcm& operator=(const IpsecMbGcm&) = delete;

  // Only where the CPU has AES-NI (the library's code without it is not
  // what sealed links run).
  bool usable() const { return arch_ >= IMB_ARCH_SSE; }
  void Seal(uint8_t* out, const uint8_t* in, size_t n, uint8_t* tag, uint64_t c) {
    uint8_t nonce[12];
    Nonce(c, nonce);
    gcm_context_data ctx;
    IMB_AES256_GCM_ENC(mgr_, &key_, &ctx, out, in, n, nonce, nonce, 0, tag, kTag);
  }
  bool Open(uint8_t* out, const uint8_t* in, size_t n, const uint8_t* tag, uint64_t c) {
    uint8_t nonce[12];
    Nonce(c, nonce);
    uint8_t expected[kTag], computed[kTag];
    std::memcpy(expected, tag, kTag);
    gcm_context_data ctx;
    IMB_AES256_GCM_DEC(mgr_, &key_, &ctx, out, in, n, nonce, nonce, 0, computed, kTag);
    return sodium_memcmp(expected, computed, kTag) == 0;
  }

 private:
  IMB_MGR* mgr_;
  IMB_ARCH arch_ = IMB_ARCH_NONE;
  alignas(64) gcm_key_data key_;
};
#endif

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seal then open must give the plaintext back; one flipped bit must fail.
void Check(const Cipher& c, size_t n) {
  std::vector<uint8_t> plain(n);
  randombytes_buf(plain.data(), n);
  std::vector<uint8_t> data = plain;
  uint8_t tag[kTag];
  c.seal(data.data(), data.data(), n, tag, 1);
  if (n >= 16 && std::memcmp(data.data(), plain.data(), 16) == 0) {
    Die(c.name + " left the plaintext as it was");
  }
  std::vector<uint8_t> tampered = data;
  tampered[n / 2] ^= 0x10;
  if (c.open(tampered.data(), tampered.data(), n, tag, 1)) {
    Die(c.name + " opened a tampered message");
  }
  if (!c.open(data.data(), data.data(), n, tag, 1) || data != plain) {
    Die(c.name + " does not round-trip");
  }
}

// One loopback link of the link table: a PUSH socket and a PULL socket,
// each in its own context (so each side has its own I/O thread), and the
// cipher its frames are sealed with (null: sent as they are).
struct Link {
  std::string name;
  const Cipher* cipher = nullptr;
  zmq::context_t send_context{1};
  zmq::context_t receive_context{1};
  zmq::socket_t push{send_context, zmq::socket_type::push};
  zmq::socket_t pull{receive_context, zmq::socket_type::pull};
  uint64_t counter = 0;

  Link(std::string link_name, const Cipher* c, bool curve) : name(std::move(link_name)), cipher(c) {
    for (zmq::socket_t* s : {&push, &pull}) s->set(zmq::sockopt::linger, 0);
    if (curve) {
      char server_public[41], server_secret[41], client_public[41], client_secret[41];
      if (zmq_curve_keypair(server_public, server_secret) != 0 ||
          zmq_curve_keypair(client_public, client_secret) != 0) {
        Die("no CURVE keys: libzmq lacks CURVE");
      }
      pull.set(zmq::sockopt::curve_server, 1);
      pull.set(zmq::sockopt::curve_secretkey, server_secret);
      push.set(zmq::sockopt::curve_serverkey, server_public);
      push.set(zmq::sockopt::curve_publickey, client_public);
      push.set(zmq::sockopt::curve_secretkey, client_secret);
    }
    pull.bind("tcp://127.0.0.1:*");
    push.connect(pull.get(zmq::sockopt::last_endpoint));
  }

  // Sends src[0, total) in messages of `n` bytes and receives them into
  // dst; returns the seconds from the first send to the last message in
  // dst.
  double Transfer(const uint8_t* src, uint8_t* dst, size_t total, size_t n) {
    const size_t messages = total / n;
    const uint64_t first = counter;
    counter += messages;
    const double start = Now();
    std::thread sender([&] {
      for (size_t i = 0; i < messages; ++i) {
        const uint8_t* at = src + i * n;
        if (cipher == nullptr) {  // zero-copy: src outlives the transfer
          push.send(zmq::message_t(const_cast<uint8_t*>(at), n, nullptr, nullptr),
                    zmq::send_flags::none);
          continue;
        }
        const uint64_t c = first + i;
        zmq::message_t m(sizeof(c) + kTag + n);
        auto* out = static_cast<uint8_t*>(m.data());
        std::memcpy(out, &c, sizeof(c));
        cipher->seal(out + sizeof(c) + kTag, at, n, out + sizeof(c), c);
        push.send(std::move(m), zmq::send_flags::none);
      }
    });
    for (size_t i = 0; i < messages; ++i) {
      zmq::message_t m;
      if (!pull.recv(m)) Die(name + ": receive failed");
      const auto* in = static_cast<const uint8_t*>(m.data());
      if (cipher == nullptr) {
        if (m.size() != n) Die(name + ": a message of the wrong size");
        std::memcpy(dst + i * n, in, n);
        continue;
      }
      uint64_t c = 0;
      if (m.size() != sizeof(c) + kTag + n) Die(name + ": a message of the wrong size");
      std::memcpy(&c, in, sizeof(c));
      if (c != first + i ||
          !cipher->open(dst + i * n, in + sizeof(c) + kTag, n, in + sizeof(c), c)) {
        Die(name + ": a message did not open");
      }
    }
    const double took = Now() - start;
    sender.join();
    return took;
  }
};

// The link table (above the file).
void LinkTable(const Flags& flags, const Cipher& secretbox, const Cipher& gcm) {
  const size_t total = flags.link_mib << 20;
  std::vector<uint8_t> src(total), dst(total);
  randombytes_buf(src.data(), total);
  std::vector<std::unique_ptr<Link>> links;
  links.push_back(std::make_unique<Link>("plain", nullptr, false));
  links.push_back(std::make_unique<Link>("CURVE", nullptr, true));
  links.push_back(std::make_unique<Link>("plain + sealed xsalsa20poly1305", &secretbox, false));
  links.push_back(std::make_unique<Link>("plain + sealed aes256gcm (OpenSSL)", &gcm, false));
  std::map<std::string, std::vector<double>> gbps;
  for (size_t n : flags.sizes) {
    if (n > total) Die("--link_mib is smaller than a message of " + std::to_string(n) + " bytes");
    std::map<std::string, std::vector<double>> times;
    for (int round = -1; round < flags.rounds; ++round) {  // round -1 warms up and checks
      for (auto& link : links) {
        std::fill(dst.begin(), dst.end(), 0);
        const double t = link->Transfer(src.data(), dst.data(), total, n);
        if (round < 0 && !std::equal(src.begin(), src.begin() + total / n * n, dst.begin())) {
          Die(link->name + " delivered other bytes");
        }
        if (round >= 0) times[link->name].push_back(t);
      }
    }
    for (auto& link : links) {
      gbps[link->name].push_back(static_cast<double>(total / n * n) /
                                 Quantile(times[link->name], 0.5) / 1e9);
    }
  }
  std::printf("\nlink: %zu MiB over loopback TCP per round, goodput GB/s (median of %d rounds)\n\n",
              flags.link_mib, flags.rounds);
  std::printf("%-36s", "message bytes");
  for (size_t n : flags.sizes) std::printf(" %12zu   vs plain", n);
  std::printf("\n");
  for (auto& link : links) {
    std::printf("%-36s", link->name.c_str());
    for (size_t i = 0; i < flags.sizes.size(); ++i) {
      std::printf(" %12.2f  %7.2fx", gbps[link->name][i], gbps[link->name][i] / gbps["plain"][i]);
    }
    std::printf("\n");
  }
  std::printf("\n");
  for (auto& link : links) {
    for (size_t i = 0; i < flags.sizes.size(); ++i) {
      std::printf("{\"link\":\"%s\",\"bytes\":%zu,\"gbps\":%.3f,\"vs_plain\":%.3f}\n",
                  link->name.c_str(), flags.sizes[i], gbps[link->name][i],
                  gbps[link->name][i] / gbps["plain"][i]);
    }
  }
}

int Main(int argc, char** argv) {
  const Flags flags = OrDie(ParseFlags(argc, argv), "flags");
  if (sodium_init() < 0) Die("libsodium cannot start");
  uint8_t key[32];
  randombytes_buf(key, sizeof(key));
  std::vector<Cipher> ciphers = {
      Secretbox(key), SodiumAead<crypto_aead_chacha20poly1305_ietf_encrypt_detached,
                                 crypto_aead_chacha20poly1305_ietf_decrypt_detached,
                                 crypto_aead_chacha20poly1305_ietf_NPUBBYTES>(
                          "chacha20poly1305 (libsodium)", static_cast<const uint8_t*>(key))};
  crypto_aead_aes256gcm_state state;
  if (crypto_aead_aes256gcm_is_available()) {
    crypto_aead_aes256gcm_beforenm(&state, key);
    ciphers.push_back(
        SodiumAead<crypto_aead_aes256gcm_encrypt_detached_afternm,
                   crypto_aead_aes256gcm_decrypt_detached_afternm, crypto_aead_aes256gcm_NPUBBYTES>(
            "aes256gcm (libsodium)", &state));
  } else {
    std::printf("libsodium's AES-256-GCM needs AES-NI and PCLMUL: not measured\n");
  }
  OpensslGcm openssl(key);
  ciphers.push_back({"aes256gcm (OpenSSL)",
                     [&](uint8_t* out, const uint8_t* in, size_t n, uint8_t* t, uint64_t c) {
                       openssl.Seal(out, in, n, t, c);
                     },
                     [&](uint8_t* out, const uint8_t* in, size_t n, const uint8_t* t, uint64_t c) {
                       return openssl.Open(out, in, n, t, c);
                     }});
#ifdef GRADSYNC_HAVE_IPSEC_MB
  auto ipsec = std::make_unique<IpsecMbGcm>(key);
  if (ipsec->usable()) {
    ciphers.push_back({"aes256gcm (intel-ipsec-mb)",
                       [&](uint8_t* out, const uint8_t* in, size_t n, uint8_t* t, uint64_t c) {
                         ipsec->Seal(out, in, n, t, c);
                       },
                       [&](uint8_t* out, const uint8_t* in, size_t n, const uint8_t* t,
                           uint64_t c) { return ipsec->Open(out, in, n, t, c); }});
  } else {
    std::printf("intel-ipsec-mb: this CPU has no AES-NI: not measured\n");
  }
#endif
  std::printf(
      "cipher_bench: seal + open in place on one core, median of %d rounds, GB/s of "
      "plaintext (memcpy: two copies)\n\n",
      flags.rounds);
  std::printf("%-30s", "bytes");
  for (size_t n : flags.sizes) std::printf(" %12zu   vs CURVE", n);
  std::printf("\n");
  std::map<std::string, std::vector<double>> gbps;  // name -> per size
  std::vector<std::string> order = {"memcpy"};
  for (const Cipher& c : ciphers) order.push_back(c.name);
  uint64_t counter = 10;
  for (size_t n : flags.sizes) {
    for (const Cipher& c : ciphers) Check(c, std::min<size_t>(n, 4096));
    std::vector<uint8_t> data(n), copy(n);
    randombytes_buf(data.data(), n);
    std::map<std::string, std::vector<double>> times;
    for (int round = -1; round < flags.rounds; ++round) {  // round -1 warms up
      double t = Now();
      std::memcpy(copy.data(), data.data(), n);
      std::memcpy(data.data(), copy.data(), n);
      if (round >= 0) times["memcpy"].push_back(Now() - t);
      for (const Cipher& c : ciphers) {
        uint8_t tag[kTag];
        t = Now();
        c.seal(data.data(), data.data(), n, tag, ++counter);
        if (!c.open(data.data(), data.data(), n, tag, counter)) {
          Die(c.name + " failed to open its own seal");
        }
        if (round >= 0) times[c.name].push_back(Now() - t);
      }
    }
    for (const std::string& name : order) {
      gbps[name].push_back(static_cast<double>(n) / Quantile(times[name], 0.5) / 1e9);
    }
  }
  const std::string curve = ciphers[0].name;
  for (const std::string& name : order) {
    std::printf("%-30s", name.c_str());
    for (size_t i = 0; i < flags.sizes.size(); ++i) {
      std::printf(" %12.2f  %7.2fx", gbps[name][i], gbps[name][i] / gbps[curve][i]);
    }
    std::printf("\n");
  }
  std::printf("\n");
  for (const std::string& name : order) {
    for (size_t i = 0; i < flags.sizes.size(); ++i) {
      std::printf("{\"cipher\":\"%s\",\"bytes\":%zu,\"gbps\":%.3f,\"vs_curve\":%.3f}\n",
                  name.c_str(), flags.sizes[i], gbps[name][i], gbps[name][i] / gbps[curve][i]);
    }
  }
  if (flags.link_mib > 0) LinkTable(flags, ciphers[0], ciphers.back());
  return 0;
}

}  // namespace
}  // namespace gradsync::bench

int main(int argc, char** argv) { return gradsync::bench::Main(argc, argv); }
