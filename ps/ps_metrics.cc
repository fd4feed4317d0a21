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

}  // namespace gradsync::server
