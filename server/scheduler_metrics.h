// The scheduler's Prometheus metrics, resolved once at setup.
#ifndef GRADSYNC_SERVER_SCHEDULER_METRICS_H_
#define GRADSYNC_SERVER_SCHEDULER_METRICS_H_

#include <array>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "wire/message.h"
#include "wire/rejected_metrics.h"

namespace gradsync::server {

struct SchedulerMetrics {
  explicit SchedulerMetrics(prometheus::Registry& registry);

  // By wire::Role (index 1 = worker, 2 = server).
  std::array<prometheus::Gauge*, 3> live_nodes{};
  std::array<prometheus::Gauge*, 3> expected_nodes{};
  std::array<prometheus::Counter*, 3> heartbeat_timeouts{};
  prometheus::Counter* registrations = nullptr;
  prometheus::Counter* barriers_completed = nullptr;
  wire::RejectedMetrics rejected;
};

}  // namespace gradsync::server

#endif  // GRADSYNC_SERVER_SCHEDULER_METRICS_H_
