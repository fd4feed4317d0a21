// The transport a worker's PS client talks to the shards on, of its own
// (identity wire::PsClientIdentity of the session's data transport, which
// the shards answer): TCP streams to the shards' stream ports (sealed under
// the node keys with CURVE); with the shards of this host
// written to and heard through shared memory (cluster/ps_links.h). A client
// of a later membership epoch than 0 has an identity of its own and talks
// to every shard over the network (the shards read the first epoch's links
// only).
#ifndef GRADSYNC_CLIENT_PS_TRANSPORT_H_
#define GRADSYNC_CLIENT_PS_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "client/session.h"
#include "cluster/ps_links.h"
#include "common/status.h"
#include "wire/transport.h"

namespace gradsync::client {

// By rank, where the session's PS client reaches each shard (its stream
// endpoint).
std::vector<std::string> PsShardEndpoints(const Session& session);

// Errors: a shard that announced no stream port; the transport's own.
StatusOr<std::unique_ptr<wire::Transport>> MakePsClientTransport(
    Session& session, const cluster::PsLinkOptions& links);

// The lane of the PS client's identity the embedding client goes under
// (the last: PsClientOptions::lanes stay below it).
constexpr int kEmbeddingLane = wire::kMaxLanes - 1;

// The transport of a worker's embedding client (client/embedding_client.h):
// TCP streams to every shard (sealed with CURVE; loopback to a shard of the
// same host) under lane kEmbeddingLane of its PS client's identity, which
// the shards take as that worker's.
StatusOr<std::unique_ptr<wire::Transport>> MakeEmbeddingTransport(
    Session& session, const cluster::PsLinkOptions& links);

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_PS_TRANSPORT_H_
