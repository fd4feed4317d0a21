#include "cluster/node_agent.h"

#include <unistd.h>

#include <set>

#include "common/logging.h"
#include "common/refusal_log.h"
#include "common/version.h"
#include "wire/shm_link.h"

namespace gradsync::cluster {
namespace {

using wire::MsgType;

constexpr uint32_t kDefaultMissedHeartbeats = 6;
constexpr Millis kProbeTimeout{5000};

}  // namespace

StatusOr<NodeOptions> NodeOptions::FromConfig(const Config& config) {
  NodeOptions o;
  GS_ASSIGN_OR_RETURN(o.scheduler, config.GetString("scheduler", ""));
  if (o.scheduler.empty()) {
    return InvalidArgumentError(
        "no scheduler address: set GRADSYNC_SCHEDULER=host:port or "
        "--scheduler=host:port");
  }
  if (o.scheduler.find(':') == std::string::npos) {
    return InvalidArgumentError("scheduler address '" + o.scheduler +
                                "' has no port (want host:port)");
  }
  GS_ASSIGN_OR_RETURN(int64_t rank, config.GetInt("rank", -1));
  GS_ASSIGN_OR_RETURN(int64_t workers, config.GetInt("num_workers", -1));
  GS_ASSIGN_OR_RETURN(int64_t servers, config.GetInt("num_servers", -1));
  GS_ASSIGN_OR_RETURN(o.host, config.GetString("host", "127.0.0.1"));
  GS_ASSIGN_OR_RETURN(int64_t connect_ms, config.GetInt("connect_timeout_ms", 10000));
  GS_ASSIGN_OR_RETURN(int64_t rendezvous_ms, config.GetInt("rendezvous_timeout_ms", 120000));
  GS_ASSIGN_OR_RETURN(int64_t heartbeat_ms, config.GetInt("heartbeat_ms", 500));
  if (heartbeat_ms <= 0) return InvalidArgumentError("heartbeat_ms must be positive");
  GS_ASSIGN_OR_RETURN(int64_t scheduler_grace_ms, config.GetInt("scheduler_grace_ms", 0));
  if (scheduler_grace_ms < 0)
    return InvalidArgumentError("scheduler_grace_ms must not be negative");
  o.scheduler_grace = Millis(scheduler_grace_ms);
  o.rank = static_cast<int32_t>(rank);
  o.num_workers = static_cast<int32_t>(workers);
  o.num_servers = static_cast<int32_t>(servers);
  o.connect_timeout = Millis(connect_ms);
  o.rendezvous_timeout = Millis(rendezvous_ms);
  o.heartbeat_interval = Millis(heartbeat_ms);
  return o;
}

NodeAgent::NodeAgent(const NodeOptions& options, std::unique_ptr<wire::Transport> transport)
    : options_(options), transport_(std::move(transport)) {
  scheduler_endpoint_ = "tcp://" + options_.scheduler;
  policy_ = wire::Policy::Accepting({MsgType::RankAssignment, MsgType::Heartbeat,
                                     MsgType::BarrierRelease, MsgType::Error, MsgType::NodeDead,
                                     MsgType::JobState, MsgType::NcclId, MsgType::Gathered});
  assignment_.self.role = options_.role;
  assignment_.self.rank = options_.rank;
  assignment_.self.host = options_.host;
  assignment_.self.data_port = options_.data_port;
  assignment_.self.metrics_port = options_.metrics_port;
  assignment_.self.identity = options_.identity;
  assignment_.self.boot_id = wire::BootId();
  assignment_.self.public_key = options_.public_key;
  assignment_.self.stream_port = options_.stream_port;
  assignment_.heartbeat_interval = options_.heartbeat_interval;
  assignment_.missed_heartbeats = kDefaultMissedHeartbeats;
  last_heard_ = std::chrono::steady_clock::now();
}

StatusOr<std::unique_ptr<NodeAgent>> NodeAgent::Join(const NodeOptions& options,
                                                     std::unique_ptr<wire::Transport> transport,
                                                     Deadline deadline) {
  std::unique_ptr<NodeAgent> agent(new NodeAgent(options, std::move(transport)));
  GS_RETURN_IF_ERROR(agent->Register(deadline));
  GS_RETURN_IF_ERROR(
      agent->AwaitAssignment(deadline.Min(Deadline::After(options.rendezvous_timeout))));
  agent->thread_ = std::thread([a = agent.get()] { a->Run(); });
  return agent;
}

NodeAgent::~NodeAgent() {
  Leave("exit");
  transport_->Shutdown();
}

wire::Sender NodeAgent::sender() const {
  return wire::Sender{assignment_.self.role, assignment_.self.rank, assignment_.job_id};
}

Status NodeAgent::Register(Deadline deadline) {
  Status reach = transport_->Probe(scheduler_endpoint_,
                                   deadline.Min(Deadline::After(options_.connect_timeout)));
  if (!reach.ok()) {
    return UnavailableError("cannot reach the scheduler at " + options_.scheduler +
                            " (GRADSYNC_SCHEDULER): " + reach.message());
  }
  GS_ASSIGN_OR_RETURN(scheduler_conn_, transport_->Connect(scheduler_endpoint_));
  uint32_t version = options_.protocol_version ? options_.protocol_version : kProtocolVersion;
  std::string build = options_.build_id.empty() ? kBuildId : options_.build_id;
  return Send(
      wire::MakeRegister(sender(), assignment_.self, build, static_cast<uint32_t>(getpid()),
                         version, options_.num_workers, options_.num_servers, wire::PidNamespace(),
                         options_.prove ? options_.prove(assignment_.self) : ""),
      deadline);
}

void NodeAgent::LogRejected(const wire::Verdict& v) {
  uint64_t left_out = 0;
  if (refusal_log_.Admit("scheduler", wire::ErrorCodeLabel(v.code), &left_out)) {
    GS_LOG(WARNING) << "rejected a message from the scheduler: " << wire::Escaped(v.detail)
                    << LeftOutNote(left_out);
  }
}

std::string NodeAgent::ImpossibleAssignment(const wire::RankAssignmentBody& a) const {
  constexpr int32_t kMaxNodes = 4096;
  const int32_t workers = a.num_workers(), servers = a.num_servers();
  if (workers < 1 || workers > kMaxNodes || servers < 0 || servers > kMaxNodes) {
    return std::to_string(workers) + " workers and " + std::to_string(servers) + " servers";
  }
  // A later epoch of an elastic job has other workers, re-ranked.
  const bool later_epoch = a.epoch() > 0;
  if ((options_.num_workers >= 0 && workers != options_.num_workers && !later_epoch) ||
      (options_.num_servers >= 0 && servers != options_.num_servers)) {
    return "a job of " + std::to_string(workers) + " workers and " + std::to_string(servers) +
           " servers, this node expects " + std::to_string(options_.num_workers) + " and " +
           std::to_string(options_.num_servers);
  }
  const int32_t of_role = options_.role == wire::Role::Worker ? workers : servers;
  if (a.rank() < 0 || a.rank() >= of_role ||
      (options_.rank >= 0 && a.rank() != options_.rank && !later_epoch)) {
    return "rank " + std::to_string(a.rank()) + " of " + std::to_string(of_role);
  }
  if (a.heartbeat_interval_ms() < 1 || a.heartbeat_interval_ms() > 600000 ||
      a.missed_heartbeats() < 1 || a.missed_heartbeats() > 1000) {
    return "heartbeats every " + std::to_string(a.heartbeat_interval_ms()) + " ms, " +
           std::to_string(a.missed_heartbeats()) + " missed allowed";
  }
  const size_t n = a.peers() ? a.peers()->size() : 0;
  if (n != static_cast<size_t>(workers) + static_cast<size_t>(servers)) {
    return std::to_string(n) + " peers for " + std::to_string(workers + servers) + " nodes";
  }
  std::set<std::pair<wire::Role, int32_t>> seen;
  for (const wire::NodeAddress* p : *a.peers()) {
    const int32_t limit = p->role() == wire::Role::Worker   ? workers
                          : p->role() == wire::Role::Server ? servers
                                                            : 0;
    if (p->rank() < 0 || p->rank() >= limit || p->host() == nullptr ||
        !seen.insert({p->role(), p->rank()}).second) {
      return "a peer list naming " + std::string(wire::RoleName(p->role())) + " " +
             std::to_string(p->rank()) + " out of place";
    }
  }
  return "";
}

Status NodeAgent::AwaitAssignment(Deadline deadline) {
  SteadyTime next_beat = std::chrono::steady_clock::now();
  for (;;) {
    if (std::chrono::steady_clock::now() >= next_beat) {
      Send(wire::MakeHeartbeat(sender()), deadline).IgnoreError();
      next_beat += options_.heartbeat_interval;
    }
    auto in = transport_->Receive(deadline.Min(Deadline::At(next_beat)));
    if (!in.ok()) {
      if (in.status().code() == StatusCode::kDeadlineExceeded && !deadline.Expired()) continue;
      if (in.status().code() != StatusCode::kDeadlineExceeded) return in.status();
      return DeadlineExceededError(
          "no rank assignment from the scheduler at " + options_.scheduler +
          " before the deadline: the job has not assembled (are all workers and servers "
          "started with the same GRADSYNC_NUM_WORKERS / GRADSYNC_NUM_SERVERS?)");
    }
    wire::Verdict v = wire::Validate(in->message, policy_);
    if (!v.ok()) {
      LogRejected(v);
      continue;
    }
    if (v.header->type() == MsgType::Error) {
      const auto* e = v.header->body_as_ErrorBody();
      return FailedPreconditionError("the scheduler at " + options_.scheduler +
                                     " refused this node: " + wire::Escaped(e->message()));
    }
    if (v.header->type() == MsgType::JobState) {
      return FailedPreconditionError("job failed before it started: " +
                                     wire::Escaped(v.header->body_as_JobStateBody()->message()));
    }
    if (v.header->type() != MsgType::RankAssignment) continue;
    const auto* a = v.header->body_as_RankAssignmentBody();
    const std::string impossible = ImpossibleAssignment(*a);
    if (!impossible.empty()) {
      GS_LOG(WARNING) << "refused a rank assignment: " << impossible;
      continue;
    }
    assignment_ = ReadAssignment(v.header->job_id(), *a);
    policy_.job_id = assignment_.job_id;
    std::lock_guard<std::mutex> lock(mu_);
    latest_ = assignment_;
    last_heard_ = std::chrono::steady_clock::now();
    return OkStatus();
  }
}

Assignment NodeAgent::ReadAssignment(uint64_t job_id, const wire::RankAssignmentBody& a) const {
  Assignment out = assignment_;
  out.job_id = job_id;
  out.self.rank = a.rank();
  out.num_workers = a.num_workers();
  out.num_servers = a.num_servers();
  out.heartbeat_interval = Millis(a.heartbeat_interval_ms());
  out.missed_heartbeats = a.missed_heartbeats();
  out.peers.clear();
  for (const wire::NodeAddress* p : *a.peers()) out.peers.push_back(wire::ToNodeInfo(*p));
  // The scheduler gave this node its data identity (ImpossibleAssignment
  // checked that the peers name it).
  for (const wire::NodeInfo& p : out.peers) {
    if (p.role == out.self.role && p.rank == out.self.rank) out.self.identity = p.identity;
  }
  out.epoch = a.epoch();
  out.change = wire::Escaped(a.change(), 1024);
  out.elastic = a.elastic();
  return out;
}

// Called under mu_.
void NodeAgent::OnEpoch(const wire::Header& h) {
  const auto* a = h.body_as_RankAssignmentBody();
  const std::string impossible = ImpossibleAssignment(*a);
  if (!impossible.empty() || !latest_.elastic || a->epoch() <= latest_.epoch) {
    GS_LOG(WARNING) << "refused a rank assignment for epoch " << a->epoch() << " (at epoch "
                    << latest_.epoch << "): "
                    << (impossible.empty() ? "not a later epoch of an elastic job" : impossible);
    return;
  }
  latest_ = ReadAssignment(h.job_id(), *a);
  // Barrier counts of past epochs are never read again (Barrier refuses
  // calls of an epoch behind the latest).
  for (auto it = barrier_called_.begin(); it != barrier_called_.end();) {
    it = it->first.second < latest_.epoch ? barrier_called_.erase(it) : std::next(it);
  }
  for (auto it = barrier_released_.begin(); it != barrier_released_.end();) {
    it = it->first.second < latest_.epoch ? barrier_released_.erase(it) : std::next(it);
  }
  for (const EpochCallback& cb : epoch_callbacks_) cb(latest_);
  if (latest_.self.role == wire::Role::Worker) {
    GS_LOG(WARNING) << "epoch " << latest_.epoch << ": now worker " << latest_.self.rank << " of "
                    << latest_.num_workers << " (" << latest_.change << ")";
  } else {
    GS_LOG(WARNING) << "epoch " << latest_.epoch << ": the job has " << latest_.num_workers
                    << " workers (" << latest_.change << ")";
  }
}

uint32_t NodeAgent::latest_epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_.epoch;
}

