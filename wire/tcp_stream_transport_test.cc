// TcpStreamTransport over loopback between transports of this process:
// messages of every size arrive whole and in order and are answered on the
// connection they came over, a message larger than the socket buffers goes
// through the writer thread while the receiver reads, a stranger, another
// job, a second connection under a taken identity, garbage and a silent
// connection are refused and counted while the real peer keeps being
// served, a bad frame table ends that connection with DataLoss before
// anything is allocated, a peer that goes away fails the sends to it, and
// sends that cannot finish end at their deadline. Sealed (a CURVE job's
// node keys): messages arrive and answers go back, no byte of a payload
// crosses in the clear, a bit flipped, a message replayed or one dropped on
// the path ends the connection with DataLoss, a job member showing its own
// key under another's identity, a process showing another's key without its
// secret and a listener without the key the plan names are refused, and a
// plain peer and a sealed one are told the other's mode.
#include "wire/tcp_stream_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "sodium.h"
#include "wire/bulk_cipher.h"
#include "wire/curve.h"
#include "wire/node_keys.h"
#include "wire/noise.h"

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

// `sender` connects to `endpoint` (in `lane`) and sends one message while
// `acceptor` receives until it has refused `refusals` connections; the
// send's outcome.
// A refusal in clear to a sealed connector is waited out until the send's
// deadline (`wait`).
Status SendRefused(TcpStreamTransport& sender, const std::string& endpoint,
                   TcpStreamTransport& acceptor, uint64_t refusals, int lane = 0,
                   Millis wait = Millis(20000)) {
  auto conn = sender.ConnectLane(endpoint, lane);
  if (!conn.ok()) return conn.status();
  std::thread reader([&] { WaitRefused(acceptor, refusals); });
  Status s = sender.Send(Route::Connection(*conn), WithPayloads({8}, 1), Deadline::After(wait));
  reader.join();
  return s;
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
  Status s = SendRefused(stranger, right.endpoint, right.t, 1);
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("does not take connections")) << s.ToString();

  TcpStreamTransport other_job(Options("left", {}, kJob + 1));
  s = SendRefused(other_job, right.endpoint, right.t, 2);
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
  // The twin is told so, and waits it out (the taken one may be an old
  // connection that broke) until its deadline.
  TcpStreamTransport twin(Options("left", {}));
  auto tc = twin.Connect(right.endpoint);
  ASSERT_TRUE(tc.ok());
  std::thread reader([&] { WaitRefused(right.t, 3); });
  s = twin.Send(Route::Connection(*tc), WithPayloads({8}, 1), Deadline::After(Millis(1500)));
  reader.join();
  EXPECT_EQ(StatusCode::kDeadlineExceeded, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("connected already")) << s.ToString();
  // The first is still served.
  ASSERT_TRUE(left.Send(Route::Connection(*c3), m, Deadline::After(Millis(20000))).ok());
  got = right.t.Receive(Deadline::After(Millis(20000)));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ("left", got->from.identity);
}

