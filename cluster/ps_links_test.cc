// Which parameter-server peers share a machine: both sides derive matching
// pairs from the same assignment, only for nodes of the same host address
// and boot id, and none when ps_shm is off.
#include "cluster/ps_links.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync::cluster {
namespace {

wire::NodeInfo Node(wire::Role role, int rank, const std::string& host, const std::string& boot,
                    uint16_t port) {
  wire::NodeInfo n;
  n.role = role;
  n.rank = rank;
  n.host = host;
  n.boot_id = boot;
  n.data_port = port;
  n.identity = (role == wire::Role::Worker ? "w" : "s") + std::to_string(rank);
  return n;
}

// Two workers and a shard on host A, a worker and a shard on host B, and a
// worker on A's address after a reboot (another boot id).
std::vector<wire::NodeInfo> Job() {
  return {Node(wire::Role::Worker, 0, "10.0.0.1", "boot-a", 7000),
          Node(wire::Role::Worker, 1, "10.0.0.1", "boot-a", 7001),
          Node(wire::Role::Worker, 2, "10.0.0.2", "boot-b", 7000),
          Node(wire::Role::Worker, 3, "10.0.0.1", "boot-old", 7003),
          Node(wire::Role::Server, 0, "10.0.0.1", "boot-a", 7100),
          Node(wire::Role::Server, 1, "10.0.0.2", "boot-b", 7100)};
}

// A worker reaches the shards at their stream endpoints, and fails naming a
// shard that announced none; a shard takes the PS clients of the epoch's
// workers, by rank.
TEST(PsLinksTest, StreamsOfEveryShardAndTheEpochsClientsByRank) {
  auto job = Job();
  Status none = CheckShardStreamPorts(job);
  EXPECT_EQ(none.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.message().find("server 0 announced no TCP stream port"), std::string::npos)
      << none;
  job[4].stream_port = 7200;
  none = CheckShardStreamPorts(job);
  EXPECT_NE(none.message().find("server 1 announced no TCP stream port"), std::string::npos)
      << none;
  job[5].stream_port = 7200;
  EXPECT_TRUE(CheckShardStreamPorts(job).ok());
  EXPECT_EQ(job[5].StreamEndpoint(), "tcp://10.0.0.2:7200");
  job[1].identity.clear();  // a worker that gave none
  EXPECT_EQ(PsClientIdentities(job, 4, 2),
            (std::vector<std::string>{"w0/ps2", "", "w2/ps2", "w3/ps2"}));
  EXPECT_EQ(PsClientIdentities(job, 4, 0),
            (std::vector<std::string>{"w0/ps", "", "w2/ps", "w3/ps"}));
}

TEST(PsLinksTest, AWorkerWritesToTheShardsOfItsMachineByEndpoint) {
  auto job = Job();
  job[4].stream_port = 7200;
  const wire::SameHostOptions o = PsSameHostOptions({}, 7, job[0], job);
  EXPECT_EQ(o.job_id, 7u);
  ASSERT_EQ(o.peers.size(), 1u);
  EXPECT_EQ(o.peers[0].identity, "s0");
  EXPECT_EQ(o.peers[0].endpoint, "tcp://10.0.0.1:7200");
  EXPECT_TRUE(o.peers[0].send);
  EXPECT_TRUE(o.peers[0].receive);
}

TEST(PsLinksTest, AShardAnswersThePsClientsOfItsMachinesWorkers) {
  const auto job = Job();
  const wire::SameHostOptions a = PsSameHostOptions({}, 7, job[4], job);
  ASSERT_EQ(a.peers.size(), 2u);
  EXPECT_EQ(a.peers[0].identity, wire::PsClientIdentity("w0"));
  EXPECT_EQ(a.peers[1].identity, wire::PsClientIdentity("w1"));
  EXPECT_EQ(a.peers[0].endpoint, "");
  const wire::SameHostOptions b = PsSameHostOptions({}, 7, job[5], job);
  ASSERT_EQ(b.peers.size(), 1u);
  EXPECT_EQ(b.peers[0].identity, wire::PsClientIdentity("w2"));
  // The worker of another boot shares no link with anyone.
  EXPECT_TRUE(PsSameHostOptions({}, 7, job[3], job).peers.empty());
}

TEST(PsLinksTest, OffWhenDisabledAndItsSizeIsBounded) {
  auto off = PsLinkOptions::FromConfig(Config::FromMap({{"ps_shm", "false"}}));
  ASSERT_TRUE(off.ok()) << off.status();
  const auto job = Job();
  EXPECT_TRUE(PsSameHostOptions(*off, 7, job[0], job).peers.empty());
  auto sized = PsLinkOptions::FromConfig(Config::FromMap({{"ps_shm_bytes", "65536"}}));
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ(PsSameHostOptions(*sized, 7, job[4], job).link_bytes, 65536u);
  EXPECT_FALSE(PsLinkOptions::FromConfig(Config::FromMap({{"ps_shm_bytes", "100"}})).ok());
}

TEST(PsLinksTest, MessagesAreBoundedByThePartitionSize) {
  auto small = PsLinkOptions::FromConfig(Config::FromMap({{"partition_bytes", "1024"}}));
  ASSERT_TRUE(small.ok()) << small.status();
  const auto job = Job();
  // 8 bytes per element at most, plus the largest header.
  EXPECT_EQ(PsSameHostOptions(*small, 7, job[4], job).max_message_bytes, 2048u + 65536u);
  EXPECT_FALSE(PsLinkOptions::FromConfig(Config::FromMap({{"partition_bytes", "0"}})).ok());
}

}  // namespace
}  // namespace gradsync::cluster