Assignment NodeAgent::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

Status NodeAgent::EpochBarrier(uint32_t epoch, Deadline deadline) {
  GS_RETURN_IF_ERROR(Send(wire::MakeBarrier(sender(), MsgType::Barrier, wire::kMembershipBarrier,
                                            wire::Group::Workers, epoch),
                          deadline));
  std::unique_lock<std::mutex> lock(mu_);
  GS_RETURN_IF_ERROR(WaitFor(
      lock, deadline, [&] { return epoch_released_ >= epoch || latest_.epoch > epoch; },
      "every worker of epoch " + std::to_string(epoch)));
  if (latest_.epoch > epoch) return MembershipChangedError(latest_.change);
  return OkStatus();
}

Status NodeAgent::Send(wire::Message msg, Deadline deadline) {
  return transport_->Send(wire::Route::Connection(scheduler_conn_), std::move(msg), deadline);
}

void NodeAgent::Run() {
  const Millis interval = assignment_.heartbeat_interval;
  const Millis silence_limit = interval * assignment_.missed_heartbeats + options_.scheduler_grace;
  SteadyTime next_beat = std::chrono::steady_clock::now();
  for (;;) {
    bool silent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      silent = job_status_.ok() && std::chrono::steady_clock::now() - last_heard_ > silence_limit;
    }
    // What the scheduler sent while this thread was held up (a loaded
    // machine) is read before its silence is judged: a shutdown it sent
    // last is not mistaken for its death.
    auto in = transport_->Receive(silent ? Deadline::After(Millis(0)) : Deadline::At(next_beat));
    if (silent && !in.ok() && in.status().code() != StatusCode::kCancelled) {
      std::lock_guard<std::mutex> lock(mu_);
      FailJob(UnavailableError("the scheduler at " + options_.scheduler +
                               " stopped answering (silent for more than " +
                               FormatSeconds(silence_limit) + ")"));
      cv_.notify_all();
    }
    if (std::chrono::steady_clock::now() >= next_beat) {
      Send(wire::MakeHeartbeat(sender()), Deadline::After(interval)).IgnoreError();
      next_beat += interval;
    }
    if (!in.ok()) {
      if (in.status().code() == StatusCode::kCancelled) return;
      continue;
    }
    wire::Verdict v = wire::Validate(in->message, policy_);
    if (!v.ok()) {
      LogRejected(v);
      if (v.ShouldAnswer()) {
        Send(wire::MakeError(sender(), v.code, v.detail, v.type), Deadline::After(interval))
            .IgnoreError();
      }
      continue;
    }
    Dispatch(*v.header);
  }
}

