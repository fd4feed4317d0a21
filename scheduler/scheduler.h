// The scheduler: rendezvous, barriers, heartbeats and membership of a job.
//
// Workers and servers register (wire Register); once the expected number of
// each has registered, every node gets its rank, the job id and the full peer
// list. Nodes then report whether they reach the peers they need; the job is
// declared Ready, or Failed with every pair that cannot connect named.
// While the job runs the scheduler answers heartbeats, releases barriers,
// passes worker 0's NCCL unique id to the other workers and declares a node
// dead, by role and rank, when it has been silent for
// heartbeat_interval x missed_heartbeats. Refusals (another protocol version
// or build, a rank taken, a full job, a malformed message) are answered with
// an Error naming what was wrong and counted.
//
// Server restarts: while the job runs, a server that registers with the host
// and data port of one of the job's servers replaces it once the old
// process is silent for two heartbeat intervals (the claim waits until
// then; if the old process speaks meanwhile it is alive, and the claim is
// refused with RankTaken); a requested rank, if any, must be that server's. The new process gets
// the same rank, the job id, the peer list and the nodes already dead, and is Ready once its
// reachability report is in; the workers' connections to that address reconnect to it. A silent
// server is given server_grace to come back this way before it is declared
// dead (0: declared dead at once, as any node). A server declared dead is
// not taken back.
//
// Elastic jobs (min_workers below num_workers; scheduler/membership.h): a
// worker declared dead while the job runs ends the membership epoch instead
// of the job. It is told to nobody as dead but the servers; the survivors
// get new assignments (epoch, dense rank, world size, peers without it),
// enter the epoch's membership barrier (wire::kMembershipBarrier) and go on. A
// removed worker that speaks again is refused, told why. Below min_workers
// the job waits up to elastic_timeout, then fails naming the lost workers.
// A worker that registers while an elastic job runs joins it (refused once
// max_workers are there): it is ranked last in a new epoch, every member
// gets the new assignment (the servers too), and the epoch barrier holds
// until it is in. A worker that leaves (Leave) has finished: it ends no
// epoch.
//
// Thread-safety: Run() on one thread.
#ifndef GRADSYNC_SCHEDULER_SCHEDULER_H_
#define GRADSYNC_SCHEDULER_SCHEDULER_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/refusal_log.h"
#include "common/status.h"
#include "common/time.h"
#include "scheduler/membership.h"
#include "scheduler/process_watch.h"
#include "scheduler/scheduler_metrics.h"
#include "wire/curve.h"
#include "wire/message.h"
#include "wire/transport.h"
#include "wire/validate.h"

namespace gradsync::server {

struct SchedulerOptions {
  std::string listen = "tcp://127.0.0.1:9000";
  int32_t num_workers = 1;
  int32_t num_servers = 0;
  Millis heartbeat_interval{500};
  uint32_t missed_heartbeats = 6;
  Millis rendezvous_timeout{120000};
  Millis server_grace{0};               // a silent server's time to restart, after the heartbeats
  std::optional<wire::CurveKey> curve;  // CURVE with the job's key (wire/curve.h)
  ElasticOptions elastic;               // min_workers 0: not elastic

  // Reads num_workers, num_servers, heartbeat_ms, missed_heartbeats,
  // rendezvous_timeout_ms, server_grace_ms, min_workers (num_workers: not
  // elastic), max_workers (num_workers), elastic_timeout_ms (60000), host (the address to listen
  // on, 127.0.0.1), security and key_file (wire/curve.h); the port comes from `scheduler`
  // (host:port) or `port`.
  static StatusOr<SchedulerOptions> FromConfig(const Config& config);
};

class Scheduler {
 public:
  // `metrics` may be null (no metrics); it and `clock` must outlive this.
  Scheduler(SchedulerOptions options, std::unique_ptr<wire::Transport> transport,
            SchedulerMetrics* metrics, const Clock* clock);

  // Binds the listening endpoint; returns it with the real port.
  StatusOr<std::string> Start();
  // Serves until the job ends: OK when every node left or `stop` became
  // true (then every node is told the job is shut down), an error naming the
  // cause when the job failed or a node died. `stop` is polled a few times
  // per heartbeat interval and may be set from any thread.
  Status Run(const std::atomic<bool>& stop);

