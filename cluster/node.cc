#include "cluster/node.h"

#include "cluster/topology.h"
#include "common/logging.h"
#include "common/placement.h"
#include "common/refusal_log.h"
#include "wire/zmq_transport.h"

namespace gradsync::cluster {

namespace {

// Counts one refusal in `count` (if any) and logs `what` about `peer`,
// rate-limited per peer and `reason`.
void Refused(RefusalLog& log, std::atomic<uint64_t>* count, const std::string& peer,
             const char* reason, const std::string& what) {
  if (count != nullptr) count->fetch_add(1);
  uint64_t left_out = 0;
  if (log.Admit(peer, reason, &left_out)) {
    GS_LOG(WARNING) << what << " from " << wire::Escaped(peer, 64) << LeftOutNote(left_out);
  }
}

}  // namespace

wire::ZmqOptions TransportOptions(const std::optional<wire::CurveKey>& curve,
                                  std::shared_ptr<wire::TransportRefusals> refusals) {
  wire::ZmqOptions o;
  o.curve = curve;
  auto log = std::make_shared<RefusalLog>();
  o.on_dropped = [refusals, log](const std::string& peer, const std::string& why) {
    Refused(*log, refusals ? &refusals->dropped : nullptr, peer, "dropped",
            "dropped a message as it was read (" + why + ")");
  };
  o.on_impostor = [refusals, log](const std::string& peer, const std::string& why) {
    Refused(*log, refusals ? &refusals->impostors : nullptr, peer, "impostor", "refused " + why);
  };
  o.on_send_dropped = [refusals, log](const std::string& peer) {
    Refused(*log, refusals ? &refusals->sends_dropped : nullptr, peer, "send",
            "dropped sends: too many wait for a peer that is not reading, the peer");
  };
  o.on_auth_failure = [refusals, log](const std::string& peer) {
    Refused(*log, refusals ? &refusals->handshakes : nullptr, peer, "handshake",
            "refused a connection whose handshake failed (no, wrong or another job's CURVE "
            "key)");
  };
  return o;
}

std::string KeptNodeKeyPath(const std::string& checkpoint_dir, const std::string& host,
                            int64_t data_port) {
  if (checkpoint_dir.empty() || data_port <= 0) return "";
  return checkpoint_dir + "/node-" + host + "-" + std::to_string(data_port) + ".key";
}

StatusOr<std::shared_ptr<wire::NodeKeys>> NodeKeysFromConfig(const Config& config, wire::Role role,
                                                             const wire::CurveKey& job,
                                                             const std::string& host,
                                                             int64_t data_port) {
  GS_ASSIGN_OR_RETURN(std::string key_file, config.GetString("node_key_file", ""));
  GS_ASSIGN_OR_RETURN(std::string checkpoint_dir, config.GetString("checkpoint_dir", ""));
  const std::string keep =
      role == wire::Role::Server ? KeptNodeKeyPath(checkpoint_dir, host, data_port) : "";
  GS_ASSIGN_OR_RETURN(wire::CurveKey own, wire::LoadNodeKey(key_file, keep));
  return std::make_shared<wire::NodeKeys>(job, own);
}

StatusOr<Node> StartNode(const Config& config, wire::Role role, Deadline deadline) {
  GS_ASSIGN_OR_RETURN(NodeOptions options, NodeOptions::FromConfig(config));
  GS_ASSIGN_OR_RETURN(int64_t data_port, config.GetInt("data_port", 0));
  options.role = role;
  Node node;
  GS_ASSIGN_OR_RETURN(node.curve, wire::SecurityFromConfig(config, options.host));
  if (node.curve) {
    GS_ASSIGN_OR_RETURN(node.keys,
                        NodeKeysFromConfig(config, role, *node.curve, options.host, data_port));
  }
  node.refusals = std::make_shared<wire::TransportRefusals>();
  wire::ZmqOptions data = TransportOptions(node.curve, node.refusals);
  data.node_keys = node.keys;
  GS_ASSIGN_OR_RETURN(std::string cipher, config.GetString("bulk_cipher", "auto"));
  const std::optional<wire::BulkCipherEngine> engine = wire::ParseBulkCipherSetting(cipher);
  if (!engine) {
    return InvalidArgumentError("bulk_cipher must be auto or openssl, got '" + cipher + "'");
  }
  node.bulk_cipher = *engine;
  // A node's data port is its address and what its peers' reachability
  // checks reach: the ring, the parameter-server traffic and the ring
  // order's link timing go over TCP streams of their own. What a peer
  // sends there is not read (a shard refuses it, server/server_main.cc):
  // one control-sized message waits at most, and ZeroMQ's high-water marks
  // push back.
  data.max_frame_bytes = kControlFrameBytes;
  data.max_queued_incoming = 1;
  data.max_queued_incoming_bytes = size_t{64} << 10;
  GS_ASSIGN_OR_RETURN(node.data, wire::ZmqTransport::Create(std::move(data)));
  GS_ASSIGN_OR_RETURN(std::string endpoint, wire::ListenEndpoint(options.host, data_port));
  GS_ASSIGN_OR_RETURN(std::string bound, node.data->Listen(endpoint));
  options.data_port = static_cast<uint16_t>(std::stoi(bound.substr(bound.rfind(':') + 1)));
  options.identity = node.data->identity();
  if (node.keys) options.public_key = node.keys->own().public_z85;
  PsLinkOptions links;
  auto listen_streams = [&](uint16_t port, uint16_t* bound) {
    links.stream_port = port;
    return ListenPsStreams(links, options.host, options.identity, node.keys, node.bulk_cipher,
                           node.refusals, bound);
  };
  if (role == wire::Role::Server) {
    // Workers of other hosts push and pull over TCP streams, at the port
    // announced in the plan.
    GS_ASSIGN_OR_RETURN(links, PsLinkOptions::FromConfig(config));
    GS_ASSIGN_OR_RETURN(node.streams, listen_streams(links.stream_port, &options.stream_port));
  }
  if (node.keys) {
    // Proves to the scheduler that this node holds its node key.
    options.prove = [own = node.keys->own(),
                     scheduler = wire::SchedulerPublicKey(*node.curve)](const wire::NodeInfo& me) {
      return wire::RegistrationProof(own, scheduler, me);
    };
  }
  wire::ZmqOptions control = TransportOptions(node.curve, nullptr);
  control.node_keys = node.keys;  // probes of the peers' data ports
  control.max_frame_bytes = kControlFrameBytes;
  GS_ASSIGN_OR_RETURN(auto agent_transport, wire::ZmqTransport::Create(std::move(control)));
  GS_ASSIGN_OR_RETURN(node.agent, NodeAgent::Join(options, std::move(agent_transport), deadline));
  const Assignment& a = node.agent->assignment();
  if (node.keys) {
    node.keys->SetPlan(a.peers, a.epoch);
    // A joiner of an elastic job connects with its own key: every node's
    // plan takes each epoch's peers.
    node.agent->OnNewEpoch(
        [keys = node.keys](const Assignment& next) { keys->SetPlan(next.peers, next.epoch); });
  }
  if (node.streams) {
    // A shard restarted in its old place: the workers know the stream port
    // of the plan, which the old process announced.
    const wire::NodeInfo* planned = nullptr;
    for (const wire::NodeInfo& p : a.peers) {
      if (p.role == role && p.rank == a.self.rank) planned = &p;
    }
    uint16_t port = options.stream_port;
    if (planned != nullptr && planned->stream_port != 0 && planned->stream_port != port) {
      auto again = listen_streams(planned->stream_port, &port);
      if (again.ok() && *again != nullptr) {
        node.streams = std::move(*again);
      } else {
        GS_LOG(ERROR) << "cannot listen at the plan's TCP stream port " << planned->stream_port
                      << " (" << (again.ok() ? "no streams" : again.status().message())
                      << "): the workers cannot push to this shard over TCP streams; give shards "
                         "a fixed ps_stream_port";
      }
    }
    // Before this node reports its reachability, so before any worker pushes.
    node.streams->SetAccept(a.job_id, PsClientIdentities(a.peers, a.num_workers, a.epoch));
    GS_LOG(INFO) << "workers of other hosts reach this shard over "
                 << (node.streams->sealed() ? "sealed " : "") << "TCP streams at port " << port;
  }
  SetLogTag(a.self.Name());
  GS_LOG(INFO) << "joined job " << a.job_id << " as " << a.self.Name() << " (identity "
               << a.self.identity << ", data port " << options.data_port << ", " << a.num_workers
               << " workers, " << a.num_servers << " servers, "
               << (!node.curve ? "no CURVE"
                               : "CURVE on every link, TCP streams sealed with AES-256-GCM by " +
                                     wire::BulkCipherEngineName(node.bulk_cipher) + " (Noise KK)")
               << ")";
  GS_RETURN_IF_ERROR(node.agent->CheckReachability(PeersToReach(a.self, a.peers), deadline));
  return node;
}

}  // namespace gradsync::cluster
