// TcpStreamTransport: a Transport over plain TCP connections that the
// calling threads read and write themselves, for a ring's neighbours on
// other hosts when the job runs without CURVE. ZeroMQ hands every message
// to an I/O thread on each side (one way on loopback: 47 us raw, 85 us
// through ZmqTransport); here Send writes into the socket from the caller's
// thread when nothing is queued before it, and Receive polls the sockets and
// reads the message into its buffers on the receiver's thread.
//
// Connections:
//   - Connect(endpoint) returns at once; a thread of the connection's own
//     opens it when the first message is queued (retrying a refused connect
//     until that message's deadline), so that a peer that does not answer
//     holds back no other, sends the hello (job id and this transport's
//     identity) and waits for the peer's answer. "Not yet" and "connected
//     already" are waited out the same way (SetAccept); any other
//     refusal fails every queued message with FailedPrecondition naming
//     the endpoint and the reason; a connection that breaks fails them
//     with Unavailable, and the next message connects again.
//   - Listen binds a listening socket and starts a thread that accepts
//     connections and reads their hellos without blocking: a connection is taken only from
//     an identity in `accept`, for this job, one at a time per identity;
//     anything else is answered with the reason (where the hello was read)
//     and closed, counted in refused(). At most `max_pending` connections
//     may be waiting to say hello, each for at most `hello_wait`; past that
//     the oldest that has not passed its hello is closed (or the newcomer).
//   - Replies go back on the connection they answer: Send to
//     Inbound(identity) writes on the connection that identity made, and
//     what a peer sends back on a connection this transport made comes
//     from Connection(id).
//
// Framing: u32 magic, u32 frame count, u64 size per frame, then the frames
// (the header first, then the payloads), as on the same-host links. Every
// message is checked before anything is allocated for it: the frame count,
// each frame's size and their sum against the limits; a connection that
// breaks the framing is closed and that Receive returns DataLoss naming
// the peer. Received payloads go into pooled buffers (wire/buffer_pool.h).
//
// Without node keys a peer's identity is what it says in its hello, as it
// is with plain ZeroMQ. With TcpStreamOptions::node_keys (a CURVE job,
// docs/design/tcp_streams.md) every connection is sealed:
//   - The hello is Noise_KK_25519_AESGCM_BLAKE2b's first message
//     (wire/noise.h) to the key the plan has for the endpoint, its payload
//     the identity. The acceptor opens it under the key of a plan node at
//     the connection's source address (a source with none is closed before
//     reading; connectors bind to their own plan address) and takes it
//     further only when the plan binds that key to the identity said. Its
//     answer is Noise's second message, the verdict sealed.
//   - Split gives one AES-256-GCM key a direction. The connector proves it
//     holds its node key with a sealed word; only then does the acceptor
//     take the connection (and its sealed verdict comes back). A
//     connection that does not prove its key is closed and counted, never
//     taken under its identity. Answers in clear and closes mid-handshake
//     are waited out until the deadline; sealed refusals are final.
//   - Each message is sealed frame by frame under its direction's key with
//     the nonce (message counter, frame index), the header's tag also
//     covering the frame table; the counters start at 1 and only move
//     forward, so a message that was altered, dropped, replayed or
//     reordered does not open: the connection is closed, counted in
//     `refusals->impostors`, and Receive returns DataLoss naming the peer.
//     A sealed message is written or its connection breaks, never dropped.
//     Keys are renewed (Noise's REKEY) every rekey_messages or rekey_bytes.
//   Sealing goes from the caller's buffers into pooled ones (on the thread
//   that writes the message first: the caller's, or the writer thread's);
//   opening is in place, on the receiving thread.
//
// Thread-safety: Send and Post from any threads, Receive from one thread at
// a time.
#ifndef GRADSYNC_WIRE_TCP_STREAM_TRANSPORT_H_
#define GRADSYNC_WIRE_TCP_STREAM_TRANSPORT_H_

#include <poll.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "wire/buffer_pool.h"
#include "wire/bulk_cipher.h"
#include "wire/node_keys.h"
#include "wire/noise.h"
#include "wire/transport.h"

