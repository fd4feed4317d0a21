// CURVE between real ZeroMQ transports on loopback: peers with the job's key
// talk; a peer with no key or another job's key is refused at the
// handshake, counted, and the job's own traffic goes on.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>

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
  if (!client.Send(Route::Connection(*conn), MakeHeartbeat(Sender{Role::Worker, 0, 1}),
                   Deadline::AfterMs(500)).ok()) {
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
