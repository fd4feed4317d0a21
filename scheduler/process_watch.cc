#include "scheduler/process_watch.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "wire/shm_link.h"

namespace gradsync::server {

namespace {

// -1 when the process cannot be opened.
int OpenPidFd(uint32_t pid) {
#ifdef SYS_pidfd_open
  if (pid == 0) return -1;
  return static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
#else
  (void)pid;
  return -1;
#endif
}

}  // namespace

ProcessWatch::ProcessWatch() : boot_id_(wire::BootId()), pid_ns_(wire::PidNamespace()) {}

ProcessWatch::~ProcessWatch() {
  for (const auto& [identity, fd] : fds_) close(fd);
}

bool ProcessWatch::Watch(const std::string& identity, uint32_t pid, const std::string& boot_id,
                         const std::string& pid_ns) {
  Forget(identity);
  if (boot_id_.empty() || pid_ns_.empty() || boot_id != boot_id_ || pid_ns != pid_ns_) {
    return false;
  }
  const int fd = OpenPidFd(pid);
  if (fd < 0) return false;
  fds_[identity] = fd;
  return true;
}

void ProcessWatch::Forget(const std::string& identity) {
  auto it = fds_.find(identity);
  if (it == fds_.end()) return;
  close(it->second);
  fds_.erase(it);
}

std::vector<std::string> ProcessWatch::Exited() {
  std::vector<std::string> exited;
  if (fds_.empty()) return exited;
  std::vector<pollfd> fds;
  std::vector<std::string> ids;
  for (const auto& [identity, fd] : fds_) {
    fds.push_back({fd, POLLIN, 0});
    ids.push_back(identity);
  }
  if (poll(fds.data(), fds.size(), 0) <= 0) return exited;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents != 0) exited.push_back(ids[i]);
  }
  for (const std::string& identity : exited) Forget(identity);
  return exited;
}

}  // namespace gradsync::server
