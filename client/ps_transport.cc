#include "client/ps_transport.h"

#include <utility>

#include "cluster/node.h"
#include "cluster/same_host_links.h"
#include "wire/zmq_transport.h"

namespace gradsync::client {

StatusOr<std::unique_ptr<wire::Transport>> MakePsClientTransport(
    Session& session, const cluster::PsLinkOptions& links) {
  wire::ZmqOptions zmq = session.DataTransportOptions(
      wire::PsClientIdentity(session.data().identity(), session.epoch()),
      cluster::PartitionFrameBytes(links.partition_bytes));  // replies
  GS_ASSIGN_OR_RETURN(std::unique_ptr<wire::Transport> transport, wire::ZmqTransport::Create(zmq));
  // The shards read the links of the first epoch's clients only.
  if (session.epoch() > 0) return transport;
  wire::SameHostOptions same_host =
      cluster::PsSameHostOptions(links, session.job_id(), session.self(), session.peers());
  same_host.refusals = session.refusals();
  return cluster::OverSameHostLinks(
      std::move(transport), std::move(same_host),
      "parameter-server traffic with the shards on this host uses shared memory");
}

}  // namespace gradsync::client
