// libFuzzer target over a shared-memory link (wire/shm_link.h) whose mapping
// a hostile peer writes into. Each input makes a fresh link (a real
// shm_open'd mapping, both sides in this process) and runs a sequence of
// operations: the real writer's Write and Pad, the real reader's Read, Skip,
// Borrow and releases, and the peer's stores of arbitrary words into the
// head and tail words and of arbitrary bytes anywhere in the mapping. The
// sides must never hand out more than the stream allows nor step outside
// the buffer: any crash, sanitizer report or broken invariant is a bug.
//
// Input: a sequence of operations, each an opcode byte and its arguments.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/fuzz/byte_reader.h"
#include "wire/shm_link.h"

namespace gradsync::fuzz {
namespace {

using wire::ShmLink;

constexpr size_t kCapacity = 4096;

using Input = ByteReader;

void Check(bool ok) {
  if (!ok) std::abort();
}

// A length that is often small, sometimes near or past the capacity.
size_t Length(Input& in) {
  const uint8_t b = in.Byte();
  if (b < 0xf0) return b;
  return static_cast<size_t>(in.Word(2)) % (2 * kCapacity + 1);
}

// A store of a word the peer chose into the mapping, as another process
// would make it: the mapping's header starts kDataOffset before the buffer.
void PeerStore(const ShmLink& reader, size_t offset, uint64_t value, size_t bytes) {
  auto* base = const_cast<uint8_t*>(reader.data()) - ShmLink::kDataOffset;
  if (offset == ShmLink::kHeadOffset || offset == ShmLink::kTailOffset) {
    reinterpret_cast<std::atomic<uint64_t>*>(base + offset)->store(value);
    return;
  }
  std::memcpy(base + offset, &value, bytes);
}

struct Link {
  std::shared_ptr<ShmLink> reader, writer;
  std::vector<std::shared_ptr<const void>> lent;
};

void ReaderOp(Link& l, uint8_t op, Input& in) {
  ShmLink& r = *l.reader;
  switch (op) {
    case 0: {  // Read into storage of exactly the size asked for
      const size_t n = Length(in);
      std::unique_ptr<uint8_t[]> out(new uint8_t[n == 0 ? 1 : n]);
      const size_t before = r.Readable();
      const size_t got = r.Read(out.get(), n);
      Check(got <= n && got <= before);
      break;
    }
    case 1: {
      const size_t before = r.Position();
      r.Skip(Length(in));
      Check(r.Position() - before <= kCapacity);
      break;
    }
    case 2: {  // Borrow as the contract allows: readable and not wrapping
      const size_t n = Length(in);
      if (n == 0 || n > r.Readable() || !r.Contiguous(n)) break;
      const uint8_t* p = nullptr;
      l.lent.push_back(r.Borrow(n, &p));
      Check(r.Contains(p) && r.Contains(p + n - 1));
      uint8_t sum = 0;
      for (size_t i = 0; i < n; ++i) sum ^= p[i];
      volatile uint8_t sink = sum;
      (void)sink;
      break;
    }
    default:  // release one lent region, in any order
      if (!l.lent.empty()) {
        const size_t i = in.Byte() % l.lent.size();
        l.lent.erase(l.lent.begin() + static_cast<std::ptrdiff_t>(i));
      }
      break;
  }
  Check(r.Readable() <= kCapacity && r.Pinned() <= kCapacity);
}

void WriterOp(Link& l, uint8_t op, Input& in) {
  ShmLink& w = *l.writer;
  if (op == 0) {
    size_t n = Length(in);
    const uint8_t* p = in.Take(&n);
    const size_t room = w.Writable();
    Check(w.Write(p, n) <= std::min(n, room));
  } else {
    const size_t n = Length(in);
    const bool fits = w.Writable() >= n;
    Check(w.Pad(n) == fits);
  }
  Check(w.Writable() <= kCapacity);
}

void PeerOp(Link& l, uint8_t op, Input& in) {
  switch (op) {
    case 0:  // the head word: near the real head, or anything
      PeerStore(*l.reader, ShmLink::kHeadOffset,
                (in.Byte() & 1) ? l.writer->Position() + Length(in) - 128 : in.Word(8), 8);
      break;
    case 1:  // the tail word
      PeerStore(*l.reader, ShmLink::kTailOffset,
                (in.Byte() & 1) ? l.reader->Position() + Length(in) - 128 : in.Word(8), 8);
      break;
    default: {  // any bytes anywhere in the header page or the buffer
      const size_t offset =
          static_cast<size_t>(in.Word(2)) % (ShmLink::kDataOffset + kCapacity - 8);
      PeerStore(*l.reader, offset, in.Word(8), 1 + in.Byte() % 8);
      break;
    }
  }
}

}  // namespace
}  // namespace gradsync::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gradsync::wire::ShmLink;
  namespace f = gradsync::fuzz;
  static int serial = 0;
  const std::string name =
      "/gradsync-fuzz-" + std::to_string(getpid()) + "-" + std::to_string(serial++);
  f::Link l;
  auto reader = ShmLink::Create(name, f::kCapacity);
  if (!reader.ok()) std::abort();
  auto writer = ShmLink::Open(name);
  if (!writer.ok()) std::abort();
  l.reader = *reader;
  l.writer = *writer;
  f::Input in(data, size);
  for (int steps = 0; !in.empty() && steps < 256; ++steps) {
    const uint8_t op = in.Byte();
    switch (op >> 6) {
      case 0:
        f::ReaderOp(l, op & 3, in);
        break;
      case 1:
        f::WriterOp(l, op & 1, in);
        break;
      case 2:
        f::PeerOp(l, op % 3, in);
        break;
      default:
        f::ReaderOp(l, 0, in);
        f::WriterOp(l, 0, in);
        break;
    }
  }
  // Regions still lent are released after both sides are done with them.
  l.lent.clear();
  return 0;
}
