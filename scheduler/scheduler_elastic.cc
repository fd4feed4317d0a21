// The Scheduler's side of elastic jobs (scheduler/membership.h): removing a
// lost worker, admitting a joiner, starting the members' next epoch, and
// the wait below min_workers.
#include <map>
#include <string>

#include "common/logging.h"
#include "scheduler/scheduler.h"

namespace gradsync::server {

using wire::Role;

std::map<std::string, int32_t> Scheduler::LiveWorkers() const {
  std::map<std::string, int32_t> live;
  for (const auto& [id, n] : nodes_) {
    if (n.alive && !n.left && n.info.role == Role::Worker) live[id] = n.info.rank;
  }
  return live;
}

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
  // The servers hear of it as before, then of the next epoch with the
  // workers.
  const wire::NodeInfo info = node.info;
  for (const std::string& id : order_) {
    const Node& n = nodes_[id];
    if (n.alive && !n.left && n.info.role == Role::Server) {
      Reply(id, wire::MakeNodeDead(sender(), info, why));
    }
  }
  const std::string change = "membership changed: worker rank " + std::to_string(info.rank) +
                             " (identity " + wire::Escaped(info.identity, 64) + ") left: " + why;
  StartEpoch(membership_.EndEpoch(LiveWorkers(), change, now), MembershipReason::kDead);
}

// With the live workers below max_workers, a worker registering with the
// running job is admitted at once: it starts the next epoch.
std::optional<Scheduler::Refusal> Scheduler::CheckJoin() const {
  const size_t live = LiveWorkers().size();
  if (static_cast<int32_t>(live) < membership_.max_workers()) return std::nullopt;
  return Refusal{wire::ErrorCode::JobFull,
                 "the running job already has " + std::to_string(live) +
                     " workers, its max_workers " + std::to_string(membership_.max_workers()) +
                     ": a worker joins only below it (start the scheduler with a larger "
                     "--max_workers)"};
}

void Scheduler::OnJoinRequest(Node node) {
  const std::optional<Refusal> full = CheckJoin();
  if (!full) return AdmitJoiner(std::move(node));
  // Bounded: no more waiting joiners than max_workers.
  if (static_cast<int32_t>(waiting_joiners_.size()) >= membership_.max_workers()) {
    Refuse(node.identity, wire::ErrorCode::JobFull,
           full->text + " (and " + std::to_string(waiting_joiners_.size()) +
               " workers already wait to join)",
           wire::MsgType::Register);
    return;
  }
  GS_LOG(WARNING) << "a worker (pid " << node.pid << ") asks to join at max_workers "
                  << membership_.max_workers() << ": waiting up to " << FormatSeconds(JoinWait())
                  << " for a worker to be declared lost";
  waiting_joiners_[node.identity] = std::move(node);
}

// Long enough for a worker that just died (the process a restart may
// replace) to be declared lost.
Millis Scheduler::JoinWait() const {
  return options_.heartbeat_interval * (options_.missed_heartbeats + 2);
}

void Scheduler::TakeWaitingJoiners() {
  const SteadyTime now = clock_->Now();
  for (auto it = waiting_joiners_.begin(); it != waiting_joiners_.end();) {
    const std::optional<Refusal> full = CheckJoin();
    if (!full) {
      Node node = std::move(it->second);
      it = waiting_joiners_.erase(it);
      AdmitJoiner(std::move(node));
    } else if (now - it->second.last_seen > JoinWait()) {
      Refuse(it->first, wire::ErrorCode::JobFull, full->text, wire::MsgType::Register);
      it = waiting_joiners_.erase(it);
    } else {
      ++it;
    }
  }
}

void Scheduler::AdmitJoiner(Node node) {
  const std::string identity = node.identity;
  std::map<std::string, int32_t> members = LiveWorkers();
  node.info.rank = -1;
  node.last_seen = clock_->Now();
  nodes_[identity] = node;
  WatchProcess(node);
  order_.push_back(identity);
  if (metrics_) metrics_->registrations->Increment();
  UpdateLiveGauges();
  const std::string change = "membership changed: worker " + wire::Escaped(node.info.identity, 64) +
                             " joined (pid " + std::to_string(node.pid) + " on " +
                             wire::Escaped(node.info.host, 256) + ")";
  GS_LOG(WARNING) << "a worker joins the running job: pid " << node.pid << " on "
                  << wire::Escaped(node.info.host, 256);
  StartEpoch(membership_.Join(members, identity, change, clock_->Now()), MembershipReason::kJoined,
             identity);
}