// A shard's listener: lanes of an accepted identity are taken, each its own
// connection answered on itself; SetAccept changes who is taken (a new
// membership epoch) and keeps the connections already taken.
TEST(TcpStreamTransport, LanesOfAnAcceptedIdentityAndANewAcceptListAreTaken) {
  TcpStreamOptions o = Options("shard", {"w0/ps"});
  o.accept_lanes = true;
  Listener shard(o);
  TcpStreamTransport worker(Options("w0/ps", {}));
  std::vector<ConnId> lanes;
  for (int lane = 0; lane < 3; ++lane) {
    auto c = worker.ConnectLane(shard.endpoint, lane);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    lanes.push_back(*c);
  }
  EXPECT_EQ(StatusCode::kInvalidArgument, worker.ConnectLane(shard.endpoint, 16).status().code());
  for (int lane = 0; lane < 3; ++lane) {
    Message m = WithPayloads({256}, static_cast<uint8_t>(lane));
    ASSERT_TRUE(worker
                    .Send(Route::Connection(lanes[static_cast<size_t>(lane)]), m,
                          Deadline::After(Millis(20000)))
                    .ok());
    auto got = shard.t.Receive(Deadline::After(Millis(20000)));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(lane == 0 ? "w0/ps" : LaneIdentity("w0/ps", lane), got->from.identity);
    ExpectSame(m, got->message);
    // The answer comes back on that lane's own connection.
    ASSERT_TRUE(
        shard.t.Send(got->from, WithPayloads({8}, 50), Deadline::After(Millis(20000))).ok());
    auto back = worker.Receive(Deadline::After(Millis(20000)));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(lanes[static_cast<size_t>(lane)], back->from.conn);
  }
  // Lanes are not taken where accept_lanes is off.
  Listener ring(Options("right", {"w0/ps"}));
  Status s = SendRefused(worker, ring.endpoint, ring.t, 1, 1);
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
  // Epoch 1: "w1/ps1" is taken, "w0/ps" no longer (its connection stays).
  shard.t.SetAccept(kJob, {"w1/ps1"});
  TcpStreamTransport joiner(Options("w1/ps1", {}));
  auto jc = joiner.ConnectLane(shard.endpoint, 1);
  ASSERT_TRUE(jc.ok());
  ASSERT_TRUE(
      joiner.Send(Route::Connection(*jc), WithPayloads({8}, 2), Deadline::After(Millis(20000)))
          .ok());
  auto got = shard.t.Receive(Deadline::After(Millis(20000)));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(LaneIdentity("w1/ps1", 1), got->from.identity);
  TcpStreamTransport old(Options("w0/ps", {}));
  s = SendRefused(old, shard.endpoint, shard.t, 1);
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("does not take connections")) << s.ToString();
  ASSERT_TRUE(
      worker.Send(Route::Connection(lanes[2]), WithPayloads({8}, 3), Deadline::After(Millis(20000)))
          .ok());
  got = shard.t.Receive(Deadline::After(Millis(20000)));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(LaneIdentity("w0/ps", 2), got->from.identity);
}

// A listener that does not know its job yet (a shard before the plan is in,
// or restarted at its old port) answers "not yet"; the connector tries
// again and gets in once SetAccept names it. With strangers_may_wait, an
// identity the list does not name yet (a new epoch's worker) waits too.
TEST(TcpStreamTransport, AConnectorWaitsOutAListenerThatDoesNotKnowItsJobYet) {
  TcpStreamOptions o = Options("shard", {}, 0);
  o.refusals = std::make_shared<TransportRefusals>();
  o.strangers_may_wait = true;
  Listener shard(o);
  TcpStreamTransport worker(Options("w0/ps", {}));
  auto c = worker.Connect(shard.endpoint);
  ASSERT_TRUE(c.ok());
  Status sent;
  std::thread sender([&] {
    sent =
        worker.Send(Route::Connection(*c), WithPayloads({64}, 4), Deadline::After(Millis(60000)));
  });
  WaitRefused(shard.t, 2);  // told "not yet" at least twice
  shard.t.SetAccept(kJob, {"w0/ps"});
  auto got = shard.t.Receive(Deadline::After(Millis(60000)));
  sender.join();
  EXPECT_TRUE(sent.ok()) << sent.ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ("w0/ps", got->from.identity);
  ExpectSame(WithPayloads({64}, 4), got->message);
  EXPECT_EQ(0u, o.refusals->handshakes.load()) << "\"not yet\" is no failed handshake";

  TcpStreamTransport joiner(Options("w1/ps1", {}));
  auto jc = joiner.Connect(shard.endpoint);
  ASSERT_TRUE(jc.ok());
  std::thread join_sender([&] {
    sent =
        joiner.Send(Route::Connection(*jc), WithPayloads({32}, 6), Deadline::After(Millis(60000)));
  });
  const Deadline by = Deadline::After(Millis(60000));
  while (o.refusals->handshakes.load() < 2 && !by.Expired()) {
    (void)shard.t.Receive(Deadline::After(Millis(20)));
  }
  shard.t.SetAccept(kJob, {"w0/ps", "w1/ps1"});
  got = shard.t.Receive(Deadline::After(Millis(60000)));
  join_sender.join();
  EXPECT_TRUE(sent.ok()) << sent.ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ("w1/ps1", got->from.identity);
  ExpectSame(WithPayloads({32}, 6), got->message);
}

