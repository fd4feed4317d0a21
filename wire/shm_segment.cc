#include "wire/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "wire/shm_common.h"
#include "wire/shm_link.h"

namespace gradsync::wire {

namespace {

constexpr uint64_t kMagic = 0x31474553534Bull;  // "KSSEG1"
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kMaxBytes = size_t{1} << 34;

struct Header {
  std::atomic<uint64_t> magic;  // published last
  uint64_t bytes;
  char boot_id[64];
};
static_assert(sizeof(Header) <= kHeaderBytes);

size_t Rounded(size_t bytes) { return (bytes + 4095) & ~size_t{4095}; }

}  // namespace

ShmSegment::ShmSegment(std::string name, bool owner, int fd, void* map, size_t map_bytes,
                       size_t bytes)
    : name_(std::move(name)),
      owner_(owner),
      fd_(fd),
      map_(map),
      map_bytes_(map_bytes),
      data_(static_cast<uint8_t*>(map) + kHeaderBytes),
      bytes_(bytes) {}

StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name, size_t bytes) {
  if (bytes == 0 || bytes > kMaxBytes) {
    return InvalidArgumentError("a shared-memory segment of " + std::to_string(bytes) + " bytes");
  }
  const size_t map_bytes = kHeaderBytes + Rounded(bytes);
  GS_ASSIGN_OR_RETURN(const int fd, shm::CreateLocked(name, map_bytes));
  void* map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (map == MAP_FAILED) {
    const int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return UnavailableError("mapping " + name + ": " + std::strerror(err));
  }
  std::memset(static_cast<uint8_t*>(map) + kHeaderBytes, 0, Rounded(bytes));
  auto* header = new (map) Header();
  header->bytes = bytes;
  const std::string boot = BootId();
  std::strncpy(header->boot_id, boot.c_str(), sizeof(header->boot_id) - 1);
  header->magic.store(kMagic, std::memory_order_release);
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, true, fd, map, map_bytes, bytes));
}

StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError("no shared memory " + name + " yet");
    return UnavailableError("shm_open " + name + ": " + std::strerror(errno));
  }
  auto refuse = [&](Status why, void* map = nullptr, size_t map_bytes = 0) {
    if (map != nullptr) munmap(map, map_bytes);
    close(fd);
    return why;
  };
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return refuse(UnavailableError("fstat of shared memory " + name + ": " + std::strerror(errno)));
  }
  Status owned = shm::CheckOwned(name, st, "segment");
  if (!owned.ok()) return refuse(owned);
  const size_t map_bytes = kHeaderBytes + Rounded(bytes);
  if (static_cast<size_t>(st.st_size) != map_bytes) {
    return refuse(st.st_size == 0
                      ? NotFoundError("shared memory " + name + " is not sized yet")
                      : FailedPreconditionError("shared memory " + name + " holds " +
                                                std::to_string(st.st_size) + " bytes, not " +
                                                std::to_string(map_bytes)));
  }
  void* map = mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (map == MAP_FAILED) {
    return refuse(UnavailableError("mapping shared memory " + name + ": " + std::strerror(errno)));
  }
  const auto* header = static_cast<const Header*>(map);
  if (header->magic.load(std::memory_order_acquire) != kMagic) {
    return refuse(NotFoundError("shared memory " + name + " is not initialised yet"), map,
                  map_bytes);
  }
  const uint64_t size = header->bytes;
  char boot_id[sizeof(header->boot_id)];
  std::memcpy(boot_id, header->boot_id, sizeof(boot_id));
  const std::string boot(boot_id, strnlen(boot_id, sizeof(boot_id)));
  if (size != bytes) {
    return refuse(FailedPreconditionError("shared memory " + name + " has a bad layout"), map,
                  map_bytes);
  }
  if (boot.empty() || boot != BootId()) {
    return refuse(FailedPreconditionError("shared memory " + name + " was made on another boot"),
                  map, map_bytes);
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, false, fd, map, map_bytes, bytes));
}

ShmSegment::~ShmSegment() {
  if (owner_) Unlink();
  munmap(map_, map_bytes_);
  close(fd_);
}

bool ShmSegment::OwnerAlive() const { return shm::LockFirstByte(fd_, F_OFD_GETLK); }

void ShmSegment::Unlink() {
  if (!owner_ || unlinked_) return;
  unlinked_ = true;
  shm_unlink(name_.c_str());
}

}  // namespace gradsync::wire
