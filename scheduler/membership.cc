#include "scheduler/membership.h"

#include <algorithm>
#include <utility>

namespace gradsync::server {
namespace {

// Dense ranks in the order of the current ones.
std::map<std::string, int32_t> Dense(const std::map<std::string, int32_t>& members) {
  std::vector<std::pair<int32_t, std::string>> by_rank;
  for (const auto& [identity, rank] : members) by_rank.emplace_back(rank, identity);
  std::sort(by_rank.begin(), by_rank.end());
  std::map<std::string, int32_t> ranks;
  for (size_t i = 0; i < by_rank.size(); ++i) {
    ranks[by_rank[i].second] = static_cast<int32_t>(i);
  }
  return ranks;
}

}  // namespace

std::map<std::string, int32_t> Membership::EndEpoch(const std::map<std::string, int32_t>& survivors,
                                                    const std::string& why, SteadyTime now) {
  std::map<std::string, int32_t> ranks = Dense(survivors);
  ++epoch_;
  world_size_ = static_cast<int32_t>(ranks.size());
  change_ = why;
  changed_at_ = now;
  joined_ = false;
  if (below_min() && !below_min_since_) below_min_since_ = now;
  return ranks;
}

std::map<std::string, int32_t> Membership::Join(const std::map<std::string, int32_t>& members,
                                                const std::string& joiner, const std::string& why,
                                                SteadyTime now) {
  std::map<std::string, int32_t> ranks = Dense(members);
  ranks[joiner] = static_cast<int32_t>(members.size());
  ++epoch_;
  world_size_ = static_cast<int32_t>(ranks.size());
  change_ = why;
  changed_at_ = now;
  joined_ = true;
  if (!below_min()) below_min_since_.reset();
  return ranks;
}

}  // namespace gradsync::server
