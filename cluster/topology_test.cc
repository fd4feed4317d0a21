#include "cluster/topology.h"

#include "gtest/gtest.h"

namespace gradsync::cluster {
namespace {

using wire::NodeInfo;
using wire::Role;

std::vector<NodeInfo> Job(int workers, int servers) {
  std::vector<NodeInfo> peers;
  for (int r = 0; r < workers; ++r)
    peers.push_back({Role::Worker, r, "h", uint16_t(100 + r), 0, "", "", ""});
  for (int r = 0; r < servers; ++r)
    peers.push_back({Role::Server, r, "h", uint16_t(200 + r), 0, "", "", ""});
  return peers;
}

std::vector<std::string> Names(const std::vector<NodeInfo>& nodes) {
  std::vector<std::string> out;
  for (const NodeInfo& n : nodes) out.push_back(n.Name());
  return out;
}

TEST(TopologyTest, WorkersReachRingNeighboursAndEveryServer) {
  auto peers = Job(4, 2);
  EXPECT_EQ(Names(PeersToReach(peers[0], peers)),
            (std::vector<std::string>{"worker 3", "worker 1", "server 0", "server 1"}));
  EXPECT_EQ(Names(PeersToReach(peers[3], peers)),
            (std::vector<std::string>{"worker 2", "worker 0", "server 0", "server 1"}));
}

TEST(TopologyTest, SmallRingsHaveNoDuplicatesAndServersReachNobody) {
  auto two = Job(2, 0);
  EXPECT_EQ(Names(PeersToReach(two[0], two)), (std::vector<std::string>{"worker 1"}));
  auto one = Job(1, 1);
  EXPECT_EQ(Names(PeersToReach(one[0], one)), (std::vector<std::string>{"server 0"}));
  EXPECT_TRUE(PeersToReach(one[1], one).empty());
}

TEST(TopologyTest, FindNodeByRoleAndRank) {
  auto peers = Job(2, 2);
  ASSERT_NE(FindNode(peers, Role::Server, 1), nullptr);
  EXPECT_EQ(FindNode(peers, Role::Server, 1)->data_port, 201);
  EXPECT_EQ(FindNode(peers, Role::Worker, 5), nullptr);
}

}  // namespace
}  // namespace gradsync::cluster
