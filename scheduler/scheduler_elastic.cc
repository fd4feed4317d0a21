// The Scheduler's side of elastic jobs (scheduler/membership.h): removing a
// lost worker, starting the survivors' next epoch, and the wait below
// min_workers.
#include <map>
#include <string>

#include "common/logging.h"
#include "scheduler/scheduler.h"

namespace gradsync::server {

using wire::Role;

void Scheduler::RemoveWorker(Node& node, const std::string& why) {
  const SteadyTime now = clock_->Now();
  const std::string who = node.info.Name() + " (pid " + std::to_string(node.pid) + " on " +
                          wire::Escaped(node.info.host, 256) + ", identity " +
                          wire::Escaped(node.info.identity, 64) + ")";
  node.alive = false;
  node.removed = true;
  node.removed_why = "epoch " + std::to_string(membership_.epoch()) + " ended without it: " + why;
  removed_.push_back(node.info.Name() + " lost: " + why);
  GS_LOG(ERROR) << who << " is lost: " << why;
  if (metrics_) metrics_->heartbeat_timeouts[static_cast<int>(Role::Worker)]->Increment();
  UpdateLiveGauges();
  // The servers hear of it as before; the workers through their next epoch.
  const wire::NodeInfo info = node.info;
  for (const std::string& id : order_) {
    const Node& n = nodes_[id];
    if (n.alive && !n.left && n.info.role == Role::Server) {
      Reply(id, wire::MakeNodeDead(sender(), info, why));
    }
  }
  std::map<std::string, int32_t> survivors;
  for (const auto& [id, n] : nodes_) {
    if (n.alive && !n.left && n.info.role == Role::Worker) survivors[id] = n.info.rank;
  }
  const std::string change = "membership changed: worker rank " + std::to_string(info.rank) +
                             " (identity " + wire::Escaped(info.identity, 64) + ") left: " + why;
  auto ranks = membership_.EndEpoch(survivors, change, now);
  if (metrics_) metrics_->world_size->Set(membership_.world_size());
  if (!ranks) {
    if (metrics_) {
      metrics_->membership_changes[static_cast<int>(MembershipReason::kBelowMin)]->Increment();
    }
    GS_LOG(ERROR) << survivors.size() << " workers remain, below min_workers "
                  << membership_.min_workers() << ": waiting up to "
                  << FormatSeconds(membership_.elastic_timeout()) << " for workers";
    return;
  }
  StartEpoch(*ranks);
}

void Scheduler::StartEpoch(const std::map<std::string, int32_t>& ranks) {
  if (metrics_) {
    metrics_->membership_changes[static_cast<int>(MembershipReason::kDead)]->Increment();
    metrics_->epoch->Set(membership_.epoch());
  }
  for (const auto& [id, rank] : ranks) nodes_[id].info.rank = rank;
  GS_LOG(WARNING) << "epoch " << membership_.epoch() << " starts with " << membership_.world_size()
                  << " workers: " << membership_.change();
  // The barriers the lost worker held up are released for the survivors
  // (a trainer's own barrier, or an earlier epoch's).
  std::vector<BarrierKey> keys;
  for (const auto& kv : barriers_) keys.push_back(kv.first);
  for (const BarrierKey& k : keys) TryRelease(k);
  for (const auto& [id, rank] : ranks) SendAssignment(id);
}

void Scheduler::ElasticTick() {
  if (phase_ == Phase::kDone || !membership_.WaitExpired(clock_->Now())) return;
  std::string lost;
  for (const std::string& r : removed_) lost += (lost.empty() ? "" : "; ") + r;
  FailJob("only " + std::to_string(membership_.world_size()) + " workers remain, below " +
          "min_workers " + std::to_string(membership_.min_workers()) + ", and none joined within " +
          "elastic_timeout_ms " + FormatSeconds(membership_.elastic_timeout()) +
          " (joining a running job is not supported yet): " + lost);
}

}  // namespace gradsync::server