namespace gradsync::wire {

struct TcpStreamOptions {
  uint64_t job_id = 0;
  std::string identity;             // presented in the hello; random when empty
  std::vector<std::string> accept;  // identities whose connections are taken
  // Also take the lanes (LaneIdentity) of an identity in `accept`, each a
  // connection of its own.
  bool accept_lanes = false;
  // Tell an identity not in `accept` "not yet" rather than "never", so that
  // it tries again until its deadline: a shard's workers of a new
  // membership epoch may connect before the shard has the epoch's plan.
  bool strangers_may_wait = false;
  // Frames a message may have, the header included, each way (at most 65,
  // the header and Limits::max_payload_frames): a longer one is refused.
  size_t max_frames = 8;
  size_t max_header_bytes = 64 << 10;
  size_t max_frame_bytes = (size_t{1} << 30) + (64 << 10);
  size_t max_message_bytes = (size_t{1} << 30) + (64 << 10);
  Millis hello_wait{2000};  // an accepted connection's time to say hello
  size_t max_pending = 16;  // accepted connections that have not, at once
  // Where refusals are also counted (may be null): connections refused at
  // the hello (or that said none, or proved no key) in `handshakes`,
  // connections closed for a bad frame table in `dropped`, for a sealed
  // message that did not open in `impostors`.
  std::shared_ptr<TransportRefusals> refusals;
  // Set (a CURVE job): sealed connections, see above. This node's own key
  // pair and the plan's keys.
  std::shared_ptr<const NodeKeys> node_keys;
  // The library that seals and opens (the setting bulk_cipher).
  BulkCipherEngine cipher = BulkCipherEngine::kBest;
  // Sealed: each direction's key is renewed (Noise's REKEY) after this many
  // messages or sealed bytes under it, whichever comes first. Both ends
  // must use the same; only tests lower them.
  uint64_t rekey_messages = uint64_t{1} << 24;
  uint64_t rekey_bytes = uint64_t{256} << 30;
};

// What both sides of a sealed connection mix into Noise's handshake before
// its first message: "gradsync tcp stream" and its NUL, the hello's version
// (u32) and the job id (u64), little endian.
std::vector<uint8_t> SealedStreamPrologue(uint64_t job);

class TcpStreamTransport : public Transport {
 public:
  explicit TcpStreamTransport(TcpStreamOptions options);
  ~TcpStreamTransport() override;  // Shutdown()

  const std::string& identity() const override { return options_.identity; }
  StatusOr<std::string> Listen(const std::string& endpoint) override;
  StatusOr<ConnId> Connect(const std::string& endpoint) override;
  // A further connection to `endpoint` whose hello presents
  // LaneIdentity(identity(), lane) (lane 0: Connect's identity).
  StatusOr<ConnId> ConnectLane(const std::string& endpoint, int lane) override;
  Status Send(const Route& to, Message message, Deadline deadline) override;
  void Post(const Route& to, Message message, Deadline deadline,
            std::function<void(const Status&)> done) override;
  StatusOr<Incoming> Receive(Deadline deadline) override;
  // Connects, says hello and takes the answer; closes again.
  Status Probe(const std::string& endpoint, Deadline deadline) override;
  void Shutdown() override;

  // Replaces the job and the identities whose connections are taken
  // (`job_id`, `accept`): a shard listens before it knows its job, and its
  // workers change with the membership epoch. Connections already taken
  // stay. Constructed with an empty `accept`, the transport answers every
  // hello "not yet" until this is called, and connectors try again until
  // their deadline (as they do while another connection under their
  // identity is still taken).
  void SetAccept(uint64_t job_id, std::vector<std::string> identities);

  // Connections closed unread or refused: bad hellos, strangers, other
  // jobs, broken framing, past max_pending; and those told "not yet"
  // (SetAccept), which alone are not counted in options.refusals.
  uint64_t refused() const { return refused_.load(); }
  // Whether its connections are sealed (it has node keys).
  bool sealed() const { return options_.node_keys != nullptr; }

 private:
  struct Pending;
  struct Conn;