// A peer that cannot be reached holds back no other: while the connection
// to a port nobody listens on is retried, a message to a live peer larger
// than its socket takes at once (the writer thread finishes it) arrives, and
// the post to the dead port is still waiting for its deadline.
TEST(TcpStreamTransport, APeerThatCannotBeReachedHoldsBackNoOther) {
  Neighbours n;
  auto& [right, left, conn] = n;
  ASSERT_TRUE(conn.ok());
  const int probe = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(0, bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof(a)));
  socklen_t len = sizeof(a);
  getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len);
  close(probe);  // nobody listens there now
  auto dead = left.Connect("tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  ASSERT_TRUE(dead.ok());
  std::atomic<bool> dead_done{false};
  left.Post(Route::Connection(*dead), WithPayloads({8}, 1), Deadline::After(Millis(60000)),
            [&](const Status&) { dead_done.store(true); });
  const Message big = WithPayloads({size_t{32} << 20}, 3);
  StatusOr<Incoming> got = UnavailableError("nothing yet");
  std::thread reader([&] { got = right.t.Receive(Deadline::After(Millis(60000))); });
  Status sent = left.Send(Route::Connection(*conn), big, Deadline::After(Millis(60000)));
  reader.join();
  EXPECT_TRUE(sent.ok()) << sent.ToString();
  EXPECT_FALSE(dead_done.load()) << "the dead port's post ended before the live peer was served";
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(big, got->message);
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

// Sealed connections: three nodes of a CURVE job, each with its key pair,
// and every node's view of the plan (right's data port is its listener).
struct SealedJob {
  SealedJob() {
    job = *GenerateCurveKey();
    for (const char* name : {"left", "right", "mallory"}) pairs[name] = *GenerateCurveKey();
  }
  std::shared_ptr<NodeKeys> KeysOf(const std::string& name, int right_port,
                                   const std::string& own = "") {
    auto keys = std::make_shared<NodeKeys>(job, pairs[own.empty() ? name : own]);
    std::vector<NodeInfo> plan;
    for (const auto& [who, pair] : pairs) {
      NodeInfo n;
      n.identity = who;
      n.host = hosts.count(who) != 0 ? hosts[who] : "127.0.0.1";
      n.data_port = static_cast<uint16_t>(who == "right" ? right_port : 1);
      n.public_key = pair.public_z85;
      plan.push_back(n);
    }
    keys->SetPlan(plan);
    return keys;
  }
  CurveKey job;
  std::map<std::string, CurveKey> pairs;
  std::map<std::string, std::string> hosts;  // "127.0.0.1" unless named
};

// The 32 bytes of a Z85 key.
std::string Binary(std::string_view z85) { return *DecodeKey(z85); }
const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// `o` sealed with `keys`.
TcpStreamOptions Sealed(TcpStreamOptions o, std::shared_ptr<const NodeKeys> keys) {
  o.node_keys = std::move(keys);
  o.refusals = std::make_shared<TransportRefusals>();
  return o;
}

// A sealed listener "right" taking "left", and right's port for the plan.
struct SealedRight {
  explicit SealedRight(SealedJob& job)
      : options(Sealed(Options("right", {"left"}), job.KeysOf("right", 0))),
        listener(std::make_unique<Listener>(options)),
        port(PortOf(listener->endpoint)) {}
  TcpStreamOptions options;
  std::unique_ptr<Listener> listener;
  int port;
  TcpStreamTransport& t() { return listener->t; }
  const std::string& endpoint() { return listener->endpoint; }
};

// Forwards one connection between `to` and whoever connects to endpoint,
// calling `tamper` on each chunk going to `to` (it may change or repeat
// bytes) with the bytes forwarded before it.
class Relay {
 public:
  Relay(const std::string& to,
        std::function<std::vector<uint8_t>(std::vector<uint8_t>, size_t)> tamper)
      : tamper_(std::move(tamper)) {
    listen_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(0, bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a)));
    EXPECT_EQ(0, listen(listen_, 1));
    socklen_t len = sizeof(a);
    getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    endpoint = "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    thread_ = std::thread([this, to] {
      const int in = accept(listen_, nullptr, nullptr);
      if (in < 0) return;
      const int out = RawConnect(to);
      std::thread back([in, out] { Pump(out, in, nullptr); });
      Pump(in, out, this);
      shutdown(out, SHUT_RDWR);
      shutdown(in, SHUT_RDWR);
      back.join();
      close(in);
      close(out);
    });
  }
  ~Relay() {
    shutdown(listen_, SHUT_RDWR);
    thread_.join();
    close(listen_);
  }
  std::string endpoint;
  std::vector<uint8_t> seen;  // what went towards `to`, as it came

 private:
  static void Pump(int from, int to, Relay* self) {
    std::vector<uint8_t> chunk(1 << 16);
    size_t forwarded = 0;
    for (;;) {
      const ssize_t r = read(from, chunk.data(), chunk.size());
      if (r <= 0) return;
      std::vector<uint8_t> bytes(chunk.begin(), chunk.begin() + r);
      if (self != nullptr) {
        self->seen.insert(self->seen.end(), bytes.begin(), bytes.end());
        bytes = self->tamper_(std::move(bytes), forwarded);
      }
      forwarded += static_cast<size_t>(r);
      for (size_t done = 0; done < bytes.size();) {
        const ssize_t w = send(to, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
        if (w <= 0) return;
        done += static_cast<size_t>(w);
      }
    }
  }
  std::function<std::vector<uint8_t>(std::vector<uint8_t>, size_t)> tamper_;
  int listen_ = -1;
  std::thread thread_;
};

