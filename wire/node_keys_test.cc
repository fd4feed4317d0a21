// Per-node CURVE identity between real ZeroMQ transports on loopback: a
// member with a key of the plan cannot send under another member's identity,
// a connection talks only to the server holding the peer's own key, a
// handshake waits for the plan that names its key, a flood of strangers'
// handshakes does not shut out a peer the plan names late, and a shard's key
// survives its restart.
#include "wire/node_keys.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "wire/bulk_cipher.h"
#include "wire/curve.h"
#include "wire/message.h"
#include "wire/zmq_curve.h"
#include "wire/zmq_transport.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace gradsync::wire {
namespace {

struct Member {
  std::string identity;
  CurveKey key;
  std::shared_ptr<NodeKeys> keys;
  std::unique_ptr<ZmqTransport> transport;
  std::string endpoint;  // when it listens
};

// A data transport of identity `identity` with the node key `own`.
Member Make(const CurveKey& job, const std::string& identity, const CurveKey& own,
            bool bulk = false, int bulk_connect_timeout_ms = 5000, int bulk_port_offset = 0,
            int bulk_crypto_threads = -1) {
  Member m{identity, own, std::make_shared<NodeKeys>(job, own), nullptr, ""};
  ZmqOptions o;
  o.identity = identity;
  o.node_keys = m.keys;
  o.bulk_encryption = bulk;
  o.bulk_connect_timeout_ms = bulk_connect_timeout_ms;
  o.bulk_port_offset = bulk_port_offset;
  o.bulk_crypto_threads = bulk_crypto_threads;
  m.transport = std::move(ZmqTransport::Create(o)).value();
  return m;
}

NodeInfo Entry(const std::string& identity, const CurveKey& key, const std::string& endpoint) {
  NodeInfo n;
  n.identity = identity;
  n.public_key = key.public_z85;
  n.host = "127.0.0.1";
  n.data_port = static_cast<uint16_t>(std::atoi(endpoint.c_str() + endpoint.rfind(':') + 1));
  return n;
}

// Sends a heartbeat over a new connection from `from` to `endpoint`,
// without waiting: it leaves once the connection is up, within 10 s.
void SendTo(Member& from, const std::string& endpoint) {
  auto conn = from.transport->Connect(endpoint);
  ASSERT_TRUE(conn.ok()) << conn.status();
  from.transport->Post(Route::Connection(*conn), MakeHeartbeat(Sender{Role::Worker, 0, 1}),
                       Deadline::AfterMs(10000), [](const Status&) {});
}

class NodeKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_ = *GenerateCurveKey();
    server_ = Make(job_, "server", *GenerateCurveKey());
    server_.endpoint = *server_.transport->Listen("tcp://127.0.0.1:0");
  }

  CurveKey job_;
  Member server_;
};

TEST_F(NodeKeysTest, AMemberCannotSendUnderAnotherMembersIdentity) {
  Member victim = Make(job_, "victim", *GenerateCurveKey());
  const CurveKey impostor_key = *GenerateCurveKey();
  // The impostor's key is in the plan (it is a member), bound to "impostor";
  // its transport claims the victim's identity.
  Member impostor = Make(job_, "victim", impostor_key);
  const std::vector<NodeInfo> plan = {Entry("victim", victim.key, "tcp://127.0.0.1:1"),
                                      Entry("impostor", impostor_key, "tcp://127.0.0.1:2"),
                                      Entry("server", server_.key, server_.endpoint)};
  for (Member* m : {&server_, &victim, &impostor}) m->keys->SetPlan(plan);

  SendTo(victim, server_.endpoint);
  auto in = server_.transport->Receive(Deadline::AfterMs(5000));
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->from.ToString(), Route::Inbound("victim").ToString());

  SendTo(impostor, server_.endpoint);
  EXPECT_FALSE(server_.transport->Receive(Deadline::AfterMs(1500)).ok());
  for (Deadline d = Deadline::AfterMs(5000); server_.transport->impostors() == 0 && !d.Expired();) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_.transport->impostors(), 1u);

  // The victim's route is still the victim's: a reply reaches it alone.
  ASSERT_TRUE(server_.transport
                  ->Send(Route::Inbound("victim"), MakeHeartbeat(Sender{Role::Server, 0, 1}),
                         Deadline::AfterMs(1000))
                  .ok());
  EXPECT_TRUE(victim.transport->Receive(Deadline::AfterMs(5000)).ok());
  EXPECT_FALSE(impostor.transport->Receive(Deadline::AfterMs(500)).ok());
}

