#include "common/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace gradsync {

std::string NumericAddress(const sockaddr* sa) {
  if (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) return "";
  char text[INET6_ADDRSTRLEN] = {};
  const in6_addr* v6 = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
  if (sa->sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(v6)) {
    in_addr v4;
    std::memcpy(&v4, v6->s6_addr + 12, sizeof(v4));
    return inet_ntop(AF_INET, &v4, text, sizeof(text)) == nullptr ? "" : text;
  }
  const void* where =
      sa->sa_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr)
          : static_cast<const void*>(v6);
  if (inet_ntop(sa->sa_family, where, text, sizeof(text)) == nullptr) return "";
  return text;
}

StatusOr<std::vector<std::string>> ResolveHost(const std::string& host) {
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = host.empty() ? EAI_NONAME : getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    return NotFoundError("host '" + host + "' does not resolve: " + gai_strerror(rc));
  }
  std::vector<std::string> addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    const std::string numeric = NumericAddress(a->ai_addr);
    if (numeric.empty()) continue;
    if (std::find(addresses.begin(), addresses.end(), numeric) == addresses.end()) {
      addresses.push_back(numeric);
    }
  }
  freeaddrinfo(found);
  if (addresses.empty()) return NotFoundError("host '" + host + "' has no IP address");
  return addresses;
}

bool IsLoopbackAddress(const std::string& address) {
  in_addr v4;
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, address.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

bool AllLoopback(const std::vector<std::string>& addresses) {
  return !addresses.empty() && std::all_of(addresses.begin(), addresses.end(), IsLoopbackAddress);
}

bool IsLoopbackHost(const std::string& host) {
  auto addresses = ResolveHost(host);
  return addresses.ok() && AllLoopback(*addresses);
}

StatusOr<std::string> BindAddress(const std::string& host) {
  GS_ASSIGN_OR_RETURN(std::vector<std::string> addresses, ResolveHost(host));
  in_addr v4;
  for (const std::string& a : addresses) {
    if (inet_pton(AF_INET, a.c_str(), &v4) == 1) return a;
  }
  return addresses.front();
}

}  // namespace gradsync
