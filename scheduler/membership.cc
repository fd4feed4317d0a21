#include "scheduler/membership.h"

#include <algorithm>
#include <utility>

namespace gradsync::server {

std::optional<std::map<std::string, int32_t>> Membership::EndEpoch(
    const std::map<std::string, int32_t>& survivors, const std::string& why, SteadyTime now) {
  if (static_cast<int32_t>(survivors.size()) < options_.min_workers) {
    if (!below_min_since_) below_min_since_ = now;
    world_size_ = static_cast<int32_t>(survivors.size());
    return std::nullopt;
  }
  std::vector<std::pair<int32_t, std::string>> by_rank;
  for (const auto& [identity, rank] : survivors) by_rank.emplace_back(rank, identity);
  std::sort(by_rank.begin(), by_rank.end());
  std::map<std::string, int32_t> ranks;
  for (size_t i = 0; i < by_rank.size(); ++i) {
    ranks[by_rank[i].second] = static_cast<int32_t>(i);
  }
  ++epoch_;
  world_size_ = static_cast<int32_t>(survivors.size());
  change_ = why;
  changed_at_ = now;
  return ranks;
}

}  // namespace gradsync::server
