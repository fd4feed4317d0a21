// ShmLink: a one-way byte stream between two processes on the same host,
// through a ring buffer in POSIX shared memory (shm_open, mode 0600) with
// futex wake-ups. The reader creates it under a name both sides know, before
// anything could be sent to it; the writer opens it, checks that it was made
// on this boot of this machine, and removes the name, so that nothing is
// left in /dev/shm once both sides have it mapped (a reader whose writer
// never came removes it itself). A link takes one writer only. The reader
// holds a lock on the file while it lives, so that a writer can tell a
// reader that died (however it ended) from one that is only slow.
//
// One writer and one reader, each a single thread at a time. Nothing a
// reader reads is trusted: the stream's framing is the caller's to verify.
// Neither side trusts the other's words either: each keeps its own
// position, and a head or tail the other side publishes outside what the
// stream allows (more than the capacity apart, or going backwards) breaks
// the link (Broken(); nothing more is read or written, PeerClosed() turns
// true) instead of being used. Open takes only a link of this user's own
// (effective uid, mode 0600, as Create makes it): see
// docs/design/shared_memory.md for who can do what to a link.
//
// Thread-safety: Write/Pad/WaitWritable on the writer's side and Read/
// Skip/Borrow/WaitReadable on the reader's may run concurrently; each side
// alone is single-threaded, except that what Borrow lent may be released
// from any thread.
#ifndef GRADSYNC_WIRE_SHM_LINK_H_
#define GRADSYNC_WIRE_SHM_LINK_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"

namespace gradsync::wire {

class ShmLink : public std::enable_shared_from_this<ShmLink> {
 public:
  // The reader's side: a new buffer of `capacity` bytes (rounded up to a
  // power of two) under `name` ("/gradsync-..."), replacing a stale one.
  static StatusOr<std::shared_ptr<ShmLink>> Create(const std::string& name, size_t capacity);
  // The writer's side. NotFound while the reader has not made it yet;
  // FailedPrecondition when it is not a regular object of this process's
  // effective uid with mode 0600, not a link of this boot of this machine,
  // its layout (size, capacity) is wrong or it has a writer already.
  static StatusOr<std::shared_ptr<ShmLink>> Open(const std::string& name);
  ~ShmLink();  // Close(), unmaps

  ShmLink(const ShmLink&) = delete;
  ShmLink& operator=(const ShmLink&) = delete;

  // Writer: copies up to `n` bytes in; returns how many fitted.
  size_t Write(const void* data, size_t n);
  // Writer: leaves `n` bytes out (the reader Skips them); false, and
  // nothing done, when they do not fit.
  bool Pad(size_t n);
  // Reader: copies up to `n` bytes out; returns how many there were.
  size_t Read(void* out, size_t n);
  // Reader: steps over `n` bytes (at most Readable()).
  void Skip(size_t n);
  // Reader: the next `n` bytes in place, which must be readable and must
  // not wrap (Contiguous). They stay in memory the writer can write: read
  // each byte once, or copy it, before it is checked. The region is not written over until the
  // returned owner (which keeps this link mapped) is released, from any
  // thread; regions are let go of in any order.
  std::shared_ptr<const void> Borrow(size_t n, const uint8_t** data);
  bool Contiguous(size_t n) const;
  // Reader: bytes from the start of the oldest region still lent out to
  // where the next read starts (0 when nothing is lent): the part of the
  // link the writer cannot reuse yet though it was read.
  size_t Pinned() const;
  // Whether `p` points into this link's buffer.
  bool Contains(const void* p) const {
    auto* b = static_cast<const uint8_t*>(p);
    return b >= data_ && b < data_ + capacity_;
  }
  // Bytes since the start: where the next Write (writer) or Read (reader)
  // goes; both sides see the same positions for the same bytes.
  uint64_t Position() const;
  size_t Readable() const;
  size_t Writable() const;
  // Wait until there is something to read / room to write, the other side
  // closed, or `deadline` (whichever first; spurious returns are possible).
  void WaitReadable(Deadline deadline);
  void WaitWritable(Deadline deadline);
  // Reader: until one of `links` has something to read or was closed by
  // its writer, or `deadline` (spurious returns are possible).
  static void WaitReadableAny(const std::vector<ShmLink*>& links, Deadline deadline);
  // Tells the other side that this one is gone (it stops waiting).
  void Close();
  // The other side closed, or the link is Broken().
  bool PeerClosed() const;
  // Whether the other side published a position the stream does not allow
  // (seen by Readable/Writable and the calls that use them).
  bool Broken() const { return broken_.load(); }
  // Reader: whether a writer has opened the link.
  bool WriterAttached() const;
  // Writer: whether the reader's process still has the link open (a
  // system call: ask now and then, not per byte).
  bool ReaderAlive() const;
  size_t capacity() const { return capacity_; }
  const uint8_t* data() const { return data_; }

  struct Shared;  // the layout in shared memory (shm_link.cc)
  // Byte offsets in the mapping of the writer's head word, the reader's tail
  // word and the buffer (for tests that play a hostile peer).
  static constexpr size_t kHeadOffset = 128;
  static constexpr size_t kTailOffset = 192;
  static constexpr size_t kDataOffset = 4096;

 private:
  ShmLink(std::string name, bool writer, int fd, Shared* shared, size_t map_bytes, size_t capacity);
  // Reader: returns [start, start + n) and moves the shared tail up to the
  // first region still lent out.
  void Release(uint64_t start);
  void UpdateTailLocked();  // requires borrow_mu_
  // Writer: makes the bytes up to `head` readable and wakes the reader.
  void Publish(uint64_t head);
  // Marks the link broken and tells the other side it is closed.
  void Break() const;

  std::string name_;
  bool writer_;
  int fd_;  // kept open: the reader's lock lives on it
  Shared* shared_;
  uint8_t* data_;
  size_t map_bytes_;
  size_t capacity_;
  std::atomic<bool> closed_{false};
  mutable std::atomic<bool> broken_{false};
  // The writer's own head (the shared one is only published to).
  std::atomic<uint64_t> head_{0};

  // The reader's side: where it has read up to, and the regions lent out
  // (start, end, released), in stream order. The shared tail is the first
  // lent region's start, or read_ when none is.
  mutable std::mutex borrow_mu_;
  uint64_t read_ = 0;  // written by the reader's thread only, under borrow_mu_
  // The tail the reader last published (its own copy of the shared word).
  std::atomic<uint64_t> tail_{0};
  struct Lent {
    uint64_t start, end;
    bool released;
  };
  std::deque<Lent> lent_;  // guarded by borrow_mu_
};

// This machine's boot id (/proc/sys/kernel/random/boot_id), "" if unknown.
std::string BootId();
// This process's pid namespace ("pid:[4026531836]", the link
// /proc/self/ns/pid), "" if unknown: with the boot id, two processes that
// agree on it name each other's processes by the same pids.
std::string PidNamespace();

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_SHM_LINK_H_
