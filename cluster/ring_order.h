// The order of the workers around the ring, chosen from measured link
// times between their hosts, so that one slow link does not set the pace
// when another order can leave it out.
//
// Workers of one host stay next to each other (rank order among them), so
// the ring crosses each host boundary once; the hosts go around in the
// cycle whose slowest link is fastest, then whose links add up least. With
// up to kExactHosts hosts that cycle is found exactly (Held-Karp under each
// bound on the slowest link); beyond, by improving rank order with 2-opt
// moves. The rank order stays unless its slowest link, or the sum of its
// links, is more than `margin` times the chosen cycle's (timings are noisy;
// equal links never reorder). The sum counts because links that cross
// between sites often share one uplink: the fewer crossings, the better.
//
// Pure functions: every worker derives the same order from the same
// timings.
#ifndef GRADSYNC_CLUSTER_RING_ORDER_H_
#define GRADSYNC_CLUSTER_RING_ORDER_H_

#include <string>
#include <vector>

#include "wire/message.h"

namespace gradsync::cluster {

inline constexpr int kExactHosts = 12;
inline constexpr double kUnmeasuredFactor = 1000;

// Workers grouped by host address: host h holds the ranks in hosts[h],
// ascending; hosts are numbered by their lowest rank (rank 0's is host 0).
// `peers` is the job's assignment (other roles are skipped).
std::vector<std::vector<int>> WorkerHosts(const std::vector<wire::NodeInfo>& peers);

// A link's cost between hosts a and b: the slower of the two directions.
// `cost[a][b]` is the time host a measured to host b (any unit, > 0 off the
// diagonal; 0 or less: not measured (the peer did not answer), taken as
// kUnmeasuredFactor times the slowest measured, so orders avoid it).
double LinkCost(const std::vector<std::vector<double>>& cost, int a, int b);

// The slowest link of `cycle` under `cost` (as LinkCost counts it).
double SlowestLink(const std::vector<std::vector<double>>& cost, const std::vector<int>& cycle);

// The cycle of hosts (starting at host 0) as described above.
std::vector<int> HostCycle(const std::vector<std::vector<double>>& cost, double margin);

// Ranks by ring position: the hosts in `cycle` order, each host's ranks
// ascending.
std::vector<int> RingOrderOf(const std::vector<std::vector<int>>& hosts,
                             const std::vector<int>& cycle);

// The ranks `rank` receives from (left) and sends to (right) in a ring of
// `world` ranks in `order` (ranks by position; empty: rank order).
struct RingNeighbours {
  int left = 0;
  int right = 0;
};
RingNeighbours NeighboursOf(const std::vector<int>& order, int rank, int world);

// "0 1 2 3" for logs.
std::string OrderText(const std::vector<int>& order);

}  // namespace gradsync::cluster

#endif  // GRADSYNC_CLUSTER_RING_ORDER_H_