// The bytes left sends before its first message: hello (fixed part, then
// Noise's first message: ephemeral key, sealed identity "left" and tag) and
// proof.
constexpr size_t kSealedHandshake = 20 + (32 + 4 + 16) + 20;
// A sealed message of one payload of n bytes and a 3-byte header.
size_t SealedBytes(size_t n) { return 8 + 16 + (16 + 3) + (16 + n); }

TEST(TcpStreamTransport, SealedMessagesArriveAndAnswersGoBack) {
  SealedJob job;
  SealedRight right(job);
  TcpStreamTransport left(Sealed(Options("left", {}), job.KeysOf("left", right.port)));
  auto conn = left.Connect(right.endpoint());
  ASSERT_TRUE(conn.ok());
  std::vector<Message> sent;
  PostedSends posted;
  for (uint8_t i = 0; i < 12; ++i) {
    std::vector<size_t> sizes;
    for (uint8_t k = 0; k < i % 4; ++k) sizes.push_back(k == 1 ? 0 : size_t{1} << (2 * i % 25));
    sent.push_back(WithPayloads(sizes, i));
    left.Post(Route::Connection(*conn), sent.back(), Deadline::After(Millis(60000)),
              posted.callback());
  }
  for (const Message& want : sent) {
    auto got = right.t().Receive(Deadline::After(Millis(60000)));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ("left", got->from.identity);
    ExpectSame(want, got->message);
  }
  EXPECT_TRUE(posted.first_failure().ok()) << posted.first_failure().ToString();
  Message answer = WithPayloads({100, 5}, 77);
  ASSERT_TRUE(right.t().Send(Route::Inbound("left"), answer, Deadline::After(Millis(20000))).ok());
  auto back = left.Receive(Deadline::After(Millis(20000)));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSame(answer, back->message);
  EXPECT_EQ(0u, right.t().refused());
}

TEST(TcpStreamTransport, SealedLanesPresentTheirOwnIdentityUnderTheNodesKey) {
  SealedJob job;
  TcpStreamOptions o = Sealed(Options("right", {"left"}), job.KeysOf("right", 0));
  o.accept_lanes = true;
  Listener right(o);
  TcpStreamTransport left(Sealed(Options("left", {}), job.KeysOf("left", PortOf(right.endpoint))));
  auto lane = left.ConnectLane(right.endpoint, 3);
  ASSERT_TRUE(lane.ok());
  Message m = WithPayloads({4096}, 5);
  ASSERT_TRUE(left.Send(Route::Connection(*lane), m, Deadline::After(Millis(20000))).ok());
  auto got = right.t.Receive(Deadline::After(Millis(20000)));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(LaneIdentity("left", 3), got->from.identity);
  ExpectSame(m, got->message);
  // mallory's key cannot present left's lane.
  TcpStreamTransport mallory(
      Sealed(Options("left", {}), job.KeysOf("left", PortOf(right.endpoint), "mallory")));
  Status s = SendRefused(mallory, right.endpoint, right.t, 1, 1);
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
}

