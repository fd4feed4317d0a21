// ShmSegment: a block of POSIX shared memory (shm_open, mode 0600) that one
// process, its owner, writes and the other processes of its host map
// read-only. The owner makes it under a name they all know and holds a lock
// on it while it lives, so that a reader can tell an owner that died
// (however it ended) from one that is only slow; it removes the name once
// every reader has it mapped (Unlink), or when it goes.
//
// Nothing a reader reads is trusted: the layout of the area is the caller's,
// and every word in it can change while it is read (read each once, or copy
// it, before checking it). The ownership rules are the shared-memory links'
// (shm_link.h, docs/design/shared_memory.md): Open maps only an object of
// this process's effective uid with mode 0600, of the size asked for, made on
// this boot of this machine.
//
// Thread-safety: data() of the owner is the owner's to write; the rest may be
// called from any thread.
#ifndef GRADSYNC_WIRE_SHM_SEGMENT_H_
#define GRADSYNC_WIRE_SHM_SEGMENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace gradsync::wire {

class ShmSegment {
 public:
  // The owner's side: `bytes` of zeroed memory under `name` ("/gradsync-..."),
  // replacing a stale object of an earlier run, mapped and touched once
  // (every page faulted in now, not at its first use).
  static StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name, size_t bytes);
  // A reader's side, mapped read-only. NotFound while the owner has not made
  // it yet; FailedPrecondition when it is not this user's own with mode
  // 0600, not made on this boot, or its size is not `bytes`.
  static StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& name, size_t bytes);
  ~ShmSegment();  // unmaps; the owner also removes the name if still there

  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // The area: `bytes` long, 4096-aligned; mutable_data() is the owner's
  // (null for a reader, whose mapping is read-only).
  const uint8_t* data() const { return data_; }
  uint8_t* mutable_data() { return owner_ ? data_ : nullptr; }
  size_t size() const { return bytes_; }
  bool owner() const { return owner_; }
  // Reader: whether the owner still has the segment open (a system call:
  // ask now and then).
  bool OwnerAlive() const;
  // Owner: removes the name (the readers keep their mappings); nothing can
  // open the segment by name afterwards.
  void Unlink();
  const std::string& name() const { return name_; }

 private:
  ShmSegment(std::string name, bool owner, int fd, void* map, size_t map_bytes, size_t bytes);

  std::string name_;
  bool owner_;
  int fd_;  // kept open: the owner's lock lives on it
  void* map_;
  size_t map_bytes_;
  uint8_t* data_;
  size_t bytes_;
  bool unlinked_ = false;
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_SHM_SEGMENT_H_