 private:
  enum class Phase { kRendezvous, kReachability, kRunning, kDone };
  struct Node {
    std::string identity;
    wire::NodeInfo info;
    uint32_t pid = 0;
    std::string pid_ns;  // of pid, as it registered (ProcessWatch)
    SteadyTime last_seen;
    bool alive = true;
    bool left = false;
    bool reported = false;
    bool missing = false;  // silent, within server_grace
    bool removed = false;  // lost by an elastic job: out of every later epoch
    std::string removed_why;
  };
  // A barrier: its group, membership epoch and id in the epoch
  // (wire::kMembershipBarrier: the epoch's membership barrier).
  struct BarrierKey {
    wire::Group group = wire::Group::Workers;
    uint32_t epoch = 0;
    uint64_t id = 0;
    bool operator<(const BarrierKey& o) const {
      return std::tie(group, epoch, id) < std::tie(o.group, o.epoch, o.id);
    }
    bool operator==(const BarrierKey& o) const {
      return group == o.group && epoch == o.epoch && id == o.id;
    }
    bool operator!=(const BarrierKey& o) const { return !(*this == o); }
  };

  void Handle(wire::Incoming in);
  // Why a registration is refused.
  struct Refusal {
    wire::ErrorCode code;
    std::string text;
  };

  void Dispatch(Node& node, const wire::Header& h);
  void OnRegister(const std::string& identity, const wire::RegisterBody& r);
  // `replaces`: set to the identity of the server a registration replaces.
  std::optional<Refusal> CheckRegistration(const wire::RegisterBody& r,
                                           std::string* replaces) const;
  // A registration whose data or stream port is already a live node's, on
  // its host.
  std::optional<Refusal> CheckEndpoints(const wire::RegisterBody& r) const;
  std::optional<Refusal> CheckRejoin(const wire::RegisterBody& r, std::string* replaces) const;
  // With CURVE: the node's own public key is given and bound to no other
  // node (`replaces`: the node a restarted server takes the place of, whose
  // key it must present).
  std::optional<Refusal> CheckNodeKey(const wire::RegisterBody& r,
                                      const std::string& replaces) const;
  void ClaimRejoin(const std::string& old_identity, const std::string& identity,
                   const wire::RegisterBody& r);
  void RefuseClaimsOn(const Node& node);
  void TakeSilentClaims();
  struct PendingRejoin;
  void Rejoin(const std::string& old_identity, const std::string& identity,
              const PendingRejoin& claim);
  void AssignRanks();
  // A new node's data identity: "worker-" or "server-" and 64 random bits
  // (wire::RandomIdentity), no live or waiting node's.
  std::string MintIdentity(wire::Role role);
  void SendAssignment(const std::string& identity);
  void OnReachReport(Node& node, const wire::ReachReportBody& report);
  void FinishReachability(const std::string& timeout_note);
  void OnBarrier(Node& node, uint32_t epoch, const wire::BarrierBody& b);
  // A worker's part of an all-gather (a barrier that carries one); its
  // ports are refused where another node listens on its host.
  void OnGather(Node& node, uint32_t epoch, const wire::GatherBody& b);
  // Why `node` may not announce `ports` ("" when it may).
  std::string PortClash(const Node& node, const std::vector<uint16_t>& ports) const;
  // `node` enters barrier `key` (a Gather, when `type` says so).
  void EnterBarrier(Node& node, const BarrierKey& key, wire::MsgType type);
  // Forgets barrier `key` and any parts gathered for it.
  void DropBarrier(const BarrierKey& key);
  // Releases gather `key` (every member's part in): Gathered to each.
  void ReleaseGather(const BarrierKey& key, const std::set<std::string>& members);
  void TryRelease(const BarrierKey& key);
  std::string LeftBarrierText(const BarrierKey& key, const Node& left) const;
  void RememberBroken(const BarrierKey& key, const std::string& why);
  void OnNcclOffer(Node& node, const wire::NcclIdBody& body);
  void OnLeave(Node& node, const wire::LeaveBody& body);
  void Tick();
  // Watches a worker's process when it runs on this machine (ProcessWatch).
  void WatchProcess(const Node& node);
  // Declares dead the workers whose process exited.
  void TakeExits();
  void DeclareDead(Node& node, Millis silent);
  // Declares `node` dead for `why`: recorded, and every node is told.
  // `failure`: a worker that departed on its own failure says its kind,
  // passed on in NodeDead (Unknown for any other death).
  void MarkDead(Node& node, const std::string& why,
                wire::ErrorCode failure = wire::ErrorCode::Unknown);
  void FailJob(const std::string& why);
  // Elastic jobs: `node` (a worker) is out; the survivors start a new epoch,
  // or the job waits for workers.
  void RemoveWorker(Node& node, const std::string& why);
  // Workers alive and not gone, with their ranks, by identity.
  std::map<std::string, int32_t> LiveWorkers() const;
  // A worker registering with the running job: refused at max_workers.
  std::optional<Refusal> CheckJoin() const;
  // A worker registers with the running job: admitted below max_workers;
  // at it, it waits up to JoinWait for a worker to be declared lost (the
  // process it may replace), and is refused after that.
  void OnJoinRequest(Node node);
  void TakeWaitingJoiners();
  Millis JoinWait() const;
  // `node` joins: registered, and ranked last in the next epoch.
  void AdmitJoiner(Node node);
  // Sends the new epoch's assignments (`joiner`'s last, after the servers').
  void StartEpoch(const std::map<std::string, int32_t>& ranks, MembershipReason reason,
                  const std::string& joiner = "");
  bool HoldsEpochBarrier(const BarrierKey& key) const;
  void EpochBarrierReleased(const BarrierKey& key);
  void ElasticTick();
  void Reply(const std::string& identity, wire::Message msg);
  void ReplyError(const std::string& identity, wire::ErrorCode code, const std::string& text,
                  wire::MsgType in_reply_to);
  // A message a peer should not have sent: counted by reason, logged, and
  // answered with an Error (unless it was an Error itself).
  void Refuse(const std::string& identity, wire::ErrorCode code, const std::string& text,
              wire::MsgType in_reply_to, bool answer = true);
  void Broadcast(const std::function<wire::Message()>& make);
  bool InGroup(const Node& node, wire::Group group) const;
  int Count(wire::Role role) const;
  void UpdateLiveGauges();
  wire::Sender sender() const { return {wire::Role::Scheduler, -1, job_id_}; }

