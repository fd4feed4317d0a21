#include "wire/noise.h"

#include <sodium.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync::wire::noise {
namespace {

// One published vector: its string fields and its messages (payload,
// ciphertext), as hex.
struct Vector {
  std::map<std::string, std::string> fields;
  std::vector<std::pair<std::string, std::string>> messages;
};

std::string ReadData(const std::string& rel) {
  const char* dir = std::getenv("TEST_SRCDIR");
  std::ifstream in(std::string(dir != nullptr ? dir : ".") + "/gradsync/" + rel);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The vectors of testdata/noise_kk_25519_aesgcm_blake2b.json: the file is
// read as a sequence of "key": "value" pairs (every value it holds is a
// string, a list of strings or a list of {payload, ciphertext}).
std::vector<Vector> LoadVectors() {
  const std::string text = ReadData("wire/testdata/noise_kk_25519_aesgcm_blake2b.json");
  // Each string, and whether it is a key (a ':' follows it).
  std::vector<std::pair<std::string, bool>> strings;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '"') continue;
    const size_t end = text.find('"', i + 1);
    if (end == std::string::npos) break;
    const size_t next = text.find_first_not_of(" \t\r\n", end + 1);
    strings.emplace_back(text.substr(i + 1, end - i - 1),
                         next != std::string::npos && text[next] == ':');
    i = end;
  }
  std::vector<Vector> out;
  bool in_vectors = false;
  for (size_t i = 0; i + 1 < strings.size(); ++i) {
    const auto& [key, is_key] = strings[i];
    if (!is_key) continue;
    if (key == "vectors") in_vectors = true;
    if (!in_vectors || strings[i + 1].second) continue;  // no string value
    const std::string& value = strings[i + 1].first;
    if (key == "source") out.emplace_back();
    if (out.empty()) continue;
    if (key == "payload") {
      out.back().messages.emplace_back(value, "");
    } else if (key == "ciphertext" && !out.back().messages.empty()) {
      out.back().messages.back().second = value;
    } else {
      out.back().fields[key == "name" ? "protocol_name" : key] = value;
    }
  }
  return out;
}

std::vector<uint8_t> Hex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  size_t n = 0;
  sodium_hex2bin(out.data(), out.size(), hex.data(), hex.size(), nullptr, &n, nullptr);
  out.resize(n);
  return out;
}

std::string ToHex(const uint8_t* p, size_t n) {
  std::string out(2 * n + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), p, n);
  out.resize(2 * n);
  return out;
}
std::string ToHex(const std::vector<uint8_t>& v) { return ToHex(v.data(), v.size()); }

