// What the users of shared memory share (the link, shm_link.h; the segment,
// shm_segment.h; the collectives over segments): the futex calls, the
// poll-then-sleep wait, the lock a maker holds on its object's first byte,
// the ownership check and the making of an object.
#ifndef GRADSYNC_WIRE_SHM_COMMON_H_
#define GRADSYNC_WIRE_SHM_COMMON_H_

#include <sched.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/time.h"

namespace gradsync::wire::shm {

// Sleeps while *word == seen, until woken or `deadline` (at most 100 ms).
void FutexWait(const std::atomic<uint32_t>* word, uint32_t seen, Deadline deadline);
// Wakes up to `count` sleepers on `word`.
void FutexWake(std::atomic<uint32_t>* word, int count = 1);

// Polls before sleeping: a peer that is mid-copy or about to publish is
// usually quicker than a futex round trip. The first iterations spin; later
// ones yield the core, so that a process sharing it with the one it waits
// for does not hold it up. True once `ready`; false after 50 us without.
template <typename Ready>
bool Spin(Ready ready) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if (i < 32) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    if (std::chrono::steady_clock::now() >= until) return ready();
    sched_yield();
  }
}

// The maker of an object holds a write lock on its first byte for as long as
// it has it open (F_OFD_SETLK), which goes with its process however it ends;
// with F_OFD_GETLK: whether somebody else holds that lock.
bool LockFirstByte(int fd, int cmd);

// Whether `st` is an object as its maker makes it: a regular object of our
// effective uid with mode 0600 exactly. Nobody else can then map it, resize
// it or read what is written to it; a process of the same uid can, and could
// as well ptrace this one. `what`: "link", "segment".
Status CheckOwned(const std::string& name, const struct stat& st, const char* what);

// Makes `name` (shm_open O_CREAT | O_EXCL, replacing an object of an earlier
// run), mode 0600 whatever the umask, `bytes` reserved (a full /dev/shm fails
// here rather than with SIGBUS later) and its first byte locked. Returns the
// descriptor; on failure nothing is left behind. The first call of a process
// also removes what dead processes left (RemoveStale("gradsync-", 60 s)).
StatusOr<int> CreateLocked(const std::string& name, size_t bytes);

// Removes the objects in /dev/shm whose names start with `prefix` that are
// this user's, at least `min_age` old, and whose maker's lock is gone: what a
// process killed before its peer opened (and unlinked) an object leaves
// behind. A live maker holds its lock, so its objects stay. Returns how many
// were removed.
int RemoveStale(const std::string& prefix, std::chrono::seconds min_age);

}  // namespace gradsync::wire::shm

#endif  // GRADSYNC_WIRE_SHM_COMMON_H_
