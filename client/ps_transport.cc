#include "client/ps_transport.h"

#include <utility>

#include "cluster/node.h"
#include "common/logging.h"
#include "wire/same_host_transport.h"
#include "wire/zmq_transport.h"

namespace gradsync::client {

StatusOr<std::unique_ptr<wire::Transport>> MakePsClientTransport(
    Session& session, const cluster::PsLinkOptions& links) {
  wire::ZmqOptions zmq = cluster::TransportOptions(session.curve(), nullptr);
  zmq.identity = wire::PsClientIdentity(session.data().identity());
  zmq.node_keys = session.node_keys();
  zmq.max_frame_bytes = cluster::PartitionFrameBytes(links.partition_bytes);  // replies
  GS_ASSIGN_OR_RETURN(std::unique_ptr<wire::Transport> transport,
                      wire::ZmqTransport::Create(zmq));
  wire::SameHostOptions same_host =
      cluster::PsSameHostOptions(links, session.job_id(), session.self(), session.peers());
  if (same_host.peers.empty()) return transport;
  GS_LOG(INFO) << "parameter-server traffic with " << same_host.peers.size()
               << " shard(s) on this host uses shared memory";
  return std::unique_ptr<wire::Transport>(
      std::make_unique<wire::SameHostTransport>(std::move(transport), same_host));
}

}  // namespace gradsync::client
