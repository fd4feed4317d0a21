// Conformance tests that every Transport passes, run against ZmqTransport
// (TCP on loopback) and InProcTransport, plus ZeroMQ-specific behaviour.
#include "wire/transport.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/inproc_transport.h"
#include "wire/validate.h"
#include "wire/zmq_transport.h"

namespace gradsync::wire {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Makes transports of one kind and the endpoints they use.
class Factory {
 public:
  virtual ~Factory() = default;
  virtual std::unique_ptr<Transport> New(const std::string& identity) = 0;
  // What to pass to Listen.
  virtual std::string ListenAddress() = 0;
  // An endpoint nobody listens on.
  virtual std::string DeadEndpoint() = 0;
};

class ZmqFactory : public Factory {
 public:
  ~ZmqFactory() override {
    for (int fd : fds_) close(fd);
  }
  std::unique_ptr<Transport> New(const std::string& identity) override {
    ZmqOptions options;
    options.identity = identity;
    options.linger_ms = 0;
    auto t = ZmqTransport::Create(options);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  std::string ListenAddress() override { return "tcp://127.0.0.1:0"; }
  // A port bound but not listening: connections are refused, and nobody
  // else can take the port while the factory lives.
  std::string DeadEndpoint() override {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    fds_.push_back(fd);
    return "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  }

 private:
  std::vector<int> fds_;
};

class InProcFactory : public Factory {
 public:
  std::unique_ptr<Transport> New(const std::string& identity) override {
    return network_.NewTransport(identity);
  }
  std::string ListenAddress() override { return "inproc://node-" + std::to_string(next_++); }
  std::string DeadEndpoint() override { return "inproc://nobody-" + std::to_string(next_++); }

 private:
  InProcNetwork network_;
  int next_ = 0;
};

struct Kind {
  std::string name;
  std::function<std::unique_ptr<Factory>()> make;
};

Sender Me() {
  Sender s;
  s.rank = 0;
  return s;
}

Message Numbered(uint64_t seq) {
  DataFields f;
  f.dtype = DType::U8;
  return MakeData(Me(), MsgType::Pull, f, {}, /*step=*/0, seq);
}

int64_t MillisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

class TransportTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    factory_ = GetParam().make();
    server_ = factory_->New("server");
    client_ = factory_->New("client");
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(client_, nullptr);
    auto bound = server_->Listen(factory_->ListenAddress());
    ASSERT_TRUE(bound.ok()) << bound.status();
    endpoint_ = *bound;
    auto conn = client_->Connect(endpoint_);
    ASSERT_TRUE(conn.ok()) << conn.status();
    conn_ = *conn;
  }

  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  static Incoming MustReceive(Transport& t) {
    auto in = t.Receive(Deadline::AfterMs(10000));
    EXPECT_TRUE(in.ok()) << in.status();
    return in.ok() ? std::move(in).value() : Incoming();
  }

