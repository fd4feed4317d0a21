#include "wire/node_keys.h"

#include <sodium.h>
#include <sys/stat.h>

#include <algorithm>

#include "common/net.h"
#include "common/private_files.h"
#include "wire/transport.h"
#include "zmq.h"

namespace gradsync::wire {

namespace {

constexpr char kRoutingSeparator = '#';

}  // namespace

std::optional<std::string> DecodeKey(std::string_view z85) {
  uint8_t binary[32];
  if (!DecodeZ85Key(z85, binary)) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(binary), sizeof(binary));
}

std::optional<SecretString> DecodeSecretKey(std::string_view z85) {
  SecretString out(32, '\0');
  if (!DecodeZ85Key(z85, reinterpret_cast<uint8_t*>(out.data()))) return std::nullopt;
  return out;
}

void NodeKeys::SetPlan(const std::vector<NodeInfo>& peers, uint32_t epoch) {
  std::map<std::string, std::string> identities, keys, by_identity;
  std::map<std::string, std::vector<std::string>> by_address;
  std::vector<std::string> own_addresses;
  for (const NodeInfo& p : peers) {
    auto binary = DecodeKey(p.public_key);
    if (!binary || p.identity.empty()) continue;
    StatusOr<std::vector<std::string>> resolved = ResolveHost(p.host);
    const std::vector<std::string> addresses =
        resolved.ok() ? *resolved : std::vector<std::string>();
    if (p.public_key == own_.public_z85) own_addresses = addresses;
    for (const std::string& address : addresses) {
      std::vector<std::string>& at = by_address[address];
      if (std::find(at.begin(), at.end(), *binary) == at.end()) at.push_back(*binary);
    }
    identities[*binary] = p.identity;
    keys[p.DataEndpoint()] = p.public_key;
    if (p.stream_port != 0) keys[p.StreamEndpoint()] = p.public_key;
    by_identity[p.identity] = p.public_key;
  }
  std::lock_guard<std::mutex> lock(mu_);
  identity_by_key_.swap(identities);
  key_by_endpoint_.swap(keys);
  key_by_identity_.swap(by_identity);
  keys_by_address_.swap(by_address);
  own_addresses_.swap(own_addresses);
  epoch_ = epoch;
}

uint32_t NodeKeys::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_;
}

std::vector<std::string> NodeKeys::OwnAddresses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return own_addresses_;
}

bool NodeKeys::HasPlan() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !identity_by_key_.empty();
}

std::vector<std::string> NodeKeys::KeysAt(const std::string& address) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = keys_by_address_.find(address);
  return it == keys_by_address_.end() ? std::vector<std::string>() : it->second;
}

void NodeKeys::AddEndpoint(const std::string& identity, const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  if (key_by_endpoint_.count(endpoint) != 0) return;  // the plan's word stands
  if (extra_endpoints_.size() >= kMaxExtraEndpoints && extra_endpoints_.count(endpoint) == 0) {
    extra_endpoints_.erase(extra_endpoints_.begin());
  }
  extra_endpoints_[endpoint] = identity;
}

