// Starting a worker or server node: bind the data endpoint, join the job
// through the scheduler, and check that the peers this node needs are
// reachable (cluster/topology.h) before the first step.
#ifndef GRADSYNC_CLUSTER_NODE_H_
#define GRADSYNC_CLUSTER_NODE_H_

#include <memory>

#include "cluster/node_agent.h"
#include "common/config.h"
#include "wire/transport.h"

namespace gradsync::cluster {

struct Node {
  // Listens on the node's data port; peers connect here.
  std::unique_ptr<wire::Transport> data;
  std::unique_ptr<NodeAgent> agent;
};

// Reads the node settings from `config` (NodeOptions::FromConfig plus
// data_port, 0 = any free port), binds, joins and checks reachability.
// Errors name the scheduler address or the unreachable peers.
StatusOr<Node> StartNode(const Config& config, wire::Role role, Deadline deadline);

}  // namespace gradsync::cluster

#endif  // GRADSYNC_CLUSTER_NODE_H_
