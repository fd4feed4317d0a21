#include "cluster/ring_order.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>

namespace gradsync::cluster {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A cycle's slowest link and the sum of its links.
struct Score {
  double slowest = 0;
  double total = 0;
  bool operator<(const Score& o) const {
    return slowest != o.slowest ? slowest < o.slowest : total < o.total;
  }
};

// What a link nobody timed costs: far slower than any that was (1 when
// none was).
double UnmeasuredCost(const std::vector<std::vector<double>>& cost) {
  double slowest = 0;
  for (const auto& row : cost) {
    for (double v : row) slowest = std::max(slowest, v);
  }
  return slowest > 0 ? kUnmeasuredFactor * slowest : 1;
}

double CostGiven(const std::vector<std::vector<double>>& cost, int a, int b, double unmeasured) {
  auto one = [&](int x, int y) {
    const double v = cost[static_cast<size_t>(x)][static_cast<size_t>(y)];
    return v > 0 ? v : unmeasured;
  };
  return std::max(one(a, b), one(b, a));
}

class Costs {
 public:
  explicit Costs(const std::vector<std::vector<double>>& cost)
      : n_(static_cast<int>(cost.size())), c_(static_cast<size_t>(n_ * n_), 0.0) {
    const double unmeasured = UnmeasuredCost(cost);
    for (int a = 0; a < n_; ++a) {
      for (int b = 0; b < n_; ++b) {
        c_[Index(a, b)] = a == b ? 0.0 : CostGiven(cost, a, b, unmeasured);
      }
    }
  }
  int size() const { return n_; }
  double operator()(int a, int b) const { return c_[Index(a, b)]; }
  Score ScoreOf(const std::vector<int>& cycle) const {
    Score s;
    for (size_t i = 0; i < cycle.size(); ++i) {
      const double c = (*this)(cycle[i], cycle[(i + 1) % cycle.size()]);
      s.slowest = std::max(s.slowest, c);
      s.total += c;
    }
    return s;
  }

 private:
  size_t Index(int a, int b) const { return static_cast<size_t>(a * n_ + b); }
  int n_;
  std::vector<double> c_;
};

// The cycle from host 0 of least total using links of at most `bound`, or
// empty when there is none (Held-Karp).
std::vector<int> LeastCycleWithin(const Costs& c, double bound) {
  const int n = c.size();
  const uint32_t full = (uint32_t{1} << n) - 1;
  std::vector<double> best(static_cast<size_t>(full + 1) * n, kInf);
  std::vector<int8_t> from(best.size(), -1);
  auto at = [n](uint32_t mask, int j) { return static_cast<size_t>(mask) * n + j; };
  best[at(1, 0)] = 0;
  for (uint32_t mask = 1; mask <= full; ++mask) {
    if (!(mask & 1)) continue;
    for (int j = 0; j < n; ++j) {
      const double here = best[at(mask, j)];
      if (here == kInf) continue;
      for (int k = 1; k < n; ++k) {
        if ((mask >> k) & 1 || c(j, k) > bound) continue;
        const uint32_t next = mask | (uint32_t{1} << k);
        if (here + c(j, k) < best[at(next, k)]) {
          best[at(next, k)] = here + c(j, k);
          from[at(next, k)] = static_cast<int8_t>(j);
        }
      }
    }
  }
  int last = -1;
  double least = kInf;
  for (int j = 1; j < n; ++j) {
    if (c(j, 0) > bound || best[at(full, j)] == kInf) continue;
    if (best[at(full, j)] + c(j, 0) < least) {
      least = best[at(full, j)] + c(j, 0);
      last = j;
    }
  }
  if (last < 0) return {};
  std::vector<int> cycle;
  uint32_t mask = full;
  for (int j = last; j != 0;) {
    cycle.push_back(j);
    const int prev = from[at(mask, j)];
    mask &= ~(uint32_t{1} << j);
    j = prev;
  }
  cycle.push_back(0);
  std::reverse(cycle.begin(), cycle.end());
  return cycle;
}

std::vector<int> ExactCycle(const Costs& c) {
  std::vector<double> bounds;
  for (int a = 0; a < c.size(); ++a) {
    for (int b = a + 1; b < c.size(); ++b) bounds.push_back(c(a, b));
  }
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  // The least bound under which a cycle exists (the largest always has one).
  size_t lo = 0, hi = bounds.size() - 1;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (LeastCycleWithin(c, bounds[mid]).empty()) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return LeastCycleWithin(c, bounds[lo]);
}

// Rank order improved by reversing stretches of it while that helps.
std::vector<int> TwoOptCycle(const Costs& c) {
  const int n = c.size();
  std::vector<int> cycle(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) cycle[static_cast<size_t>(i)] = i;
  Score score = c.ScoreOf(cycle);
  for (int pass = 0; pass < 4 * n; ++pass) {
    bool better = false;
    for (int i = 1; i + 1 < n; ++i) {
      for (int j = i + 1; j < n; ++j) {
        std::reverse(cycle.begin() + i, cycle.begin() + j + 1);
        const Score s = c.ScoreOf(cycle);
        if (s < score) {
          score = s;
          better = true;
        } else {
          std::reverse(cycle.begin() + i, cycle.begin() + j + 1);
        }
      }
    }
    if (!better) break;
  }
  return cycle;
}

}  // namespace

