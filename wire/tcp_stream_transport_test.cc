// TcpStreamTransport over loopback between transports of this process:
// messages of every size arrive whole and in order and are answered on the
// connection they came over, a message larger than the socket buffers goes
// through the writer thread while the receiver reads, a stranger, another
// job, a second connection under a taken identity, garbage and a silent
// connection are refused and counted while the real peer keeps being
// served, a bad frame table ends that connection with DataLoss before
// anything is allocated, a peer that goes away fails the sends to it, and
// sends that cannot finish end at their deadline.
#include "wire/tcp_stream_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync::wire {
namespace {

constexpr uint64_t kJob = 0x7e57;

Message WithPayloads(const std::vector<size_t>& sizes, uint8_t seed) {
  Message m;
  m.header = {seed, static_cast<uint8_t>(seed + 1), static_cast<uint8_t>(seed + 2)};
  for (size_t n : sizes) {
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7);
    m.payloads.push_back(Payload::Copy(bytes.data(), n));
  }
  return m;
}

void ExpectSame(const Message& want, const Message& got) {
  EXPECT_EQ(want.header, got.header);
  ASSERT_EQ(want.payloads.size(), got.payloads.size());
  for (size_t i = 0; i < want.payloads.size(); ++i) {
    ASSERT_EQ(want.payloads[i].size, got.payloads[i].size);
    if (want.payloads[i].size == 0) continue;
    EXPECT_EQ(0, std::memcmp(want.payloads[i].data, got.payloads[i].data, want.payloads[i].size));
  }
}

TcpStreamOptions Options(const std::string& identity, std::vector<std::string> accept,
                         uint64_t job = kJob) {
  TcpStreamOptions o;
  o.job_id = job;
  o.identity = identity;
  o.accept = std::move(accept);
  o.max_frame_bytes = 64 << 20;
  o.max_message_bytes = 65 << 20;
  return o;
}

// A listening transport that takes "left", and its endpoint.
struct Listener {
  explicit Listener(TcpStreamOptions o = Options("right", {"left"})) : t(std::move(o)) {
    auto e = t.Listen("tcp://127.0.0.1:0");
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    endpoint = *e;
  }
  TcpStreamTransport t;
  std::string endpoint;
};

// A listener ("right", taking "left") and "left" connected to it.
struct Neighbours {
  Listener right;
  TcpStreamTransport left{Options("left", {})};
  StatusOr<ConnId> conn = left.Connect(right.endpoint);
};

// The port of a tcp://127.0.0.1:PORT endpoint.
int PortOf(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

// A raw TCP socket to `endpoint`.
int RawConnect(const std::string& endpoint) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(PortOf(endpoint)));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(0, connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)));
  return fd;
}