TEST_F(NodeKeysTest, AConnectionTalksOnlyToTheServerHoldingThePeersKey) {
  // A member that serves at an endpoint of the plan with a key other than
  // the one the plan gives for it (the job's, or its own), admitting all.
  Member client = Make(job_, "client", *GenerateCurveKey());
  for (const CurveKey& served : {job_, *GenerateCurveKey()}) {
    Member squatter = Make(job_, "squatter", served);
    squatter.endpoint = *squatter.transport->Listen("tcp://127.0.0.1:0");
    const std::vector<NodeInfo> plan = {Entry("client", client.key, "tcp://127.0.0.1:1"),
                                        Entry("server", server_.key, squatter.endpoint)};
    client.keys->SetPlan(plan);
    squatter.keys->SetPlan(plan);
    EXPECT_FALSE(client.transport->Probe(squatter.endpoint, Deadline::AfterMs(3000)).ok());
    SendTo(client, squatter.endpoint);
    EXPECT_FALSE(squatter.transport->Receive(Deadline::AfterMs(1500)).ok());
  }
}

// A ring lane (client/ring_lanes.h): the server's second transport, under
// its lane identity with the server's node key, listens at an endpoint the
// plan does not name; once added for the server, a client's lane reaches
// it under the client's lane identity, and the endpoint is bound to the
// server's key only (a squatter there with another key gets nothing).
TEST_F(NodeKeysTest, ALaneEndpointIsServedUnderItsNodesKeyOnly) {
  Member client = Make(job_, LaneIdentity("client", 1), *GenerateCurveKey());
  Member lane = Make(job_, LaneIdentity("server", 1), server_.key);
  lane.endpoint = *lane.transport->Listen("tcp://127.0.0.1:0");
  const std::vector<NodeInfo> plan = {Entry("client", client.key, "tcp://127.0.0.1:1"),
                                      Entry("server", server_.key, server_.endpoint)};
  client.keys->SetPlan(plan);
  server_.keys->SetPlan(plan);
  lane.keys->SetPlan(plan);
  EXPECT_EQ(client.keys->ServerKeyAt(lane.endpoint), std::nullopt);
  client.keys->AddEndpoint("server", lane.endpoint);
  EXPECT_EQ(client.keys->ServerKeyAt(lane.endpoint),
            std::optional<std::string>(server_.key.public_z85));
  // The plan's endpoints keep their own node's key.
  client.keys->AddEndpoint("client", server_.endpoint);
  EXPECT_EQ(client.keys->ServerKeyAt(server_.endpoint),
            std::optional<std::string>(server_.key.public_z85));
  SendTo(client, lane.endpoint);
  auto in = lane.transport->Receive(Deadline::AfterMs(10000));
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->from.ToString(), Route::Inbound(LaneIdentity("client", 1)).ToString());

  // A node that left the plan no longer vouches for its lane's endpoint.
  client.keys->SetPlan({Entry("client", client.key, "tcp://127.0.0.1:1")});
  EXPECT_EQ(client.keys->ServerKeyAt(lane.endpoint), std::nullopt);

  Member squatter = Make(job_, "squatter", *GenerateCurveKey());
  squatter.endpoint = *squatter.transport->Listen("tcp://127.0.0.1:0");
  client.keys->SetPlan(plan);
  client.keys->AddEndpoint("server", squatter.endpoint);
  squatter.keys->SetPlan(plan);
  EXPECT_FALSE(client.transport->Probe(squatter.endpoint, Deadline::AfterMs(3000)).ok());
}

TEST_F(NodeKeysTest, AMemberTimesItsLinkAndItsRouteStaysWhereItWas) {
  Member client = Make(job_, "client", *GenerateCurveKey());
  client.endpoint = *client.transport->Listen("tcp://127.0.0.1:0");
  const std::vector<NodeInfo> plan = {Entry("client", client.key, client.endpoint),
                                      Entry("server", server_.key, server_.endpoint)};
  client.keys->SetPlan(plan);
  server_.keys->SetPlan(plan);
  SendTo(client, server_.endpoint);
  ASSERT_TRUE(server_.transport->Receive(Deadline::AfterMs(5000)).ok());
  auto timing = client.transport->MeasureLink(server_.endpoint, 1 << 20, Deadline::AfterMs(10000));
  ASSERT_TRUE(timing.ok()) << timing.status();
  EXPECT_GT(timing->full.count(), 0);
  // The echo's own connection did not take the client's route: a message to
  // it still arrives, and the echo itself reached no Receive.
  ASSERT_TRUE(server_.transport
                  ->Send(Route::Inbound("client"), MakeHeartbeat(Sender{Role::Server, 0, 1}),
                         Deadline::AfterMs(5000))
                  .ok());
  auto back = client.transport->Receive(Deadline::AfterMs(5000));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->from.kind, Route::Kind::kConnection);  // the client's own connection
  EXPECT_FALSE(server_.transport->Receive(Deadline::AfterMs(300)).ok());
}

