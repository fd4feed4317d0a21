// CURVE between real ZeroMQ transports on loopback: peers with the job's key
// talk; a peer with no key or another job's key is refused at the
// handshake, counted, and the job's own traffic goes on; the recorded bytes
// of a member's session, replayed, get nothing in either.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "wire/curve.h"
#include "wire/message.h"
#include "wire/zmq_transport.h"

namespace gradsync::wire {
namespace {

std::unique_ptr<ZmqTransport> Make(std::optional<CurveKey> key,
                                   std::atomic<int>* failures = nullptr) {
  ZmqOptions o;
  o.curve = std::move(key);
  if (failures) o.on_auth_failure = [failures](const std::string&) { ++*failures; };
  return std::move(ZmqTransport::Create(o)).value();
}

// Sends a heartbeat from `client` to `server`; true when it arrives.
bool Delivered(ZmqTransport& client, ZmqTransport& server, const std::string& endpoint) {
  auto conn = client.Connect(endpoint);
  if (!conn.ok()) return false;
  if (!client
           .Send(Route::Connection(*conn), MakeHeartbeat(Sender{Role::Worker, 0, 1}),
                 Deadline::AfterMs(500))
           .ok()) {
    return false;
  }
  return server.Receive(Deadline::AfterMs(1500)).ok();
}

TEST(ZmqCurveTest, OnlyPeersWithTheJobsKeyGetIn) {
  const CurveKey job = *GenerateCurveKey();
  const CurveKey other = *GenerateCurveKey();
  std::atomic<int> failures{0};
  auto server = Make(job, &failures);
  const std::string endpoint = *server->Listen("tcp://127.0.0.1:0");

  auto member = Make(job);
  EXPECT_TRUE(member->Probe(endpoint, Deadline::AfterMs(3000)).ok());
  EXPECT_TRUE(Delivered(*member, *server, endpoint));

  auto no_key = Make(std::nullopt);
  Status s = no_key->Probe(endpoint, Deadline::AfterMs(3000));
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(Delivered(*no_key, *server, endpoint));

  auto other_job = Make(other);
  s = other_job->Probe(endpoint, Deadline::AfterMs(3000));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("refused the handshake"), std::string::npos) << s;
  EXPECT_FALSE(Delivered(*other_job, *server, endpoint));

  EXPECT_GE(failures.load(), 2);
  EXPECT_EQ(server->auth_failures(), static_cast<uint64_t>(failures.load()));
  EXPECT_TRUE(Delivered(*member, *server, endpoint)) << "the job's own traffic stopped";
}

// A TCP relay on 127.0.0.1 for one connection to 127.0.0.1:`port` that keeps
// a copy of every byte the client sent, as a peer on the path would.
class RecordingRelay {
 public:
  explicit RecordingRelay(int port) : target_port_(port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = Loopback(0);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(listen_fd_, 1), 0);
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~RecordingRelay() {
    stop_ = true;
    thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }
  std::string recorded() {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_;
  }

  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }
  // A new connection to 127.0.0.1:port (-1 on failure).
  static int Dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = Loopback(port);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }

 private:
  void Run() {
    pollfd l{listen_fd_, POLLIN, 0};
    while (!stop_ && poll(&l, 1, 50) <= 0) {
    }
    if (stop_) return;
    int client = accept(listen_fd_, nullptr, nullptr);
    int server = Dial(target_port_);
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    char buf[65536];
    while (!stop_) {
      if (poll(fds, 2, 50) <= 0) continue;
      bool closed = false;
      for (int i = 0; i < 2; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        ssize_t n = read(fds[i].fd, buf, sizeof(buf));
        if (n <= 0) {
          closed = true;
          break;
        }
        if (i == 0) {
          std::lock_guard<std::mutex> lock(mu_);
          recorded_.append(buf, static_cast<size_t>(n));
        }
        if (write(fds[1 - i].fd, buf, static_cast<size_t>(n)) != n) closed = true;
      }
      if (closed) break;
    }
    close(client);
    close(server);
  }

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string recorded_;
};

int PortOf(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

// A member's registration travels through a relay that records it; the
// recorded bytes, sent again on a new connection (a replay), are refused at
// the handshake (CURVE's per-connection keys), counted, and deliver nothing.
TEST(ZmqCurveTest, AReplayedRegistrationIsRefusedAndCounted) {
  const CurveKey job = *GenerateCurveKey();
  std::atomic<int> failures{0};
  auto server = Make(job, &failures);
  const std::string endpoint = *server->Listen("tcp://127.0.0.1:0");
  RecordingRelay relay(PortOf(endpoint));

  auto member = Make(job);
  auto conn = member->Connect("tcp://127.0.0.1:" + std::to_string(relay.port()));
  ASSERT_TRUE(conn.ok()) << conn.status();
  NodeInfo me;
  me.host = "127.0.0.1";
  me.data_port = 5555;
  ASSERT_TRUE(member
                  ->Send(Route::Connection(*conn),
                         MakeRegister(Sender{Role::Worker, -1, 1}, me, "build", 42, 1, 4, 2),
                         Deadline::AfterMs(3000))
                  .ok());
  auto first = server->Receive(Deadline::AfterMs(3000));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_GT(relay.recorded().size(), 100u);
  EXPECT_EQ(failures.load(), 0);

  const std::string bytes = relay.recorded();
  int fd = RecordingRelay::Dial(PortOf(endpoint));
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  auto replayed = server->Receive(Deadline::AfterMs(1500));
  EXPECT_FALSE(replayed.ok()) << "a replayed registration was delivered";
  for (int i = 0; i < 100 && failures.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(failures.load(), 1);
  EXPECT_EQ(server->auth_failures(), 1u);
  close(fd);
  EXPECT_TRUE(Delivered(*member, *server, "tcp://127.0.0.1:" + std::to_string(relay.port())))
      << "the member's own session stopped";
}

TEST(CurveKeyTest, KeyFilesAreWrittenPrivateAndReadBack) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/job.key";
  const CurveKey key = *GenerateCurveKey();
  ASSERT_TRUE(WriteKeyFile(path, key).ok());
  EXPECT_FALSE(WriteKeyFile(path, key).ok()) << "an existing key file was overwritten";
  auto read = ReadKeyFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->public_z85, key.public_z85);
  EXPECT_EQ(read->secret_z85, key.secret_z85);
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  auto open = ReadKeyFile(path);
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos);
}

TEST(CurveKeyTest, AnInsecureStartIsRefusedOffLoopback) {
  const Config loopback = Config::FromMap({});
  const Config explicit_none = Config::FromMap({{"security", "none"}});
  const Config curve_without_key = Config::FromMap({{"security", "curve"}});
  auto local = SecurityFromConfig(loopback, "127.0.0.1");
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(local->has_value());
  auto exposed = SecurityFromConfig(loopback, "10.1.2.3");
  ASSERT_FALSE(exposed.ok());
  EXPECT_NE(exposed.status().message().find("security=none"), std::string::npos);
  EXPECT_TRUE(SecurityFromConfig(explicit_none, "10.1.2.3").ok());
  EXPECT_FALSE(SecurityFromConfig(curve_without_key, "127.0.0.1").ok());
}

}  // namespace
}  // namespace gradsync::wire
