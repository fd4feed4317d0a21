#include "server/scheduler_metrics.h"

namespace gradsync::server {

SchedulerMetrics::SchedulerMetrics(prometheus::Registry& registry)
    : rejected(registry, "scheduler") {
  auto& live = prometheus::BuildGauge()
                   .Name("gradsync_scheduler_live_nodes")
                   .Help("Registered nodes that are alive, by role.")
                   .Register(registry);
  auto& expected = prometheus::BuildGauge()
                       .Name("gradsync_scheduler_expected_nodes")
                       .Help("Nodes the job expects, by role.")
                       .Register(registry);
  auto& timeouts = prometheus::BuildCounter()
                       .Name("gradsync_scheduler_heartbeat_timeouts_total")
                       .Help("Nodes declared dead after missing their heartbeats, by role.")
                       .Register(registry);
  for (wire::Role role : {wire::Role::Worker, wire::Role::Server}) {
    int i = static_cast<int>(role);
    live_nodes[i] = &live.Add({{"role", wire::RoleName(role)}});
    expected_nodes[i] = &expected.Add({{"role", wire::RoleName(role)}});
    heartbeat_timeouts[i] = &timeouts.Add({{"role", wire::RoleName(role)}});
  }
  registrations = &prometheus::BuildCounter()
                       .Name("gradsync_scheduler_registrations_total")
                       .Help("Registrations accepted.")
                       .Register(registry)
                       .Add({});
  barriers_completed = &prometheus::BuildCounter()
                            .Name("gradsync_scheduler_barriers_completed_total")
                            .Help("Barriers released.")
                            .Register(registry)
                            .Add({});
}

}  // namespace gradsync::server
