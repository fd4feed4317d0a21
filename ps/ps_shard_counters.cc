// ShardCounters, TakenRounds and the mode names of ps/ps_key_table.h.
#include "ps/ps_key_table.h"

namespace gradsync::server {

const char* PsModeName(PsMode mode) {
  switch (mode) {
    case PsMode::kSync:
      return "sync";
    case PsMode::kAsync:
      return "async";
    case PsMode::kSsp:
      return "ssp";
  }
  return "invalid";
}

void ShardCounters::Applied(uint64_t staleness) {
  applied_.fetch_add(1, std::memory_order_relaxed);
  staleness_sum_.fetch_add(staleness, std::memory_order_relaxed);
  uint64_t seen = max_staleness_.load(std::memory_order_relaxed);
  while (staleness > seen && !max_staleness_.compare_exchange_weak(seen, staleness)) {
  }
  if (metrics != nullptr) metrics->staleness->Observe(static_cast<double>(staleness));
}

void ShardCounters::Duplicate() {
  Add(duplicates);
  if (metrics != nullptr) metrics->duplicates->Increment();
}

void ShardCounters::EarlyPull() {
  Add(early_pulls);
  if (metrics != nullptr) metrics->early_pulls->Increment();
}

void ShardCounters::Unplanned() {
  Add(unplanned);
  if (metrics != nullptr) metrics->unplanned->Increment();
}

void ShardCounters::OtherEpoch() {
  Add(other_epoch);
  if (metrics != nullptr) metrics->other_epoch->Increment();
}

void ShardCounters::Rejected(wire::ErrorCode code) {
  Add(rejected);
  if (metrics != nullptr) metrics->rejected.Count(code);
}

void ShardCounters::RoundClosed(SteadyTime first, SteadyTime last) {
  Add(rounds_closed);
  straggler_wait_ns_.fetch_add(
      static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(last - first).count()),
      std::memory_order_relaxed);
  if (metrics == nullptr) return;
  using Seconds = std::chrono::duration<double>;
  metrics->rounds_completed->Increment();
  metrics->straggler_wait->Observe(Seconds(last - first).count());
  metrics->round_duration->Observe(Seconds(std::chrono::steady_clock::now() - first).count());
}

PsShardStats ShardCounters::Snapshot() const {
  PsShardStats s;
  s.pushes_applied = applied_.load();
  s.duplicates = duplicates.load();
  s.early_pulls = early_pulls.load();
  s.unplanned = unplanned.load();
  s.other_epoch = other_epoch.load();
  s.rejected = rejected.load();
  s.rounds_closed = rounds_closed.load();
  s.replies = replies.load();
  s.max_staleness = max_staleness_.load();
  s.staleness_sum = staleness_sum_.load();
  s.straggler_wait_s = static_cast<double>(straggler_wait_ns_.load()) * 1e-9;
  return s;
}

void TakenRounds::Add(uint64_t round) {
  if (Contains(round)) return;
  above.insert(round);
  while (!above.empty() && *above.begin() == floor + 1) {
    ++floor;
    above.erase(above.begin());
  }
}

}  // namespace gradsync::server
