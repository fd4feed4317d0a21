#include "common/metrics.h"

#include <exception>

#include "common/version.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"

namespace gradsync {

ProcessMetrics::ProcessMetrics(const std::string& role)
    : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::BuildGauge()
      .Name("gradsync_build_info")
      .Help("Build of this process; the value is always 1.")
      .Register(*registry_)
      .Add({{"version", kBuildId},
            {"protocol", std::to_string(kProtocolVersion)},
            {"role", role}})
      .Set(1);
}

ProcessMetrics::~ProcessMetrics() = default;

StatusOr<int> ProcessMetrics::Serve(const std::string& address) {
  if (exposer_) return FailedPreconditionError("metrics are already served");
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(address);
    exposer->RegisterCollectable(registry_);
    auto ports = exposer->GetListeningPorts();
    exposer_ = std::move(exposer);
    return ports.empty() ? 0 : ports.front();
  } catch (const std::exception& e) {
    return UnavailableError("cannot serve metrics on " + address + ": " + e.what());
  }
}

}  // namespace gradsync