std::vector<std::vector<int>> WorkerHosts(const std::vector<wire::NodeInfo>& peers) {
  std::map<int, const wire::NodeInfo*> by_rank;
  for (const wire::NodeInfo& p : peers) {
    if (p.role == wire::Role::Worker && p.rank >= 0) by_rank[p.rank] = &p;
  }
  std::vector<std::vector<int>> hosts;
  std::map<std::string, size_t> index;
  for (const auto& [rank, node] : by_rank) {
    auto [it, added] = index.emplace(node->host, hosts.size());
    if (added) hosts.emplace_back();
    hosts[it->second].push_back(rank);
  }
  return hosts;
}

double LinkCost(const std::vector<std::vector<double>>& cost, int a, int b) {
  return CostGiven(cost, a, b, UnmeasuredCost(cost));
}

double SlowestLink(const std::vector<std::vector<double>>& cost, const std::vector<int>& cycle) {
  return Costs(cost).ScoreOf(cycle).slowest;
}

RingNeighbours NeighboursOf(const std::vector<int>& order, int rank, int world) {
  if (order.size() != static_cast<size_t>(world) || world < 1) {
    return {(rank + world - 1) % std::max(world, 1), (rank + 1) % std::max(world, 1)};
  }
  const size_t n = order.size();
  const size_t pos =
      static_cast<size_t>(std::find(order.begin(), order.end(), rank) - order.begin());
  return {order[(pos + n - 1) % n], order[(pos + 1) % n]};
}

std::vector<int> HostCycle(const std::vector<std::vector<double>>& cost, double margin) {
  const Costs c(cost);
  const int n = c.size();
  std::vector<int> ranked(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ranked[static_cast<size_t>(i)] = i;
  if (n <= 3) return ranked;  // every cycle of three hosts uses every link
  const std::vector<int> chosen = n <= kExactHosts ? ExactCycle(c) : TwoOptCycle(c);
  if (chosen.size() != ranked.size()) return ranked;  // costs no cycle could add up
  const Score keep = c.ScoreOf(ranked), best = c.ScoreOf(chosen);
  if (keep.slowest > margin * best.slowest || keep.total > margin * best.total) return chosen;
  return ranked;
}

std::vector<int> RingOrderOf(const std::vector<std::vector<int>>& hosts,
                             const std::vector<int>& cycle) {
  std::vector<int> order;
  for (int h : cycle) {
    const auto& ranks = hosts[static_cast<size_t>(h)];
    order.insert(order.end(), ranks.begin(), ranks.end());
  }
  return order;
}

std::string OrderText(const std::vector<int>& order) {
  std::string text;
  for (int r : order) text += (text.empty() ? "" : " ") + std::to_string(r);
  return text;
}

}  // namespace gradsync::cluster
