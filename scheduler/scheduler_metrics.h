// The scheduler's Prometheus metrics, resolved once at setup.
#ifndef GRADSYNC_SCHEDULER_SCHEDULER_METRICS_H_
#define GRADSYNC_SCHEDULER_SCHEDULER_METRICS_H_

#include <array>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "wire/message.h"
#include "wire/rejected_metrics.h"

namespace gradsync::server {

// Why an elastic job's membership changed (label `reason`).
enum class MembershipReason { kDead = 0, kBelowMin = 1, kJoined = 2 };

struct SchedulerMetrics {
  explicit SchedulerMetrics(prometheus::Registry& registry);

  // By wire::Role (index 1 = worker, 2 = server).
  std::array<prometheus::Gauge*, 3> live_nodes{};
  std::array<prometheus::Gauge*, 3> expected_nodes{};
  std::array<prometheus::Counter*, 3> heartbeat_timeouts{};
  prometheus::Counter* registrations = nullptr;
  prometheus::Counter* barriers_completed = nullptr;
  // Elastic jobs: workers in the current epoch, the epoch, membership
  // changes by reason (MembershipReason), and the time from a worker
  // declared lost to every survivor in the new epoch's barrier.
  prometheus::Gauge* world_size = nullptr;
  prometheus::Gauge* epoch = nullptr;
  std::array<prometheus::Counter*, 3> membership_changes{};
  prometheus::Histogram* recovery_seconds = nullptr;
  prometheus::Gauge* last_recovery_seconds = nullptr;  // 0 before the first
  // From a worker's registration with the running job to every member of
  // the epoch it started in that epoch's barrier.
  prometheus::Histogram* join_seconds = nullptr;
  prometheus::Gauge* last_join_seconds = nullptr;  // 0 before the first
  wire::RejectedMetrics rejected;
};

}  // namespace gradsync::server

#endif  // GRADSYNC_SCHEDULER_SCHEDULER_METRICS_H_