void Put32(std::vector<uint8_t>* b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void Put64(std::vector<uint8_t>* b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// The hello of identity `who` in job `job`.
std::vector<uint8_t> Hello(const std::string& who, uint64_t job = kJob) {
  std::vector<uint8_t> b;
  Put32(&b, 0x47535448);
  Put32(&b, 1);
  Put64(&b, job);
  Put32(&b, static_cast<uint32_t>(who.size()));
  b.insert(b.end(), who.begin(), who.end());
  return b;
}

// Waits (receiving) until `t` has refused `n` connections.
void WaitRefused(TcpStreamTransport& t, uint64_t n) {
  const Deadline by = Deadline::After(Millis(20000));
  while (t.refused() < n && !by.Expired()) (void)t.Receive(Deadline::After(Millis(20)));
  EXPECT_GE(t.refused(), n);
}

TEST(TcpStreamTransport, MessagesArriveWholeInOrderAndAreAnswered) {
  Neighbours n;
  auto& [right, left, conn] = n;
  ASSERT_TRUE(conn.ok());
  std::vector<Message> sent;
  for (uint8_t i = 0; i < 20; ++i) {
    std::vector<size_t> sizes;
    for (uint8_t k = 0; k < i % 4; ++k) sizes.push_back(size_t{1} << (2 * i % 21));
    sent.push_back(WithPayloads(sizes, i));
    Message copy = sent.back();
    ASSERT_TRUE(
        left.Send(Route::Connection(*conn), std::move(copy), Deadline::After(Millis(20000))).ok());
  }
  for (const Message& want : sent) {
    auto got = right.t.Receive(Deadline::After(Millis(20000)));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(Route::Kind::kInbound, got->from.kind);
    EXPECT_EQ("left", got->from.identity);
    ExpectSame(want, got->message);
  }
  // The answer comes back over the connection the message came on.
  Message answer = WithPayloads({100}, 77);
  ASSERT_TRUE(right.t.Send(Route::Inbound("left"), answer, Deadline::After(Millis(20000))).ok());
  auto back = left.Receive(Deadline::After(Millis(20000)));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(Route::Kind::kConnection, back->from.kind);
  EXPECT_EQ(*conn, back->from.conn);
  ExpectSame(answer, back->message);
  EXPECT_EQ(0u, right.t.refused());
  // Nobody by that name is connected.
  EXPECT_EQ(StatusCode::kUnavailable,
            right.t.Send(Route::Inbound("nobody"), answer, Deadline::After(Millis(100))).code());
}

TEST(TcpStreamTransport, ARingOfThreeConnectsAtOnce) {
  // Each takes its left neighbour and connects to its right, all at once:
  // no connect waits on another's.
  const std::vector<std::string> names = {"r0", "r1", "r2"};
  std::vector<std::unique_ptr<Listener>> ring;
  for (size_t i = 0; i < 3; ++i) {
    ring.push_back(std::make_unique<Listener>(Options(names[i], {names[(i + 2) % 3]})));
  }
  std::vector<std::thread> threads;
  std::vector<Status> results(3);
  for (size_t i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      TcpStreamTransport& t = ring[i]->t;
      auto conn = t.Connect(ring[(i + 1) % 3]->endpoint);
      Message m = WithPayloads({size_t{1} << 20}, static_cast<uint8_t>(i));
      PostedSends posted;
      t.Post(Route::Connection(*conn), m, Deadline::After(Millis(20000)), posted.callback());
      auto got = t.Receive(Deadline::After(Millis(20000)));
      if (!got.ok()) {
        results[i] = got.status();
      } else if (got->from.identity != names[(i + 2) % 3]) {
        results[i] = InternalError("from " + got->from.identity);
      } else {
        results[i] = posted.first_failure();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(TcpStreamTransport, LargeMessagesGoThroughTheWriterWhileTheReceiverReads) {
  Neighbours n;
  auto& [right, left, conn] = n;
  ASSERT_TRUE(conn.ok());
  std::vector<Message> sent;
  PostedSends posted;
  for (uint8_t i = 0; i < 4; ++i) {
    sent.push_back(WithPayloads({size_t{16} << 20, 3}, i));
    left.Post(Route::Connection(*conn), sent.back(), Deadline::After(Millis(60000)),
              posted.callback());
  }
  for (const Message& want : sent) {
    auto got = right.t.Receive(Deadline::After(Millis(60000)));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectSame(want, got->message);
  }
  EXPECT_TRUE(posted.first_failure().ok()) << posted.first_failure().ToString();
}

TEST(TcpStreamTransport, StrangersOtherJobsAndDuplicatesAreRefusedWithTheReason) {
  Listener right;
  TcpStreamTransport stranger(Options("mallory", {}));
  auto c1 = stranger.Connect(right.endpoint);
  ASSERT_TRUE(c1.ok());
  std::thread reader([&] { WaitRefused(right.t, 1); });
  Status s =
      stranger.Send(Route::Connection(*c1), WithPayloads({8}, 1), Deadline::After(Millis(20000)));
  reader.join();
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("does not take connections")) << s.ToString();

  TcpStreamTransport other_job(Options("left", {}, kJob + 1));
  auto c2 = other_job.Connect(right.endpoint);
  std::thread reader2([&] { WaitRefused(right.t, 2); });
  s = other_job.Send(Route::Connection(*c2), WithPayloads({8}, 1), Deadline::After(Millis(20000)));
  reader2.join();
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("another job")) << s.ToString();

  // The real left neighbour, then a second connection under its name.
  TcpStreamTransport left(Options("left", {}));
  auto c3 = left.Connect(right.endpoint);
  Message m = WithPayloads({64}, 9);
  left.Post(Route::Connection(*c3), m, Deadline::After(Millis(20000)), nullptr);
  auto got = right.t.Receive(Deadline::After(Millis(20000)));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(m, got->message);
  TcpStreamTransport twin(Options("left", {}));
  auto c4 = twin.Connect(right.endpoint);
  std::thread reader3([&] { WaitRefused(right.t, 3); });
  s = twin.Send(Route::Connection(*c4), WithPayloads({8}, 1), Deadline::After(Millis(20000)));
  reader3.join();
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("connected already")) << s.ToString();
  // The first is still served.
  ASSERT_TRUE(left.Send(Route::Connection(*c3), m, Deadline::After(Millis(20000))).ok());
  got = right.t.Receive(Deadline::After(Millis(20000)));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ("left", got->from.identity);
}

TEST(TcpStreamTransport, GarbageAndSilentConnectionsAreClosedAndTheNeighbourServed) {
  TcpStreamOptions o = Options("right", {"left"});
  o.hello_wait = Millis(300);
  o.max_pending = 4;
  o.refusals = std::make_shared<TransportRefusals>();
  auto refusals = o.refusals;
  Listener right(o);
  // Garbage in place of a hello.
  const int junk = RawConnect(right.endpoint);
  std::vector<uint8_t> bytes(64, 0xab);
  ASSERT_EQ(64, write(junk, bytes.data(), bytes.size()));
  WaitRefused(right.t, 1);
  // Eight that never speak: four past max_pending at once, the rest after
  // hello_wait.
  std::vector<int> silent;
  for (int i = 0; i < 8; ++i) silent.push_back(RawConnect(right.endpoint));
  WaitRefused(right.t, 9);
  TcpStreamTransport left(Options("left", {}));
  auto conn = left.Connect(right.endpoint);
  Message m = WithPayloads({1000, 0}, 5);
  left.Post(Route::Connection(*conn), m, Deadline::After(Millis(20000)), nullptr);
  auto got = right.t.Receive(Deadline::After(Millis(20000)));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(m, got->message);
  EXPECT_EQ(9u, refusals->handshakes.load());  // also counted for /metrics
  EXPECT_EQ(0u, refusals->dropped.load());
  close(junk);
  for (int fd : silent) close(fd);
}

// A peer that said a good hello, then sends `table`.
Status AfterHello(const std::vector<uint8_t>& table) {
  TcpStreamOptions o = Options("right", {"left"});
  o.refusals = std::make_shared<TransportRefusals>();
  Listener right(o);
  const int fd = RawConnect(right.endpoint);
  std::vector<uint8_t> hello = Hello("left");
  EXPECT_EQ(static_cast<ssize_t>(hello.size()), write(fd, hello.data(), hello.size()));
  EXPECT_EQ(static_cast<ssize_t>(table.size()), write(fd, table.data(), table.size()));
  StatusOr<Incoming> got = right.t.Receive(Deadline::After(Millis(20000)));
  close(fd);
  EXPECT_EQ(1u, right.t.refused());
  EXPECT_EQ(1u, o.refusals->dropped.load());
  EXPECT_EQ(0u, o.refusals->handshakes.load());
  return got.status();
}

TEST(TcpStreamTransport, ABadFrameTableEndsTheConnectionBeforeAnyAllocation) {
  std::vector<uint8_t> many;  // more frames than allowed
  Put32(&many, 0x47535431);
  Put32(&many, 1000);
  Status s = AfterHello(many);
  EXPECT_EQ(StatusCode::kDataLoss, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("'left'")) << s.ToString();

  std::vector<uint8_t> huge;  // a 1 TiB payload
  Put32(&huge, 0x47535431);
  Put32(&huge, 2);
  Put64(&huge, 16);
  Put64(&huge, uint64_t{1} << 40);
  s = AfterHello(huge);
  EXPECT_EQ(StatusCode::kDataLoss, s.code()) << s.ToString();

  std::vector<uint8_t> magic;  // not a frame table
  Put32(&magic, 0xdeadbeef);
  Put32(&magic, 1);
  s = AfterHello(magic);
  EXPECT_EQ(StatusCode::kDataLoss, s.code()) << s.ToString();
}

TEST(TcpStreamTransport, APeerThatGoesAwayFailsTheSendsToIt) {
  auto right = std::make_unique<Listener>();
  TcpStreamTransport left(Options("left", {}));
  auto conn = left.Connect(right->endpoint);
  Message m = WithPayloads({1 << 16}, 3);
  ASSERT_TRUE(left.Send(Route::Connection(*conn), m, Deadline::After(Millis(20000))).ok());
  ASSERT_TRUE(right->t.Receive(Deadline::After(Millis(20000))).ok());
  right.reset();
  // The first sends may still fit the socket; within a deadline one fails,
  // and a connection made again finds nobody.
  Status s;
  const Deadline by = Deadline::After(Millis(20000));
  while (s.ok() && !by.Expired()) {
    s = left.Send(Route::Connection(*conn), m, Deadline::After(Millis(500)));
    (void)left.Receive(Deadline::After(Millis(10)));
  }
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded)
      << s.ToString();
}

TEST(TcpStreamTransport, SendsThatCannotFinishEndAtTheirDeadline) {
  {
    // Nothing listens on port 1: the connect is refused until the deadline.
    TcpStreamTransport t(Options("left", {}));
    auto conn = t.Connect("tcp://127.0.0.1:1");
    Status s = t.Send(Route::Connection(*conn), WithPayloads({8}, 1), Deadline::After(Millis(300)));
    EXPECT_EQ(StatusCode::kDeadlineExceeded, s.code()) << s.ToString();
    EXPECT_NE(std::string::npos, s.message().find("127.0.0.1:1")) << s.ToString();
  }
  // A peer that takes the connection and one message, then never reads:
  // 60 MiB cannot fit the socket buffers.
  Neighbours n;
  auto& [right, left, conn] = n;
  std::thread reader([&n] { EXPECT_TRUE(n.right.t.Receive(Deadline::After(Millis(20000))).ok()); });
  EXPECT_TRUE(
      left.Send(Route::Connection(*conn), WithPayloads({8}, 1), Deadline::After(Millis(20000)))
          .ok());
  reader.join();
  const auto start = std::chrono::steady_clock::now();
  Status s = left.Send(Route::Connection(*conn), WithPayloads({size_t{60} << 20}, 2),
                       Deadline::After(Millis(500)));
  EXPECT_EQ(StatusCode::kDeadlineExceeded, s.code()) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

TEST(TcpStreamTransport, ShutdownEndsAWaitingReceive) {
  Listener right;
  std::thread stop([&] {
    std::this_thread::sleep_for(Millis(50));
    right.t.Shutdown();
  });
  auto got = right.t.Receive(Deadline::After(Millis(60000)));
  stop.join();
  EXPECT_EQ(StatusCode::kCancelled, got.status().code());
}

}  // namespace
}  // namespace gradsync::wire
