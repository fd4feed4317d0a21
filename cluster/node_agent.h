// NodeAgent: a worker's or server's link to the scheduler.
//
// Join() registers with the scheduler and returns once every node of the job
// has registered and this node has its rank, the job id and the peer list.
// The agent then keeps a thread that sends heartbeats and receives the
// scheduler's notices (a peer declared dead, the job failed or shut down).
//
// Every call takes a deadline. A scheduler address that is wrong or not
// answering fails Join within `connect_timeout` with a message naming the
// address; a scheduler that stops answering heartbeats is reported through
// job_status() within heartbeat_interval x missed_heartbeats.
//
// Thread-safety: all methods are thread-safe.
#ifndef GRADSYNC_CLUSTER_NODE_AGENT_H_
#define GRADSYNC_CLUSTER_NODE_AGENT_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/refusal_log.h"
#include "common/status.h"
#include "common/time.h"
#include "wire/message.h"
#include "wire/transport.h"
#include "wire/validate.h"

namespace gradsync::cluster {

struct NodeOptions {
  std::string scheduler;  // "host:port" (GRADSYNC_SCHEDULER)
  wire::Role role = wire::Role::Worker;
  int32_t rank = -1;         // -1: the scheduler assigns one
  int32_t num_workers = -1;  // what this node expects; -1: ask nobody
  int32_t num_servers = -1;
  std::string host = "127.0.0.1";  // how peers reach this node
  uint16_t data_port = 0;          // the node's bound data port
  uint16_t metrics_port = 0;
  std::string identity;      // of the node's data transport
  std::string public_key;    // the node's own CURVE key; "" without CURVE
  uint16_t stream_port = 0;  // a shard's TCP stream port; 0: none
  // With CURVE: the proof that this node holds its node key, of the node
  // it registers as (wire::RegistrationProof).
  std::function<std::string(const wire::NodeInfo&)> prove;
  Millis connect_timeout{10000};  // to reach the scheduler at all
  Millis rendezvous_timeout{120000};
  Millis heartbeat_interval{500};
  // How much longer than missed heartbeats this node waits for a silent
  // scheduler before it gives up (scheduler_grace_ms; 0). A shard given the
  // scheduler's server_grace_ms rides out a partition that short.
  Millis scheduler_grace{0};
  uint32_t protocol_version = 0;  // 0: this build's; tests set others
  std::string build_id;           // empty: this build's

  // Reads scheduler, role, rank, num_workers, num_servers, host,
  // connect_timeout_ms, rendezvous_timeout_ms, heartbeat_ms and
  // scheduler_grace_ms.
  static StatusOr<NodeOptions> FromConfig(const Config& config);
};

struct Assignment {
  uint64_t job_id = 0;
  wire::NodeInfo self;
  int32_t num_workers = 0;
  int32_t num_servers = 0;
  std::vector<wire::NodeInfo> peers;  // every node, self included
  Millis heartbeat_interval{0};
  uint32_t missed_heartbeats = 0;
  // Elastic jobs (scheduler/membership.h): the membership epoch (0 from the
  // rendezvous on), what ended the previous one, and whether the job
  // re-forms after losing a worker rather than stopping.
  uint32_t epoch = 0;
  std::string change;
  bool elastic = false;
};

class NodeAgent {
 public:
  using DeadCallback = std::function<void(const wire::NodeInfo& dead, const std::string& why)>;

  // Registers and waits for the rank assignment. `transport` is this agent's
  // own transport to the scheduler (ZmqTransport in production).
  static StatusOr<std::unique_ptr<NodeAgent>> Join(const NodeOptions& options,
                                                   std::unique_ptr<wire::Transport> transport,
                                                   Deadline deadline);
  ~NodeAgent();  // Leave("exit") unless already left

  const Assignment& assignment() const { return assignment_; }
  wire::Sender sender() const;

