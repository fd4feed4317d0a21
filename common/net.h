// Host names and the addresses they stand for: what a name resolves to,
// whether it is this machine's loopback, and the one address to bind for it.
//
// Loopback is decided from the resolved addresses, never from the spelling
// of a name: "localhost" is loopback because it resolves to 127.0.0.1, and
// a name such as "127.example" that resolves elsewhere (or not at all) is
// not.
//
// Thread-safety: pure functions (getaddrinfo is thread-safe). Blocking:
// ResolveHost, IsLoopbackHost and BindAddress may wait for the system's
// resolver (files, then DNS, as nsswitch.conf says).
#ifndef GRADSYNC_COMMON_NET_H_
#define GRADSYNC_COMMON_NET_H_

#include <sys/socket.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace gradsync {

// The numeric addresses (IPv4 and IPv6, as inet_ntop writes them) `host`
// resolves to for TCP, in the resolver's order, without repeats.
// NotFound naming the host when it does not resolve.
StatusOr<std::vector<std::string>> ResolveHost(const std::string& host);

// The numeric address of an AF_INET or AF_INET6 socket address ("10.0.0.2",
// "fd00::2"; an IPv4 address mapped into IPv6 as IPv4); "" for another
// family.
std::string NumericAddress(const sockaddr* address);

// Whether the numeric address `address` is loopback: 127.0.0.0/8, ::1, or
// an IPv4-mapped 127.0.0.0/8 (::ffff:127.x.y.z). False for anything that is
// not a numeric address.
bool IsLoopbackAddress(const std::string& address);

// Whether `addresses` is not empty and every one of them is loopback: a
// name that also resolves to an address others can reach is not loopback.
bool AllLoopback(const std::vector<std::string>& addresses);

// Whether `host` resolves, and only to loopback addresses.
bool IsLoopbackHost(const std::string& host);

// The numeric address to bind for `host`: the first IPv4 address it
// resolves to, else the first IPv6 one (peers connect by the same name).
// Never a wildcard unless `host` is one ("0.0.0.0", "::"). NotFound when
// `host` does not resolve.
StatusOr<std::string> BindAddress(const std::string& host);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_NET_H_
