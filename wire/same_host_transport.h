// SameHostTransport: a Transport over another one (ZeroMQ) that carries
// the messages between this process and peers on the same host through
// shared memory (wire/shm_link.h) instead: a ring's neighbours, a worker and
// the parameter-server shards of its host. Everything else goes through the
// inner transport, which also stays connected to those peers.
//
// One link per direction and peer, made by its reader: at construction this
// transport makes a link for each peer it receives from (`receive`), named
// after the job and both identities, before anything could be sent to it.
// A peer it sends to (`send`) is written to through the link that peer
// made: opened by Connect(peer's endpoint), which waits up to `open_wait`
// for the peer to have made it, or, for a peer this transport only answers
// (no endpoint), at the first message to Inbound(its identity). Where the
// link cannot be opened (the peer made none, no /dev/shm, another boot) the
// peer is sent to through the inner transport, from the first message on,
// so that one peer's messages never take two ways at once; the same from
// the moment its reader is found closed or dead (checked every
// `alive_every`), which a restarted peer also gets.
//
// A Send to a link copies the message in at once when it fits and nothing
// is queued before it; otherwise it is queued (its payloads held, not
// copied) and a writer thread copies it in as the reader makes room, so a
// send never waits on the peer. A payload is released once its bytes are in
// the link.
//
// Receive returns the links' messages as the inner transport would: an
// answer the writer sent to Inbound(this transport's identity) as coming
// from this transport's connection to the writer (where it has one), any
// other as coming from Inbound(the writer's identity). It takes the links
// in turn, between the inner transport's messages (looked at between waits
// on the links of at most 2 ms).
// Every message read from a link is checked before anything is allocated
// for it: its frame count, each frame's size and their sum against the
// limits (the header against max_header_bytes of wire::Limits); a payload
// that is copied gets its buffer once its bytes are in the link. A bad frame
// table, or a head word the writer publishes outside the stream
// (wire/shm_link.h), ends that link: that Receive returns DataLoss naming
// the peer (counted in links_refused() and in options.refusals), and the peer is heard through the
// inner transport only. A link to a peer whose reader publishes a bad tail
// is given up the same way, and the peer is sent to through the network.
//
// Framing: u32 magic (one for a message sent over a connection, another for
// an answer to an inbound route), u32 frame count, u64 size per frame, then
// the frames (the header first, then the payloads). A payload frame of at most half
// the link that would wrap around the buffer's end starts at its beginning
// instead (both sides skip the same bytes).
//
// Received payloads are handed out in place, without a copy, while the part
// of the link they pin (from the oldest one still held to the read
// position) stays within half of it; past that they are copied into pooled
// buffers. A held payload pins the link behind it: a receiver must let go
// of each (as the ring does) before it waits for much more from the same
// peer, or the peer's sends stall until it does. A payload lent this way
// and sent on through a link is copied if it has to queue.
//
// Thread-safety: as the Transport interface: Send and Post from any
// threads, Receive from one thread at a time.
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

#include "wire/buffer_pool.h"
#include "wire/shm_link.h"
#include "wire/transport.h"

namespace gradsync::wire {

// A peer on this host.
struct SameHostPeer {
  std::string identity;  // its transport identity
  std::string endpoint;  // where it listens; "" when this transport only answers it
  bool send = true;      // what goes to it goes through shared memory
  bool receive = true;   // what it sends comes through shared memory
};

struct SameHostOptions {
  uint64_t job_id = 0;
  // The identity this transport's links go by (their names, what peers
  // know it as); "": the inner transport's.
  std::string identity;
  std::vector<SameHostPeer> peers;
  size_t link_bytes = size_t{16} << 20;  // each link this transport reads
  size_t max_frames = 8;
  size_t max_frame_bytes = (size_t{1} << 30) + (64 << 10);
  // The largest message (all frames) a peer may announce: set it to the
  // largest one the protocol on top sends, since a frame's buffer is
  // allocated once its first bytes are in the link.
  size_t max_message_bytes = (size_t{1} << 30) + (64 << 10);
  Millis open_wait{5000};  // Connect's wait for the peer's link
  Millis alive_every{20};  // how often a reader's liveness is checked
  // Where a link given up for a bad frame table or word is also counted, in
  // `dropped` (may be null): a process's gradsync_transport_dropped_total.
  std::shared_ptr<TransportRefusals> refusals;
};

class SameHostTransport : public Transport {
 public:
  // `inner` must outlive this transport.
  SameHostTransport(Transport* inner, SameHostOptions options);
  // Owns `inner`.
  SameHostTransport(std::unique_ptr<Transport> inner, SameHostOptions options);
  ~SameHostTransport() override;  // Shutdown()

