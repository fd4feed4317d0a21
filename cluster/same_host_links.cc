#include "cluster/same_host_links.h"

#include <utility>

#include "cluster/ring_order.h"
#include "common/logging.h"

namespace gradsync::cluster {
namespace {

void LogLinks(const wire::SameHostOptions& links, const std::string& what) {
  GS_LOG(INFO) << what << " (" << links.peers.size() << " peer(s))";
}

}  // namespace

bool SharesMachine(const wire::NodeInfo& self, const wire::NodeInfo& peer) {
  return !peer.identity.empty() && peer.SameMachine(self);
}

wire::SameHostOptions RingSameHostOptions(wire::SameHostOptions base, const wire::NodeInfo& self,
                                          const std::vector<wire::NodeInfo>& peers, int rank,
                                          int world, const std::vector<int>& order) {
  base.peers.clear();
  if (world < 2) return base;
  const RingNeighbours next = NeighboursOf(order, rank, world);
  wire::SameHostPeer right{"", "", false, false}, left{"", "", false, false};
  for (const wire::NodeInfo& p : peers) {
    if (p.role != wire::Role::Worker) continue;
    const bool here = SharesMachine(self, p);
    if (p.rank == next.right) right = {p.identity, p.DataEndpoint(), here, false};
    if (p.rank == next.left) left = {p.identity, "", false, here};
  }
  if (world == 2) {
    right.receive = left.receive;  // one neighbour, both ways
  } else if (left.receive) {
    base.peers.push_back(left);
  }
  if (right.send || right.receive) base.peers.push_back(right);
  return base;
}

std::unique_ptr<wire::SameHostTransport> OverSameHostLinks(wire::Transport* base,
                                                           wire::SameHostOptions links,
                                                           const std::string& what) {
  if (links.peers.empty()) return nullptr;
  LogLinks(links, what);
  return std::make_unique<wire::SameHostTransport>(base, std::move(links));
}

std::unique_ptr<wire::Transport> OverSameHostLinks(std::unique_ptr<wire::Transport> base,
                                                   wire::SameHostOptions links,
                                                   const std::string& what) {
  if (links.peers.empty()) return base;
  LogLinks(links, what);
  return std::make_unique<wire::SameHostTransport>(std::move(base), std::move(links));
}

}  // namespace gradsync::cluster