TEST(TcpStreamTransport, SealedBytesAreSecretAndTamperingEndsTheConnection) {
  SealedJob job;
  SealedRight right(job);
  // A payload whose every 4-byte word is "SECR".
  Message m;
  m.header = {1, 2, 3};
  std::vector<uint8_t> secret(4096);
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<uint8_t>("SECR"[i % 4]);
  m.payloads.push_back(Payload::Copy(secret.data(), secret.size()));
  const size_t one = SealedBytes(secret.size());
  using Tamper = std::function<std::vector<uint8_t>(std::vector<uint8_t>, size_t)>;
  struct Case {
    const char* what;
    Tamper tamper;
    int sends;
  };
  const std::vector<Case> cases = {
      {"untouched", [](std::vector<uint8_t> b, size_t) { return b; }, 2},
      {"a bit flipped in the payload",
       [](std::vector<uint8_t> b, size_t at) {
         const size_t target = kSealedHandshake + 200;
         if (at <= target && target < at + b.size()) b[target - at] ^= 0x01;
         return b;
       },
       1},
      {"the frame table changed",
       [](std::vector<uint8_t> b, size_t at) {
         const size_t target = kSealedHandshake + 8;  // the header's size: 19 -> 18
         if (at <= target && target < at + b.size()) b[target - at] = 18;
         return b;
       },
       1},
      // The first message again in place of the second, and the second left out.
      {"a message replayed",
       [one, held = std::make_shared<std::vector<uint8_t>>()](std::vector<uint8_t> b,
                                                              size_t at) mutable {
         std::vector<uint8_t> out;
         for (size_t i = 0; i < b.size(); ++i) {
           const size_t pos = at + i;
           if (pos >= kSealedHandshake && pos < kSealedHandshake + one) held->push_back(b[i]);
           if (pos < kSealedHandshake + one) out.push_back(b[i]);
           if (pos == kSealedHandshake + 2 * one - 1)
             out.insert(out.end(), held->begin(), held->end());
         }
         return out;
       },
       2},
      {"a message dropped",
       [one](std::vector<uint8_t> b, size_t at) {
         std::vector<uint8_t> out;
         for (size_t i = 0; i < b.size(); ++i) {
           const size_t pos = at + i;
           if (pos < kSealedHandshake || pos >= kSealedHandshake + one) out.push_back(b[i]);
         }
         return out;
       },
       2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    SealedRight right(job);
    Relay relay(right.endpoint(), c.tamper);
    auto keys = job.KeysOf("left", right.port);
    keys->AddEndpoint("right", relay.endpoint);
    TcpStreamTransport left(Sealed(Options("left", {}), keys));
    auto conn = left.Connect(relay.endpoint);
    for (int i = 0; i < c.sends; ++i) {
      ASSERT_TRUE(left.Send(Route::Connection(*conn), m, Deadline::After(Millis(20000))).ok());
    }
    auto got = right.t().Receive(Deadline::After(Millis(20000)));
    if (std::string(c.what) == "untouched") {
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ExpectSame(m, got->message);
      got = right.t().Receive(Deadline::After(Millis(20000)));
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ExpectSame(m, got->message);
      // Not one 16-byte run of the payload crossed in the clear.
      const std::vector<uint8_t> run(secret.begin(), secret.begin() + 16);
      EXPECT_EQ(relay.seen.end(),
                std::search(relay.seen.begin(), relay.seen.end(), run.begin(), run.end()));
      EXPECT_EQ(kSealedHandshake + 2 * one, relay.seen.size());
      continue;
    }
    if (std::string(c.what) != "a bit flipped in the payload" &&
        std::string(c.what) != "the frame table changed" && got.ok()) {
      // The first message is whole; the next one is refused.
      ExpectSame(m, got->message);
      got = right.t().Receive(Deadline::After(Millis(20000)));
    }
    EXPECT_EQ(StatusCode::kDataLoss, got.status().code()) << got.status().ToString();
    EXPECT_NE(std::string::npos, got.status().message().find("'left'")) << got.status().ToString();
    EXPECT_EQ(1u, right.t().refused());
    EXPECT_EQ(1u, right.options.refusals->impostors.load());  // also counted for /metrics
  }
}

TEST(TcpStreamTransport, SealedConnectionsRefuseAnotherNodesIdentityOrKey) {
  SealedJob job;
  SealedRight right(job);
  // A job member shows its own key under left's identity.
  TcpStreamTransport mallory(Sealed(Options("left", {}), job.KeysOf("mallory", right.port)));
  Status s = SendRefused(mallory, right.endpoint(), right.t(), 1);
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("another identity")) << s.ToString();
  // One shows left's public key without its secret: it cannot prove it.
  CurveKey forged = job.pairs["mallory"];
  forged.public_z85 = job.pairs["left"].public_z85;
  job.pairs["forged"] = forged;
  TcpStreamTransport forger(Sealed(Options("left", {}), job.KeysOf("left", right.port, "forged")));
  job.pairs.erase("forged");
  s = SendRefused(forger, right.endpoint(), right.t(), 2);
  EXPECT_FALSE(s.ok());
  // Both were counted as failed handshakes; left itself is then taken.
  EXPECT_EQ(2u, right.options.refusals->handshakes.load());
  TcpStreamTransport left(Sealed(Options("left", {}), job.KeysOf("left", right.port)));
  auto c3 = left.Connect(right.endpoint());
  Message m = WithPayloads({64}, 9);
  ASSERT_TRUE(left.Send(Route::Connection(*c3), m, Deadline::After(Millis(20000))).ok());
  auto got = right.t().Receive(Deadline::After(Millis(20000)));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(m, got->message);
  // A listener that holds another key than the plan's for its endpoint
  // (mallory's, at right's port as left's plan has it) is not sent to.
  Listener fake(Sealed(Options("right", {"left"}), job.KeysOf("mallory", 0)));
  auto keys = job.KeysOf("left", right.port);
  keys->AddEndpoint("right", fake.endpoint);
  TcpStreamTransport fooled(Sealed(Options("left", {}), keys));
  // The fake cannot open the hello; its answer in clear is waited out.
  s = SendRefused(fooled, fake.endpoint, fake.t, 1, 0, Millis(1000));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string::npos, s.message().find("opens under the key of no node")) << s.ToString();
  EXPECT_FALSE(fake.t.Receive(Deadline::After(Millis(100))).ok());
}

