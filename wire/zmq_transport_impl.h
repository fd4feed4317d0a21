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

inline Status ZmqError(const std::string& what, const zmq::error_t& e) {
  return UnavailableError(what + ": " + e.what());
}

class ZmqTransport::Impl {
 public:
  Impl(ZmqOptions options) : options_(std::move(options)), incoming_(options_.max_queued_incoming) {
    if (options_.identity.empty()) options_.identity = RandomIdentity("node");
    if (options_.node_keys && !options_.curve) options_.curve = options_.node_keys->job();
  }

  Status Start() {
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return InternalError("eventfd failed");
    io_thread_ = std::thread([this] { IoLoop(); });
    return OkStatus();
  }

  ~Impl() {
    Shutdown();
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
      StatusOr<Incoming> item = incoming_.Pop(deadline);
      if (!item.ok()) {
        if (item.status().code() == StatusCode::kCancelled) {
          if (listen_closed_.load()) return ListenClosedError();
          return CancelledError("transport is shut down");
        }
        return item.status();
      }
      queued_bytes_.fetch_sub(item->message.header.size() + item->message.PayloadBytes());
      // Room again: the I/O thread resumes reading if it had paused (it
      // says so before its last look at the room, so one of the two sees
      // the other). Not otherwise: a wake per message costs the I/O
      // thread a turn of its loop.
      if (reading_paused_.load()) Wake();
      return std::move(*item);
    }
  }

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

  ZmqOptions options_;
  zmq::context_t context_{1};
  std::atomic<uint64_t> next_probe_{0};
  BlockingQueue<Incoming> incoming_;
  int wake_fd_ = -1;
  std::thread io_thread_;

  mutable std::mutex mu_;
  std::deque<std::unique_ptr<Command>> commands_;  // guarded by mu_
  bool stopping_ = false;                          // guarded by mu_

  // Owned by the I/O thread.
  std::unique_ptr<zmq::socket_t> router_;
  std::unique_ptr<zmq::socket_t> monitor_;  // handshake events of router_
  std::unique_ptr<ZapHandler> zap_;
  std::atomic<uint64_t> auth_failures_{0};
  std::atomic<uint64_t> dropped_{0};  // messages dropped as they were read
  std::atomic<uint64_t> impostors_{0};
  // With node keys: the routing id of each identity's latest connection.
  std::map<std::string, std::string> routing_ids_;
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
