// A process's Prometheus registry and its /metrics endpoint.
//
// Every gradsync process owns one ProcessMetrics: a registry that components
// register their metric families in at setup, gradsync_build_info, the
// process_* families (CPU seconds, resident and virtual memory, open and
// maximum file descriptors, start time; read from /proc at scrape time), and
// (when a port is given) an HTTP exposer. A port that is busy is not fatal:
// Serve returns the error and the caller logs a warning and carries on.
//
// Conventions (see the metrics section of the design): names start with
// gradsync_, carry their base unit, counters end in _total; latencies are
// histograms over LatencyBuckets() so quantiles aggregate across processes.
// Components resolve their metric references once at setup; observing on a
// hot path allocates nothing.
//
// Thread-safety: registering and serving are thread-safe (prometheus-cpp).
#ifndef GRADSYNC_COMMON_METRICS_H_
#define GRADSYNC_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "prometheus/collectable.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}

namespace gradsync {

// Default /metrics ports: the scheduler, a server shard, and the base of the
// workers' (a worker serves on base + its local rank). gradsync_launch gives
// shard i base + 1 + i and the workers base + 10 + local rank.
constexpr int kSchedulerMetricsPort = 9400;
constexpr int kServerMetricsPort = 9401;
constexpr int kWorkerMetricsBasePort = 9410;

// Latency buckets in seconds, 50 us to 30 s.
const std::vector<double>& LatencyBuckets();

// process_* families of the calling process, read when collected, and the
// sums of the counters added: gradsync_auth_failures_total (handshakes a
// listening socket refused) and gradsync_transport_dropped_total (messages
// dropped as they were read: too many frames, a header too large;
// wire/zmq_transport.h), gradsync_impostors_total (messages under an
// identity that is not the one bound to the sender's node key) and
// gradsync_sends_dropped_total (sends failed at once: too many were waiting
// for a peer that does not read).
class ProcessCollector : public prometheus::Collectable {
 public:
  using Count = std::shared_ptr<const std::atomic<uint64_t>>;
  std::vector<prometheus::MetricFamily> Collect() const override;
  void Add(Count auth_failures, Count dropped, Count impostors, Count sends_dropped);

 private:
  mutable std::mutex mu_;
  std::vector<Count> auth_failures_;  // guarded by mu_
  std::vector<Count> dropped_;        // guarded by mu_
  std::vector<Count> impostors_;      // guarded by mu_
  std::vector<Count> sends_dropped_;  // guarded by mu_
};

class ProcessMetrics {
 public:
  // `role`: "scheduler", "server" or "worker", set as a build_info label.
  explicit ProcessMetrics(const std::string& role);
  ~ProcessMetrics();

  prometheus::Registry& registry() { return *registry_; }
  // Exports the counts of `refusals` (a wire::TransportRefusals; added to
  // any counted before) as gradsync_auth_failures_total,
  // gradsync_transport_dropped_total, gradsync_impostors_total and
  // gradsync_sends_dropped_total.
  template <typename Refusals>
  void AddTransportRefusals(std::shared_ptr<Refusals> refusals) {
    if (refusals == nullptr) return;
    process_->Add(ProcessCollector::Count(refusals, &refusals->handshakes),
                  ProcessCollector::Count(refusals, &refusals->dropped),
                  ProcessCollector::Count(refusals, &refusals->impostors),
                  ProcessCollector::Count(refusals, &refusals->sends_dropped));
  }
  // Serves /metrics on `address` ("0.0.0.0:9100"). Port 0 in the address
  // picks a free port. Returns the bound port.
  StatusOr<int> Serve(const std::string& address);
  // Serves on the address `host` resolves to (common/net.h BindAddress:
  // exactly that address, never every interface for a name) at `port` when
  // `port` > 0 and logs where; a failure (the host does not resolve, the
  // port is busy) is logged as a warning, and the process goes on without
  // /metrics. Returns the bound port, or 0 when not serving.
  int ServeOrWarn(const std::string& host, int64_t port);

  // Everything this process exports, in the text exposition format.
  std::string Scrape() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ProcessCollector> process_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_METRICS_H_