TEST_F(NodeKeysTest, AStrangerGetsNoEcho) {
  Member stranger = Make(*GenerateCurveKey(), "stranger", *GenerateCurveKey());
  server_.keys->SetPlan({Entry("server", server_.key, server_.endpoint)});
  auto timing = stranger.transport->MeasureLink(server_.endpoint, 1024, Deadline::AfterMs(1000));
  EXPECT_EQ(timing.status().code(), StatusCode::kDeadlineExceeded) << timing.status();
}

TEST_F(NodeKeysTest, AHandshakeWaitsForThePlanThatNamesItsKey) {
  Member client = Make(job_, "client", *GenerateCurveKey());
  const std::vector<NodeInfo> plan = {Entry("client", client.key, "tcp://127.0.0.1:1"),
                                      Entry("server", server_.key, server_.endpoint)};
  client.keys->SetPlan(plan);  // the server has none yet
  SendTo(client, server_.endpoint);
  EXPECT_FALSE(server_.transport->Receive(Deadline::AfterMs(300)).ok());
  server_.keys->SetPlan(plan);
  auto in = server_.transport->Receive(Deadline::AfterMs(5000));
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->from.ToString(), Route::Inbound("client").ToString());
}

// Seen before: strangers' handshakes filled the server's hold of keys its
// plan does not name yet, the late peer's handshake was refused, and libzmq
// never connected it again: nothing it sent arrived, even once the plan
// named it.
TEST_F(NodeKeysTest, AFloodOfStrangersDoesNotShutOutAPeerThePlanNamesLate) {
  const uint64_t refused_at_once = 44;
  zmq::context_t strangers_context;
  std::list<zmq::socket_t> strangers;  // closed before their context
  for (size_t i = 0; i < ZapHandler::kMaxHeld + refused_at_once; ++i) {
    const CurveKey stranger = *GenerateCurveKey();
    zmq::socket_t& s = strangers.emplace_back(strangers_context, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::curve_serverkey, server_.key.public_z85);
    s.set(zmq::sockopt::curve_publickey, stranger.public_z85);
    s.set(zmq::sockopt::curve_secretkey, stranger.secret_z85);
    s.connect(server_.endpoint);
  }
  auto wait_refused = [&](uint64_t n) {
    for (Deadline d = Deadline::AfterMs(20000);
         server_.transport->auth_failures() < n && !d.Expired();) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return server_.transport->auth_failures();
  };
  // The hold is full: those past it were refused at once.
  ASSERT_EQ(wait_refused(refused_at_once), refused_at_once);
  Member client = Make(job_, "client", *GenerateCurveKey());
  const std::vector<NodeInfo> plan = {Entry("client", client.key, "tcp://127.0.0.1:1"),
                                      Entry("server", server_.key, server_.endpoint)};
  client.keys->SetPlan(plan);  // the server has none yet
  SendTo(client, server_.endpoint);
  ASSERT_GT(wait_refused(refused_at_once + 1), refused_at_once) << "the peer was not refused";
  server_.keys->SetPlan(plan);
  auto in = server_.transport->Receive(Deadline::AfterMs(8000));
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->from.ToString(), Route::Inbound("client").ToString());
}

