#include "cluster/topology.h"

namespace gradsync::cluster {

const wire::NodeInfo* FindNode(const std::vector<wire::NodeInfo>& peers, wire::Role role,
                               int rank) {
  for (const wire::NodeInfo& n : peers) {
    if (n.role == role && n.rank == rank) return &n;
  }
  return nullptr;
}

std::vector<wire::NodeInfo> PeersToReach(const wire::NodeInfo& self,
                                         const std::vector<wire::NodeInfo>& peers) {
  std::vector<wire::NodeInfo> out;
  if (self.role != wire::Role::Worker) return out;
  int workers = 0;
  for (const wire::NodeInfo& n : peers) workers += n.role == wire::Role::Worker;
  if (workers > 1) {
    int left = (self.rank + workers - 1) % workers;
    int right = (self.rank + 1) % workers;
    for (int r : {left, right}) {
      const wire::NodeInfo* n = FindNode(peers, wire::Role::Worker, r);
      if (n && (out.empty() || out.back().rank != r)) out.push_back(*n);
    }
  }
  for (const wire::NodeInfo& n : peers) {
    if (n.role == wire::Role::Server) out.push_back(n);
  }
  return out;
}

}  // namespace gradsync::cluster
