// ZmqTransport::Impl: internal to the transport (wire/zmq_transport.cc:
// commands, sockets, handshakes and the public API; zmq_transport_io.cc: the
// I/O thread's loop, sends waiting for their peer, reads and the node-key
// check of what is read). The interface is wire/zmq_transport.h.
#ifndef GRADSYNC_WIRE_ZMQ_TRANSPORT_IMPL_H_
#define GRADSYNC_WIRE_ZMQ_TRANSPORT_IMPL_H_

#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/blocking_queue.h"
#include "common/logging.h"
#include "common/task_pool.h"
#include "wire/bulk_cipher.h"
#include "wire/zmq_curve.h"
#include "wire/zmq_handshake_retry.h"
#include "wire/zmq_transport.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace gradsync::wire {

// What the I/O thread answers a command with, the commands, and helpers of
// the transport's two files.

// Result of a command run on the I/O thread.
struct Result {
  Status status;
  std::string endpoint;
  ConnId conn = -1;
};

// Where sealed messages go out one way (wire/bulk_cipher.h): an outgoing
// connection's, or the replies to one token's holder. While it is published
// (ZmqTransport::Impl::PreSeal), a message sent its way is sealed before
// the I/O thread sees it: by the thread calling Send, or for Post on the
// transport's crypto threads. The I/O thread only sends it.
struct SealWay {
  SealWay(std::shared_ptr<BulkKeyPool> k, uint32_t d) : key(std::move(k)), direction(d) {}
  const std::shared_ptr<BulkKeyPool> key;
  const uint32_t direction;       // 0, or kBulkReplyDirection
  std::atomic<uint64_t> next{0};  // the next counter handed out
  // I/O thread: one past the counter last sent. A message sealed with a
  // lower counter (its sender's thread lost the race to the queue) is
  // sealed again, under a new counter: the receiver takes counters rising.
  uint64_t floor = 0;
};

// A message sealed under `way` with `counter` (set when the job is made,
// in the order sends are made), by the caller or a crypto thread; `frames`
// and `status` are the I/O thread's once `done` is set.
struct SealJob {
  std::shared_ptr<SealWay> way;
  uint64_t counter = 0;
  std::vector<zmq::message_t> frames;
  Status status;
  std::atomic<bool> done{false};
};

struct Command {
  enum class Kind { kListen, kConnect, kDisconnect, kSend };
  Kind kind = Kind::kSend;
  std::string endpoint;
  int lane = 0;  // kConnect
  Route route;
  Message message;
  Deadline deadline = Deadline::Infinite();
  std::promise<Result> done;
  // Set for a posted send: called with the outcome instead of `done`.
  std::function<void(const Status&)> posted;
  // Not empty: a transport control message (wire/bulk_cipher.h), sent as an
  // empty frame and this one instead of `message`.
  std::string control;
  // Set: `message` sealed, or being sealed, before the I/O thread took it;
  // `message` stays (the connection may be back on CURVE by the time it is
  // sent).
  std::shared_ptr<SealJob> sealed;

  void Finish(Result r) {
    if (posted) {
      posted(r.status);
    } else {
      done.set_value(std::move(r));
    }
  }
};

