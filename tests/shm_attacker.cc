// shm_attacker: a hostile local process for the shared-memory tests. It
// plays the other side of a link (wire/shm_link.h) the way a buggy or
// malicious peer could, writing the words the link's owner must not trust.
//
//   shm_attacker squat NAME        makes NAME first, mode 0666, laid out as a
//                                  link (magic, capacity, boot id), and keeps
//                                  its tail far ahead of any head
//   shm_attacker squat-other NAME  the same, mode 0600 but owned by uid 65534
//                                  (needs root)
//   shm_attacker tail-ahead NAME   makes NAME as a reader does, then keeps the
//                                  tail 2^40 bytes ahead of the head
//   shm_attacker tail-behind NAME  reads honestly until 2 capacities went
//                                  through, then sets the tail back to 0
//   shm_attacker head-ahead NAME   opens NAME as its writer, then keeps the
//                                  head 2^40 bytes ahead of the tail
//   shm_attacker frame NAME BYTES  opens NAME as its writer and announces a
//                                  same-host message whose payload frame is
//                                  BYTES long, and sends nothing more
//
// Prints "ready" once it is in place, then runs until it is killed.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "wire/shm_link.h"

namespace gradsync {
namespace {

using wire::ShmLink;

constexpr size_t kCapacity = 4096;
constexpr uint64_t kMagic = 0x31424C5347ull;  // as wire/shm_link.cc writes it
constexpr uint64_t kFar = uint64_t{1} << 40;

int Fail(const std::string& what) {
  std::fprintf(stderr, "shm_attacker: %s: %s\n", what.c_str(), std::strerror(errno));
  return 1;
}

void Ready() {
  std::printf("ready\n");
  std::fflush(stdout);
}

std::atomic<uint64_t>* Word(uint8_t* map, size_t offset) {
  return reinterpret_cast<std::atomic<uint64_t>*>(map + offset);
}

// Maps the object under `name` (a view of the attacker's own).
uint8_t* MapByName(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return nullptr;
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return map == MAP_FAILED ? nullptr : static_cast<uint8_t*>(map);
}

[[noreturn]] void Forever(uint8_t* map, size_t offset, size_t other, int64_t ahead) {
  for (;;) {
    const uint64_t base = Word(map, other)->load();
    Word(map, offset)->store(base + static_cast<uint64_t>(ahead));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

int Squat(const std::string& name, bool other_uid) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return Fail("shm_open " + name);
  if (other_uid ? fchown(fd, 65534, 65534) != 0 : fchmod(fd, 0666) != 0) {
    return Fail("changing the owner or mode");
  }
  const size_t bytes = ShmLink::kDataOffset + kCapacity;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return Fail("ftruncate");
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) return Fail("mmap");
  auto* map = static_cast<uint8_t*>(mapped);
  const uint64_t capacity = kCapacity;
  std::memcpy(map + 8, &capacity, 8);
  const std::string boot = wire::BootId();
  std::memcpy(map + 16, boot.data(), std::min<size_t>(boot.size(), 63));
  Word(map, 0)->store(kMagic);
  Ready();
  Forever(map, ShmLink::kTailOffset, ShmLink::kHeadOffset, static_cast<int64_t>(kFar));
}

int AsReader(const std::string& name, bool behind) {
  auto link = ShmLink::Create(name, kCapacity);
  if (!link.ok()) return Fail(link.status().message());
  uint8_t* map = MapByName(name, ShmLink::kDataOffset + kCapacity);
  if (map == nullptr) return Fail("mapping " + name);
  Ready();
  if (behind) {
    std::vector<uint8_t> sink(kCapacity);
    for (size_t got = 0; got < 2 * kCapacity;) {
      got += (*link)->Read(sink.data(), sink.size());
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    for (;;) {
      Word(map, ShmLink::kTailOffset)->store(0);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  Forever(map, ShmLink::kTailOffset, ShmLink::kHeadOffset, static_cast<int64_t>(kFar));
}

int AsWriter(const std::string& name, const char* frame_bytes) {
  uint8_t* map = nullptr;
  while ((map = MapByName(name, ShmLink::kDataOffset + kCapacity)) == nullptr) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto link = ShmLink::Open(name);
  if (!link.ok()) return Fail(link.status().message());
  if (frame_bytes == nullptr) {
    Ready();
    Forever(map, ShmLink::kHeadOffset, ShmLink::kTailOffset, static_cast<int64_t>(kFar));
  }
  // The same-host framing (wire/same_host_transport.h): magic, frame count,
  // the size of each frame (a small header, then the payload).
  const uint32_t magic = 0x47534D31, count = 2;
  const uint64_t sizes[2] = {64, std::strtoull(frame_bytes, nullptr, 10)};
  uint8_t table[24];
  std::memcpy(table, &magic, 4);
  std::memcpy(table + 4, &count, 4);
  std::memcpy(table + 8, sizes, 16);
  std::vector<uint8_t> header(64, 0);
  if ((*link)->Write(table, sizeof(table)) != sizeof(table) ||
      (*link)->Write(header.data(), header.size()) != header.size()) {
    return Fail("writing the frame table");
  }
  Ready();
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

int Main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: shm_attacker MODE NAME [BYTES]\n");
    return 2;
  }
  const std::string mode = argv[1], name = argv[2];
  if (mode == "squat" || mode == "squat-other") return Squat(name, mode == "squat-other");
  if (mode == "tail-ahead" || mode == "tail-behind") return AsReader(name, mode == "tail-behind");
  if (mode == "head-ahead") return AsWriter(name, nullptr);
  if (mode == "frame" && argc > 3) return AsWriter(name, argv[3]);
  std::fprintf(stderr, "shm_attacker: unknown mode %s\n", mode.c_str());
  return 2;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
