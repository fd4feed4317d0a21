#include "wire/shm_link.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "wire/shm_common.h"

namespace gradsync::wire {

namespace {
constexpr uint64_t kMagic = 0x31424C5347ull;  // "GSLB1"
constexpr size_t kMaxCapacity = size_t{1} << 30;
}  // namespace

// Positions count bytes since the start and never wrap; the buffer offset is
// position & (capacity - 1). Each side's words sit on cache lines of their
// own.
struct ShmLink::Shared {
  uint64_t magic;
  uint64_t capacity;
  char boot_id[64];
  alignas(64) std::atomic<uint64_t> head;  // written up to (the writer's)
  std::atomic<uint32_t> data_seq;          // futex: bumped after each write
  std::atomic<uint32_t> reader_waiting;
  std::atomic<uint32_t> writer_closed;
  alignas(64) std::atomic<uint64_t> tail;  // read up to (the reader's)
  std::atomic<uint32_t> space_seq;         // futex: bumped after each read
  std::atomic<uint32_t> writer_waiting;
  std::atomic<uint32_t> reader_closed;
  std::atomic<uint32_t> writer_attached;
};

static_assert(offsetof(ShmLink::Shared, head) == ShmLink::kHeadOffset);
static_assert(offsetof(ShmLink::Shared, tail) == ShmLink::kTailOffset);
static_assert(sizeof(ShmLink::Shared) <= ShmLink::kDataOffset);

namespace {

size_t HeaderBytes() { return (sizeof(ShmLink::Shared) + 4095) & ~size_t{4095}; }

// Until `ready`: spins, then sleeps on the futex `seq` (the other side bumps
// it after each change) with `waiting` set so that the other side wakes it.
template <typename Ready>
void WaitOn(std::atomic<uint32_t>* seq, std::atomic<uint32_t>* waiting, Deadline deadline,
            Ready ready) {
  if (shm::Spin(ready)) return;
  const uint32_t seen = seq->load(std::memory_order_seq_cst);
  waiting->store(1, std::memory_order_seq_cst);
  if (!ready()) shm::FutexWait(seq, seen, deadline);
  waiting->store(0, std::memory_order_relaxed);
}

}  // namespace

std::string PidNamespace() {
  char link[128];
  const ssize_t n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
  return n > 0 ? std::string(link, static_cast<size_t>(n)) : std::string();
}

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

ShmLink::ShmLink(std::string name, bool writer, int fd, Shared* shared, size_t map_bytes,
                 size_t capacity)
    : name_(std::move(name)),
      writer_(writer),
      fd_(fd),
      shared_(shared),
      data_(reinterpret_cast<uint8_t*>(shared) + HeaderBytes()),
      map_bytes_(map_bytes),
      capacity_(capacity) {}

StatusOr<std::shared_ptr<ShmLink>> ShmLink::Create(const std::string& name, size_t capacity) {
  size_t cap = 4096;
  while (cap < capacity && cap < kMaxCapacity) cap <<= 1;
  const size_t bytes = HeaderBytes() + cap;
  // The reader holds the lock on the first byte while it has the link open.
  GS_ASSIGN_OR_RETURN(const int fd, shm::CreateLocked(name, bytes));
  auto fail = [&](const std::string& what, int err) {
    close(fd);
    shm_unlink(name.c_str());
    return UnavailableError(what + " " + name + ": " + std::strerror(err));
  };
  // Every page mapped (MAP_POPULATE) and touched once now, on both sides,
  // before the link is used: otherwise the first pass over the buffer pays
  // a fault per page in each process, in the guest and, in a virtual
  // machine, in the host too (about 10 us each: a 16 MiB link's first pass
  // took 8-45 ms against 0.3-0.7 ms for the later ones), and small
  // all-reduces ran 3-7x slower until then.
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (map == MAP_FAILED) return fail("mapping", errno);
  std::memset(static_cast<uint8_t*>(map) + HeaderBytes(), 0, cap);
  auto* shared = new (map) Shared();
  shared->capacity = cap;
  const std::string boot = BootId();
  std::strncpy(shared->boot_id, boot.c_str(), sizeof(shared->boot_id) - 1);
  // Published last: a writer that sees the magic sees the fields above.
  auto* magic = reinterpret_cast<std::atomic<uint64_t>*>(&shared->magic);
  magic->store(kMagic, std::memory_order_release);
  return std::shared_ptr<ShmLink>(new ShmLink(name, false, fd, shared, bytes, cap));
}

StatusOr<std::shared_ptr<ShmLink>> ShmLink::Open(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError("no shared memory " + name + " yet");
    return UnavailableError("shm_open " + name + ": " + std::strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return UnavailableError("fstat of shared memory " + name + ": " + std::strerror(err));
  }
  Status owned = shm::CheckOwned(name, st, "link");
  if (!owned.ok()) {
    close(fd);
    return owned;
  }
  if (static_cast<size_t>(st.st_size) < HeaderBytes() + 4096) {
    close(fd);
    return NotFoundError("shared memory " + name + " is not sized yet");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (map == MAP_FAILED) {
    close(fd);
    return UnavailableError("mapping shared memory " + name + ": " + std::strerror(errno));
  }
  auto refuse = [&](Status why) {
    munmap(map, bytes);
    close(fd);
    return why;
  };
  auto* shared = static_cast<Shared*>(map);
  const uint64_t magic = reinterpret_cast<std::atomic<uint64_t>*>(&shared->magic)->load();
  if (magic != kMagic) {
    return refuse(NotFoundError("shared memory " + name + " is not initialised yet"));
  }
  const uint64_t cap = shared->capacity;
  std::string boot(shared->boot_id, strnlen(shared->boot_id, sizeof(shared->boot_id)));
  if (cap < 4096 || cap > kMaxCapacity || (cap & (cap - 1)) != 0 || HeaderBytes() + cap != bytes) {
    return refuse(FailedPreconditionError("shared memory " + name + " has a bad layout"));
  }
  if (boot.empty() || boot != BootId()) {
    return refuse(FailedPreconditionError("shared memory " + name + " was made on another boot"));
  }
  if (shared->writer_attached.exchange(1) != 0) {
    return refuse(FailedPreconditionError("shared memory " + name + " has a writer already"));
  }
  // Each page written once here, for the same reason the reader writes them
  // all (nothing is published yet: the reader reads none of it).
  std::memset(static_cast<uint8_t*>(map) + HeaderBytes(), 0, cap);
  shm_unlink(name.c_str());  // both sides have it: the name is no longer needed
  return std::shared_ptr<ShmLink>(new ShmLink(name, true, fd, shared, bytes, cap));
}

ShmLink::~ShmLink() {
  Close();
  if (!writer_ && shared_->writer_attached.load() == 0) shm_unlink(name_.c_str());
  munmap(shared_, map_bytes_);
  close(fd_);
}

void ShmLink::Close() {
  if (closed_.exchange(true)) return;
  if (writer_) {
    shared_->writer_closed.store(1);
    shared_->data_seq.fetch_add(1);
    shm::FutexWake(&shared_->data_seq);
  } else {
    shared_->reader_closed.store(1);
    shared_->space_seq.fetch_add(1);
    shm::FutexWake(&shared_->space_seq);
  }
}

bool ShmLink::PeerClosed() const {
  return broken_.load() || (writer_ ? shared_->reader_closed : shared_->writer_closed).load() != 0;
}

void ShmLink::Break() const {
  if (broken_.exchange(true)) return;
  // The other side stops waiting for this one.
  std::atomic<uint32_t>& closed = writer_ ? shared_->writer_closed : shared_->reader_closed;
  std::atomic<uint32_t>& seq = writer_ ? shared_->data_seq : shared_->space_seq;
  closed.store(1);
  seq.fetch_add(1);
  shm::FutexWake(&seq);
}

bool ShmLink::WriterAttached() const { return shared_->writer_attached.load() != 0; }

bool ShmLink::ReaderAlive() const { return shm::LockFirstByte(fd_, F_OFD_GETLK); }

// read_ is written by the reader's thread only (under borrow_mu_, for
// Release on other threads): that thread reads it without the lock.
// Each side keeps its own position (head_, read_ and tail_) and reads the
// other's word once per call: a word outside what the stream allows breaks
// the link.
size_t ShmLink::Readable() const {
  if (broken_.load(std::memory_order_relaxed)) return 0;
  const uint64_t head = shared_->head.load(std::memory_order_acquire);
  const uint64_t tail = tail_.load(std::memory_order_relaxed);
  if (head < read_ || head - tail > capacity_) {
    Break();
    return 0;
  }
  return static_cast<size_t>(head - read_);
}

size_t ShmLink::Writable() const {
  if (broken_.load(std::memory_order_relaxed)) return 0;
  const uint64_t head = head_.load(std::memory_order_relaxed);
  const uint64_t tail = shared_->tail.load(std::memory_order_acquire);
  if (tail > head || head - tail > capacity_) {
    Break();
    return 0;
  }
  return capacity_ - static_cast<size_t>(head - tail);
}

uint64_t ShmLink::Position() const {
  return writer_ ? head_.load(std::memory_order_relaxed) : read_;
}

bool ShmLink::Contiguous(size_t n) const {
  return static_cast<size_t>(Position() & (capacity_ - 1)) + n <= capacity_;
}

size_t ShmLink::Pinned() const {
  std::lock_guard<std::mutex> lock(borrow_mu_);
  for (const Lent& l : lent_) {
    if (!l.released) return static_cast<size_t>(read_ - l.start);
  }
  return 0;
}

void ShmLink::Publish(uint64_t head) {
  head_.store(head, std::memory_order_relaxed);
  shared_->head.store(head, std::memory_order_seq_cst);
  shared_->data_seq.fetch_add(1, std::memory_order_seq_cst);
  if (shared_->reader_waiting.load(std::memory_order_seq_cst) != 0)
    shm::FutexWake(&shared_->data_seq);
}

size_t ShmLink::Write(const void* data, size_t n) {
  n = std::min(n, Writable());
  if (n == 0) return 0;
  const uint64_t head = head_.load(std::memory_order_relaxed);
  const size_t at = static_cast<size_t>(head & (capacity_ - 1));
  const size_t first = std::min(n, capacity_ - at);
  std::memcpy(data_ + at, data, first);
  std::memcpy(data_, static_cast<const uint8_t*>(data) + first, n - first);
  Publish(head + n);
  return n;
}

bool ShmLink::Pad(size_t n) {
  if (n == 0) return true;
  if (Writable() < n) return false;
  Publish(head_.load(std::memory_order_relaxed) + n);
  return true;
}

void ShmLink::UpdateTailLocked() {
  while (!lent_.empty() && lent_.front().released) lent_.pop_front();
  const uint64_t tail = lent_.empty() ? read_ : lent_.front().start;
  tail_.store(tail, std::memory_order_relaxed);
  shared_->tail.store(tail, std::memory_order_seq_cst);
  shared_->space_seq.fetch_add(1, std::memory_order_seq_cst);
  if (shared_->writer_waiting.load(std::memory_order_seq_cst) != 0)
    shm::FutexWake(&shared_->space_seq);
}

size_t ShmLink::Read(void* out, size_t n) {
  std::lock_guard<std::mutex> lock(borrow_mu_);
  n = std::min(n, Readable());
  if (n == 0) return 0;
  const size_t at = static_cast<size_t>(read_ & (capacity_ - 1));
  const size_t first = std::min(n, capacity_ - at);
  std::memcpy(out, data_ + at, first);
  std::memcpy(static_cast<uint8_t*>(out) + first, data_, n - first);
  read_ += n;
  UpdateTailLocked();
  return n;
}

void ShmLink::Skip(size_t n) {
  std::lock_guard<std::mutex> lock(borrow_mu_);
  read_ += std::min(n, Readable());
  UpdateTailLocked();
}

std::shared_ptr<const void> ShmLink::Borrow(size_t n, const uint8_t** data) {
  std::lock_guard<std::mutex> lock(borrow_mu_);
  const uint64_t start = read_;
  *data = data_ + static_cast<size_t>(start & (capacity_ - 1));
  read_ += n;
  lent_.push_back(Lent{start, read_, false});
  std::shared_ptr<ShmLink> self = shared_from_this();
  return std::shared_ptr<const void>(*data, [self, start](const void*) { self->Release(start); });
}

void ShmLink::Release(uint64_t start) {
  std::lock_guard<std::mutex> lock(borrow_mu_);
  for (Lent& l : lent_) {
    if (l.start == start && !l.released) {
      l.released = true;
      break;
    }
  }
  UpdateTailLocked();
}

void ShmLink::WaitReadable(Deadline deadline) {
  WaitOn(&shared_->data_seq, &shared_->reader_waiting, deadline,
         [this] { return Readable() > 0 || PeerClosed(); });
}

void ShmLink::WaitReadableAny(const std::vector<ShmLink*>& links, Deadline deadline) {
  if (links.empty()) return;
  if (links.size() == 1) return links[0]->WaitReadable(deadline);
  auto ready = [&links] {
    for (const ShmLink* l : links) {
      if (l->Readable() > 0 || l->PeerClosed()) return true;
    }
    return false;
  };
  if (shm::Spin(ready)) return;
  // One sleep on every link's sequence word at once (futex_waitv); past
  // its limit of words, a short sleep on the first ones.
  const size_t n = std::min<size_t>(links.size(), FUTEX_WAITV_MAX);
  std::vector<futex_waitv> waiters(n);
  for (size_t i = 0; i < n; ++i) {
    Shared* s = links[i]->shared_;
    waiters[i].val = s->data_seq.load(std::memory_order_seq_cst);
    waiters[i].uaddr = reinterpret_cast<uintptr_t>(&s->data_seq);
    waiters[i].flags = FUTEX_32;
    s->reader_waiting.store(1, std::memory_order_seq_cst);
  }
  if (!ready()) {
    const auto cap = std::chrono::milliseconds(n < links.size() ? 1 : 100);
    const auto until = std::min(deadline.at(), std::chrono::steady_clock::now() + cap);
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(until.time_since_epoch()).count();
    // steady_clock is CLOCK_MONOTONIC; futex_waitv's timeout is absolute.
    timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    if (syscall(SYS_futex_waitv, waiters.data(), static_cast<unsigned>(n), 0, &ts,
                CLOCK_MONOTONIC) < 0 &&
        errno == ENOSYS) {
      shm::FutexWait(&links[0]->shared_->data_seq, static_cast<uint32_t>(waiters[0].val),
                     Deadline::At(until));
    }
  }
  for (size_t i = 0; i < n; ++i) links[i]->shared_->reader_waiting.store(0);
}

void ShmLink::WaitWritable(Deadline deadline) {
  WaitOn(&shared_->space_seq, &shared_->writer_waiting, deadline,
         [this] { return Writable() > 0 || PeerClosed(); });
}

}  // namespace gradsync::wire