void NodeAgent::Dispatch(const wire::Header& h) {
  std::vector<DeadCallback> callbacks;
  wire::NodeInfo dead;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_heard_ = std::chrono::steady_clock::now();
    switch (h.type()) {
      case MsgType::BarrierRelease: {
        const auto* b = h.body_as_BarrierBody();
        if (b->barrier_id() == wire::kMembershipBarrier) {
          if (h.epoch() <= latest_.epoch) epoch_released_ = std::max(epoch_released_, h.epoch());
          break;
        }
        if (h.epoch() < latest_.epoch) break;  // of an epoch that ended
        uint64_t& released = barrier_released_[{b->group(), h.epoch()}];
        released = std::max(released, b->barrier_id());
        break;
      }
      case MsgType::Error:
        HandleError(*h.body_as_ErrorBody());
        break;
      case MsgType::NodeDead: {
        const auto* d = h.body_as_NodeDeadBody();
        dead.role = d->role();
        dead.rank = d->rank();
        why = d->reason() ? d->reason()->str() : "";
        dead_.push_back({dead, why, d->failure()});
        callbacks = dead_callbacks_;
        GS_LOG(WARNING) << "scheduler reports " << dead.Name() << " dead: " << why;
        break;
      }
      case MsgType::JobState: {
        const auto* j = h.body_as_JobStateBody();
        std::string text = j->message() ? j->message()->str() : "";
        if (j->phase() == wire::JobPhase::Ready) ready_ = true;
        if (j->phase() == wire::JobPhase::Failed)
          FailJob(FailedPreconditionError("job failed: " + text));
        if (j->phase() == wire::JobPhase::Shutdown) FailJob(AbortedError("job shut down: " + text));
        break;
      }
      case MsgType::RankAssignment:
        OnEpoch(h);
        break;
      case MsgType::Gathered: {
        const auto* g = h.body_as_GatherBody();
        const std::pair<uint32_t, uint64_t> at{h.epoch(), g->barrier_id()};
        if (at > gathered_at_) {
          gathered_at_ = at;
          gathered_ = wire::ReadGathered(*g);
        }
        break;
      }
      case MsgType::NcclId: {
        const auto* id = h.body_as_NcclIdBody()->id();
        nccl_id_ = std::vector<uint8_t>(id->begin(), id->end());
        break;
      }
      default:
        break;  // heartbeat acknowledgements only refresh last_heard_
    }
    cv_.notify_all();
  }
  for (auto& cb : callbacks) cb(dead, why);
}

