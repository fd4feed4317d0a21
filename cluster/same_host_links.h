// Which peers a node reaches through shared memory instead of loopback TCP
// (wire/same_host_transport.h), and the transport that does it. A peer
// qualifies when the scheduler's assignment says it shares this node's
// machine (host address and boot id, NodeInfo::SameMachine) and names its
// transport identity; both sides derive matching pairs from the same
// assignment.
//
// Thread-safety: the functions keep no state.
#ifndef GRADSYNC_CLUSTER_SAME_HOST_LINKS_H_
#define GRADSYNC_CLUSTER_SAME_HOST_LINKS_H_

#include <memory>
#include <string>
#include <vector>

#include "wire/message.h"
#include "wire/same_host_transport.h"
#include "wire/transport.h"

namespace gradsync::cluster {

// Whether `peer` runs on `self`'s machine and can be told apart there (its
// identity is known).
bool SharesMachine(const wire::NodeInfo& self, const wire::NodeInfo& peer);

// `base` (job id, sizes) with the ring links of worker `rank` of `world`
// among `peers`: to its right neighbour (written to at its data endpoint)
// and from its left one, each when it shares the machine; with two ranks
// the one neighbour both ways. None for a world of one. `order`: the ranks
// in ring order (client::RingPeers::order); empty: rank order.
wire::SameHostOptions RingSameHostOptions(wire::SameHostOptions base, const wire::NodeInfo& self,
                                          const std::vector<wire::NodeInfo>& peers, int rank,
                                          int world, const std::vector<int>& order = {});

// `base`'s traffic with shared-memory links to `links.peers`; null when
// there are none (then `base` alone carries it). `base` must outlive the
// result. `what` is the line logged when there are links.
std::unique_ptr<wire::SameHostTransport> OverSameHostLinks(wire::Transport* base,
                                                           wire::SameHostOptions links,
                                                           const std::string& what);
// As above, owning `base`; `base` itself when there are no links.
std::unique_ptr<wire::Transport> OverSameHostLinks(std::unique_ptr<wire::Transport> base,
                                                   wire::SameHostOptions links,
                                                   const std::string& what);

}  // namespace gradsync::cluster

#endif  // GRADSYNC_CLUSTER_SAME_HOST_LINKS_H_
