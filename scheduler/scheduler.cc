#include "scheduler/scheduler.h"

#include <algorithm>

#include "common/logging.h"
#include "common/version.h"
#include "scheduler/scheduler_text.h"
#include "wire/curve.h"
#include "wire/validate.h"

namespace gradsync::server {
namespace {

using wire::ErrorCode;
using wire::MsgType;
using wire::Role;

}  // namespace

StatusOr<SchedulerOptions> SchedulerOptions::FromConfig(const Config& config) {
  SchedulerOptions o;
  GS_ASSIGN_OR_RETURN(std::string address, config.GetString("scheduler", ""));
  int64_t default_port = 9000;
  size_t colon = address.rfind(':');
  if (colon != std::string::npos) default_port = std::atoll(address.c_str() + colon + 1);
  GS_ASSIGN_OR_RETURN(int64_t port, config.GetInt("port", default_port));
  GS_ASSIGN_OR_RETURN(int64_t workers, config.GetInt("num_workers", 1));
  GS_ASSIGN_OR_RETURN(int64_t servers, config.GetInt("num_servers", 0));
  GS_ASSIGN_OR_RETURN(int64_t heartbeat_ms, config.GetInt("heartbeat_ms", 500));
  GS_ASSIGN_OR_RETURN(int64_t missed, config.GetInt("missed_heartbeats", 6));
  GS_ASSIGN_OR_RETURN(int64_t rendezvous_ms, config.GetInt("rendezvous_timeout_ms", 120000));
  GS_ASSIGN_OR_RETURN(int64_t grace_ms, config.GetInt("server_grace_ms", 0));
  if (port < 0 || port > 65535)
    return InvalidArgumentError("port " + std::to_string(port) + " out of range");
  if (workers < 1) return InvalidArgumentError("num_workers must be at least 1");
  if (servers < 0) return InvalidArgumentError("num_servers must not be negative");
  if (heartbeat_ms <= 0 || missed <= 0) {
    return InvalidArgumentError("heartbeat_ms and missed_heartbeats must be positive");
  }
  if (grace_ms < 0) return InvalidArgumentError("server_grace_ms must not be negative");
  GS_ASSIGN_OR_RETURN(int64_t min_workers, config.GetInt("min_workers", workers));
  GS_ASSIGN_OR_RETURN(int64_t elastic_ms, config.GetInt("elastic_timeout_ms", 60000));
  if (min_workers < 1 || min_workers > workers) {
    return InvalidArgumentError("min_workers must be within [1, num_workers], got " +
                                std::to_string(min_workers));
  }
  if (elastic_ms < 0) return InvalidArgumentError("elastic_timeout_ms must not be negative");
  GS_ASSIGN_OR_RETURN(int64_t max_workers, config.GetInt("max_workers", workers));
  if (max_workers < workers || max_workers > 4096) {
    return InvalidArgumentError("max_workers must be within [num_workers, 4096], got " +
                                std::to_string(max_workers));
  }
  o.elastic.max_workers = static_cast<int32_t>(max_workers);
  o.elastic.min_workers = static_cast<int32_t>(min_workers);
  o.elastic.elastic_timeout = Millis(elastic_ms);
  GS_ASSIGN_OR_RETURN(std::string host, config.GetString("host", "127.0.0.1"));
  GS_ASSIGN_OR_RETURN(o.curve, wire::SecurityFromConfig(config, host));
  GS_ASSIGN_OR_RETURN(o.listen, wire::ListenEndpoint(host, port));
  o.num_workers = static_cast<int32_t>(workers);
  o.num_servers = static_cast<int32_t>(servers);
  o.heartbeat_interval = Millis(heartbeat_ms);
  o.missed_heartbeats = static_cast<uint32_t>(missed);
  o.rendezvous_timeout = Millis(rendezvous_ms);
  o.server_grace = Millis(grace_ms);
  return o;
}

Scheduler::Scheduler(SchedulerOptions options, std::unique_ptr<wire::Transport> transport,
                     SchedulerMetrics* metrics, const Clock* clock)
    : options_(std::move(options)),
      transport_(std::move(transport)),
      metrics_(metrics),
      clock_(clock),
      membership_(options_.num_workers, options_.elastic) {
  policy_ =
      wire::Policy::Accepting({MsgType::Register, MsgType::Heartbeat, MsgType::Leave,
                               MsgType::Barrier, MsgType::ReachReport, MsgType::Error,
                               MsgType::NcclIdOffer, MsgType::NcclIdRequest, MsgType::Gather});
  if (metrics_) {
    metrics_->expected_nodes[static_cast<int>(Role::Worker)]->Set(options_.num_workers);
    metrics_->expected_nodes[static_cast<int>(Role::Server)]->Set(options_.num_servers);
    metrics_->world_size->Set(options_.num_workers);
  }
}

StatusOr<std::string> Scheduler::Start() {
  started_ = clock_->Now();
  return transport_->Listen(options_.listen);
}

namespace {
constexpr int kMaxMessagesPerTick = 4096;
}  // namespace

Status Scheduler::Run(const std::atomic<bool>& stop) {
  const Millis tick = std::max(Millis(10), options_.heartbeat_interval / 4);
  while (phase_ != Phase::kDone) {
    if (stop.load()) {
      GS_LOG(INFO) << "stopping: telling every node the job is shut down";
      Broadcast([&] {
        return wire::MakeJobState(sender(), wire::JobPhase::Shutdown, "the scheduler was stopped");
      });
      return OkStatus();
    }
    // Everything queued is taken before the clock is looked at: after this
    // thread was held up (a loaded machine), the heartbeats that waited
    // meanwhile count, and nobody is declared dead for the scheduler's own
    // stall. Bounded, so that a flood cannot keep Tick from running.
    auto in = transport_->Receive(Deadline::After(tick));
    for (int taken = 0; in.ok(); ++taken) {
      Handle(std::move(*in));
      if (taken == kMaxMessagesPerTick || phase_ == Phase::kDone) break;
      in = transport_->Receive(Deadline::After(Millis(0)));
    }
    if (!in.ok() && in.status().code() == StatusCode::kCancelled) {
      return CancelledError("scheduler transport shut down");
    }
    Tick();
  }
  return result_;
}

void Scheduler::Handle(wire::Incoming in) {
  const std::string& identity = in.from.identity;
  wire::Verdict v = wire::Validate(in.message, policy_);
  if (!v.ok()) {
    Refuse(identity, v.code, v.detail, v.type, v.ShouldAnswer());
    return;
  }
  const wire::Header& h = *v.header;
  if (h.type() == MsgType::Register) {
    OnRegister(identity, *h.body_as_RegisterBody());
    return;
  }
  // A claimant's or a waiting joiner's heartbeats while it waits.
  if (rejoins_.count(identity) || waiting_joiners_.count(identity)) return;
  auto it = nodes_.find(identity);
  if (it == nodes_.end() || !it->second.alive || it->second.left) {
    Refuse(identity, ErrorCode::NotRegistered,
           it == nodes_.end()   ? "this node is not registered with the scheduler"
           : it->second.removed ? "this worker was removed from the job: " + it->second.removed_why
                                : "this node was declared dead or left the job",
           h.type(), h.type() != MsgType::Error);
    return;
  }
  it->second.last_seen = clock_->Now();
  if (!rejoins_.empty()) RefuseClaimsOn(it->second);
  if (it->second.missing) {
    it->second.missing = false;
    GS_LOG(INFO) << it->second.info.Name() << " is heard from again";
  }
  Dispatch(it->second, h);
}

void Scheduler::Dispatch(Node& node, const wire::Header& h) {
  switch (h.type()) {
    case MsgType::Heartbeat:
      Reply(node.identity, wire::MakeHeartbeat(sender()));
      break;
    case MsgType::Leave:
      OnLeave(node, *h.body_as_LeaveBody());
      break;
    case MsgType::Barrier:
      OnBarrier(node, h.epoch(), *h.body_as_BarrierBody());
      break;
    case MsgType::Gather:
      OnGather(node, h.epoch(), *h.body_as_GatherBody());
      break;
    case MsgType::ReachReport:
      OnReachReport(node, *h.body_as_ReachReportBody());
      break;
    case MsgType::NcclIdOffer:
      OnNcclOffer(node, *h.body_as_NcclIdBody());
      break;
    case MsgType::NcclIdRequest:
      if (nccl_id_.empty()) {
        nccl_waiters_.insert(node.identity);  // once per node, however often it asks
      } else {
        Reply(node.identity, wire::MakeNcclId(sender(), MsgType::NcclId, nccl_id_));
      }
      break;
    case MsgType::Error: {
      const auto* e = h.body_as_ErrorBody();
      uint64_t left_out = 0;
      if (refusal_log_.Admit(node.identity, "reported error", &left_out)) {
        GS_LOG(WARNING) << node.info.Name() << " reports an error ("
                        << wire::ErrorCodeLabel(e->code()) << "): " << PeerText(e->message())
                        << LeftOutNote(left_out);
      }
      break;
    }
    default:
      break;
  }
}

bool Scheduler::InGroup(const Node& node, wire::Group group) const {
  if (group == wire::Group::All) return true;
  return (group == wire::Group::Workers) == (node.info.role == Role::Worker);
}

void Scheduler::OnBarrier(Node& node, uint32_t epoch, const wire::BarrierBody& b) {
  if (!InGroup(node, b.group())) {
    Refuse(node.identity, ErrorCode::BadSender,
           node.info.Name() + " is not a member of group " + wire::EnumNameGroup(b.group()),
           MsgType::Barrier);
    return;
  }
  EnterBarrier(node, BarrierKey{b.group(), epoch, b.barrier_id()}, MsgType::Barrier);
}

void Scheduler::OnGather(Node& node, uint32_t epoch, const wire::GatherBody& b) {
  if (node.info.role != Role::Worker) {
    Refuse(node.identity, ErrorCode::BadSender,
           node.info.Name() + " is not a worker: only workers gather", MsgType::Gather);
    return;
  }
  wire::GatherPartFields part;
  if (b.ports()) part.ports.assign(b.ports()->begin(), b.ports()->end());
  if (b.data()) part.data.assign(b.data()->begin(), b.data()->end());
  const std::string clash = PortClash(node, part.ports);
  if (!clash.empty()) {
    Refuse(node.identity, ErrorCode::BadSender, clash, MsgType::Gather);
    return;
  }
  const BarrierKey key{wire::Group::Workers, epoch, b.barrier_id()};
  gather_parts_[key][node.identity] = std::move(part);
  EnterBarrier(node, key, MsgType::Gather);
}

std::string Scheduler::PortClash(const Node& node, const std::vector<uint16_t>& ports) const {
  const std::string where = " on " + PeerText(node.info.host);
  for (size_t i = 0; i < ports.size(); ++i) {
    const uint16_t p = ports[i];
    if (p == 0) return node.info.Name() + " announced port 0";
    for (size_t j = 0; j < i; ++j) {
      if (ports[j] == p)
        return node.info.Name() + " announced port " + std::to_string(p) + " twice";
    }
    for (const auto& [id, n] : nodes_) {
      if (n.removed || n.left || !n.alive || n.info.host != node.info.host) continue;
      if (p == n.info.data_port || p == n.info.stream_port || p == n.info.metrics_port) {
        return node.info.Name() + " announced port " + std::to_string(p) + where + ", which is " +
               n.info.Name() + "'s";
      }
    }
    for (const auto& [key, parts] : gather_parts_) {
      for (const auto& [id, part] : parts) {
        auto other = nodes_.find(id);
        if (id == node.identity || other == nodes_.end() ||
            other->second.info.host != node.info.host) {
          continue;
        }
        if (std::find(part.ports.begin(), part.ports.end(), p) != part.ports.end()) {
          return node.info.Name() + " announced port " + std::to_string(p) + where + ", which " +
                 other->second.info.Name() + " announced";
        }
      }
    }
  }
  return "";
}

void Scheduler::EnterBarrier(Node& node, const BarrierKey& key, MsgType type) {
  if (auto broken = broken_barriers_.find(key); broken != broken_barriers_.end()) {
    ReplyError(node.identity, ErrorCode::PeerDead, broken->second, type);
    return;
  }
  for (const auto& [id, n] : nodes_) {
    if (n.removed || !InGroup(n, key.group)) continue;
    if (!n.alive) {
      ReplyError(node.identity, ErrorCode::PeerDead,
                 "barrier " + std::to_string(key.id) + " of " + wire::EnumNameGroup(key.group) +
                     " cannot complete: " + n.info.Name() + " is dead",
                 type);
      return;
    }
  }
  // A node waits in one barrier at a time: entering this one leaves any
  // other, so the barriers held (and parts gathered) are at most one per
  // node, whatever ids the nodes send.
  for (auto it = barriers_.begin(); it != barriers_.end();) {
    if (it->first != key) {
      it->second.erase(node.identity);
      if (auto g = gather_parts_.find(it->first); g != gather_parts_.end()) {
        g->second.erase(node.identity);
        if (g->second.empty()) gather_parts_.erase(g);
      }
    }
    if (it->second.empty() && it->first != key) {
      gather_parts_.erase(it->first);
      it = barriers_.erase(it);
    } else {
      ++it;
    }
  }
  if (type == MsgType::Barrier) {
    // A Barrier under a gather's id leaves no part behind.
    if (auto g = gather_parts_.find(key); g != gather_parts_.end()) {
      g->second.erase(node.identity);
      if (g->second.empty()) gather_parts_.erase(g);
    }
  }
  barriers_[key].insert(node.identity);
  TryRelease(key);
}

void Scheduler::DropBarrier(const BarrierKey& key) {
  barriers_.erase(key);
  gather_parts_.erase(key);
}

void Scheduler::ReleaseGather(const BarrierKey& key, const std::set<std::string>& members) {
  const auto parts = gather_parts_.find(key);
  std::string why;
  std::vector<wire::GatherPartFields> all;
  if (key.epoch != membership_.epoch()) {
    why = "gather " + std::to_string(key.id) + " is of membership epoch " +
          std::to_string(key.epoch) + ", the job is at " + std::to_string(membership_.epoch());
  }
  for (const std::string& id : members) {
    if (!why.empty()) break;
    const wire::GatherPartFields* part = nullptr;
    if (parts != gather_parts_.end()) {
      auto found = parts->second.find(id);
      if (found != parts->second.end()) part = &found->second;
    }
    if (part == nullptr) {
      why = "workers disagree on barrier " + std::to_string(key.id) + ": " +
            nodes_[id].info.Name() + " entered it as a barrier, others as a gather";
      break;
    }
    all.push_back(*part);
    all.back().rank = nodes_[id].info.rank;
  }
  std::sort(all.begin(), all.end(),
            [](const wire::GatherPartFields& a, const wire::GatherPartFields& b) {
              return a.rank < b.rank;
            });
  // Built once: every member gets a copy of the same header.
  const wire::Message answer = wire::MakeGathered(sender(), key.id, all, key.epoch);
  if (why.empty() && answer.header.size() > wire::Limits{}.max_header_bytes) {
    why = "the parts of gather " + std::to_string(key.id) + " hold " +
          std::to_string(answer.header.size()) + " bytes, more than one message carries (" +
          std::to_string(wire::Limits{}.max_header_bytes) + ")";
  }
  for (const std::string& id : members) {
    if (why.empty()) {
      Reply(id, answer);
    } else {
      ReplyError(id, ErrorCode::Mismatch, why, MsgType::Gather);
    }
  }
}

// A user's barrier waits for every member of its group: one that left the
// job without entering it (its process ended normally) never will, so the
// barrier fails naming it rather than letting the others through. Epoch
// barriers count the members still in the job.
std::string Scheduler::LeftBarrierText(const BarrierKey& key, const Node& left) const {
  return "barrier " + std::to_string(key.id) + " of " + wire::EnumNameGroup(key.group) +
         " cannot complete: " + left.info.Name() + " left the job without entering it";
}

void Scheduler::RememberBroken(const BarrierKey& key, const std::string& why) {
  broken_barriers_[key] = why;
  if (broken_barriers_.size() > kMaxBrokenBarriers)
    broken_barriers_.erase(broken_barriers_.begin());
}

void Scheduler::TryRelease(const BarrierKey& key) {
  auto it = barriers_.find(key);
  if (it == barriers_.end()) return;
  const bool user = key.id != wire::kMembershipBarrier;
  const Node* gone = nullptr;  // the lowest rank that left without entering
  bool awaited = false;
  for (const auto& [id, n] : nodes_) {
    if (!InGroup(n, key.group) || it->second.count(id)) continue;
    if (user && n.left && !n.removed) {
      if (gone == nullptr || n.info.rank < gone->info.rank) gone = &n;
    } else if (n.alive && !n.left) {
      awaited = true;
    }
  }
  if (gone != nullptr) {
    const std::string why = LeftBarrierText(key, *gone);
    const MsgType type = gather_parts_.count(key) ? MsgType::Gather : MsgType::Barrier;
    for (const std::string& waiting : it->second)
      ReplyError(waiting, ErrorCode::PeerDead, why, type);
    DropBarrier(key);
    RememberBroken(key, why);
    return;
  }
  if (awaited) return;
  if (HoldsEpochBarrier(key)) return;
  EpochBarrierReleased(key);  // counted before anyone is released
  if (gather_parts_.count(key)) {
    ReleaseGather(key, it->second);
  } else {
    for (const std::string& id : it->second) {
      Reply(id, wire::MakeBarrier(sender(), MsgType::BarrierRelease, key.id, key.group, key.epoch));
    }
  }
  DropBarrier(key);
  if (metrics_) metrics_->barriers_completed->Increment();
}

void Scheduler::OnNcclOffer(Node& node, const wire::NcclIdBody& body) {
  if (node.info.role != Role::Worker || node.info.rank != 0) {
    Refuse(node.identity, ErrorCode::BadSender,
           "only worker 0 offers the NCCL id, not " + node.info.Name(), MsgType::NcclIdOffer);
    return;
  }
  nccl_id_.assign(body.id()->begin(), body.id()->end());
  for (const std::string& id : nccl_waiters_) {
    Reply(id, wire::MakeNcclId(sender(), MsgType::NcclId, nccl_id_));
  }
  nccl_waiters_.clear();
}

void Scheduler::OnLeave(Node& node, const wire::LeaveBody& body) {
  const std::string reason = PeerText(body.reason());
  if (body.departing() && node.info.role == Role::Worker && phase_ == Phase::kRunning &&
      node.alive) {
    // Before the job's end: an elastic job goes on without it at once,
    // another fails as when a worker dies.
    MarkDead(node, "it left the job (" + reason + ")", body.failure());
    node.left = true;
    return;
  }
  if (node.info.role == Role::Server && phase_ == Phase::kRunning && !servers_released_ &&
      node.alive) {
    // The workers still need this shard. A restart may bring it back within
    // server_grace_ms (Tick declares it dead after that); without a grace it
    // is gone now, and its workers must hear of it (a shard that lost the
    // scheduler in a partition leaves when the link comes back).
    if (options_.server_grace.count() > 0) {
      GS_LOG(WARNING) << node.info.Name() << " left the running job (" << reason
                      << "): waiting up to " << FormatSeconds(options_.server_grace)
                      << " for it to restart and rejoin";
      node.missing = true;
      return;
    }
    MarkDead(node, "left the job while the workers still needed it (" + reason + ")");
    node.left = true;
    return;
  }
  node.left = true;
  GS_LOG(INFO) << node.info.Name() << " left the job: " << reason;
  UpdateLiveGauges();
  std::vector<BarrierKey> keys;
  for (const auto& kv : barriers_) keys.push_back(kv.first);
  for (const BarrierKey& k : keys) TryRelease(k);
}

void Scheduler::WatchProcess(const Node& node) {
  // A server may restart within its grace; without one, its exit is its
  // death (its copies take over, where embedding rows have them).
  if (node.info.role == Role::Server && options_.server_grace.count() > 0) return;
  if (node.info.role != Role::Worker && node.info.role != Role::Server) return;
  if (exits_.Watch(node.identity, node.pid, node.info.boot_id, node.pid_ns)) {
    GS_LOG(INFO) << node.info.Name() << " runs on this machine: its exit (pid " << node.pid
                 << ") is seen at once";
  }
}

void Scheduler::TakeExits() {
  for (const std::string& id : exits_.Exited()) {
    auto it = nodes_.find(id);
    if (it == nodes_.end() || !it->second.alive || it->second.left) continue;
    MarkDead(it->second, "its process (pid " + std::to_string(it->second.pid) + ") exited");
  }
}

void Scheduler::Tick() {
  TakeExits();
  TakeSilentClaims();
  TakeWaitingJoiners();
  const SteadyTime now = clock_->Now();
  const auto limit = options_.heartbeat_interval * options_.missed_heartbeats;
  for (const std::string& id : order_) {
    Node& n = nodes_[id];
    if (!n.alive || n.left || now - n.last_seen <= limit) continue;
    const bool may_restart = n.info.role == Role::Server && phase_ == Phase::kRunning &&
                             options_.server_grace.count() > 0;
    if (may_restart && now - n.last_seen <= limit + options_.server_grace) {
      if (!n.missing) {
        n.missing = true;
        GS_LOG(WARNING) << n.info.Name() << " (pid " << n.pid << " on " << PeerText(n.info.host)
                        << ") is silent: waiting up to " << FormatSeconds(options_.server_grace)
                        << " for it to restart and rejoin";
      }
      continue;
    }
    DeclareDead(n, std::chrono::duration_cast<Millis>(now - n.last_seen));
  }
  ElasticTick();
  if (phase_ == Phase::kRendezvous && now - started_ > options_.rendezvous_timeout) {
    FailJob("rendezvous timed out after " + FormatSeconds(options_.rendezvous_timeout) + ": " +
            std::to_string(Count(Role::Worker)) + " of " + std::to_string(options_.num_workers) +
            " workers and " + std::to_string(Count(Role::Server)) + " of " +
            std::to_string(options_.num_servers) + " servers registered");
  } else if (phase_ == Phase::kReachability && now - reach_started_ > options_.rendezvous_timeout) {
    std::vector<std::string> silent;
    for (const auto& [id, n] : nodes_) {
      if (!n.reported) silent.push_back(n.info.Name());
    }
    FinishReachability("no reachability report from " + Join(silent, ", "));
  }
  bool anyone = false, any_worker = false;
  for (const auto& [id, n] : nodes_) {
    anyone |= n.alive && !n.left;
    any_worker |= n.alive && !n.left && n.info.role == Role::Worker;
  }
  if (phase_ == Phase::kRunning && anyone && !any_worker && !servers_released_) {
    servers_released_ = true;
    GS_LOG(INFO) << "every worker is gone: releasing the servers";
    Broadcast([&] {
      return wire::MakeJobState(sender(), wire::JobPhase::Shutdown, "every worker has finished");
    });
  }
  if (phase_ == Phase::kRunning && !anyone) {
    phase_ = Phase::kDone;
    if (dead_.empty()) {
      GS_LOG(INFO) << "job " << job_id_ << " finished: every node left";
    } else {
      result_ = AbortedError("job ended after node failures: " + Join(dead_, "; "));
    }
  }
}

void Scheduler::DeclareDead(Node& node, Millis silent) {
  MarkDead(node, "no message for " + FormatSeconds(silent) + " (" +
                     std::to_string(options_.missed_heartbeats) + " heartbeats of " +
                     FormatSeconds(options_.heartbeat_interval) + " missed" +
                     (node.missing ? ", and it did not rejoin within the grace of " +
                                         FormatSeconds(options_.server_grace)
                                   : std::string()) +
                     ")");
}

void Scheduler::MarkDead(Node& node, const std::string& why, wire::ErrorCode failure) {
  if (membership_.elastic() && node.info.role == Role::Worker && phase_ == Phase::kRunning) {
    RemoveWorker(node, why);
    return;
  }
  node.alive = false;
  GS_LOG(ERROR) << node.info.Name() << " (pid " << node.pid << " on " << PeerText(node.info.host)
                << ") is dead: " << why;
  dead_.push_back(node.info.Name() + " dead: " + why);
  if (metrics_) metrics_->heartbeat_timeouts[static_cast<int>(node.info.role)]->Increment();
  UpdateLiveGauges();
  if (phase_ == Phase::kRendezvous) return;
  const wire::NodeInfo info = node.info;
  Broadcast([&] { return wire::MakeNodeDead(sender(), info, why, failure); });
  std::vector<BarrierKey> broken;
  for (const auto& kv : barriers_) {
    if (InGroup(node, kv.first.group)) broken.push_back(kv.first);
  }
  for (const BarrierKey& k : broken) {
    const MsgType type = gather_parts_.count(k) ? MsgType::Gather : MsgType::Barrier;
    for (const std::string& id : barriers_[k]) {
      ReplyError(
          id, ErrorCode::PeerDead,
          "barrier " + std::to_string(k.id) + " cannot complete: " + info.Name() + " is dead",
          type);
    }
    DropBarrier(k);
  }
}

void Scheduler::FailJob(const std::string& why) {
  GS_LOG(ERROR) << "job failed: " << why;
  Broadcast([&] { return wire::MakeJobState(sender(), wire::JobPhase::Failed, why); });
  result_ = FailedPreconditionError(why);
  phase_ = Phase::kDone;
}

// Posted: a node that does not read never holds up the scheduler's loop
// (and with it every other node's heartbeats).
void Scheduler::Reply(const std::string& identity, wire::Message msg) {
  transport_->Post(wire::Route::Inbound(identity), std::move(msg),
                   Deadline::After(options_.heartbeat_interval),
                   LogSendFailure(reply_failures_, identity, "answer"));
}

// Only registered nodes (dead or gone included: they were told the job id)
// learn the job id from an Error; anyone else gets job id 0.
void Scheduler::ReplyError(const std::string& identity, ErrorCode code, const std::string& text,
                           MsgType in_reply_to) {
  const bool member = nodes_.count(identity) > 0;
  Reply(identity, wire::MakeError(wire::AnswerAs(sender(), member), code, text, in_reply_to));
}

void Scheduler::Refuse(const std::string& identity, ErrorCode code, const std::string& text,
                       MsgType in_reply_to, bool answer) {
  if (metrics_) metrics_->rejected.Count(code);
  uint64_t left_out = 0;
  if (refusal_log_.Admit(identity, wire::ErrorCodeLabel(code), &left_out)) {
    GS_LOG(WARNING) << "refused a message from '" << wire::Escaped(identity, 64) << "' ("
                    << wire::ErrorCodeLabel(code) << "): " << wire::Escaped(text)
                    << LeftOutNote(left_out);
  }
  if (answer) ReplyError(identity, code, text, in_reply_to);
}

void Scheduler::Broadcast(const std::function<wire::Message()>& make) {
  for (const std::string& id : order_) {
    const Node& n = nodes_[id];
    if (n.alive && !n.left) Reply(id, make());
  }
}

int Scheduler::Count(Role role) const {
  int c = 0;
  for (const auto& [id, n] : nodes_) c += n.info.role == role;
  return c;
}

void Scheduler::UpdateLiveGauges() {
  if (!metrics_) return;
  for (Role role : {Role::Worker, Role::Server}) {
    int live = 0;
    for (const auto& [id, n] : nodes_) live += n.info.role == role && n.alive && !n.left;
    metrics_->live_nodes[static_cast<int>(role)]->Set(live);
  }
}

}  // namespace gradsync::server