  std::unique_ptr<Factory> factory_;
  std::unique_ptr<Transport> server_;
  std::unique_ptr<Transport> client_;
  std::string endpoint_;
  ConnId conn_ = -1;
};

TEST_P(TransportTest, RequestAndReplyOnConnectionAndInboundRoutes) {
  ASSERT_TRUE(
      client_->Send(Route::Connection(conn_), MakeHeartbeat(Me()), Deadline::AfterMs(5000)).ok());
  Incoming request = MustReceive(*server_);
  EXPECT_EQ(request.from.kind, Route::Kind::kInbound);
  EXPECT_EQ(request.from.identity, client_->identity());
  Verdict v = Validate(request.message, Policy::Accepting({MsgType::Heartbeat}));
  ASSERT_TRUE(v.ok()) << v.detail;

  Message reply = MakeLeave(Me(), "bye");
  const std::vector<uint8_t> sent_header = reply.header;
  ASSERT_TRUE(server_->Send(request.from, std::move(reply), Deadline::AfterMs(5000)).ok());
  Incoming answer = MustReceive(*client_);
  EXPECT_EQ(answer.from.kind, Route::Kind::kConnection);
  EXPECT_EQ(answer.from.conn, conn_);
  EXPECT_EQ(answer.message.header, sent_header);
  Verdict w = Validate(answer.message, Policy::Accepting({MsgType::Leave}));
  ASSERT_TRUE(w.ok()) << w.detail;
  EXPECT_EQ(w.header->body_as_LeaveBody()->reason()->str(), "bye");
}

TEST_P(TransportTest, ConnectTwiceToOneEndpointGivesOneConnection) {
  auto again = client_->Connect(endpoint_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, conn_);
}

TEST_P(TransportTest, PayloadBytesArriveIntact) {
  const std::vector<size_t> sizes = {1, 4093, size_t{16} << 20, 64};
  std::vector<std::vector<uint8_t>> frames;
  std::vector<Payload> payloads;
  uint64_t total = 0;
  for (size_t f = 0; f < sizes.size(); ++f) {
    auto bytes = std::make_shared<std::vector<uint8_t>>(sizes[f]);
    for (size_t i = 0; i < sizes[f]; ++i) (*bytes)[i] = static_cast<uint8_t>(i * 31 + f * 7);
    frames.push_back(*bytes);
    payloads.push_back(Payload::Borrow(bytes->data(), bytes->size(), bytes));
    total += sizes[f];
  }
  DataFields fields;
  fields.dtype = DType::U8;
  fields.num_elements = total;
  Message msg = MakeData(Me(), MsgType::Push, fields, std::move(payloads), 1, 2);
  ASSERT_TRUE(
      client_->Send(Route::Connection(conn_), std::move(msg), Deadline::AfterMs(10000)).ok());
  Incoming in = MustReceive(*server_);
  ASSERT_EQ(in.message.payloads.size(), sizes.size());
  for (size_t f = 0; f < sizes.size(); ++f) {
    const Payload& p = in.message.payloads[f];
    ASSERT_EQ(p.size, sizes[f]) << "frame " << f;
    EXPECT_EQ(std::memcmp(p.data, frames[f].data(), p.size), 0) << "frame " << f;
  }
  Verdict v = Validate(in.message, Policy::Accepting({MsgType::Push}));
  EXPECT_TRUE(v.ok()) << v.detail;

  // And back on the Inbound route.
  Message echo;
  echo.header = in.message.header;
  echo.payloads = in.message.payloads;
  ASSERT_TRUE(server_->Send(in.from, std::move(echo), Deadline::AfterMs(10000)).ok());
  Incoming back = MustReceive(*client_);
  ASSERT_EQ(back.message.payloads.size(), sizes.size());
  for (size_t f = 0; f < sizes.size(); ++f) {
    ASSERT_EQ(back.message.payloads[f].size, sizes[f]);
    EXPECT_EQ(std::memcmp(back.message.payloads[f].data, frames[f].data(), sizes[f]), 0);
  }
}

TEST_P(TransportTest, MessagesOnOneRouteArriveInOrder) {
  constexpr uint64_t kCount = 1000;
  for (uint64_t i = 0; i < kCount; ++i) {
    ASSERT_TRUE(
        client_->Send(Route::Connection(conn_), Numbered(i), Deadline::AfterMs(10000)).ok());
  }
  Route back;
  for (uint64_t i = 0; i < kCount; ++i) {
    Incoming in = MustReceive(*server_);
    ASSERT_FALSE(in.message.header.empty());
    ASSERT_EQ(in.message.header_view()->seq(), i);
    back = in.from;
  }
  for (uint64_t i = 0; i < kCount; ++i) {
    ASSERT_TRUE(server_->Send(back, Numbered(i), Deadline::AfterMs(10000)).ok());
  }
  for (uint64_t i = 0; i < kCount; ++i) {
    Incoming in = MustReceive(*client_);
    ASSERT_FALSE(in.message.header.empty());
    ASSERT_EQ(in.message.header_view()->seq(), i);
  }
}

TEST_P(TransportTest, ReceiveGivesUpAtItsDeadline) {
  const auto start = Clock::now();
  auto in = server_->Receive(Deadline::AfterMs(200));
  const int64_t took = MillisSince(start);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), StatusCode::kDeadlineExceeded) << in.status();
  EXPECT_GE(took, 190);
  EXPECT_LT(took, 1500);
  auto now = client_->Receive(Deadline::Past());
  EXPECT_EQ(now.status().code(), StatusCode::kDeadlineExceeded);
}