void NodeAgent::HandleError(const wire::ErrorBody& e) {
  std::string text = e.message() ? e.message()->str() : "";
  if (e.in_reply_to() == MsgType::Barrier || e.in_reply_to() == MsgType::Gather) {
    barrier_error_ = AbortedError("barrier failed: " + text);
    return;
  }
  if (e.in_reply_to() == MsgType::NcclIdRequest || e.in_reply_to() == MsgType::NcclIdOffer) {
    FailJob(FailedPreconditionError("NCCL id exchange failed: " + text));
    return;
  }
  GS_LOG(ERROR) << "scheduler error (" << wire::ErrorCodeLabel(e.code()) << ", in reply to "
                << wire::MsgTypeName(e.in_reply_to()) << "): " << text;
  if (e.code() == wire::ErrorCode::NotRegistered || e.code() == wire::ErrorCode::Unreachable ||
      e.code() == wire::ErrorCode::ShuttingDown) {
    FailJob(FailedPreconditionError(text));
  }
}

void NodeAgent::FailJob(Status why) {
  if (job_status_.ok()) job_status_ = std::move(why);
}

Status NodeAgent::WaitFor(std::unique_lock<std::mutex>& lock, Deadline deadline,
                          const std::function<bool()>& done, const std::string& what) {
  cv_.wait_until(lock, deadline.at(), [&] { return done() || !job_status_.ok(); });
  if (done()) return OkStatus();
  if (!job_status_.ok()) return job_status_;
  return DeadlineExceededError("timed out waiting for " + what);
}

