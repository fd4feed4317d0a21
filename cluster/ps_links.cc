#include "cluster/ps_links.h"

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
  return o;
}

wire::SameHostOptions PsSameHostOptions(const PsLinkOptions& options, uint64_t job_id,
                                        const wire::NodeInfo& self,
                                        const std::vector<wire::NodeInfo>& peers) {
  wire::SameHostOptions out;
  out.job_id = job_id;
  out.link_bytes = options.link_bytes;
  if (!options.enabled) return out;
  const bool worker = self.role == wire::Role::Worker;
  if (!worker && self.role != wire::Role::Server) return out;
  for (const wire::NodeInfo& p : peers) {
    if (p.identity.empty() || !p.SameMachine(self)) continue;
    if (worker && p.role == wire::Role::Server) {
      out.peers.push_back({p.identity, p.DataEndpoint(), true, true});
    } else if (!worker && p.role == wire::Role::Worker) {
      out.peers.push_back({wire::PsClientIdentity(p.identity), "", true, true});
    }
  }
  return out;
}

}  // namespace gradsync::cluster