TEST_P(TransportTest, SendToUnknownInboundIdentityFailsAtOnce) {
  const auto start = Clock::now();
  Status s = server_->Send(Route::Inbound("nobody"), MakeHeartbeat(Me()), Deadline::AfterMs(10000));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("nobody"));
  EXPECT_LT(MillisSince(start), 1000);
  // A transport that does not listen has no inbound peers at all.
  Status c = client_->Send(Route::Inbound(server_->identity()), MakeHeartbeat(Me()),
                           Deadline::AfterMs(10000));
  EXPECT_EQ(c.code(), StatusCode::kUnavailable) << c;
}

TEST_P(TransportTest, ShutdownUnblocksReceive) {
  std::atomic<bool> returned{false};
  Status got;
  std::thread receiver([&] {
    auto in = server_->Receive(Deadline::Infinite());
    got = in.ok() ? InternalError("received a message") : in.status();
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(returned);
  const auto start = Clock::now();
  server_->Shutdown();
  receiver.join();
  EXPECT_LT(MillisSince(start), 3000);
  EXPECT_EQ(got.code(), StatusCode::kCancelled) << got;
  // Later calls are cancelled too, and Shutdown is idempotent.
  EXPECT_EQ(server_->Receive(Deadline::AfterMs(10)).status().code(), StatusCode::kCancelled);
  EXPECT_EQ(
      server_->Send(Route::Inbound(client_->identity()), MakeHeartbeat(Me()), Deadline::AfterMs(10))
          .code(),
      StatusCode::kCancelled);
  server_->Shutdown();
}

TEST_P(TransportTest, ProbeFindsListenerAndNamesAnUnreachableEndpoint) {
  EXPECT_TRUE(client_->Probe(endpoint_, Deadline::AfterMs(5000)).ok());
  const std::string dead = factory_->DeadEndpoint();
  const auto start = Clock::now();
  Status s = client_->Probe(dead, Deadline::AfterMs(500));
  const int64_t took = MillisSince(start);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr(dead));
  EXPECT_LT(took, 1500);
}

INSTANTIATE_TEST_SUITE_P(
    Transports, TransportTest,
    ::testing::Values(Kind{"Zmq", [] { return std::unique_ptr<Factory>(new ZmqFactory); }},
                      Kind{"InProc", [] { return std::unique_ptr<Factory>(new InProcFactory); }}),
    [](const ::testing::TestParamInfo<Kind>& info) { return info.param.name; });

// ZeroMQ only: sending zero-copy hands the payload owners to ZeroMQ, which
// lets them go once the bytes are on the wire.
TEST(ZmqTransportTest, ZeroCopyPayloadOwnersAreReleasedAfterSending) {
  ZmqFactory factory;
  auto server = factory.New("server");
  auto client = factory.New("client");
  auto bound = server->Listen(factory.ListenAddress());
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_THAT(*bound, HasSubstr("tcp://127.0.0.1:"));
  EXPECT_THAT(*bound, ::testing::Not(::testing::EndsWith(":0")));
  auto conn = client->Connect(*bound);
  ASSERT_TRUE(conn.ok());

  auto owner = std::make_shared<std::vector<uint8_t>>(size_t{4} << 20, 0xab);
  DataFields f;
  f.dtype = DType::U8;
  f.num_elements = owner->size();
  Message msg =
      MakeData(Me(), MsgType::Push, f, {Payload::Borrow(owner->data(), owner->size(), owner)});
  EXPECT_EQ(owner.use_count(), 2);
  ASSERT_TRUE(
      client->Send(Route::Connection(*conn), std::move(msg), Deadline::AfterMs(10000)).ok());
  auto in = server->Receive(Deadline::AfterMs(10000));
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_EQ(in->message.payloads.size(), 1u);
  EXPECT_NE(in->message.payloads[0].data, owner->data());  // it crossed a socket
  const auto start = Clock::now();
  while (owner.use_count() > 1 && MillisSince(start) < 5000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(owner.use_count(), 1);
}

// ZeroMQ only: a peer that comes back under the same identity (a restarted
// process) takes over its route and gets the replies.
TEST(ZmqTransportTest, PeerThatReconnectsUnderItsIdentityGetsReplies) {
  ZmqFactory factory;
  auto server = factory.New("server");
  auto bound = server->Listen(factory.ListenAddress());
  ASSERT_TRUE(bound.ok()) << bound.status();
  for (int life = 0; life < 2; ++life) {
    SCOPED_TRACE("life " + std::to_string(life));
    auto peer = factory.New("worker-7");
    auto conn = peer->Connect(*bound);
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(peer->Send(Route::Connection(*conn), Numbered(life), Deadline::AfterMs(5000)).ok());
    auto in = server->Receive(Deadline::AfterMs(10000));
    ASSERT_TRUE(in.ok()) << in.status();
    EXPECT_EQ(in->from.identity, "worker-7");
    ASSERT_TRUE(server->Send(in->from, Numbered(100 + life), Deadline::AfterMs(5000)).ok());
    auto reply = peer->Receive(Deadline::AfterMs(10000));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->message.header_view()->seq(), static_cast<uint64_t>(100 + life));
    peer->Shutdown();
  }
}

// A last broadcast posted just before Shutdown (the scheduler's "job shut
// down") reaches every peer: nothing queued before Shutdown is dropped.
TEST(ZmqTransportTest, PostsQueuedBeforeShutdownAreAllSent) {
  constexpr int kPeers = 8;
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ZmqOptions options;
    options.identity = "hub";
    auto hub = std::move(ZmqTransport::Create(options)).value();
    auto bound = hub->Listen("tcp://127.0.0.1:0");
    ASSERT_TRUE(bound.ok()) << bound.status();
    std::vector<std::unique_ptr<ZmqTransport>> peers;
    std::vector<Route> routes;
    for (int i = 0; i < kPeers; ++i) {
      ZmqOptions peer_options;
      peer_options.identity = "peer-" + std::to_string(i);
      peers.push_back(std::move(ZmqTransport::Create(peer_options)).value());
      auto conn = peers.back()->Connect(*bound);
      ASSERT_TRUE(conn.ok()) << conn.status();
      ASSERT_TRUE(
          peers.back()->Send(Route::Connection(*conn), Numbered(i), Deadline::AfterMs(5000)).ok());
      auto in = hub->Receive(Deadline::AfterMs(10000));
      ASSERT_TRUE(in.ok()) << in.status();
      routes.push_back(in->from);
    }
    for (int i = 0; i < kPeers; ++i) {
      hub->Post(routes[static_cast<size_t>(i)], Numbered(100 + i), Deadline::AfterMs(5000), {});
    }
    hub->Shutdown();
    for (int i = 0; i < kPeers; ++i) {
      auto got = peers[static_cast<size_t>(i)]->Receive(Deadline::AfterMs(10000));
      ASSERT_TRUE(got.ok()) << "peer " << i << ": " << got.status();
      EXPECT_EQ(got->message.header_view()->seq(), static_cast<uint64_t>(100 + i));
    }
  }
}