// The servers first (their shards count the new epoch's workers before a
// worker of it pushes, and their node keys admit a joiner), then the
// members, the joiner (if any) last: the members' node keys admit it by
// the time it probes them.
void Scheduler::StartEpoch(const std::map<std::string, int32_t>& ranks, MembershipReason reason,
                           const std::string& joiner) {
  if (metrics_) {
    const MembershipReason counted = membership_.below_min() ? MembershipReason::kBelowMin : reason;
    metrics_->membership_changes[static_cast<int>(counted)]->Increment();
    metrics_->epoch->Set(membership_.epoch());
    metrics_->world_size->Set(membership_.world_size());
  }
  for (const auto& [id, rank] : ranks) nodes_[id].info.rank = rank;
  if (membership_.below_min()) {
    GS_LOG(ERROR) << "epoch " << membership_.epoch() << ": " << membership_.world_size()
                  << " workers, below min_workers " << membership_.min_workers()
                  << ": waiting up to " << FormatSeconds(membership_.elastic_timeout())
                  << " for workers to join (" << membership_.change() << ")";
  } else {
    GS_LOG(WARNING) << "epoch " << membership_.epoch() << " starts with "
                    << membership_.world_size() << " workers: " << membership_.change();
  }
  // The barriers the lost worker held up are released for the survivors
  // (a trainer's own barrier).
  std::vector<BarrierKey> keys;
  for (const auto& kv : barriers_) keys.push_back(kv.first);
  for (const BarrierKey& k : keys) TryRelease(k);
  for (const std::string& id : order_) {
    const Node& n = nodes_[id];
    if (n.alive && !n.left && n.info.role == Role::Server) SendAssignment(id);
  }
  for (const auto& [id, rank] : ranks) {
    if (id != joiner) SendAssignment(id);
  }
  if (!joiner.empty()) SendAssignment(joiner);
}

// The barrier of an epoch below min_workers holds its workers until a
// joiner starts the next epoch (or the wait expires). An earlier epoch's
// is never released: its workers learn of the later epoch from their
// assignments and leave it.
bool Scheduler::HoldsEpochBarrier(const BarrierKey& key) const {
  if (key.id != wire::kMembershipBarrier) return false;
  return key.epoch != membership_.epoch() || membership_.below_min();
}

void Scheduler::EpochBarrierReleased(const BarrierKey& key) {
  if (key.id != wire::kMembershipBarrier || key.epoch != membership_.epoch() ||
      membership_.epoch() == 0) {
    return;
  }
  const double seconds =
      std::chrono::duration<double>(clock_->Now() - membership_.changed_at()).count();
  GS_LOG(INFO) << "epoch " << membership_.epoch() << ": every one of the "
               << membership_.world_size() << " workers is in, " << seconds << " s after "
               << (membership_.joined() ? "the join request" : "the loss");
  if (!metrics_) return;
  if (membership_.joined()) {
    metrics_->join_seconds->Observe(seconds);
    metrics_->last_join_seconds->Set(seconds);
    return;
  }
  metrics_->recovery_seconds->Observe(seconds);
  metrics_->last_recovery_seconds->Set(seconds);
}

void Scheduler::ElasticTick() {
  if (phase_ == Phase::kDone || !membership_.WaitExpired(clock_->Now())) return;
  std::string lost;
  for (const std::string& r : removed_) lost += (lost.empty() ? "" : "; ") + r;
  FailJob("only " + std::to_string(membership_.world_size()) + " workers remain, below " +
          "min_workers " + std::to_string(membership_.min_workers()) + ", and none joined within " +
          "elastic_timeout_ms " + FormatSeconds(membership_.elastic_timeout()) + ": " + lost);
}

}  // namespace gradsync::server
