// The Scheduler assembling a job: registrations (checked, ranked, a
// restarted node's claim on its old identity) and the reachability reports
// that make the job ready.
#include <algorithm>
#include <random>

#include "common/logging.h"
#include "common/version.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_text.h"
#include "wire/curve.h"
#include "wire/node_keys.h"

namespace gradsync::server {

using wire::ErrorCode;
using wire::MsgType;
using wire::Role;

namespace {

uint64_t NewJobId() {
  std::random_device rd;
  uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return id == 0 ? 1 : id;
}

}  // namespace

std::optional<Scheduler::Refusal> Scheduler::CheckRegistration(const wire::RegisterBody& r,
                                                               std::string* replaces) const {
  std::string build = r.build_id() ? r.build_id()->str() : "";
  if (build != kBuildId) {
    return Refusal{ErrorCode::WrongBuild,
                   "build mismatch: peer is '" + build + "', scheduler is '" + kBuildId + "'"};
  }
  const char* role = wire::RoleName(r.role());
  if ((r.num_workers() >= 0 && r.num_workers() != options_.num_workers) ||
      (r.num_servers() >= 0 && r.num_servers() != options_.num_servers)) {
    return Refusal{ErrorCode::WrongJob, std::string("job size mismatch: this ") + role +
                                            " expects " + std::to_string(r.num_workers()) +
                                            " workers and " + std::to_string(r.num_servers()) +
                                            " servers, the scheduler expects " +
                                            std::to_string(options_.num_workers) + " and " +
                                            std::to_string(options_.num_servers)};
  }
  if (phase_ == Phase::kRunning && r.role() == Role::Server) return CheckRejoin(r, replaces);
  if (phase_ == Phase::kRunning && membership_.elastic()) return std::nullopt;  // a joiner
  if (phase_ != Phase::kRendezvous) {
    return Refusal{ErrorCode::JobFull, "the job has already assembled; no more nodes are accepted"};
  }
  const int expected = r.role() == Role::Worker ? options_.num_workers : options_.num_servers;
  if (Count(r.role()) >= expected) {
    return Refusal{ErrorCode::JobFull,
                   "the job already has all " + std::to_string(expected) + " " + role + "s"};
  }
  if (r.requested_rank() >= expected) {
    return Refusal{ErrorCode::BadSender,
                   std::string(role) + " rank " + std::to_string(r.requested_rank()) +
                       " is out of range (the job has " + std::to_string(expected) + ")"};
  }
  for (const auto& [id, n] : nodes_) {
    if (n.info.role == r.role() && r.requested_rank() >= 0 && n.info.rank == r.requested_rank()) {
      return Refusal{ErrorCode::RankTaken, std::string(role) + " rank " +
                                               std::to_string(r.requested_rank()) +
                                               " is already taken by pid " + std::to_string(n.pid) +
                                               " on " + n.info.host};
    }
  }
  return std::nullopt;
}

std::optional<Scheduler::Refusal> Scheduler::CheckNodeKey(const wire::RegisterBody& r,
                                                          const std::string& replaces) const {
  if (!options_.curve) return std::nullopt;
  const std::string key = r.public_key() ? r.public_key()->str() : "";
  if (!wire::IsCurvePublicKey(key)) {
    return Refusal{ErrorCode::WrongKey,
                   "a node of a CURVE job registers with its own public key (40 Z85 characters)"};
  }
  const std::string proof =
      r.key_proof()
          ? std::string(reinterpret_cast<const char*>(r.key_proof()->data()), r.key_proof()->size())
          : "";
  StatusOr<wire::CurveKey> serving = wire::SchedulerServerKey(*options_.curve);
  if (!serving.ok() ||
      !wire::CheckRegistrationProof(serving->secret_z85, wire::RegisteredNode(r), proof)) {
    return Refusal{ErrorCode::WrongKey,
                   "the registration does not prove that the node holds the secret key of the "
                   "public key it registers with"};
  }
  if (!replaces.empty()) {
    const Node& old = nodes_.at(replaces);
    if (old.info.public_key == key) return std::nullopt;
    return Refusal{ErrorCode::WrongKey,
                   old.info.Name() +
                       " registered with another node key: a restarted server "
                       "proves it is the same one with the key it kept (in its checkpoint_dir, "
                       "or node_key_file)"};
  }
  for (const auto& [id, n] : nodes_) {
    if (n.info.public_key == key) {
      return Refusal{ErrorCode::WrongKey, "that node key is already bound to " + n.info.Name()};
    }
  }
  return std::nullopt;
}

// No two live nodes share an endpoint: a plan binds each to one node's key.
std::optional<Scheduler::Refusal> Scheduler::CheckEndpoints(const wire::RegisterBody& r) const {
  const std::string host = r.host() ? r.host()->str() : "";
  const uint16_t ports[] = {r.data_port(), r.stream_port()};
  for (const auto& [id, n] : nodes_) {
    if (!n.alive || n.info.host != host) continue;
    for (const uint16_t port : ports) {
      if (port != 0 && (port == n.info.data_port || port == n.info.stream_port)) {
        return Refusal{ErrorCode::BadSender, host + ":" + std::to_string(port) +
                                                 " is already an endpoint of " + n.info.Name()};
      }
    }
  }
  return std::nullopt;
}

// A server of the running job restarted: it registers with the address the
// workers know it by.
std::optional<Scheduler::Refusal> Scheduler::CheckRejoin(const wire::RegisterBody& r,
                                                         std::string* replaces) const {
  const std::string host = r.host() ? r.host()->str() : "";
  const std::string address = host + ":" + std::to_string(r.data_port());
  for (const auto& [id, n] : nodes_) {
    if (n.info.role != Role::Server) continue;
    const bool same_address = n.info.host == host && n.info.data_port == r.data_port();
    const bool same_rank = r.requested_rank() == n.info.rank;
    const std::string known = n.info.host + ":" + std::to_string(n.info.data_port);
    if (!same_address && same_rank) {
      return Refusal{ErrorCode::BadSender, n.info.Name() + " can only rejoin at " + known +
                                               ", where the workers "
                                               "reach it (start it there with --data_port=" +
                                               std::to_string(n.info.data_port) + "), not at " +
                                               address};
    }
    if (!same_address) continue;
    if (r.requested_rank() >= 0 && !same_rank) {
      return Refusal{ErrorCode::RankTaken, address + " is the address of " + n.info.Name() +
                                               ", not of server " +
                                               std::to_string(r.requested_rank())};
    }
    if (!n.alive) {
      return Refusal{ErrorCode::PeerDead, n.info.Name() +
                                              " was declared dead and the workers "
                                              "were told; the job cannot take it back"};
    }
    *replaces = id;
    return std::nullopt;
  }
  return Refusal{ErrorCode::JobFull,
                 "the job has already assembled; no more nodes are accepted (a restarted "
                 "server rejoins with the host and data port it first had, " +
                     address + " is not one of them)"};
}

std::string Scheduler::MintIdentity(Role role) {
  for (;;) {
    std::string id = wire::RandomIdentity(role == Role::Server ? "server" : "worker");
    bool taken = false;
    for (const auto& [conn, n] : nodes_) taken = taken || n.info.identity == id;
    for (const auto& [conn, n] : waiting_joiners_) taken = taken || n.info.identity == id;
    if (!taken) return id;
  }
}

void Scheduler::OnRegister(const std::string& identity, const wire::RegisterBody& r) {
  const std::string key = r.public_key() ? r.public_key()->str() : "";
  auto known = nodes_.find(identity);
  if (known != nodes_.end() && known->second.info.public_key != key) {
    Refuse(identity, ErrorCode::WrongKey,
           known->second.info.Name() + " registered with another node key", MsgType::Register);
    return;
  }
  if (known != nodes_.end() || rejoins_.count(identity) || waiting_joiners_.count(identity)) {
    return;  // a resent registration
  }
  std::string replaces;
  std::optional<Refusal> refusal;
  const std::string data_identity = r.identity() ? r.identity()->str() : "";
  if (!data_identity.empty() && !wire::IsDataIdentity(data_identity)) {
    // Derived identities ("<identity>/ps<epoch>", lanes, pairs) are made
    // from a node's data identity; none may be registered as one.
    refusal = Refusal{ErrorCode::BadSender,
                      "a data identity is 1 to 64 letters, digits, '.', '_' or '-' (derived "
                      "identities such as '<identity>/ps<epoch>' are not registered)"};
  }
  if (!refusal) refusal = CheckRegistration(r, &replaces);
  if (!refusal && replaces.empty()) refusal = CheckEndpoints(r);
  if (!refusal) refusal = CheckNodeKey(r, replaces);
  if (refusal) {
    Refuse(identity, refusal->code, refusal->text, MsgType::Register);
    return;
  }
  if (!replaces.empty()) {
    ClaimRejoin(replaces, identity, r);
    return;
  }
  Node node;
  node.identity = identity;
  node.info = wire::RegisteredNode(r);
  // The node's data identity is the scheduler's to give, in one grammar
  // (wire::IsDataIdentity): what the node asked for is not taken, and the
  // derived identities (PS clients, lanes, pairs, probes) are made from
  // this one.
  node.info.identity = MintIdentity(node.info.role);
  node.pid = r.pid();
  node.pid_ns = r.pid_ns() ? r.pid_ns()->str() : "";
  node.last_seen = clock_->Now();
  if (phase_ == Phase::kRunning) {
    OnJoinRequest(std::move(node));
    return;
  }
  nodes_[identity] = node;
  WatchProcess(node);
  order_.push_back(identity);
  if (metrics_) metrics_->registrations->Increment();
  UpdateLiveGauges();
  GS_LOG(INFO) << "registered a " << wire::RoleName(r.role()) << " (pid " << r.pid() << " on "
               << PeerText(node.info.host) << ":" << node.info.data_port
               << "): " << Count(Role::Worker) << "/" << options_.num_workers << " workers, "
               << Count(Role::Server) << "/" << options_.num_servers << " servers (requested rank "
               << node.info.rank << ", data identity " << PeerText(node.info.identity) << ")";
  if (Count(Role::Worker) == options_.num_workers && Count(Role::Server) == options_.num_servers) {
    AssignRanks();
  }
}

void Scheduler::AssignRanks() {
  job_id_ = NewJobId();
  policy_.job_id = job_id_;
  for (Role role : {Role::Worker, Role::Server}) {
    std::set<int> taken;
    for (const auto& id : order_) {
      if (nodes_[id].info.role == role && nodes_[id].info.rank >= 0)
        taken.insert(nodes_[id].info.rank);
    }
    int next = 0;
    for (const auto& id : order_) {
      Node& n = nodes_[id];
      if (n.info.role != role || n.info.rank >= 0) continue;
      while (taken.count(next)) ++next;
      n.info.rank = next++;
    }
  }
  for (const auto& id : order_) SendAssignment(id);
  phase_ = Phase::kReachability;
  reach_started_ = clock_->Now();
  GS_LOG(INFO) << "job " << job_id_ << " assembled: " << options_.num_workers << " workers, "
               << options_.num_servers << " servers; waiting for reachability reports";
}

void Scheduler::SendAssignment(const std::string& identity) {
  std::vector<wire::NodeInfo> peers;
  for (const auto& id : order_) {
    if (!nodes_[id].removed) peers.push_back(nodes_[id].info);
  }
  std::sort(peers.begin(), peers.end(), [](const wire::NodeInfo& a, const wire::NodeInfo& b) {
    return std::make_pair(a.role, a.rank) < std::make_pair(b.role, b.rank);
  });
  const auto heartbeat_ms = static_cast<uint32_t>(options_.heartbeat_interval.count());
  const wire::EpochFields epoch{membership_.epoch(), membership_.change(), membership_.elastic()};
  Reply(identity, wire::MakeRankAssignment(sender(), nodes_[identity].info.rank,
                                           membership_.world_size(), options_.num_servers, peers,
                                           heartbeat_ms, options_.missed_heartbeats, epoch));
}

// A claim to be a restarted server is taken at once when the old process
// left or has been silent for two heartbeat intervals. Otherwise it waits:
// a live server speaks again within an interval, and then the claim is
// refused; a dead one stays silent, and then the claim is taken (Tick).
void Scheduler::ClaimRejoin(const std::string& old_identity, const std::string& identity,
                            const wire::RegisterBody& r) {
  const Node& old = nodes_[old_identity];
  if (old.left || clock_->Now() - old.last_seen > 2 * options_.heartbeat_interval) {
    Rejoin(old_identity, identity,
           PendingRejoin{old_identity, r.pid(), r.metrics_port(),
                         r.boot_id() ? r.boot_id()->str() : ""});
    return;
  }
  for (const auto& [claimant, claim] : rejoins_) {
    if (claim.old_identity == old_identity && claimant != identity) {
      Refuse(identity, ErrorCode::RankTaken,
             "another process already claims to be " + old.info.Name() + " restarted",
             MsgType::Register);
      return;
    }
  }
  rejoins_[identity] =
      PendingRejoin{old_identity, r.pid(), r.metrics_port(), r.boot_id() ? r.boot_id()->str() : ""};
}

// The old process of a pending claim spoke: it is alive, the claim is false.
void Scheduler::RefuseClaimsOn(const Node& node) {
  for (auto it = rejoins_.begin(); it != rejoins_.end();) {
    if (it->second.old_identity != node.identity) {
      ++it;
      continue;
    }
    Refuse(it->first, ErrorCode::RankTaken,
           node.info.Name() + " at " + node.info.host + ":" + std::to_string(node.info.data_port) +
               " is alive; a restarted server takes its place only after the old process stopped",
           MsgType::Register);
    it = rejoins_.erase(it);
  }
}

void Scheduler::TakeSilentClaims() {
  for (auto it = rejoins_.begin(); it != rejoins_.end();) {
    const auto old = nodes_.find(it->second.old_identity);
    if (old == nodes_.end() || !old->second.alive) {  // declared dead meanwhile
      Refuse(it->first, ErrorCode::PeerDead, "the server it replaces was declared dead",
             MsgType::Register);
      it = rejoins_.erase(it);
    } else if (clock_->Now() - old->second.last_seen > 2 * options_.heartbeat_interval) {
      const PendingRejoin claim = it->second;
      const std::string identity = it->first;
      it = rejoins_.erase(it);
      Rejoin(claim.old_identity, identity, claim);
    } else {
      ++it;
    }
  }
}

// The new process takes the old one's place: same rank and address, so the
// peer list every node holds stays true.
void Scheduler::Rejoin(const std::string& old_identity, const std::string& identity,
                       const PendingRejoin& claim) {
  Node node = nodes_[old_identity];
  const uint32_t old_pid = node.pid;
  const std::string was =
      node.left ? "it had left" : "silent for " + FormatSeconds(clock_->Now() - node.last_seen);
  node.identity = identity;
  node.pid = claim.pid;
  node.info.metrics_port = claim.metrics_port;
  // A restarted server keeps the data identity the workers know it by.
  node.info.boot_id = claim.boot_id;
  node.last_seen = clock_->Now();
  node.left = node.missing = node.reported = false;
  nodes_.erase(old_identity);
  nodes_[identity] = node;
  std::replace(order_.begin(), order_.end(), old_identity, identity);
  for (auto& [key, waiting] : barriers_) waiting.erase(old_identity);
  for (auto& [key, parts] : gather_parts_) parts.erase(old_identity);
  if (metrics_) metrics_->registrations->Increment();
  UpdateLiveGauges();
  GS_LOG(INFO) << node.info.Name() << " rejoined the job: pid " << node.pid << " on "
               << PeerText(node.info.host) << ":" << node.info.data_port << " replaces pid "
               << old_pid << " (" << was << ")";
  SendAssignment(identity);
  for (const auto& [id, n] : nodes_) {
    if (!n.alive) {
      Reply(identity, wire::MakeNodeDead(sender(), n.info,
                                         "declared dead before " + node.info.Name() + " rejoined"));
    }
  }
}

void Scheduler::OnReachReport(Node& node, const wire::ReachReportBody& report) {
  if (node.reported) return;
  const bool rejoined = phase_ == Phase::kRunning;
  if (phase_ != Phase::kReachability && !rejoined) return;
  node.reported = true;
  if (report.results()) {
    for (const wire::ReachResult* r : *report.results()) {
      if (r->ok()) continue;
      wire::NodeInfo peer = wire::ToNodeInfo(*r->peer());
      unreachable_.push_back(node.info.Name() + " (" + PeerText(node.info.host) +
                             ") cannot reach " + peer.Name() + " at " +
                             PeerText(peer.DataEndpoint()) + ": " + PeerText(r->detail()));
    }
  }
  if (rejoined && node.info.role == Role::Worker && !unreachable_.empty()) {
    // A joiner that cannot reach its neighbours: refused, and out of the job.
    const std::string why = "cannot reach its peers: " + Join(unreachable_, "; ");
    unreachable_.clear();
    ReplyError(node.identity, ErrorCode::Unreachable, "this worker " + why, MsgType::ReachReport);
    RemoveWorker(node, why);
    return;
  }
  if (rejoined) {
    if (!unreachable_.empty()) {
      FailJob("nodes cannot reach their peers: " + Join(unreachable_, "; "));
    } else {
      Reply(node.identity, wire::MakeJobState(sender(), wire::JobPhase::Ready, "ready"));
    }
    return;
  }
  for (const auto& [id, n] : nodes_) {
    if (!n.reported) return;
  }
  FinishReachability("");
}

void Scheduler::FinishReachability(const std::string& timeout_note) {
  std::vector<std::string> problems = unreachable_;
  if (!timeout_note.empty()) problems.push_back(timeout_note);
  if (!problems.empty()) {
    FailJob("nodes cannot reach their peers: " + Join(problems, "; "));
    return;
  }
  phase_ = Phase::kRunning;
  GS_LOG(INFO) << "job " << job_id_ << " ready: every node reaches the peers it needs";
  Broadcast([&] { return wire::MakeJobState(sender(), wire::JobPhase::Ready, "ready"); });
}

}  // namespace gradsync::server
