#include "ps/ps_metrics.h"

#include "common/metrics.h"

namespace gradsync::server {
namespace {

prometheus::Counter* Counter(prometheus::Registry& r, const char* name, const char* help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Gauge* Gauge(prometheus::Registry& r, const char* name, const char* help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

prometheus::Histogram* Histogram(prometheus::Registry& r, const char* name, const char* help,
                                 const std::vector<double>& buckets) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

// Moves `counter` by what `now` grew past `last`.
void Grow(prometheus::Counter* counter, uint64_t now, uint64_t last) {
  if (now > last) counter->Increment(static_cast<double>(now - last));
}

}  // namespace

ShardMetrics::ShardMetrics(prometheus::Registry& r) : rejected(r, "shard") {
  round_duration =
      Histogram(r, "gradsync_server_round_duration_seconds",
                "From the first push of a round of a key to the round's close.", LatencyBuckets());
  straggler_wait =
      Histogram(r, "gradsync_server_straggler_wait_seconds",
                "From the first to the last push of a round of a key.", LatencyBuckets());
  rounds_completed = Counter(r, "gradsync_server_rounds_completed_total",
                             "Rounds of a key closed (sync and ssp).");
  staleness = Histogram(r, "gradsync_server_push_staleness",
                        "Versions between the parameters a gradient was computed from and "
                        "those it was applied to.",
                        {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64});
  queue_depth =
      Gauge(r, "gradsync_server_queue_depth", "Received messages waiting for their key thread.");
  pushes = Counter(r, "gradsync_server_pushes_total", "Pushes received and verified.");
  pulls = Counter(r, "gradsync_server_pulls_total", "Pulls received and verified.");
  duplicates = Counter(r, "gradsync_server_duplicates_total",
                       "Pushes seen before: acknowledged again and not applied.");
  early_pulls = Counter(r, "gradsync_server_early_pulls_total",
                        "Pulls of a key no push made yet (behind a lost push, or outside the "
                        "job's plan): answered Busy, nothing kept.");
  other_epoch = Counter(r, "gradsync_server_other_epoch_total",
                        "Pushes and pulls of another membership epoch than the shard's: an "
                        "ended one (refused) or a later one (answered Busy, sent again).");
  unplanned = Counter(r, "gradsync_server_unplanned_pushes_total",
                      "Pushes of a key worker 0 has not pushed (ahead of it, or outside the "
                      "job's plan) by another worker: answered Busy, nothing kept.");
  expected_workers = Gauge(r, "gradsync_server_expected_workers", "Workers of the job.");
  connected_workers =
      Gauge(r, "gradsync_server_connected_workers", "Workers of the job that are alive.");
  missing_workers =
      Gauge(r, "gradsync_server_missing_workers", "Workers of the job declared dead.");
  checkpoint_duration = Histogram(r, "gradsync_server_checkpoint_duration_seconds",
                                  "Time to write one checkpoint.", LatencyBuckets());
  last_checkpoint = Gauge(r, "gradsync_server_last_checkpoint_timestamp_seconds",
                          "Unix time of the last checkpoint written; 0: none.");
}

void ShardMetrics::SetWorkers(int expected, int dead) {
  expected_workers->Set(expected);
  connected_workers->Set(expected - dead);
  missing_workers->Set(dead);
}

EmbeddingMetrics::EmbeddingMetrics(prometheus::Registry& r, size_t max_bytes) {
  tables_ = Gauge(r, "gradsync_server_embedding_tables", "Embedding tables on the shard.");
  rows_ = Gauge(r, "gradsync_server_embedding_rows",
                "Embedding rows with storage on the shard, every table.");
  bytes_ = Gauge(r, "gradsync_server_embedding_bytes",
                 "Bytes the shard's embedding rows take, optimizer state included.");
  Gauge(r, "gradsync_server_embedding_max_bytes",
        "The bound on gradsync_server_embedding_bytes (embedding_max_bytes).")
      ->Set(static_cast<double>(max_bytes));
  pulled_ = Counter(r, "gradsync_server_embedding_rows_pulled_total", "Embedding rows pulled.");
  pushed_ =
      Counter(r, "gradsync_server_embedding_rows_pushed_total", "Embedding gradient rows applied.");
  admitted_ =
      Counter(r, "gradsync_server_embedding_rows_admitted_total", "Ids given a row of their own.");
  not_admitted_ = Counter(r, "gradsync_server_embedding_rows_not_admitted_total",
                          "Gradient rows of ids seen fewer than embedding_admit_after times: "
                          "dropped.");
  auto& evicted = prometheus::BuildCounter()
                      .Name("gradsync_server_embedding_rows_evicted_total")
                      .Help(
                          "Embedding rows evicted: idle for embedding_idle_steps, or the "
                          "least recently used under embedding_max_bytes.")
                      .Register(r);
  evicted_idle_ = &evicted.Add({{"reason", "idle"}});
  evicted_memory_ = &evicted.Add({{"reason", "memory"}});
  auto& refused = prometheus::BuildCounter()
                      .Name("gradsync_server_embedding_rows_refused_total")
                      .Help(
                          "Ids not given a row (memory: no row to give up under "
                          "embedding_max_bytes) and gradient rows refused (nonfinite: a NaN "
                          "or an infinity).")
                      .Register(r);
  refused_memory_ = &refused.Add({{"reason", "memory"}});
  refused_nonfinite_ = &refused.Add({{"reason", "nonfinite"}});
  refused_messages_ = Counter(r, "gradsync_server_embedding_refused_messages_total",
                              "Embedding pulls and pushes answered with an Error.");
  rounds_ = Counter(r, "gradsync_server_embedding_rounds_completed_total",
                    "Sync rounds of an embedding table closed.");
}

void EmbeddingMetrics::Set(const EmbeddingTableStats& s, uint64_t tables, uint64_t refused,
                           uint64_t rounds, size_t bytes) {
  tables_->Set(static_cast<double>(tables));
  rows_->Set(static_cast<double>(s.rows));
  bytes_->Set(static_cast<double>(bytes));
  Grow(pulled_, s.pulled, last_.pulled);
  Grow(pushed_, s.pushed, last_.pushed);
  Grow(admitted_, s.admitted, last_.admitted);
  Grow(not_admitted_, s.not_admitted, last_.not_admitted);
  Grow(evicted_idle_, s.evicted_idle, last_.evicted_idle);
  Grow(evicted_memory_, s.evicted_memory, last_.evicted_memory);
  Grow(refused_memory_, s.refused_memory, last_.refused_memory);
  Grow(refused_nonfinite_, s.refused_nonfinite, last_.refused_nonfinite);
  Grow(refused_messages_, refused, last_refused_);
  Grow(rounds_, rounds, last_rounds_);
  last_ = s;
  last_refused_ = refused;
  last_rounds_ = rounds;
}

}  // namespace gradsync::server
