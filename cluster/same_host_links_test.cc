// Which ring neighbours share a machine: only nodes of the same host address
// and boot id whose identity is known, the right one written to at its
// endpoint, the left one heard, and with two ranks one link both ways.
#include "cluster/same_host_links.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync::cluster {
namespace {

wire::NodeInfo Worker(int rank, const std::string& boot) {
  wire::NodeInfo n;
  n.role = wire::Role::Worker;
  n.rank = rank;
  n.host = "10.0.0.1";
  n.boot_id = boot;
  n.data_port = static_cast<uint16_t>(7000 + rank);
  n.identity = "w" + std::to_string(rank);
  return n;
}

TEST(SameHostLinksTest, RingLinksGoToTheRightAndComeFromTheLeft) {
  // Ranks 0, 1 and 3 on one machine, rank 2 on another boot.
  std::vector<wire::NodeInfo> job = {Worker(0, "a"), Worker(1, "a"), Worker(2, "b"),
                                     Worker(3, "a")};
  wire::SameHostOptions base;
  base.job_id = 9;
  const wire::SameHostOptions o = RingSameHostOptions(base, job[0], job, 0, 4);
  EXPECT_EQ(o.job_id, 9u);
  ASSERT_EQ(o.peers.size(), 2u);
  EXPECT_EQ(o.peers[0].identity, "w3");  // the left neighbour, heard
  EXPECT_EQ(o.peers[0].endpoint, "");
  EXPECT_FALSE(o.peers[0].send);
  EXPECT_TRUE(o.peers[0].receive);
  EXPECT_EQ(o.peers[1].identity, "w1");  // the right one, written to
  EXPECT_EQ(o.peers[1].endpoint, job[1].DataEndpoint());
  EXPECT_TRUE(o.peers[1].send);
  EXPECT_FALSE(o.peers[1].receive);
  // Rank 1's right neighbour is on the other boot: only its left link.
  const wire::SameHostOptions r1 = RingSameHostOptions(base, job[1], job, 1, 4);
  ASSERT_EQ(r1.peers.size(), 1u);
  EXPECT_EQ(r1.peers[0].identity, "w0");
  EXPECT_TRUE(r1.peers[0].receive);
  EXPECT_TRUE(RingSameHostOptions(base, job[2], job, 2, 4).peers.empty());
  EXPECT_TRUE(RingSameHostOptions(base, job[0], {job[0]}, 0, 1).peers.empty());
}

TEST(SameHostLinksTest, TwoRanksShareOneLinkBothWays) {
  std::vector<wire::NodeInfo> job = {Worker(0, "a"), Worker(1, "a")};
  const wire::SameHostOptions o = RingSameHostOptions({}, job[1], job, 1, 2);
  ASSERT_EQ(o.peers.size(), 1u);
  EXPECT_EQ(o.peers[0].identity, "w0");
  EXPECT_TRUE(o.peers[0].send);
  EXPECT_TRUE(o.peers[0].receive);
  job[0].identity.clear();  // cannot be told apart: no link
  EXPECT_TRUE(RingSameHostOptions({}, job[1], job, 1, 2).peers.empty());
}

}  // namespace
}  // namespace gradsync::cluster