TEST(NodeKeyFileTest, AShardsKeyIsKeptPrivateAndLoadedAgain) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/shard";
  auto first = LoadNodeKey("", dir + "/node.key");
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = LoadNodeKey("", dir + "/node.key");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(first->public_z85, again->public_z85);
  EXPECT_EQ(first->secret_z85, again->secret_z85);
  struct stat st;
  ASSERT_EQ(stat((dir + "/node.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto worker = LoadNodeKey("", "");
  ASSERT_TRUE(worker.ok());
  EXPECT_NE(worker->public_z85, first->public_z85);
}

TEST(NodeKeyPlanTest, AShardsStreamEndpointIsServedUnderItsKey) {
  NodeKeys keys(*GenerateCurveKey(), *GenerateCurveKey());
  const CurveKey shard = *GenerateCurveKey(), worker = *GenerateCurveKey();
  NodeInfo s;
  s.role = Role::Server;
  s.rank = 0;
  s.host = "10.0.0.2";
  s.data_port = 7000;
  s.stream_port = 7100;
  s.identity = "shard-0";
  s.public_key = shard.public_z85;
  NodeInfo w = s;
  w.role = Role::Worker;
  w.stream_port = 0;
  w.data_port = 7200;
  w.identity = "worker-0";
  w.public_key = worker.public_z85;
  keys.SetPlan({s, w});
  EXPECT_EQ(keys.ServerKeyAt("tcp://10.0.0.2:7100"), std::optional<std::string>(shard.public_z85));
  EXPECT_EQ(keys.ServerKeyAt("tcp://10.0.0.2:7000"), std::optional<std::string>(shard.public_z85));
  EXPECT_EQ(keys.ServerKeyAt("tcp://10.0.0.2:0"), std::nullopt);  // no stream port: none
}

TEST(RoutingIdTest, TheIdentityComesBackFromTheRoutingId) {
  const std::string id = RoutingIdFor("node-1/ps");
  EXPECT_NE(id, RoutingIdFor("node-1/ps"));
  EXPECT_EQ(RoutedIdentity(id), std::optional<std::string>("node-1/ps"));
  EXPECT_EQ(RoutedIdentity("node-1"), std::nullopt);
  EXPECT_TRUE(IdentityMatchesKey("node-1/ps", "node-1", 0));
  EXPECT_TRUE(IdentityMatchesKey("node-1/ps1", "node-1", 0));  // the next epoch's
  EXPECT_FALSE(IdentityMatchesKey("node-1/ps3", "node-1", 0));
  EXPECT_TRUE(IdentityMatchesKey("node-1/ps3", "node-1", 3));
  EXPECT_FALSE(IdentityMatchesKey("node-1/ps", "node-1", 3));  // an ended epoch's
  EXPECT_TRUE(IdentityMatchesKey(PsClientIdentity("node-1", 12), "node-1", 12));
  EXPECT_TRUE(IdentityMatchesKey(PsClientIdentity("node-1", 13), "node-1", 12));
  EXPECT_FALSE(IdentityMatchesKey(PsClientIdentity("node-1", 14), "node-1", 12));
  EXPECT_FALSE(IdentityMatchesKey("node-1/ps03", "node-1", 3));
  EXPECT_FALSE(IdentityMatchesKey("node-1/psx", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-1/ps12345678901", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-12/ps", "node-1", 0));
  EXPECT_TRUE(IdentityMatchesKey(LaneIdentity("node-1", 1), "node-1", 0));
  EXPECT_TRUE(IdentityMatchesKey("node-1/lane15", "node-1", 0));
  EXPECT_TRUE(IdentityMatchesKey(LaneIdentity(PsClientIdentity("node-1", 2), 3), "node-1", 2));
  EXPECT_FALSE(IdentityMatchesKey("node-1/lane16", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-1/lane0", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-1/lane01", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-2/lane1", "node-1", 0));
  EXPECT_TRUE(IdentityMatchesKey(LaneIdentity(PsClientIdentity("node-1", 3), 2), "node-1", 3));
  EXPECT_FALSE(IdentityMatchesKey("node-1/lane1/lane1", "node-1", 0));
  EXPECT_EQ(LaneBase("node-1/ps/lane3"), "node-1/ps");
  EXPECT_TRUE(IdentityMatchesKey(PairIdentity("node-1", 0), "node-1", 0));
  EXPECT_TRUE(IdentityMatchesKey("node-1/pair15", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-1/pair16", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-1/pair01", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-1/pair", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-2/pair1", "node-1", 0));
  EXPECT_EQ(PairBase("node-1/pair3"), "node-1");
  EXPECT_EQ(PairBase("node-1/pair-3"), "node-1/pair-3");
  EXPECT_EQ(LaneBase("node-1/lane16"), "node-1/lane16");
  EXPECT_EQ(LaneOf("node-1/ps/lane3"), 3);
  EXPECT_EQ(LaneOf("node-1/ps"), 0);
  EXPECT_EQ(LaneOf("node-1/lane07"), 0);
  EXPECT_TRUE(IdentityMatchesKey("node-1", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-2", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-1", "", 0));
}

// Sealed bulk messages (wire/bulk_cipher.h): message `i` of a stream, a
// heartbeat header and, every third, a payload of `large` bytes that holds i.
Message Numbered(size_t i, size_t large) {
  Message m = MakeHeartbeat(Sender{Role::Worker, static_cast<int32_t>(i % 1000), 1});
  std::vector<uint8_t> bytes(i % 3 == 0 ? large : 8);
  for (size_t b = 0; b < bytes.size(); ++b) bytes[b] = static_cast<uint8_t>(i * 7 + b);
  m.payloads.push_back(Payload::Copy(bytes.data(), bytes.size()));
  return m;
}

void ExpectNumbered(const Incoming& in, size_t i, size_t large) {
  const Message want = Numbered(i, large);
  EXPECT_EQ(in.message.header, want.header) << i;
  ASSERT_EQ(in.message.payloads.size(), 1u) << i;
  ASSERT_EQ(in.message.payloads[0].size, want.payloads[0].size) << i;
  EXPECT_EQ(std::memcmp(in.message.payloads[0].data, want.payloads[0].data, want.payloads[0].size),
            0)
      << i;
}

// Each case runs with the sealing and opening on the callers' and I/O
// threads (0) and on crypto threads of the transport (2).
class BulkTest : public ::testing::TestWithParam<int> {
 protected:
  Member Make(const CurveKey& job, const std::string& identity, const CurveKey& own,
              bool bulk = false, int bulk_connect_timeout_ms = 5000, int bulk_port_offset = 0) {
    return gradsync::wire::Make(job, identity, own, bulk, bulk_connect_timeout_ms, bulk_port_offset,
                                GetParam());
  }

  void SetUp() override {
    job_ = *GenerateCurveKey();
    server_ = Make(job_, "server", *GenerateCurveKey(), true);
    server_.endpoint = *server_.transport->Listen("tcp://127.0.0.1:0");
    client_ = Make(job_, "client", *GenerateCurveKey(), true);
    plan_ = {Entry("client", client_.key, "tcp://127.0.0.1:1"),
             Entry("server", server_.key, server_.endpoint)};
    client_.keys->SetPlan(plan_);
    server_.keys->SetPlan(plan_);
  }

  // Sends `count` numbered messages from the client, all posted at once,
  // and checks that the server gets them in order, intact, from "client".
  void Stream(size_t from, size_t count, size_t large) {
    auto conn = client_.transport->Connect(server_.endpoint);
    ASSERT_TRUE(conn.ok()) << conn.status();
    for (size_t i = from; i < from + count; ++i) {
      client_.transport->Post(Route::Connection(*conn), Numbered(i, large),
                              Deadline::AfterMs(20000), [](const Status&) {});
    }
    for (size_t i = from; i < from + count; ++i) {
      auto in = server_.transport->Receive(Deadline::AfterMs(20000));
      ASSERT_TRUE(in.ok()) << "message " << i << ": " << in.status();
      EXPECT_EQ(in->from.ToString(), Route::Inbound("client").ToString());
      ExpectNumbered(*in, i, large);
    }
  }

  // Streams small batches from message `*next` on until one went sealed.
  void UntilSealed(size_t* next) {
    const uint64_t before = client_.transport->bulk_sent();
    for (Deadline d = Deadline::AfterMs(20000);
         client_.transport->bulk_sent() == before && !d.Expired(); *next += 3) {
      Stream(*next, 3, 65536);
    }
    ASSERT_GT(client_.transport->bulk_sent(), before) << "nothing went sealed";
  }

  CurveKey job_;
  Member server_;
  Member client_;
  std::vector<NodeInfo> plan_;
};

// Messages posted before, during and after the switch to the sealed path
// arrive in order and intact; most went sealed.
TEST_P(BulkTest, MessagesArriveInOrderAcrossTheSwitchToSealed) {
  Stream(0, 120, size_t{256} << 10);
  Stream(120, 30, size_t{256} << 10);
  EXPECT_GT(client_.transport->bulk_sent(), 0u);
  EXPECT_EQ(server_.transport->bulk_received(), client_.transport->bulk_sent());
  EXPECT_EQ(server_.transport->bulk_refused(), 0u);
  EXPECT_FALSE(server_.transport->bulk_endpoint().empty());
}

// bulk_port_offset puts the bulk port at the data port plus the offset; an
// offset past the last port leaves the connection on CURVE.
TEST_P(BulkTest, TheBulkPortCanSitAtAFixedOffsetFromTheDataPort) {
  for (int offset : {1000, 65535}) {
    const CurveKey key = server_.key;
    server_ = Make(job_, "server", key, true, 5000, offset);
    server_.endpoint = *server_.transport->Listen("tcp://127.0.0.1:0");
    plan_ = {Entry("client", client_.key, "tcp://127.0.0.1:1"),
             Entry("server", server_.key, server_.endpoint)};
    client_ = Make(job_, "client", client_.key, true);
    client_.keys->SetPlan(plan_);
    server_.keys->SetPlan(plan_);
    const int data_port = std::atoi(server_.endpoint.c_str() + server_.endpoint.rfind(':') + 1);
    if (offset == 1000) {
      size_t next = 0;
      UntilSealed(&next);
      const std::string bulk = server_.transport->bulk_endpoint();
      EXPECT_EQ(std::atoi(bulk.c_str() + bulk.rfind(':') + 1), data_port + offset) << bulk;
    } else {
      Stream(0, 30, 4096);  // all of it over CURVE (small: slow under TSan)
      EXPECT_EQ(client_.transport->bulk_sent(), 0u);
      EXPECT_TRUE(server_.transport->bulk_endpoint().empty());
    }
  }
}

// Replies from the receiver to the sender's identity go back sealed on the
// bulk connection once it switched, in order across that switch too.
TEST_P(BulkTest, RepliesComeBackSealedInOrder) {
  size_t next = 0;
  UntilSealed(&next);
  auto conn = client_.transport->Connect(server_.endpoint);
  ASSERT_TRUE(conn.ok());
  size_t reply = 0;
  for (Deadline d = Deadline::AfterMs(20000);
       server_.transport->bulk_sent() == 0 && !d.Expired();) {
    for (size_t i = reply; i < reply + 40; ++i) {
      server_.transport->Post(Route::Inbound("client"), Numbered(i, size_t{256} << 10),
                              Deadline::AfterMs(20000), [](const Status&) {});
    }
    for (size_t i = reply; i < reply + 40; ++i) {
      auto in = client_.transport->Receive(Deadline::AfterMs(20000));
      ASSERT_TRUE(in.ok()) << "reply " << i << ": " << in.status();
      EXPECT_EQ(in->from.ToString(), Route::Connection(*conn).ToString());
      ExpectNumbered(*in, i, size_t{256} << 10);
    }
    reply += 40;
  }
  EXPECT_GT(server_.transport->bulk_sent(), 0u);
  EXPECT_EQ(client_.transport->bulk_received(), server_.transport->bulk_sent());
  EXPECT_EQ(client_.transport->bulk_refused(), 0u);
}

// A peer whose bulk port takes no connection (a firewall; here a port
// bound and not listening) leaves the connection on CURVE: no 'S' goes, and
// every message arrives over CURVE, those sent after the wait too.
TEST_P(BulkTest, ABulkPortNobodyReachesKeepsTheConnectionOnCurve) {
  constexpr int kWaitMs = 300;
  client_ = Make(job_, "client", client_.key, true, kWaitMs);
  const CurveKey raw_key = *GenerateCurveKey();
  zmq::context_t context;
  zmq::socket_t raw(context, zmq::socket_type::router);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::curve_server, 1);
  raw.set(zmq::sockopt::curve_secretkey, raw_key.secret_z85);
  raw.bind("tcp://127.0.0.1:*");
  const std::string raw_endpoint = raw.get(zmq::sockopt::last_endpoint);
  const int dead = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(dead, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(dead, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(dead, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const uint16_t dead_port = ntohs(addr.sin_port);
  client_.keys->SetPlan(
      {Entry("client", client_.key, "tcp://127.0.0.1:1"), Entry("raw", raw_key, raw_endpoint)});
  auto conn = client_.transport->Connect(raw_endpoint);
  ASSERT_TRUE(conn.ok()) << conn.status();
  auto post = [&](size_t i) {
    client_.transport->Post(Route::Connection(*conn), Numbered(i, 4096), Deadline::AfterMs(10000),
                            [](const Status&) {});
  };
  // Reads the raw server's next message: a control message is answered
  // ('H': the dead port) and counted, a gradsync message returned.
  size_t controls = 0;
  auto next = [&]() -> std::vector<zmq::message_t> {
    for (Deadline d = Deadline::AfterMs(10000); !d.Expired();) {
      zmq::pollitem_t item{raw.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(raw, std::back_inserter(frames))) continue;
      if (frames.size() == 3 && frames[1].size() == 0) {
        ++controls;
        auto c = ParseBulkControl(frames[2].data<uint8_t>(), frames[2].size());
        if (c && c->kind == 'H') {
          BulkControl answer;
          answer.kind = 'A';
          answer.token = c->token;
          answer.port = dead_port;
          std::vector<zmq::message_t> reply;
          reply.emplace_back(frames[0].data(), frames[0].size());
          reply.emplace_back();
          reply.emplace_back(EncodeBulkControl(answer));
          zmq::send_multipart(raw, reply);
        }
        continue;
      }
      return frames;
    }
    return {};
  };
  for (size_t i = 0; i < 5; ++i) {
    post(i);
    auto frames = next();
    ASSERT_EQ(frames.size(), 3u) << "message " << i;
    EXPECT_EQ(frames[2].size(), i % 3 == 0 ? 4096u : 8u);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * kWaitMs));
  for (size_t i = 5; i < 20; ++i) {
    post(i);
    auto frames = next();
    ASSERT_EQ(frames.size(), 3u) << "message " << i << " did not come over CURVE";
  }
  EXPECT_EQ(controls, 1u) << "only the hello: no switch";
  EXPECT_EQ(client_.transport->bulk_sent(), 0u);
  close(dead);
}

// A receiver without bulk_encryption never answers: the connection stays on
// CURVE and loses nothing.
TEST_P(BulkTest, APeerWithoutItKeepsTheConnectionOnCurve) {
  server_ = Make(job_, "server", server_.key, false);
  server_.endpoint = *server_.transport->Listen("tcp://127.0.0.1:0");
  plan_[1] = Entry("server", server_.key, server_.endpoint);
  client_.keys->SetPlan(plan_);
  server_.keys->SetPlan(plan_);
  Stream(0, 60, 4096);  // small: CURVE's hand-off is slow under TSan
  EXPECT_EQ(client_.transport->bulk_sent(), 0u);
  EXPECT_TRUE(server_.transport->bulk_endpoint().empty());
}

// Strangers on the bulk port (no token, a guessed one, junk frames) are
// dropped as they are read and counted; the sealed link goes on.
TEST_P(BulkTest, StrangersOnTheBulkPortAreDroppedAndCounted) {
  size_t next = 0;
  UntilSealed(&next);
  zmq::context_t context;
  const std::vector<std::string> ids = {"", "bulk-00000000000000000000000000000000", "server",
                                        "client"};
  std::list<zmq::socket_t> strangers;
  for (const std::string& id : ids) {
    zmq::socket_t& s = strangers.emplace_back(context, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    if (!id.empty()) s.set(zmq::sockopt::routing_id, id);
    s.connect(server_.transport->bulk_endpoint());
    std::vector<zmq::message_t> junk;
    junk.emplace_back(std::string(40, 'x'));
    junk.emplace_back(std::string(1000, 'y'));
    ASSERT_TRUE(zmq::send_multipart(s, junk));
  }
  for (Deadline d = Deadline::AfterMs(10000);
       server_.transport->bulk_refused() < ids.size() && !d.Expired();) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server_.transport->bulk_refused(), ids.size());
  UntilSealed(&next);
  EXPECT_EQ(server_.transport->bulk_refused(), ids.size());
}

// A member that holds its own node key talks the bulk protocol by hand:
// it hands the server a key it knows, then sends sealed messages, some
// good and some forged (a payload bit flipped, a message replayed, a
// payload moved from another message, an unsealed payload). The server
// takes the good ones, in order, and refuses and counts each forged one.
TEST_P(BulkTest, ForgedSealedMessagesAreRefusedAndTheGoodOnesArrive) {
  zmq::context_t context;
  zmq::socket_t curve(context, zmq::socket_type::dealer);
  curve.set(zmq::sockopt::linger, 0);
  ApplyCurveClientOf(curve, client_.key, server_.key.public_z85);
  curve.set(zmq::sockopt::routing_id, RoutingIdFor("client"));
  curve.connect(server_.endpoint);
  auto control = [&](const BulkControl& c) {
    std::vector<zmq::message_t> frames;
    frames.emplace_back();
    frames.emplace_back(EncodeBulkControl(c));
    ASSERT_TRUE(zmq::send_multipart(curve, frames));
  };
  BulkControl hello;
  hello.kind = 'H';
  hello.token = *RandomBulkToken();
  auto key = BulkKey::Random();
  ASSERT_NE(key, nullptr);
  std::memcpy(hello.key.data(), key->bytes(), kBulkKeyBytes);
  control(hello);
  std::optional<BulkControl> answer;
  for (Deadline d = Deadline::AfterMs(10000); !answer && !d.Expired();) {
    zmq::pollitem_t item{curve.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0) continue;
    std::vector<zmq::message_t> frames;
    ASSERT_TRUE(zmq::recv_multipart(curve, std::back_inserter(frames)));
    if (frames.size() == 2 && frames[0].size() == 0) {
      answer = ParseBulkControl(frames[1].data<uint8_t>(), frames[1].size());
    }
  }
  ASSERT_TRUE(answer && answer->kind == 'A') << "no answer to the hello";
  zmq::socket_t bulk(context, zmq::socket_type::dealer);
  bulk.set(zmq::sockopt::linger, 0);
  bulk.set(zmq::sockopt::routing_id, BulkRoutingId(hello.token));
  bulk.connect("tcp://127.0.0.1:" + std::to_string(answer->port));
  BulkControl go = hello;
  go.kind = 'S';
  control(go);

  // Message `i` sealed under counter `counter` (frame 0 the counter, a tag
  // and the sealed header; frame 1 a tag and the sealed payload).
  auto sealed = [&](size_t i, uint64_t counter) {
    const Message m = Numbered(i, 4096);
    std::vector<zmq::message_t> frames;
    frames.emplace_back(kBulkCounterBytes + kBulkTagBytes + m.header.size());
    auto* head = frames[0].data<uint8_t>();
    for (int b = 0; b < 8; ++b) head[b] = static_cast<uint8_t>(counter >> (8 * b));
    EXPECT_TRUE(
        key->Seal(counter, 0, m.header.data(), m.header.size(), head + kBulkCounterBytes).ok());
    frames.emplace_back(kBulkTagBytes + m.payloads[0].size);
    EXPECT_TRUE(
        key->Seal(counter, 1, m.payloads[0].data, m.payloads[0].size, frames[1].data<uint8_t>())
            .ok());
    return frames;
  };
  auto send = [&](std::vector<zmq::message_t> frames) {
    ASSERT_TRUE(zmq::send_multipart(bulk, frames));
  };
  send(sealed(0, 0));
  auto flipped = sealed(3, 1);
  flipped[1].data<uint8_t>()[kBulkTagBytes + 100] ^= 0x04;
  send(std::move(flipped));
  send(sealed(0, 0));  // replayed
  auto moved = sealed(6, 5);
  auto other = sealed(9, 6);
  moved[1] = std::move(other[1]);
  send(std::move(moved));
  auto unsealed = sealed(12, 7);
  const Message plain = Numbered(12, 4096);
  std::memcpy(unsealed[1].data<uint8_t>() + kBulkTagBytes, plain.payloads[0].data,
              plain.payloads[0].size);
  send(std::move(unsealed));
  send(sealed(15, 8));

  auto in = server_.transport->Receive(Deadline::AfterMs(20000));
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->from.ToString(), Route::Inbound("client").ToString());
  ExpectNumbered(*in, 0, 4096);
  in = server_.transport->Receive(Deadline::AfterMs(20000));
  ASSERT_TRUE(in.ok()) << in.status();
  ExpectNumbered(*in, 15, 4096);
  EXPECT_EQ(server_.transport->bulk_refused(), 4u);
  EXPECT_EQ(server_.transport->bulk_received(), 2u);
  EXPECT_FALSE(server_.transport->Receive(Deadline::AfterMs(200)).ok());
}

// A receiver that restarts (same key, same endpoint) knows no token: the
// sender's connection hands it a new one, and what it sends after the
// restart arrives.
TEST_P(BulkTest, ARestartedReceiverGetsANewTokenAndTheStreamGoesOn) {
  size_t next = 0;
  UntilSealed(&next);
  const CurveKey key = server_.key;
  const std::string endpoint = server_.endpoint;
  server_.transport.reset();
  server_ = Make(job_, "server", key, true);
  // The old socket lets go of the port a little after it closes.
  StatusOr<std::string> bound = server_.transport->Listen(endpoint);
  for (Deadline d = Deadline::AfterMs(10000); !bound.ok() && !d.Expired();) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    bound = server_.transport->Listen(endpoint);
  }
  ASSERT_TRUE(bound.ok()) << bound.status();
  server_.endpoint = endpoint;
  server_.keys->SetPlan(plan_);
  UntilSealed(&next);
  EXPECT_EQ(server_.transport->bulk_refused(), 0u);
}

INSTANTIATE_TEST_SUITE_P(CryptoThreads, BulkTest, ::testing::Values(0, 2),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return p.param == 0 ? std::string("OnTheCallersAndIoThread")
                                               : std::string("OnCryptoThreads");
                         });

}  // namespace
}  // namespace gradsync::wire