  const std::string& identity() const override {
    return options_.identity.empty() ? inner_->identity() : options_.identity;
  }
  StatusOr<std::string> Listen(const std::string& endpoint) override {
    return inner_->Listen(endpoint);
  }
  StatusOr<ConnId> Connect(const std::string& endpoint) override;
  // A lane to a peer over shared memory takes the link while it is open,
  // and the lane's own connection of the inner transport once it is given
  // up; other lanes go to the inner transport.
  StatusOr<ConnId> ConnectLane(const std::string& endpoint, int lane) override;
  Status Send(const Route& to, Message message, Deadline deadline) override;
  void Post(const Route& to, Message message, Deadline deadline,
            std::function<void(const Status&)> done) override;
  StatusOr<Incoming> Receive(Deadline deadline) override;
  Status Probe(const std::string& endpoint, Deadline deadline) override {
    return inner_->Probe(endpoint, deadline);
  }
  // Stops the writer and closes the links; an inner transport not owned is
  // its owner's to shut down.
  void Shutdown() override;

  // The name of the link from `writer` to `reader` (identities) in job `job`.
  static std::string LinkName(uint64_t job, const std::string& writer, const std::string& reader);
  // How many peers are written to / read from through links now (for tests
  // and logs).
  size_t sending_by_shm() const;
  size_t receiving_by_shm() const;
  // Links this transport read from and gave up for a bad frame table or word.
  uint64_t links_refused() const { return refused_links_.load(); }

 private:
  // Send, or with `post` a Post whose completion is *post: a message that
  // falls back to the network (the link's reader is gone) is posted there,
  // *post moved along, so that a Post never waits for an unreachable peer.
  Status Deliver(const Route& to, Message message, Deadline deadline,
                 std::function<void(const Status&)>* post);
  struct Framed {
    std::vector<uint8_t> table;  // magic, count, sizes
    Message message;
    size_t frame = 0;     // next frame to write (0: the table)
    size_t done = 0;      // bytes of it written
    bool placed = false;  // the padding before it is written
  };
  struct Out;
  struct In;

  // The link peer `to` is written to through, or null (the inner transport).
  Out* OutFor(const Route& to);
  // Whether `out` is written to through its link now; opens it at the first
  // message and gives it up once its reader is gone. Requires out.mu.
  bool Usable(Out& out, const Route& to);
  void Open(Out& out, Deadline wait);  // requires out.mu
  // Writes what fits of `f`; true when all of it is in.
  static bool WriteSome(ShmLink& link, Framed& f);
  void WriterLoop();
  // DataLoss unless the frame sizes `in` announces are within the limits.
  Status CheckSizes(const In& in) const;
  // Reads what is there of `in`'s next message; set when one is complete.
  StatusOr<std::optional<Incoming>> ReadSome(In& in);
  // One message from the links, if any is complete.
  StatusOr<std::optional<Incoming>> ReadLinks();
  // The links that have a writer and are not done (in live_); `waiting`:
  // whether another still waits for its writer.
  const std::vector<ShmLink*>& Live(bool* waiting);
  // Whether `p` lies in a link this transport reads.
  bool InLink(const void* p) const;

  std::unique_ptr<Transport> owned_;
  Transport* inner_;
  const SameHostOptions options_;
  std::vector<std::unique_ptr<Out>> outs_;
  std::vector<std::unique_ptr<In>> ins_;
  size_t next_in_ = 0;          // Receive's thread only: the link to look at first
  std::vector<ShmLink*> live_;  // Receive's thread only: Live's answer
  std::atomic<uint64_t> refused_links_{0};

  std::mutex work_mu_;
  std::condition_variable work_cv_;
  size_t queued_ = 0;  // messages queued over all links; guarded by work_mu_
  bool stop_ = false;  // guarded by work_mu_
  std::thread writer_;

  // Payload buffers come back here when the receiver lets go of them.
  std::shared_ptr<BufferPool> pool_;
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_SAME_HOST_TRANSPORT_H_
