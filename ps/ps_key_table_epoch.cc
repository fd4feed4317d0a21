// KeyTable's membership epochs (ps/ps_key_table.h): starting the next
// epoch, and where ssp rounds go on in it.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "ps/ps_key_table.h"

namespace gradsync::server {

void KeyTable::StartEpoch(uint32_t epoch, int32_t num_workers,
                          std::vector<std::string> identities) {
  epoch_ = epoch;
  rules_.num_workers = num_workers;
  rules_.worker_identities = std::move(identities);
  dead_.clear();
  resumed_.clear();
  for (auto& [key, k] : keys_) {
    for (auto& [round, contributions] : k.open) {
      for (auto& [worker, c] : contributions) Recycle(std::move(c.grad));
    }
    k.open.clear();
    k.held.clear();
    k.taken.clear();
    if (rules_.mode == PsMode::kAsync) {
      // Round 0 of the epoch answers with the parameters as they are now.
      if (k.initialised) k.results[0] = MakeSnapshot(k.params, k.version);
      continue;  // each worker's rounds go on from its first push (PushAsync)
    }
    // Every round closed so far counts as taken from every worker: pushed
    // again, it is acknowledged, not applied.
    for (int32_t w = 0; w < num_workers; ++w) k.taken[w].floor = k.closed;
  }
}

bool KeyTable::ResumeRounds(const Key& key, uint64_t round, KeyState& k) {
  if (epoch_ == 0 || !resumed_.insert(key).second || round <= k.closed + 1) return true;
  // ssp: rounds between the last closed one and the epoch's first are given
  // up (their gradients went with the epoch): at most staleness + 1 of them.
  const uint64_t skipped = round - 1 - k.closed;
  if (skipped > rules_.staleness + 1) {
    resumed_.erase(key);
    return false;
  }
  k.closed = round - 1;
  for (auto& [worker, taken] : k.taken) taken.floor = std::max(taken.floor, k.closed);
  return true;
}

}  // namespace gradsync::server
