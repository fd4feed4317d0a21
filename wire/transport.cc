#include "wire/transport.h"

#include <arpa/inet.h>

#include <cstdio>
#include <random>

namespace gradsync::wire {

std::string ListenEndpoint(const std::string& host, int64_t port) {
  in6_addr any;
  const bool literal = inet_pton(AF_INET, host.c_str(), &any) == 1 ||
                       inet_pton(AF_INET6, host.c_str(), &any) == 1;
  return "tcp://" + (literal ? host : std::string("*")) + ":" + std::to_string(port);
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