TEST(TcpStreamTransport, PlainAndSealedPeersAreToldTheOthersMode) {
  SealedJob job;
  SealedRight right(job);
  TcpStreamTransport plain(Options("left", {}));
  Status s = SendRefused(plain, right.endpoint(), right.t(), 1);
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("only sealed")) << s.ToString();

  Listener open_right;
  auto keys = job.KeysOf("left", PortOf(open_right.endpoint));
  TcpStreamTransport sealed(Sealed(Options("left", {}), keys));
  // An answer in clear to a sealed connector may be forged on the path: it
  // is waited out until the deadline, and named then.
  s = SendRefused(sealed, open_right.endpoint, open_right.t, 1, 0, Millis(1000));
  EXPECT_TRUE(s.code() == StatusCode::kDeadlineExceeded || s.code() == StatusCode::kUnavailable)
      << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("only plain")) << s.ToString();
}

TEST(TcpStreamTransport, AThiefOfANodesKeyCannotPoseAsAnotherNodeToIt) {
  // right's key file was stolen (a shard keeps it in its checkpoint
  // directory). The thief connects to right as left: Noise KK's first
  // message it can write (es and ss need only right's secret), but not the
  // proof after the second (se needs left's secret).
  SealedJob job;
  SealedRight right(job);
  const std::string right_secret = Binary(job.pairs["right"].secret_z85);
  const std::string right_pub = Binary(job.pairs["right"].public_z85);
  const std::string left_pub = Binary(job.pairs["left"].public_z85);
  const std::vector<uint8_t> prologue = SealedStreamPrologue(kJob);
  noise::SymmetricState st(noise::kProtocolName);
  st.MixHash(prologue.data(), prologue.size());
  st.MixHash(Bytes(left_pub), 32);
  st.MixHash(Bytes(right_pub), 32);
  uint8_t e_pub[32], e_secret[32], dh[32];
  crypto_box_keypair(e_pub, e_secret);
  std::vector<uint8_t> first(e_pub, e_pub + 32);
  st.MixHash(e_pub, 32);
  ASSERT_EQ(0, crypto_scalarmult(dh, e_secret, Bytes(right_pub)));
  st.MixKey(dh, 32);
  ASSERT_EQ(0, crypto_scalarmult(dh, Bytes(right_secret), Bytes(left_pub)));
  st.MixKey(dh, 32);
  ASSERT_TRUE(st.EncryptAndHash(reinterpret_cast<const uint8_t*>("left"), 4, &first));
  std::vector<uint8_t> hello;
  Put32(&hello, 0x47535448);
  Put32(&hello, 3);
  Put64(&hello, kJob);
  Put32(&hello, static_cast<uint32_t>(first.size()));
  hello.insert(hello.end(), first.begin(), first.end());
  const int fd = RawConnect(right.endpoint());
  ASSERT_EQ(static_cast<ssize_t>(hello.size()), write(fd, hello.data(), hello.size()));
  // right answers: go on (8), then its second message.
  std::vector<uint8_t> answer(8 + 52);
  size_t got = 0;
  while (got < answer.size()) {
    const ssize_t r = read(fd, answer.data() + got, answer.size() - got);
    ASSERT_GT(r, 0);
    got += static_cast<size_t>(r);
  }
  const uint8_t* second = answer.data() + 8;
  st.MixHash(second, 32);
  ASSERT_EQ(0, crypto_scalarmult(dh, e_secret, second));
  st.MixKey(dh, 32);
  ASSERT_EQ(0, crypto_scalarmult(dh, Bytes(right_secret), second));  // its best guess for se
  st.MixKey(dh, 32);
  std::vector<uint8_t> verdict;
  EXPECT_FALSE(st.DecryptAndHash(second + 32, 20, &verdict));
  uint8_t k1[32], k2[32];
  st.Split(k1, k2);
  uint8_t word[4] = {0x50, 0x52, 0x4f, 0x46}, proof[20];  // "PROF" under its guess
  ASSERT_TRUE(BulkKey::FromBytes(k1)->Seal(0, 0, word, 4, proof).ok());
  ASSERT_EQ(20, write(fd, proof, sizeof(proof)));
  // right closes the connection unread and never takes it as left's.
  uint8_t rest[64];
  EXPECT_LE(read(fd, rest, sizeof(rest)), 0);
  close(fd);
  EXPECT_FALSE(right.t().Receive(Deadline::After(Millis(200))).ok());
  EXPECT_EQ(1u, right.options.refusals->handshakes.load());
  // left itself is taken.
  TcpStreamTransport left(Sealed(Options("left", {}), job.KeysOf("left", right.port)));
  auto conn = left.Connect(right.endpoint());
  Message m = WithPayloads({64}, 3);
  ASSERT_TRUE(left.Send(Route::Connection(*conn), m, Deadline::After(Millis(20000))).ok());
  auto in = right.t().Receive(Deadline::After(Millis(20000)));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ("left", in->from.identity);
  ExpectSame(m, in->message);
}

