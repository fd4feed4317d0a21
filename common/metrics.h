// A process's Prometheus registry and its /metrics endpoint.
//
// Every gradsync process owns one ProcessMetrics: a registry that components
// register their metric families in at setup, gradsync_build_info, and (when
// a port is given) an HTTP exposer. A port that is busy is not fatal: Serve
// returns the error and the caller logs a warning and carries on.
//
// Thread-safety: registering and serving are thread-safe (prometheus-cpp).
#ifndef GRADSYNC_COMMON_METRICS_H_
#define GRADSYNC_COMMON_METRICS_H_

#include <memory>
#include <string>

#include "common/status.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}

namespace gradsync {

class ProcessMetrics {
 public:
  // `role`: "scheduler", "server" or "worker", set as a build_info label.
  explicit ProcessMetrics(const std::string& role);
  ~ProcessMetrics();

  prometheus::Registry& registry() { return *registry_; }
  // Serves /metrics on `address` ("0.0.0.0:9100"). Port 0 in the address
  // picks a free port. Returns the bound port.
  StatusOr<int> Serve(const std::string& address);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_METRICS_H_
