// A parameter-server shard's Prometheus metrics, resolved once at setup so
// that an observation allocates nothing:
//   gradsync_server_round_duration_seconds    first push of a round to its close
//   gradsync_server_straggler_wait_seconds    first to last push of a round
//   gradsync_server_rounds_completed_total
//   gradsync_server_push_staleness            versions, per applied push
//   gradsync_server_queue_depth               messages waiting for a key thread
//   gradsync_server_pushes_total, _pulls_total, _duplicates_total
//   gradsync_server_early_pulls_total   pulls of a key no push made, answered Busy
//   gradsync_server_unplanned_pushes_total  pushes of a key worker 0 did not push, Busy
//   gradsync_server_other_epoch_total  messages of another membership epoch
//   gradsync_server_expected_workers, _connected_workers (live per the
//   scheduler), _missing_workers (declared dead)
//   gradsync_server_checkpoint_duration_seconds
//   gradsync_server_last_checkpoint_timestamp_seconds  (Unix time; 0: never)
//   gradsync_messages_rejected_total{component="shard",reason}
// and of the sparse embedding tables (EmbeddingMetrics, summed over the
// shard's tables: table ids come from workers, so they are no label):
//   gradsync_server_embedding_tables, _rows, _bytes, _max_bytes
//   gradsync_server_embedding_rows_pulled_total, _rows_pushed_total
//   gradsync_server_embedding_rows_admitted_total
//   gradsync_server_embedding_rows_not_admitted_total  gradient rows of ids
//       seen fewer than embedding_admit_after times, dropped
//   gradsync_server_embedding_rows_evicted_total{reason="idle"|"memory"}
//   gradsync_server_embedding_rows_refused_total{reason="memory"|"nonfinite"}
//   gradsync_server_embedding_refused_messages_total  answered with an Error
//   gradsync_server_embedding_rounds_completed_total
// Rounds are per key; the labels never name a worker or a key.
//
// Thread-safety: every member is thread-safe (prometheus-cpp).
#ifndef GRADSYNC_PS_PS_METRICS_H_
#define GRADSYNC_PS_PS_METRICS_H_

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "ps/embedding_table.h"
#include "wire/rejected_metrics.h"

namespace gradsync::server {

struct ShardMetrics {
  explicit ShardMetrics(prometheus::Registry& registry);

  // Membership: `dead` of `expected` workers were declared dead.
  void SetWorkers(int expected, int dead);

  prometheus::Histogram* round_duration = nullptr;
  prometheus::Histogram* straggler_wait = nullptr;
  prometheus::Counter* rounds_completed = nullptr;
  prometheus::Histogram* staleness = nullptr;
  prometheus::Gauge* queue_depth = nullptr;
  prometheus::Counter* pushes = nullptr;
  prometheus::Counter* pulls = nullptr;
  prometheus::Counter* duplicates = nullptr;
  prometheus::Counter* early_pulls = nullptr;
  prometheus::Counter* other_epoch = nullptr;
  prometheus::Counter* unplanned = nullptr;
  prometheus::Gauge* expected_workers = nullptr;
  prometheus::Gauge* connected_workers = nullptr;
  prometheus::Gauge* missing_workers = nullptr;
  prometheus::Histogram* checkpoint_duration = nullptr;
  prometheus::Gauge* last_checkpoint = nullptr;
  wire::RejectedMetrics rejected;
};

// The embedding tables' metrics, set from snapshots of the shard's counters
// (PsShard::EmbeddingStats) by one thread.
class EmbeddingMetrics {
 public:
  EmbeddingMetrics(prometheus::Registry& registry, size_t max_bytes);
  // `rows` summed over every table, `tables` of them, `refused` messages,
  // `rounds` closed, `bytes` held: the counters move by what grew since
  // the last call.
  void Set(const EmbeddingTableStats& rows, uint64_t tables, uint64_t refused, uint64_t rounds,
           size_t bytes);

 private:
  prometheus::Gauge* tables_;
  prometheus::Gauge* rows_;
  prometheus::Gauge* bytes_;
  prometheus::Counter* pulled_;
  prometheus::Counter* pushed_;
  prometheus::Counter* admitted_;
  prometheus::Counter* not_admitted_;
  prometheus::Counter* evicted_idle_;
  prometheus::Counter* evicted_memory_;
  prometheus::Counter* refused_memory_;
  prometheus::Counter* refused_nonfinite_;
  prometheus::Counter* refused_messages_;
  prometheus::Counter* rounds_;
  EmbeddingTableStats last_;
  uint64_t last_refused_ = 0;
  uint64_t last_rounds_ = 0;
};

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_PS_METRICS_H_