TEST(Noise, ThePublishedVectorsOfNoiseKK25519AesGcmBlake2b) {
  ASSERT_GE(sodium_init(), 0);
  const std::vector<Vector> vectors = LoadVectors();
  ASSERT_EQ(vectors.size(), 3u);
  for (const Vector& v : vectors) {
    SCOPED_TRACE(v.fields.at("source"));
    ASSERT_EQ(v.fields.at("protocol_name"), kProtocolName);
    ASSERT_GE(v.messages.size(), 4u);
    const auto f = [&](const char* k) { return Hex(v.fields.at(k)); };
    const auto ip = f("init_prologue"), rp = f("resp_prologue");
    const auto is = f("init_static"), ie = f("init_ephemeral"), irs = f("init_remote_static");
    const auto rs = f("resp_static"), re = f("resp_ephemeral"), rrs = f("resp_remote_static");
    HandshakeKK init(true, is.data(), irs.data(), ip.data(), ip.size(), ie.data());
    HandshakeKK resp(false, rs.data(), rrs.data(), rp.data(), rp.size(), re.data());
    // Messages 0 and 1: the handshake, each read back by the other side.
    for (int m = 0; m < 2; ++m) {
      HandshakeKK& writer = m == 0 ? init : resp;
      HandshakeKK& reader = m == 0 ? resp : init;
      const auto payload = Hex(v.messages[m].first);
      std::vector<uint8_t> wire, read;
      ASSERT_TRUE(writer.WriteMessage(payload.data(), payload.size(), &wire));
      EXPECT_EQ(ToHex(wire), v.messages[m].second) << "message " << m;
      ASSERT_TRUE(reader.ReadMessage(wire.data(), wire.size(), &read));
      EXPECT_EQ(read, payload);
    }
    ASSERT_TRUE(init.Finished());
    ASSERT_TRUE(resp.Finished());
    if (v.fields.count("handshake_hash") != 0) {
      EXPECT_EQ(ToHex(init.HandshakeHash(), kHashBytes), v.fields.at("handshake_hash"));
    }
    EXPECT_EQ(ToHex(init.HandshakeHash(), kHashBytes), ToHex(resp.HandshakeHash(), kHashBytes));
    // The rest: transport messages, the initiator's first, alternating.
    uint8_t k1[kKeyBytes], k2[kKeyBytes], r1[kKeyBytes], r2[kKeyBytes];
    init.Split(k1, k2);
    resp.Split(r1, r2);
    EXPECT_EQ(ToHex(k1, kKeyBytes), ToHex(r1, kKeyBytes));
    EXPECT_EQ(ToHex(k2, kKeyBytes), ToHex(r2, kKeyBytes));
    CipherState to_resp, to_init, from_init, from_resp;
    to_resp.InitializeKey(k1);
    from_init.InitializeKey(r1);
    to_init.InitializeKey(r2);
    from_resp.InitializeKey(k2);
    for (size_t m = 2; m < v.messages.size(); ++m) {
      const bool by_initiator = m % 2 == 0;
      const auto payload = Hex(v.messages[m].first);
      std::vector<uint8_t> wire, read;
      ASSERT_TRUE((by_initiator ? to_resp : to_init)
                      .EncryptWithAd(nullptr, 0, payload.data(), payload.size(), &wire));
      EXPECT_EQ(ToHex(wire), v.messages[m].second) << "message " << m;
      ASSERT_TRUE((by_initiator ? from_init : from_resp)
                      .DecryptWithAd(nullptr, 0, wire.data(), wire.size(), &read));
      EXPECT_EQ(read, payload);
    }
  }
}

struct Keys {
  uint8_t pub[kDhBytes], secret[kDhBytes];
  Keys() { crypto_box_keypair(pub, secret); }
};

TEST(Noise, AMessageUnderOtherKeysOrAlteredDoesNotOpen) {
  ASSERT_GE(sodium_init(), 0);
  const Keys a, b, c;
  const uint8_t prologue[] = "job";
  std::vector<uint8_t> m1, read;
  HandshakeKK init(true, a.secret, b.pub, prologue, sizeof(prologue));
  ASSERT_TRUE(init.WriteMessage(reinterpret_cast<const uint8_t*>("id"), 2, &m1));
  ASSERT_EQ(m1.size(), 2 + kMessageOverhead);
  // A responder that expects another initiator (c), or has another prologue.
  HandshakeKK other_peer(false, b.secret, c.pub, prologue, sizeof(prologue));
  EXPECT_FALSE(other_peer.ReadMessage(m1.data(), m1.size(), &read));
  const uint8_t other_prologue[] = "jox";
  HandshakeKK other_job(false, b.secret, a.pub, other_prologue, sizeof(other_prologue));
  EXPECT_FALSE(other_job.ReadMessage(m1.data(), m1.size(), &read));
  // One flipped bit anywhere.
  for (size_t i = 0; i < m1.size(); i += 7) {
    std::vector<uint8_t> bad = m1;
    bad[i] ^= 1;
    HandshakeKK r(false, b.secret, a.pub, prologue, sizeof(prologue));
    EXPECT_FALSE(r.ReadMessage(bad.data(), bad.size(), &read)) << "byte " << i;
  }
  // Short, and a low-order ephemeral key (all zero).
  HandshakeKK r(false, b.secret, a.pub, prologue, sizeof(prologue));
  EXPECT_FALSE(r.ReadMessage(m1.data(), kMessageOverhead - 1, &read));
  std::vector<uint8_t> zero = m1;
  std::fill(zero.begin(), zero.begin() + kDhBytes, 0);
  EXPECT_FALSE(r.ReadMessage(zero.data(), zero.size(), &read));
  // The real pair goes through, and out of turn is refused.
  HandshakeKK resp(false, b.secret, a.pub, prologue, sizeof(prologue));
  EXPECT_FALSE(resp.WriteMessage(nullptr, 0, &read));
  ASSERT_TRUE(resp.ReadMessage(m1.data(), m1.size(), &read));
  EXPECT_EQ(std::string(read.begin(), read.end()), "id");
}

