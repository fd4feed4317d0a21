#include "cluster/ps_links.h"

#include <algorithm>

#include "cluster/same_host_links.h"
#include "wire/validate.h"

namespace gradsync::cluster {

StatusOr<PsLinkOptions> PsLinkOptions::FromConfig(const Config& config) {
  PsLinkOptions o;
  GS_ASSIGN_OR_RETURN(o.enabled, config.GetBool("ps_shm", true));
  GS_ASSIGN_OR_RETURN(int64_t bytes, config.GetInt("ps_shm_bytes", 8 << 20));
  if (bytes < 4096 || bytes > (int64_t{1} << 30)) {
    return InvalidArgumentError("ps_shm_bytes must be within [4096, 1 GiB], got " +
                                std::to_string(bytes));
  }
  o.link_bytes = static_cast<size_t>(bytes);
  GS_ASSIGN_OR_RETURN(int64_t partition,
                      config.GetInt("partition_bytes", static_cast<int64_t>(o.partition_bytes)));
  if (partition < 4 || partition > (int64_t{1} << 30)) {
    return InvalidArgumentError("partition_bytes must be within [4, 1 GiB], got " +
                                std::to_string(partition));
  }
  o.partition_bytes = static_cast<size_t>(partition);
  GS_ASSIGN_OR_RETURN(int64_t port, config.GetInt("ps_stream_port", 0));
  if (port < 0 || port > 65535) {
    return InvalidArgumentError("ps_stream_port must be within [0, 65535], got " +
                                std::to_string(port));
  }
  o.stream_port = static_cast<uint16_t>(port);
  return o;
}

Status CheckShardStreamPorts(const std::vector<wire::NodeInfo>& peers) {
  for (const wire::NodeInfo& p : peers) {
    if (p.role == wire::Role::Server && p.stream_port == 0) {
      return FailedPreconditionError(p.Name() +
                                     " announced no TCP stream port: workers push "
                                     "and pull over TCP streams only");
    }
  }
  return OkStatus();
}

std::vector<std::string> PsClientIdentities(const std::vector<wire::NodeInfo>& peers,
                                            int32_t num_workers, uint32_t epoch) {
  std::vector<std::string> out(static_cast<size_t>(std::max(0, num_workers)));
  for (const wire::NodeInfo& p : peers) {
    if (p.role == wire::Role::Worker && !p.identity.empty() && p.rank >= 0 &&
        p.rank < num_workers) {
      out[static_cast<size_t>(p.rank)] = wire::PsClientIdentity(p.identity, epoch);
    }
  }
  return out;
}

wire::TcpStreamOptions PsStreamOptions(const PsLinkOptions& options) {
  wire::TcpStreamOptions o;
  o.max_frames = wire::Limits{}.max_payload_frames + 1;
  o.max_frame_bytes = static_cast<size_t>(PartitionFrameBytes(options.partition_bytes));
  o.max_message_bytes = o.max_frame_bytes + wire::Limits{}.max_header_bytes;
  return o;
}

StatusOr<std::unique_ptr<wire::TcpStreamTransport>> ListenPsStreams(
    const PsLinkOptions& options, const std::string& host, const std::string& identity,
    std::shared_ptr<const wire::NodeKeys> keys, wire::BulkCipherEngine cipher,
    std::shared_ptr<wire::TransportRefusals> refusals, uint16_t* port) {
  *port = 0;
  wire::TcpStreamOptions o = PsStreamOptions(options);
  o.identity = identity;
  o.accept_lanes = true;
  o.strangers_may_wait = true;  // a new epoch's workers, before the shard has its plan
  o.node_keys = std::move(keys);
  o.cipher = cipher;
  o.refusals = std::move(refusals);
  auto streams = std::make_unique<wire::TcpStreamTransport>(std::move(o));
  GS_ASSIGN_OR_RETURN(std::string endpoint, wire::ListenEndpoint(host, options.stream_port));
  GS_ASSIGN_OR_RETURN(std::string bound, streams->Listen(endpoint));
  *port = static_cast<uint16_t>(std::stoi(bound.substr(bound.rfind(':') + 1)));
  return streams;
}

wire::SameHostOptions PsSameHostOptions(const PsLinkOptions& options, uint64_t job_id,
                                        const wire::NodeInfo& self,
                                        const std::vector<wire::NodeInfo>& peers) {
  wire::SameHostOptions out;
  out.job_id = job_id;
  out.link_bytes = options.link_bytes;
  out.max_message_bytes = 2 * options.partition_bytes + wire::Limits{}.max_header_bytes;
  if (!options.enabled) return out;
  const bool worker = self.role == wire::Role::Worker;
  if (!worker && self.role != wire::Role::Server) return out;
  for (const wire::NodeInfo& p : peers) {
    if (!SharesMachine(self, p)) continue;
    if (worker && p.role == wire::Role::Server) {
      out.peers.push_back({p.identity, p.StreamEndpoint(), true, true});
    } else if (!worker && p.role == wire::Role::Worker) {
      out.peers.push_back({wire::PsClientIdentity(p.identity), "", true, true});
    }
  }
  return out;
}

}  // namespace gradsync::cluster
