#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/histogram.h"

namespace gradsync {
namespace {

// name -> value of every sample without labels in an exposition.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line.find('{') != std::string::npos) continue;
    const size_t space = line.find(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

// A plain HTTP GET of /metrics on loopback.
// Whether a TCP connection to `ip`:`port` is accepted.
bool Connects(const char* ip, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip, &addr.sin_addr);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// A port nothing listens on at this moment.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string Get(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string body;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) body.append(buf, static_cast<size_t>(n));
  close(fd);
  return body;
}

TEST(MetricsTest, LatencyBucketsSpan50usTo30sAscending) {
  const auto& b = LatencyBuckets();
  ASSERT_GE(b.size(), 10u);
  EXPECT_DOUBLE_EQ(b.front(), 50e-6);
  EXPECT_DOUBLE_EQ(b.back(), 30.0);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
}

TEST(MetricsTest, ProcessFamiliesArePlausible) {
  ProcessMetrics metrics("worker");
  auto s = Samples(metrics.Scrape());
  ASSERT_EQ(s.count("process_cpu_seconds_total"), 1u);
  EXPECT_GE(s["process_cpu_seconds_total"], 0.0);
  EXPECT_GT(s["process_resident_memory_bytes"], 1 << 20);
  EXPECT_GE(s["process_virtual_memory_bytes"], s["process_resident_memory_bytes"]);
  EXPECT_GE(s["process_open_fds"], 3.0);  // stdin, stdout, stderr at least
  EXPECT_GE(s["process_max_fds"], s["process_open_fds"]);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // Started within the last hour, not in the future (clock ticks: 10 ms).
  EXPECT_LE(s["process_start_time_seconds"], now + 1);
  EXPECT_GT(s["process_start_time_seconds"], now - 3600);
}

// The shape of wire::TransportRefusals (common cannot depend on wire).
struct Refusals {
  std::atomic<uint64_t> handshakes{0};
  std::atomic<uint64_t> dropped{0};
  std::atomic<uint64_t> impostors{0};
  std::atomic<uint64_t> sends_dropped{0};
};

TEST(MetricsTest, TransportRefusalsAreSummedOverEverySourceAdded) {
  ProcessMetrics metrics("server");
  auto a = std::make_shared<Refusals>();
  auto b = std::make_shared<Refusals>();
  metrics.AddTransportRefusals(a);
  metrics.AddTransportRefusals(b);
  metrics.AddTransportRefusals(std::shared_ptr<Refusals>());  // none: ignored
  a->handshakes = 2;
  b->handshakes = 1;
  b->dropped = 5;
  a->impostors = 4;
  a->sends_dropped = 6;
  b->sends_dropped = 1;
  auto s = Samples(metrics.Scrape());
  EXPECT_EQ(s["gradsync_sends_dropped_total"], 7.0);
  EXPECT_EQ(s["gradsync_impostors_total"], 4.0);
  EXPECT_EQ(s["gradsync_auth_failures_total"], 3.0);
  EXPECT_EQ(s["gradsync_transport_dropped_total"], 5.0);
}

TEST(MetricsTest, ServesBuildInfoAndComponentsOverHttp) {
  ProcessMetrics metrics("server");
  auto& h = prometheus::BuildHistogram()
                .Name("gradsync_test_latency_seconds")
                .Help("test")
                .Register(metrics.registry())
                .Add({}, LatencyBuckets());
  h.Observe(0.003);
  auto port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  const std::string body = Get(*port);
  EXPECT_NE(body.find("200 OK"), std::string::npos) << body;
  EXPECT_NE(body.find("gradsync_build_info{"), std::string::npos);
  EXPECT_NE(body.find("role=\"server\""), std::string::npos);
  EXPECT_NE(body.find("gradsync_test_latency_seconds_bucket{le=\"0.005\"} 1"), std::string::npos)
      << body;
  EXPECT_NE(body.find("process_open_fds "), std::string::npos);
}

TEST(MetricsTest, BusyPortIsAnErrorNamingTheAddressAndServeOrWarnGoesOn) {
  ProcessMetrics first("server");
  auto port = first.Serve("0.0.0.0:0");
  ASSERT_TRUE(port.ok());
  ProcessMetrics second("server");
  auto again = second.Serve("0.0.0.0:" + std::to_string(*port));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find(std::to_string(*port)), std::string::npos);
  ProcessMetrics third("server");
  EXPECT_EQ(third.ServeOrWarn("0.0.0.0", *port), 0);
  EXPECT_EQ(third.ServeOrWarn("127.0.0.1", 0), 0);
}

// A host name binds the one address it resolves to ("localhost":
// 127.0.0.1), not every interface: another loopback address of this
// machine gets no answer.
TEST(MetricsTest, ServeOrWarnBindsTheHostsAddressOnly) {
  ProcessMetrics metrics("server");
  const int port = metrics.ServeOrWarn("localhost", FreePort());
  ASSERT_GT(port, 0);
  EXPECT_TRUE(Connects("127.0.0.1", port));
  EXPECT_FALSE(Connects("127.0.0.2", port)) << "metrics listen on every interface";
  ProcessMetrics unresolved("server");
  EXPECT_EQ(unresolved.ServeOrWarn("127.0.0.1.invalid", FreePort()), 0);
}

}  // namespace
}  // namespace gradsync