  // Probes the data endpoints of `peers`, reports the outcome to the
  // scheduler and waits for its verdict on the whole job: OK when every node
  // can reach its peers, FailedPrecondition listing every pair that cannot.
  Status CheckReachability(const std::vector<wire::NodeInfo>& peers, Deadline deadline);
  // Blocks until every live member of `group` reached barrier number n (this
  // node's n-th call for that group in membership epoch `epoch`: a worker
  // that joined a running job counts from 1 as the others do from the
  // epoch it joined in). Fails if a member is dead; MembershipChanged when
  // a later epoch starts meanwhile.
  Status Barrier(wire::Group group, uint32_t epoch, Deadline deadline);
  // A barrier of the workers (counted with Barrier's) that carries a part
  // from each: every live worker's part, in rank order, each under the
  // rank the scheduler bound to its sender. The scheduler refuses ports
  // that another node listens at on this node's host.
  StatusOr<std::vector<wire::GatherPartFields>> Gather(uint32_t epoch,
                                                       const wire::GatherPartFields& mine,
                                                       Deadline deadline);
  // Worker rank 0 passes its NCCL unique id; the others pass nullopt and get
  // rank 0's id.
  StatusOr<std::vector<uint8_t>> ShareNcclId(std::optional<std::vector<uint8_t>> mine,
                                             Deadline deadline);
  // OK while the job runs; the reason once it failed, was shut down, or the
  // scheduler stopped answering.
  Status job_status() const;
  // Blocks until job_status() is not OK, or the deadline.
  Status WaitForJobEnd(Deadline deadline);
  std::vector<wire::NodeInfo> dead_peers() const;
  // OK while the scheduler has declared no node of `role` dead; otherwise
  // why the first one is: Unavailable, or for a worker that departed on a
  // failure of its own, that failure's kind (wire::FailureStatus: a peer's
  // deadline reads as DeadlineExceeded here too). The message names the
  // node and gives the scheduler's reason.
  Status PeerDeathStatus(wire::Role role) const;
  // Elastic jobs: the newest assignment the scheduler sent (assignment()
  // until a worker is lost; later epochs carry fewer workers, re-ranked).
  Assignment latest() const;
  // latest().epoch, without the copy.
  uint32_t latest_epoch() const;
  // Blocks until every worker of epoch `epoch` has entered its epoch
  // barrier. MembershipChanged when a later epoch started meanwhile; the
  // job's failure, or DeadlineExceeded.
  Status EpochBarrier(uint32_t epoch, Deadline deadline);
  void OnPeerDead(DeadCallback callback);
  // Elastic jobs: `callback` runs on the agent's thread, under its lock,
  // with each later epoch's assignment as it arrives; it must not block
  // nor call back into the agent.
  using EpochCallback = std::function<void(const Assignment& next)>;
  void OnNewEpoch(EpochCallback callback);
  // Tells the scheduler this node leaves on purpose, then stops the agent.
  // `departing`: a worker leaving a running elastic job before its end
  // (LeaveBody.departing); otherwise it is done.
  // `failure`: the kind of failure a departing worker leaves on
  // (wire::FailureCode), Unknown for none.
  void Leave(const std::string& reason, bool departing = false,
             wire::ErrorCode failure = wire::ErrorCode::Unknown);

 private:
  NodeAgent(const NodeOptions& options, std::unique_ptr<wire::Transport> transport);
  Status Register(Deadline deadline);
  Status AwaitAssignment(Deadline deadline);
  void Run();
  void Dispatch(const wire::Header& h);
  void HandleError(const wire::ErrorBody& e);
  void FailJob(Status why);
  Status Send(wire::Message msg, Deadline deadline);
  // "" when `a` can be this node's assignment: sizes in range and as this
  // node expects, its rank among them, sane heartbeats, and a peer list of
  // every node once. Otherwise what is wrong with it.
  std::string ImpossibleAssignment(const wire::RankAssignmentBody& a) const;
  // `a` (checked) as an Assignment of job `job_id`.
  Assignment ReadAssignment(uint64_t job_id, const wire::RankAssignmentBody& a) const;
  // A later epoch's assignment: kept as latest_ when it is possible and new.
  void OnEpoch(const wire::Header& h);
  // A line for a message that failed verification, rate-limited.
  void LogRejected(const wire::Verdict& v);
  // Waits on cv_ until `done` or the job fails or the deadline passes.
  // The id of this node's next barrier or gather of `group` in `epoch`.
  StatusOr<uint64_t> NextBarrierId(wire::Group group, uint32_t epoch);
  // Waits (taking mu_) until `released` (called under mu_), a barrier
  // error, a later epoch or the deadline.
  Status WaitForBarrier(wire::Group group, uint32_t epoch, uint64_t id,
                        const std::function<bool()>& released, Deadline deadline);
  Status WaitFor(std::unique_lock<std::mutex>& lock, Deadline deadline,
                 const std::function<bool()>& done, const std::string& what);

  const NodeOptions options_;
  std::unique_ptr<wire::Transport> transport_;
  wire::ConnId scheduler_conn_ = -1;
  std::string scheduler_endpoint_;
  Assignment assignment_;
  wire::Policy policy_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status job_status_;   // guarded by mu_
  bool ready_ = false;  // guarded by mu_
  // Barriers called per group and epoch (the current epoch's and any
  // later's only); guarded by mu_.
  std::map<std::pair<wire::Group, uint32_t>, uint64_t> barrier_called_;
  // The highest barrier released per group and epoch; guarded by mu_.
  std::map<std::pair<wire::Group, uint32_t>, uint64_t> barrier_released_;
  Status barrier_error_;                         // guarded by mu_
  std::optional<std::vector<uint8_t>> nccl_id_;  // guarded by mu_
  // The last gather released: its (epoch, barrier id) and parts; guarded by
  // mu_.
  std::pair<uint32_t, uint64_t> gathered_at_{0, 0};
  std::vector<wire::GatherPartFields> gathered_;
  Assignment latest_;            // guarded by mu_
  uint32_t epoch_released_ = 0;  // guarded by mu_
  struct Death {
    wire::NodeInfo node;
    std::string why;
    wire::ErrorCode failure = wire::ErrorCode::Unknown;
  };
  std::vector<Death> dead_;                     // guarded by mu_
  std::vector<DeadCallback> dead_callbacks_;    // guarded by mu_
  std::vector<EpochCallback> epoch_callbacks_;  // guarded by mu_
  SteadyTime last_heard_;                       // guarded by mu_
  bool left_ = false;                           // guarded by mu_
  bool stop_ = false;                           // guarded by mu_
  std::thread thread_;
  RefusalLog refusal_log_;
};

}  // namespace gradsync::cluster

#endif  // GRADSYNC_CLUSTER_NODE_AGENT_H_
