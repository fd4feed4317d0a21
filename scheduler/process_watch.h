// ProcessWatch: the scheduler sees a node process of its own machine exit
// the moment it does, rather than a heartbeat deadline later. A node that
// registers with the scheduler's boot id and pid namespace
// (wire::BootId, wire::PidNamespace) names its process by a pid the
// scheduler can open (pidfd_open, Linux 5.3): that descriptor becomes
// readable when the process exits, whatever killed it.
//
// What a node claims is not trusted for anything else: a node that names
// another process is declared dead when that process exits, which costs
// only itself. A pid the scheduler cannot open (another machine, a process
// gone already, a kernel without pidfd_open) is not watched: heartbeats
// alone tell.
//
// Thread-safety: none (the scheduler's thread).
#ifndef GRADSYNC_SCHEDULER_PROCESS_WATCH_H_
#define GRADSYNC_SCHEDULER_PROCESS_WATCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gradsync::server {

class ProcessWatch {
 public:
  // Of this process: its machine's boot id and its pid namespace.
  ProcessWatch();
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;
  ~ProcessWatch();  // closes every descriptor

  // Watches process `pid` for the node `identity` when `boot_id` and
  // `pid_ns` are this process's (and not empty); replaces what was watched
  // for `identity`. Returns whether it is watched.
  bool Watch(const std::string& identity, uint32_t pid, const std::string& boot_id,
             const std::string& pid_ns);
  // Stops watching `identity`'s process (it left, or was declared dead).
  void Forget(const std::string& identity);
  // The identities whose process exited since the last call, no longer
  // watched. Never blocks.
  std::vector<std::string> Exited();
  size_t size() const { return fds_.size(); }

 private:
  const std::string boot_id_;
  const std::string pid_ns_;
  std::map<std::string, int> fds_;  // by identity: a pidfd
};

}  // namespace gradsync::server

#endif  // GRADSYNC_SCHEDULER_PROCESS_WATCH_H_
