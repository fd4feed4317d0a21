// Per-node CURVE identity between real ZeroMQ transports on loopback: a
// member with a key of the plan cannot send under another member's identity,
// a connection talks only to the server holding the peer's own key, a
// handshake waits for the plan that names its key, a flood of strangers'
// handshakes does not shut out a peer the plan names late, and a shard's key
// survives its restart.
#include "wire/node_keys.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "wire/curve.h"
#include "wire/message.h"
#include "wire/zmq_curve.h"
#include "wire/zmq_transport.h"
#include "zmq.hpp"

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

TEST(RoutingIdTest, TheIdentityComesBackFromTheRoutingId) {
  const std::string id = RoutingIdFor("node-1/ps");
  EXPECT_NE(id, RoutingIdFor("node-1/ps"));
  EXPECT_EQ(RoutedIdentity(id), std::optional<std::string>("node-1/ps"));
  EXPECT_EQ(RoutedIdentity("node-1"), std::nullopt);
  EXPECT_TRUE(IdentityMatchesKey("node-1/ps", "node-1"));
  EXPECT_TRUE(IdentityMatchesKey("node-1/ps3", "node-1"));
  EXPECT_TRUE(IdentityMatchesKey(PsClientIdentity("node-1", 12), "node-1"));
  EXPECT_FALSE(IdentityMatchesKey("node-1/ps03", "node-1"));
  EXPECT_FALSE(IdentityMatchesKey("node-1/psx", "node-1"));
  EXPECT_FALSE(IdentityMatchesKey("node-1/ps12345678901", "node-1"));
  EXPECT_FALSE(IdentityMatchesKey("node-12/ps", "node-1"));
  EXPECT_TRUE(IdentityMatchesKey("node-1", "node-1"));
  EXPECT_FALSE(IdentityMatchesKey("node-2", "node-1"));
  EXPECT_FALSE(IdentityMatchesKey("node-1", ""));
}

}  // namespace
}  // namespace gradsync::wire