Status NodeAgent::CheckReachability(const std::vector<wire::NodeInfo>& peers, Deadline deadline) {
  std::vector<wire::ReachOutcome> outcomes;
  for (const wire::NodeInfo& peer : peers) {
    Status s = transport_->Probe(peer.DataEndpoint(), deadline.Min(Deadline::After(kProbeTimeout)));
    outcomes.push_back({peer, s.ok(), s.ok() ? "" : s.message()});
    if (!s.ok()) GS_LOG(ERROR) << "cannot reach " << peer.Name() << ": " << s.message();
  }
  GS_RETURN_IF_ERROR(Send(wire::MakeReachReport(sender(), outcomes), deadline));
  std::unique_lock<std::mutex> lock(mu_);
  return WaitFor(
      lock, deadline, [this] { return ready_; },
      "the scheduler to confirm that every node reaches its peers");
}

StatusOr<uint64_t> NodeAgent::NextBarrierId(wire::Group group, uint32_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (latest_.epoch > epoch) return MembershipChangedError(latest_.change);
  return ++barrier_called_[{group, epoch}];
}

Status NodeAgent::WaitForBarrier(wire::Group group, uint32_t epoch, uint64_t id,
                                 const std::function<bool()>& released, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto done = [&] { return released() || !barrier_error_.ok() || latest_.epoch > epoch; };
  GS_RETURN_IF_ERROR(WaitFor(lock, deadline, done,
                             "barrier " + std::to_string(id) + " of epoch " +
                                 std::to_string(epoch) + " of " + wire::EnumNameGroup(group)));
  if (released()) return OkStatus();
  if (latest_.epoch > epoch) return MembershipChangedError(latest_.change);
  Status error = barrier_error_;
  barrier_error_ = OkStatus();
  return error;
}

