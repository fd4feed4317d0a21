#include "cluster/ps_links.h"

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
  return o;
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
      out.peers.push_back({p.identity, p.DataEndpoint(), true, true});
    } else if (!worker && p.role == wire::Role::Worker) {
      out.peers.push_back({wire::PsClientIdentity(p.identity), "", true, true});
    }
  }
  return out;
}

}  // namespace gradsync::cluster
