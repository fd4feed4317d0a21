// libFuzzer target over the one-host all-reduce (client/host_collectives.h)
// with a hostile peer. Rank 0 is a real HostCollectives over real segments
// (shm_open'd, mapped as in a job); rank 1 is played by the input, which
// writes its segment: honest publications (the headers an honest peer
// would write, with arbitrary data), honest ones with one byte changed,
// arbitrary words into its control words and arbitrary bytes anywhere.
// Rank 0's all-reduces must never crash, read outside a slot or hang: each
// returns at once (its deadline has passed when nothing is published) with
// an error, or OK with exactly the sum of its own buffer and what the peer
// published. After an error rank 0 is broken, and the input ends.
//
// Input: a sequence of operations, each an opcode byte and its arguments.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/elementwise.h"
#include "client/host_collectives.h"
#include "client/ring_plan.h"
#include "tests/fuzz/byte_reader.h"
#include "wire/shm_segment.h"

namespace gradsync::fuzz {
namespace {

using client::HostCollectives;
using client::ReduceOp;

constexpr size_t kSlotBytes = 4096;   // 1024 f32
constexpr size_t kSmallBytes = 4096;  // whole buffers up to 512 f32 (2 ranks)

using Input = ByteReader;

void Check(bool ok) {
  if (!ok) std::abort();
}

// Stands in for the ring in the setup: the peer always says "done".
class AgreeingRing : public client::Collectives {
 public:
  const char* name() const override { return "ring"; }
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  Status AllReduce(void*, size_t, DType, ReduceOp, const client::OpTag&, Deadline) override {
    return UnimplementedError("not in this fuzzer");
  }
  Status AllGather(const void* in, size_t bytes, void* out, const client::OpTag&,
                   Deadline) override {
    std::memcpy(out, in, bytes);
    std::memset(static_cast<uint8_t*>(out) + bytes, 1, bytes);
    return Status();
  }
  Status Broadcast(void*, size_t, int, const client::OpTag&, Deadline) override {
    return UnimplementedError("not in this fuzzer");
  }
};

struct Peer {
  std::unique_ptr<wire::ShmSegment> segment;
  uint8_t* at(size_t offset) { return segment->mutable_data() + offset; }
  size_t SlotHeader(uint64_t phase) const {
    return HostCollectives::kSlot0Offset + (phase % 2) * (4096 + kSlotBytes);
  }
  uint8_t* SlotData(uint64_t phase) { return at(SlotHeader(phase) + 4096); }
  void Publish(uint64_t published) {
    std::memcpy(at(HostCollectives::kPublishedOffset), &published, sizeof(published));
  }
};

struct Call {
  size_t count = 1;
  DType dtype = DType::kF32;
  ReduceOp reduce = ReduceOp::kSum;
  client::OpTag tag;
  size_t bytes() const { return count * DTypeSize(dtype); }
  bool whole() const { return bytes() * 2 <= kSmallBytes; }
};

Call ReadCall(Input& in, uint64_t seq) {
  Call c;
  c.dtype = (in.Byte() & 1) ? DType::kF16 : DType::kF32;
  c.reduce = (in.Byte() & 1) ? ReduceOp::kAverage : ReduceOp::kSum;
  c.count = 1 + in.Word(2) % (kSlotBytes / DTypeSize(c.dtype));  // one chunk at most
  c.tag = client::OpTag{7, 2, seq, 0x1234};
  return c;
}

// What an honest peer writes for `c` at phase `p`: the headers (and the
// published word) of the one or two phases the call takes, over data from
// the input.
void PublishHonestly(Peer& peer, const Call& c, uint64_t p, Input& in) {
  HostCollectives::Fingerprint f;
  f.step = c.tag.step;
  f.seq = c.tag.seq;
  f.names_hash = c.tag.names_hash;
  f.count = c.count;
  f.bucket = c.tag.bucket;
  f.dtype = static_cast<uint32_t>(c.dtype);
  f.reduce = static_cast<uint32_t>(c.reduce);
  f.epoch = 0;
  f.world = 2;
  f.offset = 0;
  f.chunk = c.count;
  const int phases = c.whole() ? 1 : 2;
  for (int k = 0; k < phases; ++k) {
    f.phase = p + static_cast<uint64_t>(k);
    f.kind = c.whole() ? HostCollectives::kWhole
                       : (k == 0 ? HostCollectives::kChunk : HostCollectives::kReduced);
    std::memcpy(peer.at(peer.SlotHeader(f.phase)), &f, sizeof(f));
    uint8_t* data = peer.SlotData(f.phase);
    for (size_t i = 0; i < c.bytes(); ++i) data[i] = in.Byte();
  }
  peer.Publish(p + static_cast<uint64_t>(phases));
}

// Rank 0's result when the peer published `c` honestly at phase p.
std::vector<uint8_t> Expected(Peer& peer, const Call& c, uint64_t p,
                              const std::vector<uint8_t>& mine) {
  std::vector<uint8_t> out = mine;
  if (c.whole()) {
    client::AddInto(out.data(), peer.SlotData(p), c.count, c.dtype);
    if (c.reduce == ReduceOp::kAverage) client::DivideBy(out.data(), c.count, c.dtype, 2);
    return out;
  }
  const size_t es = DTypeSize(c.dtype);
  const client::Span own = client::Segment(c.count, 2, 0), theirs = client::Segment(c.count, 2, 1);
  client::AddInto(out.data() + own.begin * es, peer.SlotData(p) + own.begin * es, own.size(),
                  c.dtype);
  if (c.reduce == ReduceOp::kAverage) {
    client::DivideBy(out.data() + own.begin * es, own.size(), c.dtype, 2);
  }
  std::memcpy(out.data() + theirs.begin * es, peer.SlotData(p + 1) + theirs.begin * es,
              theirs.size() * es);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static uint64_t runs = 0;
  const uint64_t job = (static_cast<uint64_t>(getpid()) << 24) ^ ++runs;
  client::HostOptions options;
  options.slot_bytes = kSlotBytes;
  options.small_bytes = kSmallBytes;
  options.poll_interval = Millis(0);  // the deadline is looked at on every turn
  Peer peer;
  auto segment = wire::ShmSegment::Create(HostCollectives::SegmentName(job, 0, 1),
                                          HostCollectives::SegmentBytes(options));
  Check(segment.ok());
  peer.segment = std::move(*segment);
  AgreeingRing ring;
  auto made = HostCollectives::Create(client::HostPeers{0, 2, job, 0}, options, &ring, nullptr,
                                      Deadline::After(std::chrono::seconds(10)));
  Check(made.ok() && *made != nullptr);
  std::unique_ptr<HostCollectives> host = std::move(*made);

  Input in(data, size);
  uint64_t phase = 0, seq = 0;  // rank 0's next phase and operation
  while (!in.empty()) {
    const uint8_t op = in.Byte() % 5;
    if (op == 2) {  // a word into the control words
      const size_t offsets[] = {HostCollectives::kPublishedOffset, 8, 64,
                                HostCollectives::kAbortedOffset};
      const size_t at = offsets[in.Byte() % 4];
      const uint64_t v = in.Word(8);
      std::memcpy(peer.at(at), &v, at == 0 ? 8 : 4);
      continue;
    }
    if (op == 3) {  // bytes anywhere in the segment
      const size_t at = in.Word(3) % peer.segment->size();
      const size_t n = std::min<size_t>(in.Byte(), peer.segment->size() - at);
      for (size_t i = 0; i < n; ++i) *peer.at(at + i) = in.Byte();
      continue;
    }
    const Call c = ReadCall(in, seq);
    const bool honest = op == 0 || op == 1;
    if (honest) PublishHonestly(peer, c, phase, in);
    if (op == 1) {  // one byte of a header changed
      const size_t at = peer.SlotHeader(phase) + in.Byte() % sizeof(HostCollectives::Fingerprint);
      *peer.at(at) ^= static_cast<uint8_t>(1 + in.Byte() % 255);
    }
    std::vector<uint8_t> mine(c.bytes());
    for (auto& b : mine) b = in.Byte();
    std::vector<uint8_t> buffer = mine;
    const Status s = host->AllReduce(buffer.data(), c.count, c.dtype, c.reduce, c.tag,
                                     Deadline::After(Millis(0)));
    if (!s.ok()) {
      Check(!s.message().empty());
      Check(s.code() == StatusCode::kAborted || s.code() == StatusCode::kDeadlineExceeded ||
            s.code() == StatusCode::kUnavailable);
      break;  // broken for good
    }
    if (op == 0) {
      const std::vector<uint8_t> want = Expected(peer, c, phase, mine);
      Check(std::memcmp(buffer.data(), want.data(), want.size()) == 0);
    }
    phase += c.whole() ? 1 : 2;
    ++seq;
  }
  return 0;
}

}  // namespace gradsync::fuzz
