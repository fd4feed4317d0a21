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
// Thread-safety: all methods are thread-safe. Ownership: the Session owns
// its sockets and threads; destroying it leaves the job cleanly.
#ifndef GRADSYNC_CLIENT_SESSION_H_
#define GRADSYNC_CLIENT_SESSION_H_

#include <memory>
#include <optional>
#include <vector>

#include "cluster/node.h"
#include "common/config.h"
#include "common/status.h"
#include "common/time.h"

namespace gradsync::client {

class Session {
 public:
  // The data port refuses frames larger than `max_frame_bytes` unread.
  static StatusOr<std::unique_ptr<Session>> Join(const Config& config, Deadline deadline,
                                                 size_t max_frame_bytes);
  ~Session();

  int rank() const { return node_.agent->assignment().self.rank; }
  int num_workers() const { return node_.agent->assignment().num_workers; }
  int num_servers() const { return node_.agent->assignment().num_servers; }
  uint64_t job_id() const { return node_.agent->assignment().job_id; }
  const std::vector<wire::NodeInfo>& peers() const { return node_.agent->assignment().peers; }

  // Blocks until every live worker has called Barrier the same number of
  // times; fails naming the dead worker if one died.
  Status Barrier(Deadline deadline);
  // Rank 0 passes its NCCL unique id, the others nullopt; all get rank 0's.
  StatusOr<std::vector<uint8_t>> ShareNcclId(std::optional<std::vector<uint8_t>> mine,
                                             Deadline deadline);
  // Workers and servers the scheduler declared dead so far.
  std::vector<wire::NodeInfo> dead_peers() const { return node_.agent->dead_peers(); }
  // OK while the job runs; why it ended otherwise.
  Status job_status() const { return node_.agent->job_status(); }
  // The data transport, listening on this worker's data port.
  wire::Transport& data() { return *node_.data; }
  // The address peers reach this node at (the `host` setting).
  const std::string& host() const { return node_.agent->assignment().self.host; }
  // This worker as the scheduler's peers list names it (boot id included).
  const wire::NodeInfo& self() const { return node_.agent->assignment().self; }
  // The job's CURVE key, when the job runs CURVE.
  const std::optional<wire::CurveKey>& curve() const { return node_.curve; }
  // The node key and plan with CURVE (null without): for its data transports.
  std::shared_ptr<const wire::NodeKeys> node_keys() const { return node_.keys; }
  // What the data port refused (handshakes, dropped messages).
  std::shared_ptr<wire::TransportRefusals> refusals() const { return node_.refusals; }
  // Leaves the job on purpose (done, or failing) so nobody waits for us.
  void Leave(const std::string& reason) { node_.agent->Leave(reason); }

 private:
  explicit Session(cluster::Node node) : node_(std::move(node)) {}
  cluster::Node node_;
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_SESSION_H_
