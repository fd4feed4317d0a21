// CurveZMQ for a job: the job's key pair, kept in a key file that every
// process of the job reads, admits a process to the job: clients of the
// scheduler's socket present it as their own pair, and the scheduler's ZAP
// handler admits only clients whose key is the job's. The scheduler serves
// with a key pair of its own, whose public key the key file also holds:
// every node pins it (the scheduler's server key), so a member, which holds
// the job's pair, cannot serve as the scheduler. Only the scheduler's copy
// of the file holds the scheduler's secret key; the members' copy
// (MembersCopy, `gradsync_keygen --members FILE OUT`) does not. A peer with
// no key, another key or another job's key fails the handshake and is
// counted. Between the nodes of a job each node's own key pair is used
// instead (wire/node_keys.h).

// Key file: lines "public <40 Z85 chars>" and "secret <40 Z85 chars>" (the
// job's pair), "scheduler-public <40>" and, in the scheduler's copy,
// "scheduler-secret <40>"; a regular file, not a symbolic link, owned by
// the user the process runs as, that only its owner may read (mode 0600 or
// stricter). A file of the two first lines alone (an older build's) still
// works, the scheduler then serving with the job's pair, which every member
// holds: such a job has no protection against a member posing as its
// scheduler.
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

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/config.h"
#include "common/status.h"
#include "wire/secret_string.h"

namespace gradsync::wire {

struct CurveKey {
  std::string public_z85;   // 40 characters
  SecretString secret_z85;  // 40 characters
  // A job key's: the scheduler's own pair (see above); "" when the file has
  // none (the secret: in every copy but the scheduler's).
  std::string scheduler_public_z85;
  SecretString scheduler_secret_z85;

  // The secrets live in libsodium's guarded heap (wire/secret_string.h:
  // locked, out of core dumps, zeroed when freed), and every copy wipes
  // them when it goes or is assigned over.
  CurveKey() = default;
  CurveKey(const CurveKey&) = default;
  CurveKey(CurveKey&&) = default;
  CurveKey& operator=(const CurveKey& other);
  CurveKey& operator=(CurveKey&& other) noexcept;
  ~CurveKey() { Wipe(); }
  void Wipe() noexcept;
};

// A new job key: the job's pair and the scheduler's.
StatusOr<CurveKey> GenerateJobKey();
// `job` without the scheduler's secret key: what every process but the
// scheduler is given.
CurveKey MembersCopy(CurveKey job);
// The pair the scheduler serves with: the scheduler's own, or the job's
// for a key file without one. FailedPrecondition for a members' copy (it
// has the scheduler's public key but not its secret).
StatusOr<CurveKey> SchedulerServerKey(const CurveKey& job);
// The server key a node expects of the scheduler: the pinned scheduler key,
// or the job's for a key file without one.
std::string SchedulerPublicKey(const CurveKey& job);

// Decodes the 40 Z85 characters of a CURVE key into out[0, 32); false
// when `z85` is not one. The characters' copy it makes is wiped.
bool DecodeZ85Key(std::string_view z85, uint8_t* out);
// Whether `z85` is a CURVE key (40 Z85 characters).
bool IsCurvePublicKey(const std::string& z85);
// A new key pair (libzmq's zmq_curve_keypair).
StatusOr<CurveKey> GenerateCurveKey();
// Writes `key` to a new file at `path` with mode 0600; fails if it exists.
Status WriteKeyFile(const std::string& path, const CurveKey& key);
// Reads a key file, refusing (InvalidArgument naming the path and the
// problem) a symbolic link, a file of another user, one others may read,
// or one that is malformed. The file's bytes pass through secret memory
// only (and a stack buffer, wiped).
StatusOr<CurveKey> ReadKeyFile(const std::string& path);

// The key this process's sockets use, from the settings above and the host
// the node is reached at; nullopt: no CURVE. InvalidArgument naming the
// setting for a bad value, a missing or unreadable key file, or an
// insecure start on a host that is not loopback.
StatusOr<std::optional<CurveKey>> SecurityFromConfig(const Config& config, const std::string& host);

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_CURVE_H_