TEST(Noise, ResponderKeyCompromiseDoesNotLetAnotherPoseAsTheInitiator) {
  // Noise's KK message 1 is open to key-compromise impersonation (whoever
  // holds the responder's secret can write it as any initiator); message 2
  // mixes in se, which needs the initiator's own secret, so the transport
  // keys of such an impostor differ from the responder's.
  ASSERT_GE(sodium_init(), 0);
  const Keys victim, honest, impostor_e;
  const uint8_t prologue[] = "job";
  // The impostor writes message 1 as `honest` with the victim's secret:
  // es = DH(e, victim), ss = DH(victim secret, honest pub).
  SymmetricState st(kProtocolName);
  st.MixHash(prologue, sizeof(prologue));
  st.MixHash(honest.pub, kDhBytes);
  st.MixHash(victim.pub, kDhBytes);
  std::vector<uint8_t> m1(impostor_e.pub, impostor_e.pub + kDhBytes), read, m2;
  st.MixHash(impostor_e.pub, kDhBytes);
  uint8_t dh[kDhBytes];
  ASSERT_EQ(crypto_scalarmult(dh, impostor_e.secret, victim.pub), 0);
  st.MixKey(dh, kDhBytes);
  ASSERT_EQ(crypto_scalarmult(dh, victim.secret, honest.pub), 0);
  st.MixKey(dh, kDhBytes);
  ASSERT_TRUE(st.EncryptAndHash(reinterpret_cast<const uint8_t*>("honest"), 6, &m1));
  HandshakeKK resp(false, victim.secret, honest.pub, prologue, sizeof(prologue));
  ASSERT_TRUE(resp.ReadMessage(m1.data(), m1.size(), &read));  // message 1 is forgeable
  ASSERT_TRUE(resp.WriteMessage(nullptr, 0, &m2));
  // Message 2: ee = DH(e, re); se needs DH(honest secret, re): the impostor
  // has only guesses, and message 2 does not open under any of them.
  st.MixHash(m2.data(), kDhBytes);
  ASSERT_EQ(crypto_scalarmult(dh, impostor_e.secret, m2.data()), 0);
  st.MixKey(dh, kDhBytes);
  ASSERT_EQ(crypto_scalarmult(dh, victim.secret, m2.data()), 0);  // its best guess
  st.MixKey(dh, kDhBytes);
  EXPECT_FALSE(st.DecryptAndHash(m2.data() + kDhBytes, m2.size() - kDhBytes, &read));
  uint8_t mine1[kKeyBytes], mine2[kKeyBytes], real1[kKeyBytes], real2[kKeyBytes];
  st.Split(mine1, mine2);
  resp.Split(real1, real2);
  EXPECT_NE(ToHex(mine1, kKeyBytes), ToHex(real1, kKeyBytes));
  EXPECT_NE(ToHex(mine2, kKeyBytes), ToHex(real2, kKeyBytes));
}

TEST(Noise, RekeyIsTheSpecsAndBothSidesAgree) {
  uint8_t key[kKeyBytes] = {1, 2, 3}, expect[kKeyBytes + kTagBytes];
  const uint8_t zeros[kKeyBytes] = {};
  ASSERT_TRUE(Encrypt(key, ~uint64_t{0}, nullptr, 0, zeros, kKeyBytes, expect));
  CipherState a, b;
  a.InitializeKey(key);
  b.InitializeKey(key);
  ASSERT_TRUE(a.Rekey());
  ASSERT_TRUE(b.Rekey());
  EXPECT_EQ(ToHex(a.key(), kKeyBytes), ToHex(expect, kKeyBytes));
  std::vector<uint8_t> wire, read;
  ASSERT_TRUE(a.EncryptWithAd(nullptr, 0, zeros, 5, &wire));
  ASSERT_TRUE(b.DecryptWithAd(nullptr, 0, wire.data(), wire.size(), &read));
  CipherState old;
  old.InitializeKey(key);
  read.clear();
  EXPECT_FALSE(old.DecryptWithAd(nullptr, 0, wire.data(), wire.size(), &read));
}

}  // namespace
}  // namespace gradsync::wire::noise