TEST(TcpStreamTransport, AFloodOfSilentConnectionsNeverClosesOneThatPassedItsHello) {
  // left's hello passes; its proof is held back on the path while a
  // stranger opens three times as many connections as may wait. None of
  // them closes left's, which is then taken.
  SealedJob job;
  SealedRight right(job);
  const size_t hello = 20 + 32 + 4 + 16;
  std::promise<void> flooded;
  std::shared_future<void> released = flooded.get_future().share();
  auto holding = std::make_shared<std::atomic<bool>>(false);
  Relay relay(right.endpoint(), [hello, released, holding](std::vector<uint8_t> b, size_t at) {
    if (at >= hello) {
      holding->store(true);
      released.wait();
    }
    return b;
  });
  auto keys = job.KeysOf("left", right.port);
  keys->AddEndpoint("right", relay.endpoint);
  TcpStreamTransport left(Sealed(Options("left", {}), keys));
  auto conn = left.Connect(relay.endpoint);
  Message m = WithPayloads({256}, 5);
  std::thread sender([&] {
    EXPECT_TRUE(left.Send(Route::Connection(*conn), m, Deadline::After(Millis(30000))).ok());
  });
  // Once the relay holds the proof (left's hello was answered), the flood.
  const Deadline by = Deadline::After(Millis(20000));
  while (!holding->load() && !by.Expired()) std::this_thread::sleep_for(Millis(5));
  std::vector<int> flood;
  const size_t n = 3 * TcpStreamOptions().max_pending;
  for (size_t i = 0; i < n; ++i) flood.push_back(RawConnect(right.endpoint()));
  const uint64_t evicted = n - TcpStreamOptions().max_pending + 1;
  while (right.t().refused() < evicted && !by.Expired()) std::this_thread::sleep_for(Millis(5));
  EXPECT_GE(right.t().refused(), evicted);
  flooded.set_value();
  auto in = right.t().Receive(Deadline::After(Millis(30000)));
  sender.join();
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ("left", in->from.identity);
  ExpectSame(m, in->message);
  for (int fd : flood) close(fd);
}

TEST(TcpStreamTransport, ASealedStreamTakesNothingFromAnAddressOutsideItsPlan) {
  // Every node of right's plan is at 127.0.0.2; left's plan has it at
  // 127.0.0.3, where it connects from: its connections are closed before
  // a byte is read, and counted.
  SealedJob job;
  job.hosts = {{"left", "127.0.0.2"}, {"right", "127.0.0.2"}, {"mallory", "127.0.0.2"}};
  SealedRight right(job);
  job.hosts["left"] = "127.0.0.3";
  auto keys = job.KeysOf("left", right.port);
  keys->AddEndpoint("right", right.endpoint());
  TcpStreamTransport left(Sealed(Options("left", {}), keys));
  Status s = SendRefused(left, right.endpoint(), right.t(), 2, 0, Millis(1000));
  EXPECT_FALSE(s.ok());
  EXPECT_GE(right.options.refusals->handshakes.load(), 2u);
  EXPECT_FALSE(right.t().Receive(Deadline::After(Millis(50))).ok());
}

