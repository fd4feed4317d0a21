#include "wire/curve.h"

#include <fcntl.h>
#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "common/net.h"
#include "common/private_files.h"
#include "zmq.h"

namespace gradsync::wire {

void CurveKey::Wipe() noexcept {
  for (SecretString* secret : {&secret_z85, &scheduler_secret_z85}) {
    sodium_memzero(secret->data(), secret->size());
    secret->clear();
  }
}

CurveKey& CurveKey::operator=(const CurveKey& other) {
  if (this == &other) return *this;
  Wipe();
  public_z85 = other.public_z85;
  secret_z85 = other.secret_z85;
  scheduler_public_z85 = other.scheduler_public_z85;
  scheduler_secret_z85 = other.scheduler_secret_z85;
  return *this;
}

CurveKey& CurveKey::operator=(CurveKey&& other) noexcept {
  if (this == &other) return *this;
  Wipe();
  public_z85 = std::move(other.public_z85);
  secret_z85 = std::move(other.secret_z85);
  scheduler_public_z85 = std::move(other.scheduler_public_z85);
  scheduler_secret_z85 = std::move(other.scheduler_secret_z85);
  return *this;
}

namespace {

bool IsZ85Key(std::string_view s) {
  uint8_t binary[32];
  const bool ok = DecodeZ85Key(s, binary);
  sodium_memzero(binary, sizeof(binary));
  return ok;
}

}  // namespace

bool DecodeZ85Key(std::string_view z85, uint8_t* out) {
  if (z85.size() != 40) return false;
  char text[41];  // zmq_z85_decode reads a NUL-terminated string
  std::memcpy(text, z85.data(), 40);
  text[40] = '\0';
  const bool ok = zmq_z85_decode(out, text) != nullptr;
  sodium_memzero(text, sizeof(text));
  return ok;
}

bool IsCurvePublicKey(const std::string& z85) { return IsZ85Key(z85); }

StatusOr<CurveKey> GenerateCurveKey() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return UnavailableError("cannot make a CURVE key pair: libzmq has no CURVE support");
  }
  CurveKey key{pub, sec, "", ""};
  sodium_memzero(sec, sizeof(sec));
  return key;
}

StatusOr<CurveKey> GenerateJobKey() {
  GS_ASSIGN_OR_RETURN(CurveKey job, GenerateCurveKey());
  GS_ASSIGN_OR_RETURN(CurveKey scheduler, GenerateCurveKey());
  job.scheduler_public_z85 = scheduler.public_z85;
  job.scheduler_secret_z85 = scheduler.secret_z85;
  return job;
}

CurveKey MembersCopy(CurveKey job) {
  job.scheduler_secret_z85.clear();
  return job;
}

StatusOr<CurveKey> SchedulerServerKey(const CurveKey& job) {
  if (!job.scheduler_secret_z85.empty()) {
    return CurveKey{job.scheduler_public_z85, job.scheduler_secret_z85, "", {}};
  }
  if (!job.scheduler_public_z85.empty()) {
    return FailedPreconditionError(
        "this key file is a members' copy (it holds the scheduler's public key, not its secret "
        "key): the scheduler needs the copy that gradsync_keygen wrote with the scheduler's "
        "secret key");
  }
  return CurveKey{job.public_z85, job.secret_z85, "", {}};
}

std::string SchedulerPublicKey(const CurveKey& job) {
  return job.scheduler_public_z85.empty() ? job.public_z85 : job.scheduler_public_z85;
}

Status WriteKeyFile(const std::string& path, const CurveKey& key) {
  auto created = CreatePrivateFile(path, O_EXCL);
  if (!created.ok()) return created.status().WithPrefix("key file");
  const int fd = *created;
  SecretString text;
  text.reserve(256);
  text.append("public ").append(key.public_z85).append("\nsecret ");
  text.append(key.secret_z85).append("\n");
  if (!key.scheduler_public_z85.empty()) {
    text.append("scheduler-public ").append(key.scheduler_public_z85).append("\n");
  }
  if (!key.scheduler_secret_z85.empty()) {
    text.append("scheduler-secret ").append(key.scheduler_secret_z85).append("\n");
  }
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const bool closed = close(fd) == 0;
  if (!ok || !closed) return UnavailableError("cannot write key file " + path);
  return OkStatus();
}

