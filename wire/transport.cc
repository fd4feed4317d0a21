#include "wire/transport.h"

#include <cstdio>
#include <random>

namespace gradsync::wire {

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

}  // namespace gradsync::wire
