// Parameter-server traffic between the workers and the shards of one
// machine goes through shared memory (wire/same_host_transport.h) instead of
// loopback TCP: a worker's PS client writes to the shards of its host and
// reads their answers through links, and each shard does the same with the
// PS clients of its host's workers. Which peers share a machine is what the
// scheduler passed on (host address and boot id, NodeInfo::SameMachine);
// both sides derive the same pairs from the same assignment.
//
// Between hosts, a shard listens on a TCP stream port
// (wire/tcp_stream_transport.h) that it announces in the plan, and workers
// push and pull there from their own threads, sealed under the node keys
// with CURVE, with no ZeroMQ I/O thread on either side
// (docs/design/tcp_streams.md).
#ifndef GRADSYNC_CLUSTER_PS_LINKS_H_
#define GRADSYNC_CLUSTER_PS_LINKS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "wire/message.h"
#include "wire/same_host_transport.h"
#include "wire/tcp_stream_transport.h"

namespace gradsync::cluster {

// The largest frame a shard's or a PS client's socket takes: a partition in
// at most 8 bytes per fp32 element (the shard's payload limit), and a header.
constexpr int64_t PartitionFrameBytes(size_t partition_bytes) {
  return static_cast<int64_t>(2 * partition_bytes) + (int64_t{64} << 10);
}

struct PsLinkOptions {
  bool enabled = true;                  // ps_shm
  size_t link_bytes = size_t{8} << 20;  // ps_shm_bytes: each link a process reads
  // partition_bytes: the largest partition a push or reply carries. No
  // codec writes more than 8 bytes per element, so no message through a
  // link is larger than 2 * partition_bytes plus a header.
  size_t partition_bytes = size_t{4} << 20;
  uint16_t stream_port = 0;  // ps_stream_port (shards): 0, any free port

  // Reads ps_shm, ps_shm_bytes (within [4096, 1 GiB]), partition_bytes
  // (within [4, 1 GiB]) and ps_stream_port.
  static StatusOr<PsLinkOptions> FromConfig(const Config& config);
};

// The same-host peers of `self`'s parameter-server transport among `peers`
// (the assignment's nodes): for a worker, the shards of its machine (written
// to by their data endpoints); for a shard, the PS clients of its machine's
// workers (answered by identity). Empty when disabled or none shares it.
wire::SameHostOptions PsSameHostOptions(const PsLinkOptions& options, uint64_t job_id,
                                        const wire::NodeInfo& self,
                                        const std::vector<wire::NodeInfo>& peers);

// OK when every shard among `peers` announced a stream port; else which
// did not.
Status CheckShardStreamPorts(const std::vector<wire::NodeInfo>& peers);

// By rank, the identity each of the `num_workers` workers among `peers`
// reaches the shards under in membership epoch `epoch` (its PS client;
// "" where a worker gave none): what a shard's key tables check
// (PsRules::worker_identities) and its stream listener takes, with lanes.
std::vector<std::string> PsClientIdentities(const std::vector<wire::NodeInfo>& peers,
                                            int32_t num_workers, uint32_t epoch);

// The stream options of either side (sizes: a partition's push or answer).
wire::TcpStreamOptions PsStreamOptions(const PsLinkOptions& options);

// A shard's stream listener on `host` at options.stream_port (0: any free
// port), under the shard's `identity` (the plan's, which names its
// shared-memory links), sealed with `keys` (CURVE), plain without. It takes
// nobody until SetAccept names the job and its workers' PS clients (with
// their lanes). The port it listens on in *port.
StatusOr<std::unique_ptr<wire::TcpStreamTransport>> ListenPsStreams(
    const PsLinkOptions& options, const std::string& host, const std::string& identity,
    std::shared_ptr<const wire::NodeKeys> keys, wire::BulkCipherEngine cipher,
    std::shared_ptr<wire::TransportRefusals> refusals, uint16_t* port);

}  // namespace gradsync::cluster

#endif  // GRADSYNC_CLUSTER_PS_LINKS_H_
