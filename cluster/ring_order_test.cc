#include "cluster/ring_order.h"

#include <algorithm>
#include <limits>
#include <set>

#include "gtest/gtest.h"

namespace gradsync::cluster {
namespace {

using Matrix = std::vector<std::vector<double>>;

Matrix Uniform(int n, double v) {
  Matrix m(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(n), v));
  for (int i = 0; i < n; ++i) m[static_cast<size_t>(i)][static_cast<size_t>(i)] = 0;
  return m;
}

void Slow(Matrix& m, int a, int b, double v) {
  m[static_cast<size_t>(a)][static_cast<size_t>(b)] = v;
  m[static_cast<size_t>(b)][static_cast<size_t>(a)] = v;
}

// Whether the cycle goes over the link a-b (either way).
bool Uses(const std::vector<int>& cycle, int a, int b) {
  for (size_t i = 0; i < cycle.size(); ++i) {
    const int x = cycle[i], y = cycle[(i + 1) % cycle.size()];
    if ((x == a && y == b) || (x == b && y == a)) return true;
  }
  return false;
}

void ExpectACycleFromZero(const std::vector<int>& cycle, int n) {
  ASSERT_EQ(cycle.size(), static_cast<size_t>(n));
  EXPECT_EQ(cycle[0], 0);
  EXPECT_EQ(std::set<int>(cycle.begin(), cycle.end()).size(), static_cast<size_t>(n));
}

TEST(HostCycleTest, EqualLinksKeepRankOrder) {
  Matrix m = Uniform(6, 1.0);
  m[2][3] = 1.2;  // noise within the margin
  EXPECT_EQ(HostCycle(m, 1.5), (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST(HostCycleTest, ThreeHostsKeepRankOrderWhateverTheLinks) {
  Matrix m = Uniform(3, 1.0);
  Slow(m, 0, 1, 10.0);
  EXPECT_EQ(HostCycle(m, 1.5), (std::vector<int>{0, 1, 2}));
}

TEST(HostCycleTest, ASlowLinkIsLeftOutWhenAnOrderCanAvoidIt) {
  for (int n = 4; n <= 16; ++n) {
    for (const auto& [a, b] : std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {0, n - 1}}) {
      Matrix m = Uniform(n, 1.0);
      Slow(m, a, b, 10.0);
      const std::vector<int> cycle = HostCycle(m, 1.5);
      ExpectACycleFromZero(cycle, n);
      EXPECT_FALSE(Uses(cycle, a, b)) << n << " hosts, slow link " << a << "-" << b;
    }
  }
}

TEST(HostCycleTest, TwoSlowHostsAreNotNeighbours) {
  // Hosts 1 and 2 are each slow to everyone but their fast partner (a
  // second site): the ring crosses between the sites only twice.
  const int n = 8;
  Matrix m = Uniform(n, 1.0);
  for (int x = 0; x < n; ++x) {
    for (int y = 0; y < n; ++y) {
      const bool site_x = x % 2 == 1, site_y = y % 2 == 1;
      if (x != y && site_x != site_y) m[x][y] = 5.0;
    }
  }
  const std::vector<int> cycle = HostCycle(m, 1.5);
  ExpectACycleFromZero(cycle, n);
  int crossings = 0;
  for (size_t i = 0; i < cycle.size(); ++i) {
    crossings += (cycle[i] % 2) != (cycle[(i + 1) % cycle.size()] % 2);
  }
  EXPECT_EQ(crossings, 2);
}

TEST(HostCycleTest, WhenEveryOrderMeetsASlowLinkTheTotalDecides) {
  // Host 3 is slow to everyone: its two links are slow in any cycle, and the
  // choice among the rest goes by the sum.
  Matrix m = Uniform(5, 1.0);
  for (int x = 0; x < 5; ++x) {
    if (x != 3) Slow(m, 3, x, 10.0);
  }
  Slow(m, 3, 0, 9.0);
  Slow(m, 3, 4, 9.0);
  const std::vector<int> cycle = HostCycle(m, 1.0);
  ExpectACycleFromZero(cycle, 5);
  EXPECT_TRUE(Uses(cycle, 3, 0));
  EXPECT_TRUE(Uses(cycle, 3, 4));
}

TEST(HostCycleTest, AnUnmeasuredLinkIsAvoided) {
  Matrix m = Uniform(5, 1.0);
  m[1][2] = 0;                                      // host 1 could not time its link to host 2
  EXPECT_EQ(LinkCost(m, 2, 1), kUnmeasuredFactor);  // both ways
  EXPECT_FALSE(Uses(HostCycle(m, 1.5), 1, 2));
  Slow(m, 0, 3, 4.0);
  const std::vector<int> cycle = HostCycle(m, 1.5);
  EXPECT_FALSE(Uses(cycle, 1, 2));
  EXPECT_FALSE(Uses(cycle, 0, 3));
}

TEST(HostCycleTest, InfiniteCostsGiveACycleStill) {
  Matrix m = Uniform(5, 1.0);
  Slow(m, 1, 2, std::numeric_limits<double>::infinity());
  Slow(m, 0, 4, std::numeric_limits<double>::max());
  const std::vector<int> cycle = HostCycle(m, 1.5);
  ExpectACycleFromZero(cycle, 5);
  EXPECT_FALSE(Uses(cycle, 1, 2));
  EXPECT_FALSE(Uses(cycle, 0, 4));
  // Every link infinite: no order adds up, rank order stays.
  EXPECT_EQ(HostCycle(Uniform(5, std::numeric_limits<double>::infinity()), 1.5),
            (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(HostCycleTest, ManyHostsImproveOnRankOrder) {
  const int n = kExactHosts + 8;
  Matrix m = Uniform(n, 1.0);
  for (int i = 0; i < n; ++i) Slow(m, i, (i + 1) % n, 10.0);  // every rank-order link
  const std::vector<int> cycle = HostCycle(m, 1.5);
  ExpectACycleFromZero(cycle, n);
  int slow = 0;
  for (int i = 0; i < n; ++i) slow += Uses(cycle, i, (i + 1) % n);
  EXPECT_LT(slow, n / 2);
}

TEST(RingOrderTest, NeighboursFollowTheOrder) {
  const std::vector<int> order{2, 0, 3, 1};
  EXPECT_EQ(NeighboursOf(order, 0, 4).left, 2);
  EXPECT_EQ(NeighboursOf(order, 0, 4).right, 3);
  EXPECT_EQ(NeighboursOf(order, 2, 4).left, 1);  // around the end
  EXPECT_EQ(NeighboursOf(order, 1, 4).right, 2);
  EXPECT_EQ(NeighboursOf({}, 0, 4).left, 3);  // rank order
  EXPECT_EQ(NeighboursOf({}, 3, 4).right, 0);
  EXPECT_EQ(NeighboursOf({}, 0, 1).right, 0);
}

TEST(RingOrderTest, WorkersOfAHostStayTogether) {
  std::vector<wire::NodeInfo> peers;
  const char* hosts[] = {"10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.3", "10.0.0.2"};
  for (int r = 0; r < 5; ++r) {
    wire::NodeInfo w;
    w.role = wire::Role::Worker;
    w.rank = r;
    w.host = hosts[r];
    peers.push_back(w);
  }
  wire::NodeInfo server;
  server.role = wire::Role::Server;
  server.rank = 0;
  server.host = "10.0.0.9";
  peers.push_back(server);
  const auto by_host = WorkerHosts(peers);
  ASSERT_EQ(by_host.size(), 3u);
  EXPECT_EQ(by_host[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(by_host[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(by_host[2], (std::vector<int>{3}));
  EXPECT_EQ(RingOrderOf(by_host, {0, 2, 1}), (std::vector<int>{0, 2, 3, 1, 4}));
  EXPECT_EQ(OrderText({0, 2, 3}), "0 2 3");
}

}  // namespace
}  // namespace gradsync::cluster