std::optional<std::string> NodeKeys::IdentityOf(const uint8_t* key) const {
  const std::string binary(reinterpret_cast<const char*>(key), 32);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = identity_by_key_.find(binary);
  if (it == identity_by_key_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> NodeKeys::ServerKeyAt(const std::string& endpoint) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = key_by_endpoint_.find(endpoint);
  if (it != key_by_endpoint_.end()) return it->second;
  auto extra = extra_endpoints_.find(endpoint);
  if (extra == extra_endpoints_.end()) return std::nullopt;
  auto key = key_by_identity_.find(extra->second);
  if (key == key_by_identity_.end()) return std::nullopt;  // no longer in the plan
  return key->second;
}

std::string RoutingIdFor(const std::string& identity) {
  return RandomIdentity(identity + kRoutingSeparator);
}

std::optional<std::string> RoutedIdentity(const std::string& routing_id) {
  const size_t at = routing_id.rfind(kRoutingSeparator);
  if (at == std::string::npos || at == 0) return std::nullopt;
  return routing_id.substr(0, at);
}

bool IdentityMatchesKey(const std::string& lane_claimed, const std::string& bound, uint32_t epoch) {
  if (bound.empty()) return false;
  const std::string claimed = ProbeBase(PairBase(LaneBase(lane_claimed)));
  return claimed == bound || claimed == PsClientIdentity(bound, epoch) ||
         (epoch < UINT32_MAX && claimed == PsClientIdentity(bound, epoch + 1));
}

namespace {

// BLAKE2b-256 of the registration's facts, each length-prefixed.
void RegistrationFacts(const NodeInfo& me, uint8_t* out) {
  std::string t = "gradsync registration v1";
  auto add = [&t](const std::string& s) {
    const uint32_t n = static_cast<uint32_t>(s.size());
    t.append(reinterpret_cast<const char*>(&n), sizeof(n));
    t += s;
  };
  add(std::to_string(static_cast<int>(me.role)));
  add(std::to_string(me.rank));
  add(me.host);
  add(std::to_string(me.data_port));
  add(std::to_string(me.stream_port));
  add(me.identity);
  add(me.public_key);
  crypto_generichash(out, 32, reinterpret_cast<const uint8_t*>(t.data()), t.size(), nullptr, 0);
}

// A decoded secret key, in secret memory.
struct DecodedSecret {
  explicit DecodedSecret(std::string_view z85) : key(DecodeSecretKey(z85)) {}
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(key->data()); }
  std::optional<SecretString> key;
};

}  // namespace

std::string RegistrationProof(const CurveKey& node, const std::string& scheduler_public_z85,
                              const NodeInfo& me) {
  const DecodedSecret secret(node.secret_z85);
  const std::optional<std::string> server = DecodeKey(scheduler_public_z85);
  if (!secret.key || !server || sodium_init() < 0) return "";
  uint8_t facts[32];
  RegistrationFacts(me, facts);
  std::string out(kRegistrationProofBytes, '\0');
  uint8_t* p = reinterpret_cast<uint8_t*>(out.data());
  randombytes_buf(p, crypto_box_NONCEBYTES);
  const bool ok =
      crypto_box_easy(p + crypto_box_NONCEBYTES, facts, sizeof(facts), p,
                      reinterpret_cast<const uint8_t*>(server->data()), secret.data()) == 0;
  return ok ? out : "";
}

bool CheckRegistrationProof(std::string_view scheduler_secret_z85, const NodeInfo& facts,
                            const std::string& proof) {
  const DecodedSecret secret(scheduler_secret_z85);
  const std::optional<std::string> node = DecodeKey(facts.public_key);
  if (!secret.key || !node || proof.size() != kRegistrationProofBytes || sodium_init() < 0) {
    return false;
  }
  const uint8_t* p = reinterpret_cast<const uint8_t*>(proof.data());
  uint8_t opened[32], want[32];
  const bool opens =
      crypto_box_open_easy(opened, p + crypto_box_NONCEBYTES,
                           kRegistrationProofBytes - crypto_box_NONCEBYTES, p,
                           reinterpret_cast<const uint8_t*>(node->data()), secret.data()) == 0;
  RegistrationFacts(facts, want);
  return opens && sodium_memcmp(opened, want, sizeof(want)) == 0;
}

StatusOr<CurveKey> LoadNodeKey(const std::string& node_key_file, const std::string& keep_at) {
  if (!node_key_file.empty()) return ReadKeyFile(node_key_file);
  if (keep_at.empty()) return GenerateCurveKey();
  const size_t slash = keep_at.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    GS_RETURN_IF_ERROR(MakePrivateDirectory(keep_at.substr(0, slash), "node key directory"));
  }
  struct stat st;
  if (lstat(keep_at.c_str(), &st) == 0) return ReadKeyFile(keep_at);
  GS_ASSIGN_OR_RETURN(CurveKey key, GenerateCurveKey());
  GS_RETURN_IF_ERROR(WriteKeyFile(keep_at, key));
  return key;
}

}  // namespace gradsync::wire