TEST(ZmqTransportTest, ListenTwiceFails) {
  ZmqFactory factory;
  auto server = factory.New("server");
  ASSERT_TRUE(server->Listen(factory.ListenAddress()).ok());
  auto again = server->Listen(factory.ListenAddress());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

// ZeroMQ only: what no gradsync message looks like (more payload frames,
// or a larger header frame, than any has) is dropped as it is read, counted
// and reported; the messages behind it on the same route still arrive.
TEST(ZmqTransportTest, MessagesWithTooManyFramesOrTooLargeAHeaderAreDroppedAndCounted) {
  std::mutex mu;
  std::vector<std::string> reasons;
  ZmqOptions options;
  options.on_dropped = [&](const std::string& peer, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    reasons.push_back(peer + ": " + why);
  };
  auto server = std::move(ZmqTransport::Create(options)).value();
  auto bound = server->Listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(bound.ok());
  auto peer = std::move(ZmqTransport::Create({})).value();
  auto conn = peer->Connect(*bound);
  ASSERT_TRUE(conn.ok());
  Message many = Numbered(1);
  const uint8_t byte = 7;
  for (int i = 0; i < 65; ++i) many.payloads.push_back(Payload::Copy(&byte, 1));
  Message big_header;
  big_header.header.assign((64 << 10) + 1, 0x41);
  Message at_limit = Numbered(2);
  for (int i = 0; i < 64; ++i) at_limit.payloads.push_back(Payload::Copy(&byte, 1));
  for (Message* m : {&many, &big_header, &at_limit}) {
    ASSERT_TRUE(peer->Send(Route::Connection(*conn), *m, Deadline::AfterMs(5000)).ok());
  }
  ASSERT_TRUE(peer->Send(Route::Connection(*conn), Numbered(3), Deadline::AfterMs(5000)).ok());
  for (uint64_t want : {2u, 3u}) {
    auto in = server->Receive(Deadline::AfterMs(10000));
    ASSERT_TRUE(in.ok()) << in.status();
    EXPECT_EQ(in->message.header_view()->seq(), want);
  }
  EXPECT_EQ(server->dropped(), 2u);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(reasons.size(), 2u);
  EXPECT_THAT(reasons[0], ::testing::HasSubstr("65 payload frames, at most 64"));
  EXPECT_THAT(reasons[1], ::testing::HasSubstr("a header of 65537 bytes, at most 65536"));
}

// ZeroMQ only: a peer that stops reading holds back the sends to it and no
// other. Before, every send of a transport waited in one queue behind the
// first one that would block.
// A sender connected to a peer that stops reading at once (its queues hold
// one message) and to one that reads.
struct StuckAndReader {
  std::unique_ptr<ZmqTransport> stuck, reader, sender;
  std::string stuck_at, reader_at;  // their endpoints
  StatusOr<ConnId> to_stuck = UnavailableError("unset"), to_reader = UnavailableError("unset");

  StuckAndReader() {
    ZmqOptions stuck_options;
    stuck_options.max_queued_incoming = 1;
    stuck_options.recv_hwm = 1;
    stuck = std::move(ZmqTransport::Create(stuck_options)).value();
    reader = std::move(ZmqTransport::Create({})).value();
    ZmqOptions sender_options;
    sender_options.send_hwm = 1;
    sender_options.linger_ms = 0;
    sender = std::move(ZmqTransport::Create(sender_options)).value();
    stuck_at = stuck->Listen("tcp://127.0.0.1:0").value();
    reader_at = reader->Listen("tcp://127.0.0.1:0").value();
    to_stuck = sender->Connect(stuck_at);
    to_reader = sender->Connect(reader_at);
  }
  // A push whose payload is all of `big`, without copying it.
  static Message BigPush(const std::shared_ptr<std::vector<uint8_t>>& big) {
    DataFields f;
    f.dtype = DType::U8;
    f.num_elements = big->size();
    return MakeData(Me(), MsgType::Push, f, {Payload::Borrow(big->data(), big->size(), big)});
  }

  // What posts reported, in the order they did.
  struct Outcomes {
    std::mutex mu;
    std::vector<Status> all;  // guarded by mu
    size_t size() {
      std::lock_guard<std::mutex> lock(mu);
      return all.size();
    }
  };
  // Posts `n` pushes of all of `big` to the peer that never reads; each
  // reports into `outcomes`.
  void PostToStuck(int n, const std::shared_ptr<std::vector<uint8_t>>& big, Deadline deadline,
                   Outcomes* outcomes) {
    for (int i = 0; i < n; ++i) {
      sender->Post(Route::Connection(*to_stuck), BigPush(big), deadline,
                   [outcomes](const Status& s) {
                     std::lock_guard<std::mutex> lock(outcomes->mu);
                     outcomes->all.push_back(s);
                   });
    }
  }
};

TEST(ZmqTransportTest, APeerThatStopsReadingDelaysNoOtherPeer) {
  StuckAndReader p;
  ASSERT_TRUE(p.to_stuck.ok() && p.to_reader.ok());
  // Fill everything between the sender and the peer that never reads.
  std::atomic<bool> stop{false};
  std::atomic<int> blocked{0};
  std::vector<std::thread> fillers;
  for (int t = 0; t < 4; ++t) {
    fillers.emplace_back([&] {
      auto big = std::make_shared<std::vector<uint8_t>>(size_t{8} << 20, 1);
      while (!stop.load()) {
        Status s = p.sender->Send(Route::Connection(*p.to_stuck), StuckAndReader::BigPush(big),
                                  Deadline::AfterMs(3000));
        if (!s.ok()) ++blocked;
      }
    });
  }
  while (blocked.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // The stuck peer's sends are now waiting; another peer's go through.
  const auto start = Clock::now();
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(
        p.sender->Send(Route::Connection(*p.to_reader), Numbered(i), Deadline::AfterMs(2000)).ok());
    ASSERT_TRUE(p.reader->Receive(Deadline::AfterMs(2000)).ok());
  }
  EXPECT_LT(MillisSince(start), 2000);
  stop.store(true);
  for (auto& t : fillers) t.join();
}

// A peer that left: Disconnect ends what still waits for it (posted sends
// told Cancelled, every payload let go of, those ZeroMQ had queued too),
// and a later Connect to the endpoint (a peer started again in its place)
// opens a new connection that works.
TEST(ZmqTransportTest, DisconnectLetsGoOfAGonePeersSendsAndConnectOpensAnew) {
  StuckAndReader p;
  ASSERT_TRUE(p.to_stuck.ok() && p.to_reader.ok());
  auto big = std::make_shared<std::vector<uint8_t>>(size_t{8} << 20, 1);
  StuckAndReader::Outcomes outcomes;
  constexpr size_t kPosts = 8;
  p.PostToStuck(kPosts, big, Deadline::AfterMs(600000), &outcomes);
  auto waiting = [&] { return outcomes.size() < kPosts; };
  // The peer reads nothing: some of the pushes wait in the sender.
  const auto start = Clock::now();
  while (big.use_count() == 1 && MillisSince(start) < 10000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(waiting());
  p.sender->Disconnect(p.stuck_at);
  while ((waiting() || big.use_count() > 1) && MillisSince(start) < 20000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(big.use_count(), 1) << "the pushes to the gone peer still hold their payloads";
  {
    std::lock_guard<std::mutex> lock(outcomes.mu);
    ASSERT_EQ(outcomes.all.size(), kPosts);
    EXPECT_EQ(outcomes.all.back().code(), StatusCode::kCancelled) << outcomes.all.back();
    EXPECT_THAT(outcomes.all.back().message(), HasSubstr("connection to " + p.stuck_at));
  }
  // The other peer's connection is untouched.
  ASSERT_TRUE(
      p.sender->Send(Route::Connection(*p.to_reader), Numbered(1), Deadline::AfterMs(5000)).ok());
  ASSERT_TRUE(p.reader->Receive(Deadline::AfterMs(5000)).ok());
  // That peer leaves and another listens in its place.
  p.sender->Disconnect(p.reader_at);
  p.reader->Shutdown();
  p.reader = std::move(ZmqTransport::Create({})).value();
  ASSERT_TRUE(p.reader->Listen(p.reader_at).ok());
  auto again = p.sender->Connect(p.reader_at);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(*again, *p.to_reader);
  ASSERT_TRUE(p.sender->Send(Route::Connection(*again), Numbered(2), Deadline::AfterMs(5000)).ok());
  auto in = p.reader->Receive(Deadline::AfterMs(5000));
  ASSERT_TRUE(in.ok()) << in.status();
}

// A receiver whose queue holds one message pauses its reads while it is
// full and resumes as its owner takes them: every message comes, in order.
TEST(ZmqTransportTest, AReceiverWhoseQueueFilledGetsEveryMessageAsItReads) {
  ZmqOptions small;
  small.max_queued_incoming = 1;
  auto receiver = std::move(ZmqTransport::Create(small)).value();
  auto sender = std::move(ZmqTransport::Create({})).value();
  auto conn = sender->Connect(*receiver->Listen("tcp://127.0.0.1:0"));
  ASSERT_TRUE(conn.ok()) << conn.status();
  // All sent (into ZeroMQ's queues) before the receiver takes one: it has
  // read one and paused.
  constexpr int kMessages = 200;
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(sender->Send(Route::Connection(*conn), Numbered(i), Deadline::AfterMs(20000)).ok());
  }
  for (int i = 0; i < kMessages; ++i) {
    auto in = receiver->Receive(Deadline::AfterMs(20000));
    ASSERT_TRUE(in.ok()) << "message " << i << ": " << in.status();
    EXPECT_EQ(in->message.header_view()->seq(), static_cast<uint64_t>(i));
  }
}

// Post returns at once even to a peer that never reads: its outcome comes
// later (DeadlineExceeded once the message could not go out in time), and
// a later post to another peer goes out meanwhile.
TEST(ZmqTransportTest, PostNeverWaitsAndReportsTheOutcomeLater) {
  StuckAndReader p;
  ASSERT_TRUE(p.to_stuck.ok() && p.to_reader.ok());
  auto big = std::make_shared<std::vector<uint8_t>>(size_t{8} << 20, 1);
  StuckAndReader::Outcomes posted;
  const auto start = Clock::now();
  p.PostToStuck(16, big, Deadline::AfterMs(1500), &posted);
  EXPECT_LT(MillisSince(start), 500) << "posting waited on the peer";
  std::atomic<bool> delivered{false};
  p.sender->Post(Route::Connection(*p.to_reader), Numbered(1), Deadline::AfterMs(2000),
                 [&](const Status& s) { delivered = s.ok(); });
  ASSERT_TRUE(p.reader->Receive(Deadline::AfterMs(2000)).ok());
  for (int i = 0; i < 300 && posted.size() < 16; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard<std::mutex> lock(posted.mu);
  const std::vector<Status>& outcomes = posted.all;
  ASSERT_EQ(outcomes.size(), 16u) << "every post reports once";
  EXPECT_EQ(
      std::count_if(outcomes.begin(), outcomes.end(),
                    [](const Status& s) { return s.code() == StatusCode::kDeadlineExceeded; }),
      std::count_if(outcomes.begin(), outcomes.end(), [](const Status& s) { return !s.ok(); }));
  EXPECT_GT(
      std::count_if(outcomes.begin(), outcomes.end(), [](const Status& s) { return !s.ok(); }), 0)
      << "a peer that never reads took 128 MiB";
  EXPECT_TRUE(delivered.load());
}

}  // namespace
}  // namespace gradsync::wire
