// ShmLink: a one-way byte stream between two processes on the same host,
// through a ring buffer in POSIX shared memory (shm_open, mode 0600) with
// futex wake-ups. The writer creates it under a name both sides know; the
// reader opens it, checks that it was made on this boot of this machine, and
// removes the name, so that nothing is left in /dev/shm once both sides
// have it mapped (a writer whose reader never came removes it itself).
//
// One writer and one reader, each a single thread at a time. Nothing a
// reader reads is trusted: the stream's framing is the caller's to verify.
//
// Thread-safety: Write/WaitWritable on the writer's side and Read/
// WaitReadable on the reader's may run concurrently; each side alone is
// single-threaded.
#ifndef GRADSYNC_WIRE_SHM_LINK_H_
#define GRADSYNC_WIRE_SHM_LINK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/time.h"

namespace gradsync::wire {

class ShmLink {
 public:
  // The writer's side: a new buffer of `capacity` bytes (rounded up to a
  // power of two) under `name` ("/gradsync-..."), replacing a stale one.
  static StatusOr<std::unique_ptr<ShmLink>> Create(const std::string& name, size_t capacity);
  // The reader's side. NotFound while the writer has not made it yet;
  // FailedPrecondition when it is not a link of this boot of this machine
  // or its layout is wrong.
  static StatusOr<std::unique_ptr<ShmLink>> Open(const std::string& name);
  ~ShmLink();  // Close(), unmaps

  ShmLink(const ShmLink&) = delete;
  ShmLink& operator=(const ShmLink&) = delete;

  // Writer: copies up to `n` bytes in; returns how many fitted.
  size_t Write(const void* data, size_t n);
  // Reader: copies up to `n` bytes out; returns how many there were.
  size_t Read(void* out, size_t n);
  size_t Readable() const;
  size_t Writable() const;
  // Wait until there is something to read / room to write, the other side
  // closed, or `deadline` (whichever first; spurious returns are possible).
  void WaitReadable(Deadline deadline);
  void WaitWritable(Deadline deadline);
  // Tells the other side that this one is gone (it stops waiting).
  void Close();
  bool PeerClosed() const;
  size_t capacity() const { return capacity_; }

  struct Shared;  // the layout in shared memory (shm_link.cc)

 private:
  ShmLink(std::string name, bool writer, Shared* shared, size_t map_bytes, size_t capacity);

  std::string name_;
  bool writer_;
  Shared* shared_;
  uint8_t* data_;
  size_t map_bytes_;
  size_t capacity_;
  bool closed_ = false;
};

// This machine's boot id (/proc/sys/kernel/random/boot_id), "" if unknown.
std::string BootId();

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_SHM_LINK_H_
