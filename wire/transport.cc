#include "wire/transport.h"

#include <cstdio>
#include <random>

#include "common/net.h"

namespace gradsync::wire {

StatusOr<std::string> ListenEndpoint(const std::string& host, int64_t port) {
  GS_ASSIGN_OR_RETURN(std::string address, BindAddress(host));
  return "tcp://" + address + ":" + std::to_string(port);
}

std::string Route::ToString() const {
  if (kind == Kind::kConnection) return "connection " + std::to_string(conn);
  return "peer '" + Escaped(identity, 64) + "'";
}

std::string RandomIdentity(const std::string& prefix) {
  std::random_device rd;
  uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(r));
  return prefix + "-" + hex;
}

std::function<void(const Status&)> PostedSends::callback() const {
  return [state = state_](const Status& s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->first.ok()) state->first = s;
  };
}

Status PostedSends::first_failure() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->first;
}

}  // namespace gradsync::wire