  // Whether a hello under `identity` may be taken (`accept`, `accept_lanes`).
  bool Accepts(const std::string& identity);
  // The job this transport's connections are of (options_.job_id).
  uint64_t JobId();
  // The connection `to` goes over, or null.
  std::shared_ptr<Conn> ConnFor(const Route& to);
  // Sends or queues; `done` gets the outcome, maybe before this returns.
  void Deliver(const Route& to, Message message, Deadline deadline,
               std::function<void(const Status&)> done);
  void WriterLoop();
  // Opens `c` on a thread of its own (connecting at most until `by`), then
  // wakes the writer; on failure fails its queue. Requires c.mu.
  void StartConnector(const std::shared_ptr<Conn>& c, Deadline by);
  // Sealed: binds `fd` (of `family`) to this node's address in the plan,
  // where its peers take connections from.
  void BindToOwnHost(int fd, int family);
  // Connects `c`, says hello and takes the answer (a connector thread,
  // without c.mu; Probe).
  Status Open(Conn& c, Deadline deadline);
  // Says hello on `fd` (connected to c.endpoint) and takes the answer; on a
  // sealed connection also proves this node's key, checks the peer's and
  // sets c's keys.
  Status Hello(Conn& c, int fd, Deadline deadline);
  // Writes what the socket takes of `p` now (sealing it first on a sealed
  // connection): OK with part of it left when the socket is full. Requires
  // c.mu.
  Status WriteSome(Conn& c, Pending& p);
  // Replaces p's frames by their sealed form under c's next counter.
  // Requires c.mu.
  Status Seal(Conn& c, Pending& p);
  // Marks `c` broken and moves its queue to `failed`. Requires c.mu.
  static void Break(Conn& c, std::deque<Pending>* failed);
  void Wake();
  // The acceptor thread (started by Listen): takes connections on
  // `listening` and reads their hellos.
  void AcceptLoop(int listening);
  // Accepts what waits on `listening` into `pending`.
  void Accept(int listening, std::vector<std::shared_ptr<Conn>>* pending);
  // Reads what `c` has of its hello and answers it; false when `c` is done
  // with (refused, or taken into inbound_).
  bool ReadHello(const std::shared_ptr<Conn>& c);
  // A sealed connection's second step: reads what `c` has of its proof and
  // takes or refuses it; false when `c` is done with.
  bool ReadProof(const std::shared_ptr<Conn>& c);
  // Takes `c` under `identity` unless that identity is connected already
  // (requires mu_); gives `answer` the verdict before `c` can be written
  // to, and returns it.
  uint32_t Take(const std::shared_ptr<Conn>& c, const std::string& identity,
                const std::function<void(uint32_t)>& answer);
  // Receive's thread: reads what `c` has; a message when one is complete.
  StatusOr<std::optional<Incoming>> ReadSome(Conn& c);
  // Opens c's message just read, in place, under its next counter; false
  // when a frame does not open.
  bool OpenSealed(Conn& c) const;
  // Counts (in `counter` of options_.refusals) and logs a refusal.
  void Refused(const std::string& what,
               std::atomic<uint64_t> TransportRefusals::*counter = &TransportRefusals::handshakes);

  TcpStreamOptions options_;
  // With node keys: this node's secret key, decoded once into locked memory
  // (null when it does not decode).
  std::unique_ptr<noise::SecretBytes> own_secret_;
  std::shared_ptr<BufferPool> pool_;
  std::atomic<int> listen_fd_{-1};
  int wake_fd_ = -1;   // eventfd: wakes the writer's poll
  int stop_fd_ = -1;   // eventfd: set by Shutdown, ends Receive's poll
  int taken_fd_ = -1;  // eventfd: a connection was taken (wakes Receive)
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> refusals_logged_{0};
  std::atomic<bool> bind_warned_{false};

  std::mutex accept_mu_;                         // options_.accept and job_id, once listening
  bool accept_set_ = false;                      // guarded by accept_mu_
  std::mutex mu_;                                // the connection lists
  std::vector<std::shared_ptr<Conn>> outgoing_;  // by ConnId
  std::vector<std::shared_ptr<Conn>> inbound_;   // said hello and were taken
  // Receive's thread only: where to start reading, and the connections
  // and poll entries of its last look (kept to reuse their memory).
  size_t next_reader_ = 0;
  std::vector<std::shared_ptr<Conn>> readers_;
  std::vector<pollfd> poll_fds_;

  std::thread writer_;
  std::thread acceptor_;
  // Connections being opened, a thread each, so that one peer that does not
  // answer holds back no other; joined once done (or at Shutdown).
  struct Connector {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex connectors_mu_;
  std::vector<Connector> connectors_;
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_TCP_STREAM_TRANSPORT_H_