Status NodeAgent::Barrier(wire::Group group, uint32_t epoch, Deadline deadline) {
  GS_ASSIGN_OR_RETURN(const uint64_t id, NextBarrierId(group, epoch));
  GS_RETURN_IF_ERROR(
      Send(wire::MakeBarrier(sender(), MsgType::Barrier, id, group, epoch), deadline));
  // Called with mu_ held (WaitForBarrier).
  return WaitForBarrier(
      group, epoch, id,
      [&] {
        return barrier_released_[{group, epoch}] >= id;
      },
      deadline);
}

StatusOr<std::vector<wire::GatherPartFields>> NodeAgent::Gather(uint32_t epoch,
                                                                const wire::GatherPartFields& mine,
                                                                Deadline deadline) {
  GS_ASSIGN_OR_RETURN(const uint64_t id, NextBarrierId(wire::Group::Workers, epoch));
  GS_RETURN_IF_ERROR(Send(wire::MakeGather(sender(), id, mine, epoch), deadline));
  const std::pair<uint32_t, uint64_t> at{epoch, id};
  GS_RETURN_IF_ERROR(WaitForBarrier(
      wire::Group::Workers, epoch, id, [&] { return gathered_at_ >= at; }, deadline));
  std::lock_guard<std::mutex> lock(mu_);
  if (gathered_at_ != at) {
    return AbortedError("gather " + std::to_string(id) + " was overtaken by a later one");
  }
  return gathered_;
}

StatusOr<std::vector<uint8_t>> NodeAgent::ShareNcclId(std::optional<std::vector<uint8_t>> mine,
                                                      Deadline deadline) {
  if (mine) {
    GS_RETURN_IF_ERROR(Send(wire::MakeNcclId(sender(), MsgType::NcclIdOffer, *mine), deadline));
    return *mine;
  }
  GS_RETURN_IF_ERROR(Send(wire::MakeNcclId(sender(), MsgType::NcclIdRequest, {}), deadline));
  std::unique_lock<std::mutex> lock(mu_);
  GS_RETURN_IF_ERROR(WaitFor(
      lock, deadline, [this] { return nccl_id_.has_value(); }, "the NCCL unique id from worker 0"));
  return *nccl_id_;
}

Status NodeAgent::job_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return job_status_;
}

Status NodeAgent::WaitForJobEnd(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline.at(), [this] { return !job_status_.ok(); });
  return job_status_;
}

std::vector<wire::NodeInfo> NodeAgent::dead_peers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<wire::NodeInfo> nodes;
  for (const Death& d : dead_) nodes.push_back(d.node);
  return nodes;
}

Status NodeAgent::PeerDeathStatus(wire::Role role) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Death& d : dead_) {
    if (d.node.role != role) continue;
    return wire::FailureStatus(
        d.failure == wire::ErrorCode::Unknown ? wire::ErrorCode::PeerDead : d.failure,
        d.node.Name() + " died (declared dead by the scheduler: " + d.why + ")");
  }
  return Status();
}

void NodeAgent::OnNewEpoch(EpochCallback callback) {
  std::lock_guard<std::mutex> lock(mu_);
  epoch_callbacks_.push_back(std::move(callback));
}

void NodeAgent::OnPeerDead(DeadCallback callback) {
  std::lock_guard<std::mutex> lock(mu_);
  dead_callbacks_.push_back(std::move(callback));
}

void NodeAgent::Leave(const std::string& reason, bool departing, wire::ErrorCode failure) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (left_) return;
    left_ = true;
  }
  Send(wire::MakeLeave(sender(), reason, departing, failure), Deadline::AfterMs(1000))
      .IgnoreError();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    FailJob(CancelledError("this node left the job: " + reason));
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace gradsync::cluster