inline void FreePayload(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

inline zmq::message_t ZeroCopyFrame(const Payload& p) {
  if (p.size == 0) return zmq::message_t();
  auto* keep = new std::shared_ptr<const void>(p.owner);
  return zmq::message_t(const_cast<uint8_t*>(p.data), p.size, FreePayload, keep);
}

// The peer a send goes to: a connection, or an identity on the router.
inline std::string RouteKey(const Route& r) {
  return r.kind == Route::Kind::kConnection ? "c" + std::to_string(r.conn) : "i" + r.identity;
}

inline Status ListenClosedError() {
  return UnavailableError(
      "the transport closed its listening socket: its ZAP handler failed, so no peer can be "
      "authenticated");
}

// How long a handshake with a key not in the plan waits for a plan that
// names it (a peer may get it a little before this node does).
constexpr Millis kZapHold(10000);

// Link-timing echo (ZmqTransport::MeasureLink): an empty frame, then 'E' and
// an 8-byte id, then at most one payload frame; the answer is 'e' and the id.
constexpr char kEchoRequest = 'E';
constexpr char kEchoAnswer = 'e';
constexpr size_t kEchoRequestBytes = 9;
constexpr int kEchoRounds = 3;  // round trips of each kind timed

inline Status ZmqError(const std::string& what, const zmq::error_t& e) {
  return UnavailableError(what + ": " + e.what());
}

// Seals `m` under `key` as message `counter` of direction `direction` (0 or
// kBulkReplyDirection) into `frames`: frame 0 the counter, a tag and the
// sealed header, then a tag and a sealed payload each.
Status SealMessage(BulkKey& key, uint64_t counter, uint32_t direction, const Message& m,
                   std::vector<zmq::message_t>* frames);

// A job under `way`'s next counter.
std::shared_ptr<SealJob> NewSealJob(std::shared_ptr<SealWay> way);
// Seals `m` into job->frames and job->status, then sets job->done (any
// thread).
void SealInto(const Message& m, SealJob* job);

// The payloads of a sealed message whose header the I/O thread opened (and
// whose counter it checked): still sealed, each behind its tag in its
// frame, opened in place on a crypto thread while the message waits in the
// incoming queue; its receiver waits for this message's opening only.
class SealedPayloads {
 public:
  std::shared_ptr<BulkKeyPool> key;
  uint64_t counter = 0;
  uint32_t direction = 0;
  std::string who;  // whom a refusal names
  std::vector<std::shared_ptr<zmq::message_t>> frames;

  // Opens every payload in place, then wakes Wait.
  void Open();
  // True once every payload opened; false when one did not.
  bool Wait();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;    // guarded by mu_
  bool opened_ = false;  // guarded by mu_
};

// A message in the incoming queue.
struct Queued {
  Incoming in;
  std::shared_ptr<SealedPayloads> sealed;  // set: it came sealed
};

class ZmqTransport::Impl {
 public:
  Impl(ZmqOptions options) : options_(std::move(options)), incoming_(options_.max_queued_incoming) {
    if (options_.identity.empty()) options_.identity = RandomIdentity("node");
    if (options_.node_keys && !options_.curve) options_.curve = options_.node_keys->job();
    int crypto = options_.bulk_crypto_threads;
    if (crypto < 0) crypto = UsableCores() >= 8 ? 2 : 0;
    if (options_.bulk_encryption && crypto > 0) {
      crypto_ = std::make_unique<TaskPool>(crypto, "gradsync-crypto");
    }
  }

  Status Start() {
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return InternalError("eventfd failed");
    io_thread_ = std::thread([this] { IoLoop(); });
    return OkStatus();
  }

  ~Impl() {
    Shutdown();
    crypto_.reset();  // its tasks wake the I/O thread's fd
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  const std::string& identity() const { return options_.identity; }
  zmq::context_t& context() { return context_; }
  const std::optional<CurveKey>& curve() const { return options_.curve; }
  uint64_t NextProbeId() { return next_probe_++; }
  // Sets the CURVE keys of an outgoing connection to `endpoint`; true when
  // the peer is a node of the plan (its own key is required of it). Reads
  // only what never changes: any thread.
  bool ApplyClientKeys(zmq::socket_t& socket, const std::string& endpoint);

  // Hands `cmd` to the I/O thread and waits for its result.
  Result Submit(std::unique_ptr<Command> cmd) {
    std::future<Result> result = cmd->done.get_future();
    Enqueue(std::move(cmd));
    return result.get();
  }
  // Hands `cmd` to the I/O thread; returns at once (cmd->posted reports).
  void Post(std::unique_ptr<Command> cmd) { Enqueue(std::move(cmd)); }

  StatusOr<Incoming> Receive(Deadline deadline) {
    for (;;) {
      if (listen_closed_.load()) return ListenClosedError();
      StatusOr<Queued> item = incoming_.Pop(deadline);
      if (!item.ok()) {
        if (item.status().code() == StatusCode::kCancelled) {
          if (listen_closed_.load()) return ListenClosedError();
          return CancelledError("transport is shut down");
        }
        return item.status();
      }
      queued_bytes_.fetch_sub(item->in.message.header.size() + item->in.message.PayloadBytes());
      // Room again: the I/O thread resumes reading if it had paused (it
      // says so before its last look at the room, so one of the two sees
      // the other). Not otherwise: a wake per message costs the I/O
      // thread a turn of its loop.
      if (reading_paused_.load()) Wake();
      if (item->sealed == nullptr) return std::move(item->in);
      if (item->sealed->Wait()) {
        bulk_received_.fetch_add(1, std::memory_order_relaxed);
        return std::move(item->in);
      }
      RefuseBulk(item->sealed->who, "a sealed message that does not open under its token's key");
    }
  }

  // When cmd's way is sealed: seals its message on the calling thread
  // (`here`), or hands that to the crypto threads.
  void PreSeal(Command& cmd, bool here);

  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    Wake();
    if (io_thread_.joinable()) io_thread_.join();
    zap_.reset();  // its socket closes before the context does
    incoming_.Close();
  }

  uint64_t auth_failures() const { return auth_failures_.load(); }
  uint64_t dropped() const { return dropped_.load(); }
  uint64_t impostors() const { return impostors_.load(); }
  uint64_t retry_steps() const { return retry_steps_.load(); }
  uint64_t dropped_sends() const { return dropped_sends_.load(); }
  uint64_t bulk_sent() const { return bulk_sent_.load(); }
  uint64_t bulk_received() const { return bulk_received_.load(); }
  uint64_t bulk_refused() const { return bulk_refused_.load(); }
  std::string bulk_endpoint() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bulk_endpoint_;
  }

 private:
  // Queues `cmd` for the I/O thread, or finishes it as cancelled once the
  // transport is shut down.
  void Enqueue(std::unique_ptr<Command> cmd) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) {
        commands_.push_back(std::move(cmd));
        cmd = nullptr;
      }
    }
    if (cmd != nullptr) {
      cmd->Finish({CancelledError("transport is shut down"), "", -1});
      return;
    }
    Wake();
  }

  void Wake() {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }

  void IoLoop();
  // Whether another message may be read: the queue is below its count and
  // byte bounds (one message may take it past the byte bound).
  bool Room() const {
    return !incoming_.full() && queued_bytes_.load() < options_.max_queued_incoming_bytes;
  }
  void RunCommands();
  void Execute(std::unique_ptr<Command> cmd);
  void DoListen(Command& cmd);
  void DoConnect(Command& cmd);
  void DoDisconnect(Command& cmd);
  // Tries to hand the message to ZeroMQ; false when it would block.
  bool TrySend(Command& cmd);
  void RetryPending();
  // Sends waiting for one peer, in order, and the same sends by deadline, so
  // that a pass over them costs the sends it ends or starts, not their number.
  struct PeerQueue {
    struct Entry;
    using ByDeadline = std::multimap<SteadyTime, std::list<Entry>::iterator>;
    struct Entry {
      std::unique_ptr<Command> cmd;
      ByDeadline::iterator at;
    };
    std::list<Entry> order;
    ByDeadline by_deadline;

    void Add(std::unique_ptr<Command> cmd);
    std::unique_ptr<Command> Remove(std::list<Entry>::iterator it);
  };
  void RetryPeer(PeerQueue& pending);
  void ReadSocket(zmq::socket_t& socket, const Route* fixed_route);
  // With node keys: the identity a message on the listening socket comes
  // from, when its routing id claims the identity bound to its sender's key
  // (which becomes the route for replies); else nullopt, counted and
  // reported.
  std::optional<std::string> Authenticate(const std::vector<zmq::message_t>& frames);
  void Configure(zmq::socket_t& socket);
  void CloseAll();
  // The ZAP handler failed: the listening socket closes (its CURVE handshakes
  // already fail), and Receive reports Unavailable from now on.
  void CloseListening();
  // A connection to a node of the plan whose handshake is refused (its plan
  // may not name this node's key yet, or a flood of strangers' handshakes
  // fills its ZAP handler's hold) is made again after a backoff
  // (wire/zmq_handshake_retry.h): messages wait for a connection that is up
  // (ZMQ_IMMEDIATE), not in one that may be refused.
  Status RetryRefusedHandshakes(ConnId id, zmq::socket_t& dealer, const std::string& endpoint);
  // Watches the listening socket's handshakes (CURVE only).
  Status MonitorHandshakes(zmq::socket_t& router);
  void ReadMonitor();

  // Sealed bulk messages (wire/bulk_cipher.h; zmq_transport_bulk.cc).
  // Sealed messages coming one way over a bulk connection: taken once the
  // peer's marker for that way ('S', or 'R' for replies) came over CURVE;
  // those that overtake it wait, bounded with every other inbox's
  // (bulk_early_bytes_).
  struct SealedInbox {
    bool on = false;
    uint64_t next = 0;  // the lowest counter still taken
    std::deque<std::vector<zmq::message_t>> early;
    size_t early_bytes = 0;
  };
  // What an inbox's messages are opened with and handed on as: the key,
  // the nonce direction (0, or the replies' bit), the route, and whom a
  // refusal names.
  struct InboxSource {
    std::shared_ptr<BulkKeyPool> key;
    uint32_t direction;
    Route from;
    std::string who;
  };
  // An outgoing connection's: hello sent, waiting for the answer;
  // connecting to the bulk port; switching (its 'S' queued); on (what
  // follows goes sealed on `socket`). Or, when the bulk port did not take
  // the connection in time, off (the connection stays on CURVE until it is
  // made again).
  struct BulkOut {
    enum class State { kHello, kConnecting, kSwitching, kOn, kOff } state = State::kHello;
    SteadyTime connecting_since;
    BulkToken token{};
    std::shared_ptr<BulkKeyPool> key;
    std::shared_ptr<SealWay> way;  // set once on
    std::string endpoint;          // the connection's (its host serves the bulk port too)
    std::unique_ptr<zmq::socket_t> socket;
    int handshakes = 0;   // of the CURVE connection
    SealedInbox replies;  // sealed replies on `socket`
  };
  // A token this node handed out: whose it is, its key, the sealed
  // messages under it, and the way replies to the identity go sealed on
  // the bulk connection (set once its 'R' went over CURVE, behind every
  // reply before it).
  struct BulkIn {
    std::string identity;
    std::shared_ptr<BulkKeyPool> key;
    SealedInbox inbox;
    std::shared_ptr<SealWay> replies;
  };
  // Sends to `to` are sealed under `way` by their callers from now on /
  // no longer.
  void Publish(const Route& to, std::shared_ptr<SealWay> way);
  void Unpublish(const Route& to);
  // After connecting to a plan node: hands it a token and a key.
  void StartBulk(ConnId id, const std::string& endpoint, int handshakes = 0);
  // The CURVE handshake of connection `id` succeeded: after its first, the
  // peer may be a new process that knows no token, so a new one is handed.
  void OnBulkHandshake(ConnId id);
  // A control message read on the listening socket from `identity`, or on
  // connection `conn` (-1: the former).
  void OnBulkControl(const std::string& identity, ConnId conn, const zmq::message_t& frame);
  // Connections whose bulk socket is up send their 'S'; those that waited
  // past options_.bulk_connect_timeout_ms stay on CURVE.
  void CheckBulkConnections();
  // The token whose holder's replies go sealed, for `identity`; null if none.
  BulkIn* SealedRepliesTo(const std::string& identity);
  // Sends cmd's message sealed under `way` on `socket` (after routing id
  // `to`, if not empty), sealing it first unless that was done before
  // (under this way, with a counter above the last sent); false when it
  // would block, or while a crypto thread still seals it (it wakes the I/O
  // thread when done).
  bool TrySendSealed(Command& cmd, zmq::socket_t& socket, const std::string& to,
                     const std::shared_ptr<SealWay>& way);
  bool EnsureBulkListener();
  // Reads the bulk port (sealed messages) and connection `id`'s bulk
  // socket (sealed replies).
  void ReadBulk();
  void ReadBulkReplies(ConnId id);
  // A sealed message read for `box`: handed on at once when the box is on
  // and nothing waits in it, else it waits (bounded; refused past that).
  void TakeSealed(SealedInbox& box, const InboxSource& source, std::vector<zmq::message_t> frames);
  // Opens a sealed message's header and queues the message (its payloads
  // are opened by Receive); refuses it (counted) otherwise.
  void DeliverSealed(SealedInbox& box, const InboxSource& source,
                     std::vector<zmq::message_t>& frames);
  // Hands on what waits in the inboxes whose marker came, while the
  // incoming queue has room.
  void DrainBulk();
  // Forgets what waits in `box` (its token or connection is gone).
  void DropInbox(SealedInbox& box);
  void RefuseBulk(const std::string& from, const std::string& why);
  // A control message to `to` (a connection, or an identity on the router).
  void SendControl(const Route& to, const BulkControl& control);
  // A link-timing echo request read on the router (MeasureLink's): answered
  // at once and true; false for any other message.
  bool AnswerEcho(zmq::socket_t& router, const std::vector<zmq::message_t>& frames);

  ZmqOptions options_;
  std::unique_ptr<TaskPool> crypto_;  // with bulk_encryption: seals and opens
  zmq::context_t context_{1};
  std::atomic<uint64_t> next_probe_{0};
  BlockingQueue<Queued> incoming_;
  int wake_fd_ = -1;
  std::thread io_thread_;

  mutable std::mutex mu_;
  std::deque<std::unique_ptr<Command>> commands_;  // guarded by mu_
  bool stopping_ = false;                          // guarded by mu_
  std::string bulk_endpoint_;                      // guarded by mu_
  std::mutex seal_mu_;
  std::map<std::string, std::shared_ptr<SealWay>> sealers_;  // by RouteKey; guarded by seal_mu_

  // Owned by the I/O thread.
  std::unique_ptr<zmq::socket_t> router_;
  std::unique_ptr<zmq::socket_t> monitor_;  // handshake events of router_
  std::unique_ptr<ZapHandler> zap_;
  std::atomic<uint64_t> auth_failures_{0};
  std::atomic<uint64_t> dropped_{0};  // messages dropped as they were read
  std::atomic<uint64_t> impostors_{0};
  // With node keys: the routing id of each identity's latest connection.
  std::map<std::string, std::string> routing_ids_;
  std::map<ConnId, BulkOut> bulk_out_;
  std::map<std::string, BulkIn> bulk_in_;             // by the token's routing id
  std::map<std::string, std::string> bulk_token_of_;  // identity -> its token's routing id
  std::unique_ptr<zmq::socket_t> bulk_router_;        // the bulk port, plain
  std::set<std::string> bulk_draining_;               // tokens with early messages, 'S' in
  std::set<ConnId> bulk_replies_draining_;            // connections with early replies, 'R' in
  std::set<ConnId> bulk_connecting_;                  // in BulkOut::State::kConnecting
  size_t bulk_early_bytes_ = 0;                       // early messages' bytes, all inboxes
  uint16_t bulk_port_ = 0;                            // bulk_router_'s
  std::atomic<uint64_t> bulk_sent_{0};
  std::atomic<uint64_t> bulk_received_{0};
  std::atomic<uint64_t> bulk_refused_{0};
  bool bulk_listen_failed_ = false;          // the bulk port could not be bound: not tried again
  std::atomic<size_t> queued_bytes_{0};      // in incoming_
  std::atomic<bool> reading_paused_{false};  // the I/O thread has no Room()
  std::atomic<bool> listen_closed_{false};   // CloseListening ran
  std::map<ConnId, std::unique_ptr<zmq::socket_t>> dealers_;
  std::unique_ptr<HandshakeRetry> retry_;  // watches dealers_ to nodes (made on demand)
  std::map<std::pair<std::string, int>, ConnId> conn_by_endpoint_;  // (endpoint, lane)
  // Sends that would block, in order, per peer: one peer that stops reading
  // holds back only the sends to it. Keyed by RouteKey.
  std::map<std::string, PeerQueue> pending_;
  std::atomic<uint64_t> retry_steps_{0};  // see ZmqTransport::retry_steps
  std::atomic<uint64_t> dropped_sends_{0};
  ConnId next_conn_ = 0;
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_ZMQ_TRANSPORT_IMPL_H_
