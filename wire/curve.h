// CurveZMQ for a job: the job's key pair, kept in a key file that every
// process of the job reads, admits a process to the job: the scheduler's
// socket runs CURVE with it (server: its secret key; clients: its public
// key as the server key and the pair as their own) and a ZAP handler admits
// only clients whose key is the job's. A peer with no key, another key or
// another job's key fails the handshake and is counted. Between the nodes
// of a job each node's own key pair is used instead (wire/node_keys.h).

// Key file: two lines, "public <40 Z85 chars>" and "secret <40 Z85 chars>";
// a regular file, not a symbolic link, owned by the user the process runs
// as, that only its owner may read (mode 0600 or stricter).
//
// Settings (flags or GRADSYNC_ variables): security=auto|curve|none (auto),
// key_file (GRADSYNC_KEY_FILE). auto: CURVE when a key file is given;
// otherwise none when the node's host is loopback, and an error when it is
// not (a node reachable from the network does not start insecure unless
// told to with security=none). Loopback means that the host resolves, and
// only to 127.0.0.0/8 or ::1 (common/net.h): a name is judged by its
// addresses, not by how it is spelled.
//
// Thread-safety: pure functions.
#ifndef GRADSYNC_WIRE_CURVE_H_
#define GRADSYNC_WIRE_CURVE_H_

#include <optional>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace gradsync::wire {

struct CurveKey {
  std::string public_z85;  // 40 characters
  std::string secret_z85;  // 40 characters
};

// Whether `z85` is a CURVE key (40 Z85 characters).
bool IsCurvePublicKey(const std::string& z85);
// A new key pair (libzmq's zmq_curve_keypair).
StatusOr<CurveKey> GenerateCurveKey();
// Writes `key` to a new file at `path` with mode 0600; fails if it exists.
Status WriteKeyFile(const std::string& path, const CurveKey& key);
// Reads a key file, refusing (InvalidArgument naming the path and the
// problem) a symbolic link, a file of another user, one others may read,
// or one that is malformed.
StatusOr<CurveKey> ReadKeyFile(const std::string& path);

// The key this process's sockets use, from the settings above and the host
// the node is reached at; nullopt: no CURVE. InvalidArgument naming the
// setting for a bad value, a missing or unreadable key file, or an
// insecure start on a host that is not loopback.
StatusOr<std::optional<CurveKey>> SecurityFromConfig(const Config& config, const std::string& host);

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_CURVE_H_
