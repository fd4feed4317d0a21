// Parameter-server traffic between the workers and the shards of one
// machine goes through shared memory (wire/same_host_transport.h) instead of
// loopback TCP: a worker's PS client writes to the shards of its host and
// reads their answers through links, and each shard does the same with the
// PS clients of its host's workers. Which peers share a machine is what the
// scheduler passed on (host address and boot id, NodeInfo::SameMachine);
// both sides derive the same pairs from the same assignment.
#ifndef GRADSYNC_CLUSTER_PS_LINKS_H_
#define GRADSYNC_CLUSTER_PS_LINKS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "wire/message.h"
#include "wire/same_host_transport.h"

namespace gradsync::cluster {

struct PsLinkOptions {
  bool enabled = true;                  // ps_shm
  size_t link_bytes = size_t{8} << 20;  // ps_shm_bytes: each link a process reads
  // partition_bytes: the largest partition a push or reply carries. No
  // codec writes more than 8 bytes per element, so no message through a
  // link is larger than 2 * partition_bytes plus a header.
  size_t partition_bytes = size_t{4} << 20;

  // Reads ps_shm, ps_shm_bytes (within [4096, 1 GiB]) and partition_bytes
  // (within [4, 1 GiB]).
  static StatusOr<PsLinkOptions> FromConfig(const Config& config);
};

// The same-host peers of `self`'s parameter-server transport among `peers`
// (the assignment's nodes): for a worker, the shards of its machine (written
// to by their data endpoints); for a shard, the PS clients of its machine's
// workers (answered by identity). Empty when disabled or none shares it.
wire::SameHostOptions PsSameHostOptions(const PsLinkOptions& options, uint64_t job_id,
                                        const wire::NodeInfo& self,
                                        const std::vector<wire::NodeInfo>& peers);

}  // namespace gradsync::cluster

#endif  // GRADSYNC_CLUSTER_PS_LINKS_H_
