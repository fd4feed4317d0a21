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
Member Make(const CurveKey& job, const std::string& identity, const CurveKey& own) {
  Member m{identity, own, std::make_shared<NodeKeys>(job, own), nullptr, ""};
  ZmqOptions o;
  o.identity = identity;
  o.node_keys = m.keys;
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
  EXPECT_TRUE(IdentityMatchesKey(ProbeIdentity("node-1"), "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-1/probe/probe", "node-1", 0));
  EXPECT_FALSE(IdentityMatchesKey("node-1/probe", "node-12", 0));
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

}  // namespace
}  // namespace gradsync::wire
