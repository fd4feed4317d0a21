#include "client/ps_transport.h"

#include <utility>

#include "cluster/node.h"
#include "cluster/same_host_links.h"
#include "wire/tcp_stream_transport.h"

namespace gradsync::client {

std::vector<std::string> PsShardEndpoints(const Session& session) {
  std::vector<std::string> endpoints(static_cast<size_t>(session.num_servers()));
  for (const wire::NodeInfo& p : session.peers()) {
    if (p.role == wire::Role::Server && p.rank >= 0 && p.rank < session.num_servers()) {
      endpoints[static_cast<size_t>(p.rank)] = p.StreamEndpoint();
    }
  }
  return endpoints;
}

namespace {

// TCP streams to the shards under `identity` (sealed with CURVE).
StatusOr<std::unique_ptr<wire::Transport>> StreamsToShards(Session& session,
                                                           const cluster::PsLinkOptions& links,
                                                           const std::string& identity) {
  GS_RETURN_IF_ERROR(cluster::CheckShardStreamPorts(session.peers()));
  wire::TcpStreamOptions o = cluster::PsStreamOptions(links);
  o.job_id = session.job_id();
  o.identity = identity;
  o.refusals = session.refusals();
  o.node_keys = session.node_keys();  // CURVE: sealed under keys the node keys agree
  o.cipher = session.bulk_cipher();
  return std::unique_ptr<wire::Transport>(std::make_unique<wire::TcpStreamTransport>(std::move(o)));
}

}  // namespace

StatusOr<std::unique_ptr<wire::Transport>> MakeEmbeddingTransport(
    Session& session, const cluster::PsLinkOptions& links) {
  return StreamsToShards(
      session, links,
      wire::LaneIdentity(wire::PsClientIdentity(session.self().identity, session.epoch()),
                         kEmbeddingLane));
}

StatusOr<std::unique_ptr<wire::Transport>> MakePsClientTransport(
    Session& session, const cluster::PsLinkOptions& links) {
  const std::string identity = wire::PsClientIdentity(session.self().identity, session.epoch());
  GS_ASSIGN_OR_RETURN(std::unique_ptr<wire::Transport> transport,
                      StreamsToShards(session, links, identity));
  // The shards read the links of the first epoch's clients only.
  if (session.epoch() > 0) return transport;
  wire::SameHostOptions same_host =
      cluster::PsSameHostOptions(links, session.job_id(), session.self(), session.peers());
  same_host.refusals = session.refusals();
  return cluster::OverSameHostLinks(
      std::move(transport), std::move(same_host),
      "parameter-server traffic with the shards on this host uses shared memory, with the "
      "others TCP streams");
}

}  // namespace gradsync::client
