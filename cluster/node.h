// Starting a worker or server node: bind the data endpoint, join the job
// through the scheduler, and check that the peers this node needs are
// reachable (cluster/topology.h) before the first step.
#ifndef GRADSYNC_CLUSTER_NODE_H_
#define GRADSYNC_CLUSTER_NODE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "cluster/node_agent.h"
#include "cluster/ps_links.h"
#include "common/config.h"
#include "wire/curve.h"
#include "wire/node_keys.h"
#include "wire/tcp_stream_transport.h"
#include "wire/transport.h"
#include "wire/zmq_transport.h"

namespace gradsync::cluster {

struct Node {
  // Listens on the node's data port (on its host address); peers connect here.
  std::unique_ptr<wire::Transport> data;
  // A shard's TCP stream listener (port ps_stream_port), where workers push
  // and pull; it takes the workers of the plan's epoch once the shard sets
  // them (SetAccept). Null for a worker.
  std::unique_ptr<wire::TcpStreamTransport> streams;
  std::unique_ptr<NodeAgent> agent;
  // The job's key when the node runs CURVE (wire/curve.h); every transport
  // of the process uses it.
  std::optional<wire::CurveKey> curve;
  // With CURVE, the node's own key and the plan's (wire/node_keys.h): its
  // data transports use them; the plan is set from the rank assignment.
  std::shared_ptr<wire::NodeKeys> keys;
  // What the node's listening socket refused: handshakes, dropped messages.
  std::shared_ptr<wire::TransportRefusals> refusals;
  // The setting bulk_cipher: the library that seals the TCP streams
  // (wire/bulk_cipher.h).
  wire::BulkCipherEngine bulk_cipher = wire::BulkCipherEngine::kBest;
};

// Transport options for a socket of this process: the node's key, and
// refused handshakes and dropped messages counted in `refusals` (may be
// null) and logged (rate-limited per peer).
wire::ZmqOptions TransportOptions(const std::optional<wire::CurveKey>& curve,
                                  std::shared_ptr<wire::TransportRefusals> refusals);

// The largest frame each kind of socket takes (ZmqOptions::max_frame_bytes,
// ZMQ_MAXMSGSIZE): libzmq drops the connection of a peer that announces a
// larger one before it allocates it, so no flood of huge frames is ever
// held whole. Control sockets (the scheduler's, every node agent's) carry
// a header frame only; a shard's and a PS client's carry a partition in at
// most 8 bytes per fp32 element (the shard's payload limit).
// (PartitionFrameBytes, cluster/ps_links.h).
constexpr int64_t kControlFrameBytes = static_cast<int64_t>(wire::Limits{}.max_header_bytes);

// Where a shard keeps its node key: in its checkpoint_dir, named by the
// address it rejoins at ("node-HOST-PORT.key", so shards may share the
// directory); "" without a checkpoint_dir or a fixed data_port (such a
// shard cannot rejoin anyway).
std::string KeptNodeKeyPath(const std::string& checkpoint_dir, const std::string& host,
                            int64_t data_port);

// The node key of a CURVE node (wire::LoadNodeKey): node_key_file when set;
// else a shard keeps it at KeptNodeKeyPath, so that it proves to be the same
// shard when it restarts; else a new one in memory.
StatusOr<std::shared_ptr<wire::NodeKeys>> NodeKeysFromConfig(const Config& config, wire::Role role,
                                                             const wire::CurveKey& job,
                                                             const std::string& host,
                                                             int64_t data_port);

// Reads the node settings from `config` (NodeOptions::FromConfig plus
// data_port, 0 = any free port), binds, joins and checks reachability. The
// data port takes control-sized frames only (kControlFrameBytes). Errors
// name the scheduler address or the unreachable peers.
StatusOr<Node> StartNode(const Config& config, wire::Role role, Deadline deadline);

}  // namespace gradsync::cluster

#endif  // GRADSYNC_CLUSTER_NODE_H_
