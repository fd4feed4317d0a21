// Membership epochs of an elastic job (docs/design/failure_model.md).
//
// A job is elastic when it was started with min_workers below num_workers.
// Then a worker lost while the job runs (declared dead: silent past the
// heartbeat deadline, killed, cut off) ends the current epoch instead of the
// job: the survivors are re-ranked densely, in the order of their old
// ranks, and each is sent a new assignment naming the epoch, its rank, the
// world size and the peers. A worker that registers while the job runs
// (below max_workers) ends the epoch too: it is ranked last. An epoch of
// fewer than min_workers is a wait: its workers are held in its epoch
// barrier until a joiner starts the next one, or elastic_timeout passes and
// the job fails.
//
// Membership is the bookkeeping only (no I/O); the Scheduler applies it.
// Thread-safety: none (the scheduler's thread).
#ifndef GRADSYNC_SCHEDULER_MEMBERSHIP_H_
#define GRADSYNC_SCHEDULER_MEMBERSHIP_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/time.h"

namespace gradsync::server {

struct ElasticOptions {
  int32_t min_workers = 0;        // 0 or num_workers: not elastic
  Millis elastic_timeout{60000};  // below min_workers: how long the job waits
  int32_t max_workers = 0;        // joiners are refused at this many; 0: num_workers
};

class Membership {
 public:
  Membership(int32_t num_workers, ElasticOptions options)
      : num_workers_(num_workers), options_(options), world_size_(num_workers) {}

  bool elastic() const {
    return (options_.min_workers > 0 && options_.min_workers < num_workers_) ||
           options_.max_workers > num_workers_;
  }
  uint32_t epoch() const { return epoch_; }
  int32_t world_size() const { return world_size_; }
  int32_t min_workers() const { return options_.min_workers; }
  int32_t max_workers() const {
    return options_.max_workers > 0 ? options_.max_workers : num_workers_;
  }
  // Whether the current epoch has fewer than min_workers (a wait).
  bool below_min() const { return world_size_ < options_.min_workers; }
  // Whether a worker joining started the current epoch.
  bool joined() const { return joined_; }
  const std::string& change() const { return change_; }

  // The new dense ranks of the survivors, given their current ranks (by
  // transport identity): survivor i in rank order gets rank i. Starts the
  // next epoch with `why` as its cause; with fewer than min_workers
  // survivors it is a wait (since `now`, unless one already runs).
  std::map<std::string, int32_t> EndEpoch(const std::map<std::string, int32_t>& survivors,
                                          const std::string& why, SteadyTime now);
  // The same for `members` and a worker joining (`joiner`), ranked last.
  // Ends a wait once min_workers are there again.
  std::map<std::string, int32_t> Join(const std::map<std::string, int32_t>& members,
                                      const std::string& joiner, const std::string& why,
                                      SteadyTime now);
  // Fewer than min_workers since (nullopt: not waiting).
  std::optional<SteadyTime> below_min_since() const { return below_min_since_; }
  // Whether the wait for workers has passed elastic_timeout at `now`.
  bool WaitExpired(SteadyTime now) const {
    return below_min_since_ && now - *below_min_since_ > options_.elastic_timeout;
  }
  Millis elastic_timeout() const { return options_.elastic_timeout; }
  // When the current epoch's cause was seen (for the recovery time).
  SteadyTime changed_at() const { return changed_at_; }

 private:
  const int32_t num_workers_;
  const ElasticOptions options_;
  uint32_t epoch_ = 0;
  int32_t world_size_;
  std::string change_;
  SteadyTime changed_at_{};
  std::optional<SteadyTime> below_min_since_;
  bool joined_ = false;
};

}  // namespace gradsync::server

#endif  // GRADSYNC_SCHEDULER_MEMBERSHIP_H_
