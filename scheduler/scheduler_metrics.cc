#include "scheduler/scheduler_metrics.h"

#include "common/metrics.h"

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
  world_size = &prometheus::BuildGauge()
                    .Name("gradsync_scheduler_world_size")
                    .Help("Workers in the job's current membership epoch.")
                    .Register(registry)
                    .Add({});
  epoch = &prometheus::BuildGauge()
               .Name("gradsync_scheduler_membership_epoch")
               .Help("The job's membership epoch (0 until a worker is lost).")
               .Register(registry)
               .Add({});
  auto& changes = prometheus::BuildCounter()
                      .Name("gradsync_scheduler_membership_changes_total")
                      .Help(
                          "Membership changes of an elastic job: a worker lost and a new "
                          "epoch (worker_dead) or a wait for workers (below_min_workers), "
                          "or a worker joined (worker_joined).")
                      .Register(registry);
  membership_changes[static_cast<int>(MembershipReason::kDead)] =
      &changes.Add({{"reason", "worker_dead"}});
  membership_changes[static_cast<int>(MembershipReason::kBelowMin)] =
      &changes.Add({{"reason", "below_min_workers"}});
  membership_changes[static_cast<int>(MembershipReason::kJoined)] =
      &changes.Add({{"reason", "worker_joined"}});
  join_seconds = &prometheus::BuildHistogram()
                      .Name("gradsync_scheduler_join_seconds")
                      .Help(
                          "From a worker's registration with the running job to every member "
                          "of its epoch in that epoch's barrier.")
                      .Register(registry)
                      .Add({}, LatencyBuckets());
  recovery_seconds =
      &prometheus::BuildHistogram()
           .Name("gradsync_scheduler_recovery_seconds")
           .Help("From a worker declared lost to every survivor in the new epoch's barrier.")
           .Register(registry)
           .Add({}, LatencyBuckets());
  last_recovery_seconds = &prometheus::BuildGauge()
                               .Name("gradsync_scheduler_last_recovery_seconds")
                               .Help(
                                   "The last membership change's recovery time (as "
                                   "gradsync_scheduler_recovery_seconds); 0 before the first.")
                               .Register(registry)
                               .Add({});
}

}  // namespace gradsync::server