StatusOr<CurveKey> ReadKeyFile(const std::string& path) {
  auto fd = OpenPrivateFile(path, "key_file");
  if (!fd.ok()) return InvalidArgumentError(fd.status().message());
  SecretString text;
  text.reserve(4096);
  char buf[512];
  ssize_t n;
  while (text.size() < 4096 && (n = read(*fd, buf, sizeof(buf))) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buf, std::min<size_t>(static_cast<size_t>(n), 4096 - text.size()));
  }
  sodium_memzero(buf, sizeof(buf));
  close(*fd);
  // Lines "<word> <value>" (blanks around them ignored); views into `text`.
  CurveKey key;
  auto trim = [](std::string_view v) {
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
    return v;
  };
  const std::string_view all(text);
  for (size_t at = 0; at < all.size();) {
    size_t end = all.find('\n', at);
    if (end == std::string_view::npos) end = all.size();
    std::string_view line = trim(all.substr(at, end - at));
    at = end + 1;
    const size_t space = line.find_first_of(" \t");
    if (space == std::string_view::npos) continue;
    const std::string_view word = line.substr(0, space), value = trim(line.substr(space));
    if (word == "public") key.public_z85 = std::string(value);
    if (word == "secret") key.secret_z85.assign(value.data(), value.size());
    if (word == "scheduler-public") key.scheduler_public_z85 = std::string(value);
    if (word == "scheduler-secret") key.scheduler_secret_z85.assign(value.data(), value.size());
  }
  if (!IsZ85Key(key.public_z85) || !IsZ85Key(key.secret_z85)) {
    return InvalidArgumentError("key_file " + path +
                                " does not hold a 'public' and a 'secret' CURVE key (40 Z85 "
                                "characters each)");
  }
  if ((!key.scheduler_public_z85.empty() && !IsZ85Key(key.scheduler_public_z85)) ||
      (!key.scheduler_secret_z85.empty() && !IsZ85Key(key.scheduler_secret_z85))) {
    return InvalidArgumentError("key_file " + path + ": a scheduler key is not 40 Z85 characters");
  }
  if (!key.scheduler_secret_z85.empty()) {
    char derived[41];
    if (key.scheduler_public_z85.empty() ||
        zmq_curve_public(derived, key.scheduler_secret_z85.c_str()) != 0 ||
        key.scheduler_public_z85 != derived) {
      return InvalidArgumentError("key_file " + path +
                                  ": its 'scheduler-secret' is not the secret key of its "
                                  "'scheduler-public'");
    }
  }
  return key;
}

StatusOr<std::optional<CurveKey>> SecurityFromConfig(const Config& config,
                                                     const std::string& host) {
  GS_ASSIGN_OR_RETURN(std::string security, config.GetString("security", "auto"));
  GS_ASSIGN_OR_RETURN(std::string key_file, config.GetString("key_file", ""));
  if (security != "auto" && security != "curve" && security != "none") {
    return InvalidArgumentError("security must be auto, curve or none, got '" + security + "'");
  }
  if (security == "none") return std::optional<CurveKey>();
  if (!key_file.empty()) {
    GS_ASSIGN_OR_RETURN(CurveKey key, ReadKeyFile(key_file));
    return std::optional<CurveKey>(key);
  }
  if (security == "curve") {
    return InvalidArgumentError(
        "security=curve needs a key_file (GRADSYNC_KEY_FILE); "
        "gradsync_launch makes one for its job");
  }
  if (IsLoopbackHost(host)) return std::optional<CurveKey>();
  return InvalidArgumentError(
      "host " + host +
      " is not loopback (it does not resolve to 127.0.0.0/8 or ::1 alone): "
      "a node others can reach runs with CURVE (give "
      "key_file, the job's key file, which gradsync_launch makes) or, to run unencrypted "
      "and unauthenticated, security=none");
}

}  // namespace gradsync::wire