  const SchedulerOptions options_;
  std::unique_ptr<wire::Transport> transport_;
  SchedulerMetrics* const metrics_;
  const Clock* const clock_;

  Phase phase_ = Phase::kRendezvous;
  wire::Policy policy_;
  uint64_t job_id_ = 0;
  SteadyTime started_;
  SteadyTime reach_started_;
  std::map<std::string, Node> nodes_;  // by transport identity
  std::vector<std::string> order_;     // registration order
  // Claims to be a restarted server, waiting to see whether the old process
  // is silent; by the claimant's identity, at most one per server.
  struct PendingRejoin {
    std::string old_identity;
    uint32_t pid = 0;
    uint16_t metrics_port = 0;
    std::string boot_id;
  };
  std::map<std::string, PendingRejoin> rejoins_;
  // Workers waiting to join at max_workers, by identity (OnJoinRequest).
  std::map<std::string, Node> waiting_joiners_;
  std::map<BarrierKey, std::set<std::string>> barriers_;
  // The parts of the gathers among barriers_, by sender identity.
  std::map<BarrierKey, std::map<std::string, wire::GatherPartFields>> gather_parts_;
  // User barriers that failed because a member left without entering
  // them, and why: a member entering one later hears the same (the last
  // kMaxBrokenBarriers).
  std::map<BarrierKey, std::string> broken_barriers_;
  static constexpr size_t kMaxBrokenBarriers = 64;
  std::vector<uint8_t> nccl_id_;
  std::set<std::string> nccl_waiters_;
  std::vector<std::string> unreachable_;  // "worker 1 (...) cannot reach ..."
  std::vector<std::string> dead_;         // names of nodes declared dead
  bool servers_released_ = false;
  Membership membership_;
  // Workers of this machine: declared dead the moment their process exits.
  ProcessWatch exits_;
  std::vector<std::string> removed_;  // workers an elastic job lost, and why
  Status result_;
  RefusalLog refusal_log_;
  // Answers that could not be sent, logged a few per peer and reason.
  std::shared_ptr<RefusalLog> reply_failures_ = std::make_shared<RefusalLog>();
};

}  // namespace gradsync::server

#endif  // GRADSYNC_SCHEDULER_SCHEDULER_H_
