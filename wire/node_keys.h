// Per-node CURVE identity (docs/security.md): every node of a CURVE job
// has a key pair of its own besides the job's key. The job key admits a
// node to the scheduler; the node key is what its peers know it by. The
// scheduler binds each node's identity to its public key and hands every
// node the plan (each peer's identity, data endpoint and public key).
//
// A data transport (ZmqOptions::node_keys) then
//   - serves on its listening socket with the node's own secret key, and
//     its ZAP handler admits only the plan's keys, answering with the
//     identity bound to the key as ZAP User-Id;
//   - connects to a peer of the plan with that peer's public key as the
//     server key (nobody else can serve that endpoint to it) and the node's
//     own pair as client key; other endpoints (the scheduler) get the job
//     key.
//
// Thread-safety: all methods are thread-safe; the plan may be replaced at
// any time (SetPlan), and what is looked up afterwards sees the new one.
#ifndef GRADSYNC_WIRE_NODE_KEYS_H_
#define GRADSYNC_WIRE_NODE_KEYS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "wire/curve.h"
#include "wire/message.h"

namespace gradsync::wire {

class NodeKeys {
 public:
  NodeKeys(CurveKey job, CurveKey own) : job_(std::move(job)), own_(std::move(own)) {}

  const CurveKey& job() const { return job_; }
  const CurveKey& own() const { return own_; }

  // Replaces the plan with `peers` (those without an identity or a valid
  // public key are left out: nobody is admitted by them), the plan of
  // membership epoch `epoch`.
  void SetPlan(const std::vector<NodeInfo>& peers, uint32_t epoch = 0);
  // The membership epoch of the plan.
  uint32_t epoch() const;
  // The identity bound to the 32-byte public key `key`; nullopt when the
  // key is not one of the plan's.
  std::optional<std::string> IdentityOf(const uint8_t* key) const;
  // The public key (Z85) of the plan's node at `endpoint` (NodeInfo::
  // DataEndpoint or StreamEndpoint, or one added by AddEndpoint); nullopt for an endpoint
  // outside the plan.
  std::optional<std::string> ServerKeyAt(const std::string& endpoint) const;
  // The node `identity` also serves `endpoint` (a ring lane's, announced by
  // that node): connections there require that node's key, looked up in
  // the plan of the moment (none once the node left it). An endpoint of the
  // plan keeps its own node's key. At most kMaxExtraEndpoints are kept
  // (the lowest endpoint goes first).
  static constexpr size_t kMaxExtraEndpoints = 1024;
  void AddEndpoint(const std::string& identity, const std::string& endpoint);
  // Whether a plan was set with at least one node in it.
  bool HasPlan() const;
  // The public keys (32 bytes each) of the plan's nodes at the numeric
  // address `address` (their host, resolved when the plan was set); empty
  // when no node of the plan is there.
  std::vector<std::string> KeysAt(const std::string& address) const;
  // The numeric addresses of this node's own host in the plan (where its
  // connections must come from for its peers to take them); empty when
  // the plan does not have this node.
  std::vector<std::string> OwnAddresses() const;

 private:
  const CurveKey job_;
  const CurveKey own_;
  mutable std::mutex mu_;
  std::map<std::string, std::string> identity_by_key_;               // binary key -> identity
  std::map<std::string, std::string> key_by_endpoint_;               // endpoint -> Z85 key
  std::map<std::string, std::string> key_by_identity_;               // identity -> Z85 key
  std::map<std::string, std::string> extra_endpoints_;               // endpoint -> identity
  std::map<std::string, std::vector<std::string>> keys_by_address_;  // numeric -> binary keys
  std::vector<std::string> own_addresses_;
  uint32_t epoch_ = 0;
};

// The 32 bytes of a Z85 CURVE key; nullopt when `z85` is not one.
std::optional<std::string> DecodeKey(std::string_view z85);
// The same for a secret key, into secret memory (wire/secret_string.h).
std::optional<SecretString> DecodeSecretKey(std::string_view z85);

// The identity a data transport's outgoing connection presents as its
// ZeroMQ routing id with node keys: `identity` and a random suffix that no
// other node can guess, so no one can take its route on the peer's socket
// first. RoutedIdentity gives `identity` back from it (nullopt: not one).
std::string RoutingIdFor(const std::string& identity);
std::optional<std::string> RoutedIdentity(const std::string& routing_id);
// Whether a message under transport identity `claimed` may come from the
// node whose key is bound to `bound`, in membership epoch `epoch`: the
// node's own data identity, its parameter-server client's of this epoch or
// the next (PsClientIdentity; a worker may have the next plan first), one
// of their ring lanes' (LaneIdentity) or of its halving-and-doubling
// pairs' (PairIdentity), or its link-timing echoes' (ProbeIdentity).
// Compared exactly: a node has at most two
// parameter-server identities at a time.
bool IdentityMatchesKey(const std::string& claimed, const std::string& bound, uint32_t epoch);

// Registration (docs/security.md#per-node-identity): a node proves to the
// scheduler that it holds the secret key of the public key it registers
// with. The proof is a NaCl crypto_box (libsodium: X25519, XSalsa20-
// Poly1305) from the node's key pair to the scheduler's public key
// (SchedulerPublicKey) of a BLAKE2b hash of the registration's facts (role,
// requested rank, host, ports, data identity, public key): only the holder
// of the node's secret or of the scheduler's can make one that opens, and
// it opens only for these facts. kRegistrationProofBytes long.
constexpr size_t kRegistrationProofBytes = 24 + 16 + 32;  // nonce, tag, hash
std::string RegistrationProof(const CurveKey& node, const std::string& scheduler_public_z85,
                              const NodeInfo& me);
// Whether `proof` opens under the scheduler's secret key and the facts'
// public key and matches the facts.
bool CheckRegistrationProof(std::string_view scheduler_secret_z85, const NodeInfo& facts,
                            const std::string& proof);

// The node key of a process: the key file `node_key_file` (the setting)
// when given; else, with `keep_at` empty, a new pair in memory (a worker);
// else the key kept in the file `keep_at` (0600, in a 0700 directory),
// made there on first start, so that a restarted shard presents the same
// key.
StatusOr<CurveKey> LoadNodeKey(const std::string& node_key_file, const std::string& keep_at);

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_NODE_KEYS_H_
