// SameHostTransport's links as its two files see them (wire/same_host_transport.cc:
// links, writing and the writer thread; same_host_transport_read.cc: reading).
// Internal to the transport; its interface is wire/same_host_transport.h.
#ifndef GRADSYNC_WIRE_SAME_HOST_TRANSPORT_IMPL_H_
#define GRADSYNC_WIRE_SAME_HOST_TRANSPORT_IMPL_H_

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "wire/buffer_pool.h"
#include "wire/same_host_transport.h"
#include "wire/validate.h"

namespace gradsync::wire {

constexpr uint32_t kFrameMagic = 0x47534D31;  // "GSM1": sent over a connection
constexpr uint32_t kReplyMagic = 0x47535231;  // "GSR1": an answer to an inbound route
// The largest header any receiver takes (the ZeroMQ transport's bound too).
constexpr uint64_t kMaxHeaderBytes = Limits{}.max_header_bytes;
// How long Receive waits on the link before it looks at the inner transport
// again.
constexpr Millis kInnerPollEvery{2};
// How often a Receive whose links have no writer yet looks again.
constexpr Millis kAttachEvery{5};

// The bytes skipped before a payload frame of `size` at stream position
// `at`, so that a frame the receiver may borrow does not wrap.
inline size_t PaddingBefore(uint64_t at, size_t size, size_t capacity) {
  const size_t offset = static_cast<size_t>(at & (capacity - 1));
  if (size == 0 || size > capacity / 2 || offset + size <= capacity) return 0;
  return capacity - offset;
}

struct SameHostTransport::Out {
  explicit Out(SameHostPeer p) : peer(std::move(p)) {
    for (auto& l : lanes) l.store(-1);
  }
  const SameHostPeer peer;
  std::atomic<ConnId> conn{-1};  // set by Connect(peer.endpoint)
  // Set by ConnectLane(peer.endpoint, k): the inner transport's connection
  // of lane k, which carries that lane's messages once the link is given up.
  std::atomic<ConnId> lanes[kMaxLanes];
  // Whether `id` is this peer's: its connection or one of its lanes.
  bool Owns(ConnId id) const {
    if (id < 0) return false;
    if (conn.load() == id) return true;
    for (const auto& l : lanes) {
      if (l.load() == id) return true;
    }
    return false;
  }
  std::mutex mu;
  enum class State { kUntried, kOpen, kGone };
  State state = State::kUntried;  // guarded by mu
  std::shared_ptr<ShmLink> link;  // guarded by mu; set once, when opened
  std::deque<Framed> queue;       // guarded by mu; the front may be mid-write
  SteadyTime next_alive_check{};  // guarded by mu
};

struct SameHostTransport::In {
  In(std::string id, const Out* o, std::shared_ptr<ShmLink> l)
      : identity(std::move(id)),
        out(o),
        link(std::move(l)),
        begin(link->data()),
        bytes(link->capacity()) {}
  const std::string identity;
  // The same peer's Out, when this transport sends to it too: its answers
  // to this transport's connection come from that connection, as the inner
  // transport's do; what it sends over its own comes from its identity.
  const Out* const out;
  const std::shared_ptr<ShmLink> link;  // made at construction
  std::atomic<bool> done{false};        // given up: the peer is heard through the inner transport
  // Where the link's buffer is while it is read, for Send's threads.
  std::atomic<const uint8_t*> begin;
  const size_t bytes;

  // The message being read (Receive's thread only).
  enum class Stage { kPrefix, kSizes, kFrames };
  Stage stage = Stage::kPrefix;
  uint8_t prefix[8];
  bool reply = false;  // the message answers an inbound route
  size_t got = 0;      // bytes of the current part
  std::vector<uint64_t> sizes;
  std::vector<uint8_t> header;                    // frame 0
  std::vector<std::shared_ptr<uint8_t>> frames;   // payloads copied, from the pool
  std::vector<std::shared_ptr<const void>> lent;  // payloads lent by the link
  size_t frame = 0;
  bool placed = false;     // the padding before `frame` is skipped
  bool borrowing = false;  // `frame` is lent from the link, not copied

  // Receive's thread: the link is given up.
  void Done() {
    link->Close();
    done.store(true);
    begin.store(nullptr);
  }
  bool Reading() const { return !done.load() && link->WriterAttached(); }
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_SAME_HOST_TRANSPORT_IMPL_H_
