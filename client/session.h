// Session: a training process's membership in a gradsync job.
//
// Session::Join reads the job settings from flags or the environment (the
// scheduler address, GRADSYNC_SCHEDULER=host:port, is the only one required;
// also GRADSYNC_NUM_WORKERS, GRADSYNC_NUM_SERVERS, GRADSYNC_RANK,
// GRADSYNC_HOST, GRADSYNC_DATA_PORT), registers this process as a worker,
// and returns once the job has assembled and this worker reaches its ring
// neighbours and every server shard. A wrong or unreachable scheduler address
// fails within connect_timeout_ms (default 10 s) naming the address.
//
// Elastic jobs (min_workers below num_workers on the scheduler): when a
// worker is lost the scheduler starts a new membership epoch; the session
// reports it (MembershipStatus) until AdoptEpoch takes it, and rank(),
// num_workers() and peers() then describe the new epoch.
//
// Thread-safety: all methods are thread-safe. Ownership: the Session owns
// its sockets and threads; destroying it leaves the job cleanly.
#ifndef GRADSYNC_CLIENT_SESSION_H_
#define GRADSYNC_CLIENT_SESSION_H_

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "cluster/node.h"
#include "common/config.h"
#include "common/status.h"
#include "common/time.h"

namespace gradsync::client {

class Session {
 public:
  static StatusOr<std::unique_ptr<Session>> Join(const Config& config, Deadline deadline);
  ~Session();

  // Of the epoch this session adopted (the rendezvous's until a loss).
  int rank() const;
  int num_workers() const;
  std::vector<wire::NodeInfo> peers() const;
  uint32_t epoch() const;
  int num_servers() const { return node_.agent->assignment().num_servers; }
  uint64_t job_id() const { return node_.agent->assignment().job_id; }

  // Whether the job goes on without a lost worker (a new epoch).
  bool elastic() const { return node_.agent->assignment().elastic; }
  // MembershipChanged naming the lost worker once the scheduler started an
  // epoch later than the adopted one; OK otherwise.
  Status MembershipStatus() const;
  // Takes the scheduler's latest epoch as this session's; returns it.
  uint32_t AdoptEpoch();
  // Blocks until every worker of the adopted epoch adopted it too
  // (MembershipChanged when a later one started meanwhile).
  Status EpochBarrier(Deadline deadline);
  // How long the scheduler takes to declare a silent worker lost.
  Millis loss_deadline() const {
    const cluster::Assignment& a = node_.agent->assignment();
    return a.heartbeat_interval * (a.missed_heartbeats + 2);
  }

  // Blocks until every live worker has called Barrier the same number of
  // times; fails naming the dead worker if one died.
  Status Barrier(Deadline deadline);
  // An all-gather through the scheduler among the adopted epoch's workers
  // (counted with Barrier): every worker's part, in rank order, its rank
  // the scheduler's (NodeAgent::Gather).
  StatusOr<std::vector<wire::GatherPartFields>> Gather(const wire::GatherPartFields& mine,
                                                       Deadline deadline) {
    return node_.agent->Gather(epoch(), mine, deadline);
  }
  // Rank 0 passes its NCCL unique id, the others nullopt; all get rank 0's.
  StatusOr<std::vector<uint8_t>> ShareNcclId(std::optional<std::vector<uint8_t>> mine,
                                             Deadline deadline);
  // Workers and servers the scheduler declared dead so far.
  std::vector<wire::NodeInfo> dead_peers() const { return node_.agent->dead_peers(); }
  Status PeerDeathStatus(wire::Role role) const { return node_.agent->PeerDeathStatus(role); }
  // OK while the job runs; why it ended otherwise.
  Status job_status() const { return node_.agent->job_status(); }
  // The data transport, listening on this worker's data port (the node's
  // address, which peers' reachability checks reach; nothing reads it).
  wire::Transport& data() { return *node_.data; }
  // The address peers reach this node at (the `host` setting).
  const std::string& host() const { return node_.agent->assignment().self.host; }
  // This worker as the scheduler's peers list names it (boot id included).
  const wire::NodeInfo& self() const { return node_.agent->assignment().self; }
  // The job's CURVE key, when the job runs CURVE.
  const std::optional<wire::CurveKey>& curve() const { return node_.curve; }
  wire::BulkCipherEngine bulk_cipher() const { return node_.bulk_cipher; }
  // The node key and plan with CURVE (null without): for its data transports.
  std::shared_ptr<const wire::NodeKeys> node_keys() const { return node_.keys; }
  // With CURVE: the peer `identity` also serves `endpoint` (its ring lane),
  // under its own key (wire::NodeKeys::AddEndpoint). Nothing without.
  void AddPeerEndpoint(const std::string& identity, const std::string& endpoint) {
    if (node_.keys) node_.keys->AddEndpoint(identity, endpoint);
  }
  // What the data port refused (handshakes, dropped messages).
  std::shared_ptr<wire::TransportRefusals> refusals() const { return node_.refusals; }
  // Leaves the job on purpose (done, or failing) so nobody waits for us.
  // `departing`: before the job's end (NodeAgent::Leave).
  void Leave(const std::string& reason, bool departing = false,
             wire::ErrorCode failure = wire::ErrorCode::Unknown) {
    node_.agent->Leave(reason, departing, failure);
  }

 private:
  explicit Session(cluster::Node node)
      : node_(std::move(node)), current_(node_.agent->assignment()) {}
  cluster::Node node_;
  mutable std::mutex mu_;
  cluster::Assignment current_;  // guarded by mu_; the adopted epoch
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_SESSION_H_