TEST(TcpStreamTransport, BothDirectionsRenewTheirKeysAfterTheSameMessages) {
  SealedJob job;
  TcpStreamOptions ro = Sealed(Options("right", {"left"}), job.KeysOf("right", 0));
  ro.rekey_messages = 3;
  Listener right(ro);
  TcpStreamOptions lo = Sealed(Options("left", {}), job.KeysOf("left", PortOf(right.endpoint)));
  lo.rekey_messages = 3;
  TcpStreamTransport left(lo);
  auto conn = left.Connect(right.endpoint);
  for (uint8_t i = 0; i < 10; ++i) {
    Message m = WithPayloads({size_t{1} << i}, i);
    ASSERT_TRUE(left.Send(Route::Connection(*conn), m, Deadline::After(Millis(20000))).ok());
    auto in = right.t.Receive(Deadline::After(Millis(20000)));
    ASSERT_TRUE(in.ok()) << i << ": " << in.status().ToString();
    ExpectSame(m, in->message);
    Message back = WithPayloads({7}, i);
    ASSERT_TRUE(right.t.Send(Route::Inbound("left"), back, Deadline::After(Millis(20000))).ok());
    auto answer = left.Receive(Deadline::After(Millis(20000)));
    ASSERT_TRUE(answer.ok()) << i << ": " << answer.status().ToString();
    ExpectSame(back, answer->message);
  }
  // A peer that renews after another count: the 4th message does not open,
  // so the keys did change.
  TcpStreamOptions other = Sealed(Options("right", {"left"}), job.KeysOf("right", 0));
  Listener stale(other);
  auto keys = job.KeysOf("left", PortOf(right.endpoint));
  keys->AddEndpoint("right", stale.endpoint);
  lo.node_keys = keys;
  TcpStreamTransport renewing(lo);
  auto c2 = renewing.Connect(stale.endpoint);
  for (uint8_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(
        renewing.Send(Route::Connection(*c2), WithPayloads({8}, i), Deadline::After(Millis(20000)))
            .ok());
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(stale.t.Receive(Deadline::After(Millis(20000))).ok());
  auto fourth = stale.t.Receive(Deadline::After(Millis(20000)));
  EXPECT_EQ(StatusCode::kDataLoss, fourth.status().code()) << fourth.status().ToString();
}

TEST(TcpStreamTransport, ASealedMessageThatExpiresUnwrittenBreaksTheConnection) {
  // right reads nothing until left's socket is full; left sends with short
  // deadlines until one expires. A message sealed but not written when its
  // deadline passed holds its counter: dropping it would make every later
  // message fail to open. Everything reported sent arrives, and a message
  // after the expiry arrives too (on a new connection).
  SealedJob job;
  SealedRight right(job);
  TcpStreamTransport left(Sealed(Options("left", {}), job.KeysOf("left", right.port)));
  auto conn = left.Connect(right.endpoint());
  std::vector<Message> sent;
  for (uint8_t i = 0;; ++i) {
    Message m = WithPayloads({4096}, i);
    const Status s = left.Send(Route::Connection(*conn), m, Deadline::After(Millis(200)));
    if (!s.ok()) {
      EXPECT_EQ(StatusCode::kDeadlineExceeded, s.code()) << s.ToString();
      break;
    }
    sent.push_back(std::move(m));
    ASSERT_LT(sent.size(), 200000u) << "the socket never filled";
  }
  Message last = WithPayloads({64}, 200);
  std::thread sender([&] {
    EXPECT_TRUE(left.Send(Route::Connection(*conn), last, Deadline::After(Millis(30000))).ok());
  });
  for (const Message& want : sent) {
    auto in = right.t().Receive(Deadline::After(Millis(30000)));
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ExpectSame(want, in->message);
  }
  auto in = right.t().Receive(Deadline::After(Millis(30000)));
  sender.join();
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ExpectSame(last, in->message);
  EXPECT_EQ(0u, right.options.refusals->impostors.load());
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
