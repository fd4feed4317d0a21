#include "wire/shm_common.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace gradsync::wire::shm {

void FutexWait(const std::atomic<uint32_t>* word, uint32_t seen, Deadline deadline) {
  const auto left = deadline.infinite() ? std::chrono::nanoseconds(std::chrono::milliseconds(100))
                                        : deadline.at() - std::chrono::steady_clock::now();
  if (left <= std::chrono::nanoseconds(0)) return;
  const auto ns = std::min<int64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(left).count(), 100'000'000);
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word, int count) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

bool LockFirstByte(int fd, int cmd) {
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  l.l_start = 0;
  l.l_len = 1;
  return fcntl(fd, cmd, &l) == 0 && (cmd != F_OFD_GETLK || l.l_type != F_UNLCK);
}

Status CheckOwned(const std::string& name, const struct stat& st, const char* what) {
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 07777) != 0600) {
    char found[96];
    std::snprintf(found, sizeof(found), " (uid %u, mode %04o)", static_cast<unsigned>(st.st_uid),
                  static_cast<unsigned>(st.st_mode & 07777));
    return FailedPreconditionError("shared memory " + name + " is not this user's own " + what +
                                   " (uid " + std::to_string(geteuid()) + ", mode 0600)" + found);
  }
  return OkStatus();
}

int RemoveStale(const std::string& prefix, std::chrono::seconds min_age) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  const time_t now = time(nullptr);
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const int fd = shm_open(("/" + name).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0);
    if (fd < 0) continue;
    struct stat st;
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    lock.l_len = 1;
    // Stale only when the lock was asked for and nobody holds it.
    const bool stale = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                       now - st.st_ctime >= min_age.count() && fcntl(fd, F_OFD_GETLK, &lock) == 0 &&
                       lock.l_type == F_UNLCK;
    close(fd);
    if (stale && shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

StatusOr<int> CreateLocked(const std::string& name, size_t bytes) {
  static std::once_flag swept;
  std::call_once(swept, [] { RemoveStale("gradsync-", std::chrono::seconds(60)); });
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    shm_unlink(name.c_str());  // left by a process of an earlier run
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  }
  if (fd < 0) return UnavailableError("shm_open " + name + ": " + std::strerror(errno));
  auto fail = [&](const std::string& what, int err) {
    close(fd);
    shm_unlink(name.c_str());
    return UnavailableError(what + " " + name + ": " + std::strerror(err));
  };
  if (fchmod(fd, 0600) != 0) return fail("setting the mode of", errno);
  const int reserved = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (reserved != 0) return fail("reserving " + std::to_string(bytes) + " bytes of", reserved);
  if (!LockFirstByte(fd, F_OFD_SETLK)) return fail("locking", errno);
  return fd;
}

}  // namespace gradsync::wire::shm
