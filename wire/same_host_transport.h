// SameHostTransport: a Transport over another one (ZeroMQ) that carries
// the messages to one neighbour on the same host, and from another, through
// shared memory (wire/shm_link.h) instead: what a ring of workers on one
// machine needs. Everything else goes through the inner transport, which
// also stays connected to the neighbours (replies to them use it).
//
// To the right neighbour (`right_endpoint`, when `shm_right`): Connect
// creates the link, named after the job and this transport's identity. A
// Send on that connection copies the message into the link at once when
// it fits and nothing is queued before it; otherwise it is queued (its
// payloads held, not copied) and a writer thread copies it in as the
// reader makes room, so a send never waits on the neighbour. A payload is
// released once its bytes are in the link.
//
// From the left neighbour (`left_identity`, when `shm_left`): Receive opens
// that neighbour's link once it exists and returns its messages as coming
// from Inbound(left_identity), between the inner transport's messages
// (looked at between waits on the link of at most 2 ms).
// Where shared memory cannot be made or opened (no /dev/shm, another boot)
// a warning says so and the neighbour is heard through the inner transport.
// Every message read from the link is checked before anything is allocated
// for it: its frame count and each frame's size against the limits. A bad
// frame table ends the link: that Receive returns DataLoss naming the
// neighbour, and later ones serve the inner transport alone.
//
// Framing: u32 magic, u32 frame count, u64 size per frame, then the frames
// (the header first, then the payloads). A payload frame of at most half
// the link that would wrap around the buffer's end starts at its beginning
// instead (both sides skip the same bytes).
//
// Received payloads are handed out in place, without a copy, while the part
// of the link they pin (from the oldest one still held to the read
// position) stays within half of it; past that they are copied into pooled
// buffers. A held payload pins the link behind it: a receiver must let go
// of each (as the ring does) before it waits for much more from the same
// neighbour, or the neighbour's sends stall until it does. A payload lent
// this way and sent on to the right neighbour is copied if it has to queue.
//
// Thread-safety: as the Transport interface (Send and Receive may run on
// different threads; the ring calls each from one).
#ifndef GRADSYNC_WIRE_SAME_HOST_TRANSPORT_H_
#define GRADSYNC_WIRE_SAME_HOST_TRANSPORT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "wire/shm_link.h"
#include "wire/transport.h"

namespace gradsync::wire {

struct SameHostOptions {
  uint64_t job_id = 0;
  std::string right_endpoint;  // the neighbour this transport sends to
  bool shm_right = false;      // it is on this host
  std::string left_identity;   // the neighbour this transport receives from
  bool shm_left = false;       // it is on this host
  size_t link_bytes = size_t{16} << 20;
  size_t max_frames = 8;
  size_t max_frame_bytes = (size_t{1} << 30) + (64 << 10);
};

class SameHostTransport : public Transport {
 public:
  // `inner` must outlive this transport.
  SameHostTransport(Transport* inner, SameHostOptions options);
  ~SameHostTransport() override;  // Shutdown()

  const std::string& identity() const override { return inner_->identity(); }
  StatusOr<std::string> Listen(const std::string& endpoint) override {
    return inner_->Listen(endpoint);
  }
  StatusOr<ConnId> Connect(const std::string& endpoint) override;
  Status Send(const Route& to, Message message, Deadline deadline) override;
  void Post(const Route& to, Message message, Deadline deadline,
            std::function<void(const Status&)> done) override;
  StatusOr<Incoming> Receive(Deadline deadline) override;
  Status Probe(const std::string& endpoint, Deadline deadline) override {
    return inner_->Probe(endpoint, deadline);
  }
  // Stops the writer and closes the links; the inner transport is its
  // owner's to shut down.
  void Shutdown() override;

  // The link's name for a writer of job `job` whose identity is `identity`.
  static std::string LinkName(uint64_t job, const std::string& identity);
  // Whether the links are up (for tests and logs).
  bool sending_by_shm() const { return out_ != nullptr; }
  bool receiving_by_shm() const { return in_ != nullptr; }

 private:
  struct Framed {
    std::vector<uint8_t> table;  // magic, count, sizes
    Message message;
    size_t frame = 0;     // next frame to write (0: the table)
    size_t done = 0;      // bytes of it written
    bool placed = false;  // the padding before it is written
  };
  // Whether `to` is the right neighbour's connection and its link is up.
  bool ToLink(const Route& to) const {
    return out_ != nullptr && to.kind == Route::Kind::kConnection && to.conn == out_conn_;
  }
  // Writes what fits of `f`; true when all of it is in.
  bool WriteSome(Framed& f);
  void WriterLoop();
  // Reads what is there of the next message; set when one is complete.
  StatusOr<std::optional<Incoming>> ReadSome();

  Transport* inner_;
  const SameHostOptions options_;
  std::shared_ptr<ShmLink> out_;
  ConnId out_conn_ = -1;
  bool shm_left_;                 // Receive's thread only: still expecting a link
  std::shared_ptr<ShmLink> in_;  // Receive's thread only
  // in_'s buffer, for Send's thread.
  std::atomic<const uint8_t*> in_begin_{nullptr};
  std::atomic<size_t> in_bytes_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Framed> queue_;  // guarded by mu_; the front may be mid-write
  bool stop_ = false;         // guarded by mu_
  std::thread writer_;

  // The message being read (Receive's thread only).
  enum class Stage { kPrefix, kSizes, kFrames };
  Stage stage_ = Stage::kPrefix;
  uint8_t prefix_[8];
  size_t got_ = 0;  // bytes of the current part
  std::vector<uint64_t> sizes_;
  std::vector<uint8_t> header_;                 // frame 0
  std::vector<std::shared_ptr<uint8_t>> frames_;  // payloads copied, from pool_
  std::vector<std::shared_ptr<const void>> lent_;  // payloads lent by the link
  size_t frame_ = 0;
  bool placed_ = false;    // the padding before frame_ is skipped
  bool borrowing_ = false;  // frame_ is lent from the link, not copied
  // Payload buffers come back here when the receiver lets go of them: a
  // steady stream of messages reuses the same memory.
  class BufferPool;
  std::shared_ptr<BufferPool> pool_;
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_SAME_HOST_TRANSPORT_H_
