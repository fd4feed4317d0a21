// Helpers of the multi-process tests: a free loopback port, and the
// counters a node serves on /metrics.
#ifndef GRADSYNC_TESTS_JOB_METRICS_H_
#define GRADSYNC_TESTS_JOB_METRICS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace gradsync {

inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// The body of GET /metrics on 127.0.0.1:port ("" when unreachable).
inline std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;)
        out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

// The sum of the series of counter `name` ("gradsync_..._total{" for a
// labelled one, "gradsync_..._total " for one without labels).
inline double Sum(const std::string& exposition, const std::string& name) {
  double sum = 0;
  for (size_t at = 0; (at = exposition.find("\n" + name, at)) != std::string::npos; ++at) {
    const size_t value = exposition.find(' ', at + 1);
    if (value != std::string::npos) sum += std::atof(exposition.c_str() + value + 1);
  }
  return sum;
}

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_JOB_METRICS_H_
