// Who talks to whom once a job is assembled.
#ifndef GRADSYNC_CLUSTER_TOPOLOGY_H_
#define GRADSYNC_CLUSTER_TOPOLOGY_H_

#include <vector>

#include "wire/message.h"

namespace gradsync::cluster {

// The peers `self` will open connections to, and so must be able to reach:
// a worker needs its ring neighbours (rank - 1 and rank + 1 modulo the number
// of workers) and every server shard; a server needs nobody (workers connect
// to it). `peers` is the full list from the rank assignment.
std::vector<wire::NodeInfo> PeersToReach(const wire::NodeInfo& self,
                                         const std::vector<wire::NodeInfo>& peers);

// The node of `role` and `rank` in `peers`, or nullptr.
const wire::NodeInfo* FindNode(const std::vector<wire::NodeInfo>& peers, wire::Role role, int rank);

}  // namespace gradsync::cluster

#endif  // GRADSYNC_CLUSTER_TOPOLOGY_H_
