#include "wire/zmq_transport.h"

#include <malloc.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace gradsync::wire {
namespace {

// Result of a command run on the I/O thread.
struct Result {
  Status status;
  std::string endpoint;
  ConnId conn = -1;
};

struct Command {
  enum class Kind { kListen, kConnect, kSend };
  Kind kind = Kind::kSend;
  std::string endpoint;
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

void FreePayload(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

zmq::message_t ZeroCopyFrame(const Payload& p) {
  if (p.size == 0) return zmq::message_t();
  auto* keep = new std::shared_ptr<const void>(p.owner);
  return zmq::message_t(const_cast<uint8_t*>(p.data), p.size, FreePayload, keep);
}

// The peer a send goes to: a connection, or an identity on the router.
std::string RouteKey(const Route& r) {
  return r.kind == Route::Kind::kConnection ? "c" + std::to_string(r.conn) : "i" + r.identity;
}

Status ListenClosedError() {
  return UnavailableError(
      "the transport closed its listening socket: its ZAP handler failed, so no peer can be "
      "authenticated");
}

// How long a handshake with a key not in the plan waits for a plan that
// names it (a peer may get it a little before this node does).
constexpr Millis kZapHold(10000);

Status ZmqError(const std::string& what, const zmq::error_t& e) {
  return UnavailableError(what + ": " + e.what());
}

}  // namespace

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
    if (listen_closed_.load()) return ListenClosedError();
    auto item = incoming_.Pop(deadline);
    if (item.ok()) {
      queued_bytes_.fetch_sub(item->message.header.size() + item->message.PayloadBytes());
      Wake();  // room again: resume reading if it had paused
    }
    if (!item.ok() && item.status().code() == StatusCode::kCancelled) {
      if (listen_closed_.load()) return ListenClosedError();
      return CancelledError("transport is shut down");
    }
    return item;
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

  std::mutex mu_;
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
  std::atomic<size_t> queued_bytes_{0};     // in incoming_
  std::atomic<bool> listen_closed_{false};  // CloseListening ran
  std::map<ConnId, std::unique_ptr<zmq::socket_t>> dealers_;
  std::unique_ptr<HandshakeRetry> retry_;  // watches dealers_ to nodes (made on demand)
  std::map<std::string, ConnId> conn_by_endpoint_;
  // Sends that would block, in order, per peer: one peer that stops reading
  // holds back only the sends to it. Keyed by RouteKey.
  std::map<std::string, PeerQueue> pending_;
  std::atomic<uint64_t> retry_steps_{0};  // see ZmqTransport::retry_steps
  std::atomic<uint64_t> dropped_sends_{0};
  ConnId next_conn_ = 0;
};

void ZmqTransport::Impl::Configure(zmq::socket_t& socket) {
  socket.set(zmq::sockopt::maxmsgsize, options_.max_frame_bytes);
  socket.set(zmq::sockopt::sndhwm, options_.send_hwm);
  socket.set(zmq::sockopt::rcvhwm, options_.recv_hwm);
  socket.set(zmq::sockopt::linger, options_.linger_ms);
  socket.set(zmq::sockopt::reconnect_ivl, options_.reconnect_ivl_ms);
  socket.set(zmq::sockopt::reconnect_ivl_max, options_.reconnect_ivl_max_ms);
}

void ZmqTransport::Impl::IoLoop() {
  for (;;) {
    RunCommands();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    if (router_ && zap_ && zap_->failed()) CloseListening();
    std::vector<zmq::pollitem_t> items;
    items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    const bool room = Room();
    const short in = room ? ZMQ_POLLIN : 0;
    if (router_) items.push_back({router_->handle(), 0, in, 0});
    if (monitor_) items.push_back({monitor_->handle(), 0, ZMQ_POLLIN, 0});
    std::vector<ConnId> ids;
    for (auto& [id, sock] : dealers_) {
      items.push_back({sock->handle(), 0, in, 0});
      ids.push_back(id);
    }
    const size_t retry_at = items.size();
    long timeout_ms = pending_.empty() ? -1 : 1;
    if (retry_) {
      retry_->AddPollItems(&items);
      const long due = retry_->NextDueMs();
      if (due >= 0 && (timeout_ms < 0 || due < timeout_ms)) timeout_ms = due;
    }
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout_ms));
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      continue;  // EINTR
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t drained;
      ssize_t n = read(wake_fd_, &drained, sizeof(drained));
      (void)n;
    }
    size_t next = 1;
    if (router_) {
      if (items[next].revents & ZMQ_POLLIN) ReadSocket(*router_, nullptr);
      ++next;
    }
    if (monitor_) {
      if (items[next].revents & ZMQ_POLLIN) ReadMonitor();
      ++next;
    }
    for (ConnId id : ids) {
      Route route = Route::Connection(id);
      if ((items[next++].revents & ZMQ_POLLIN) && dealers_.count(id)) {
        ReadSocket(*dealers_[id], &route);
      }
    }
    if (retry_) retry_->Service(&items[retry_at]);
    RetryPending();
  }
  CloseAll();
}

void ZmqTransport::Impl::RunCommands() {
  std::deque<std::unique_ptr<Command>> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(commands_);
  }
  for (auto& cmd : batch) Execute(std::move(cmd));
}

void ZmqTransport::Impl::Execute(std::unique_ptr<Command> cmd) {
  switch (cmd->kind) {
    case Command::Kind::kListen:
      DoListen(*cmd);
      return;
    case Command::Kind::kConnect:
      DoConnect(*cmd);
      return;
    case Command::Kind::kSend: {
      // Keep per-peer order: queue behind anything already waiting for it.
      auto waiting = pending_.find(RouteKey(cmd->route));
      if (waiting != pending_.end() &&
          waiting->second.order.size() >= options_.max_pending_sends_per_peer) {
        dropped_sends_.fetch_add(1, std::memory_order_relaxed);
        if (options_.on_send_dropped) options_.on_send_dropped(cmd->route.ToString());
        cmd->Finish({UnavailableError("send to " + cmd->route.ToString() +
                                      " dropped: " + std::to_string(waiting->second.order.size()) +
                                      " sends wait for this peer already (it is not reading)"),
                     "", -1});
      } else if (waiting != pending_.end()) {
        waiting->second.Add(std::move(cmd));
      } else if (!TrySend(*cmd)) {
        pending_[RouteKey(cmd->route)].Add(std::move(cmd));
      }
      return;
    }
  }
}

void ZmqTransport::Impl::DoListen(Command& cmd) {
  if (router_ || listen_closed_.load()) {
    cmd.done.set_value({FailedPreconditionError("already listening"), "", -1});
    return;
  }
  try {
    auto router = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::router);
    Configure(*router);
    router->set(zmq::sockopt::router_mandatory, 1);
    // No ROUTER_HANDOVER: a second connection under an identity already
    // connected is refused, so it cannot take that peer's route.
    router->set(zmq::sockopt::routing_id, options_.identity);
    if (options_.curve) {
      if (!zap_) {
        auto on_failure = [this](const Status&) { Wake(); };
        auto zap = options_.node_keys
                       ? ZapHandler::Start(
                             context_,
                             [keys = options_.node_keys](const uint8_t* key) {
                               return keys->IdentityOf(key);
                             },
                             kZapHold, on_failure)
                       : ZapHandler::Start(context_, options_.curve->public_z85, on_failure);
        if (!zap.ok()) {
          cmd.done.set_value({zap.status(), "", -1});
          return;
        }
        zap_ = std::move(*zap);
      }
      Status watched = ApplyCurveServer(
          *router, options_.node_keys ? options_.node_keys->own() : *options_.curve);
      if (watched.ok()) watched = MonitorHandshakes(*router);
      if (!watched.ok()) {
        cmd.done.set_value({watched, "", -1});
        return;
      }
    }
    router->bind(cmd.endpoint);
    std::string bound = router->get(zmq::sockopt::last_endpoint);
    router_ = std::move(router);
    cmd.done.set_value({OkStatus(), bound, -1});
  } catch (const zmq::error_t& e) {
    cmd.done.set_value({ZmqError("cannot listen on " + cmd.endpoint, e), "", -1});
  }
}

void ZmqTransport::Impl::DoConnect(Command& cmd) {
  auto known = conn_by_endpoint_.find(cmd.endpoint);
  if (known != conn_by_endpoint_.end()) {
    cmd.done.set_value({OkStatus(), cmd.endpoint, known->second});
    return;
  }
  try {
    auto dealer = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
    Configure(*dealer);
    const bool node = ApplyClientKeys(*dealer, cmd.endpoint);
    dealer->set(zmq::sockopt::routing_id,
                node ? RoutingIdFor(options_.identity) : options_.identity);
    const ConnId id = next_conn_;
    if (node) {
      Status watched = RetryRefusedHandshakes(id, *dealer, cmd.endpoint);
      if (!watched.ok()) {
        cmd.done.set_value({watched, "", -1});
        return;
      }
    }
    dealer->connect(cmd.endpoint);
    ++next_conn_;
    dealers_[id] = std::move(dealer);
    conn_by_endpoint_[cmd.endpoint] = id;
    cmd.done.set_value({OkStatus(), cmd.endpoint, id});
  } catch (const zmq::error_t& e) {
    cmd.done.set_value({ZmqError("cannot connect to " + cmd.endpoint, e), "", -1});
  }
}

bool ZmqTransport::Impl::TrySend(Command& cmd) {
  const Route& to = cmd.route;
  zmq::socket_t* socket = nullptr;
  std::string routing_id = to.identity;
  if (to.kind == Route::Kind::kInbound) {
    socket = router_.get();
    if (options_.node_keys) {
      auto known = routing_ids_.find(to.identity);
      if (known == routing_ids_.end()) {
        cmd.Finish({UnavailableError(to.ToString() + " is not connected"), "", -1});
        return true;
      }
      routing_id = known->second;
    }
  } else if (dealers_.count(to.conn)) {
    socket = dealers_[to.conn].get();
  }
  if (socket == nullptr) {
    cmd.Finish({UnavailableError("no socket for " + to.ToString()), "", -1});
    return true;
  }
  const Message& m = cmd.message;
  const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
  try {
    if (to.kind == Route::Kind::kInbound) {
      if (!socket->send(zmq::buffer(routing_id), more)) return false;
    }
    auto header_flags = m.payloads.empty() ? zmq::send_flags::dontwait : more;
    if (!socket->send(zmq::message_t(m.header.data(), m.header.size()), header_flags)) {
      return false;
    }
    for (size_t i = 0; i < m.payloads.size(); ++i) {
      bool last = i + 1 == m.payloads.size();
      socket->send(ZeroCopyFrame(m.payloads[i]),
                   last ? zmq::send_flags::none : zmq::send_flags::sndmore);
    }
    cmd.Finish({OkStatus(), "", -1});
  } catch (const zmq::error_t& e) {
    Status s = e.num() == EHOSTUNREACH ? UnavailableError(to.ToString() + " is not connected")
                                       : ZmqError("send to " + to.ToString() + " failed", e);
    cmd.Finish({s, "", -1});
  }
  return true;
}

void ZmqTransport::Impl::RetryPending() {
  for (auto peer = pending_.begin(); peer != pending_.end();) {
    RetryPeer(peer->second);
    peer = peer->second.order.empty() ? pending_.erase(peer) : std::next(peer);
  }
}

void ZmqTransport::Impl::PeerQueue::Add(std::unique_ptr<Command> cmd) {
  const SteadyTime at = cmd->deadline.at();
  auto it = order.insert(order.end(), Entry{std::move(cmd), {}});
  it->at = by_deadline.emplace(at, it);
}

std::unique_ptr<Command> ZmqTransport::Impl::PeerQueue::Remove(std::list<Entry>::iterator it) {
  std::unique_ptr<Command> cmd = std::move(it->cmd);
  by_deadline.erase(it->at);
  order.erase(it);
  return cmd;
}

void ZmqTransport::Impl::RetryPeer(PeerQueue& pending) {
  // Every send ends at its own deadline, those behind a blocked one too;
  // only the expired ones are looked at.
  const SteadyTime now = std::chrono::steady_clock::now();
  while (!pending.by_deadline.empty() && pending.by_deadline.begin()->first <= now) {
    retry_steps_.fetch_add(1, std::memory_order_relaxed);
    const bool first = pending.by_deadline.begin()->second == pending.order.begin();
    std::unique_ptr<Command> cmd = pending.Remove(pending.by_deadline.begin()->second);
    cmd->Finish({DeadlineExceededError(
                     "send to " + cmd->route.ToString() +
                     (first ? " did not complete before the deadline (peer not connected or "
                              "not reading)"
                            : " did not start before the deadline (the peer is not reading)")),
                 "", -1});
  }
  while (!pending.order.empty()) {
    if (!TrySend(*pending.order.front().cmd)) return;
    retry_steps_.fetch_add(1, std::memory_order_relaxed);
    pending.Remove(pending.order.begin());
  }
}

void ZmqTransport::Impl::ReadSocket(zmq::socket_t& socket, const Route* fixed_route) {
  for (int budget = 64; budget > 0 && Room(); --budget) {
    std::vector<zmq::message_t> frames;
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(socket, std::back_inserter(frames), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      GS_LOG(WARNING) << "receive failed: " << e.what();
      return;
    }
    if (!got) return;
    Incoming in;
    size_t first = 0;
    if (fixed_route) {
      in.from = *fixed_route;
    } else if (options_.node_keys) {
      std::optional<std::string> identity = Authenticate(frames);
      if (!identity) continue;
      in.from = Route::Inbound(*identity);
      first = 1;
    } else {
      in.from = Route::Inbound(frames[0].to_string());
      first = 1;
    }
    const size_t payloads = frames.size() > first ? frames.size() - first - 1 : 0;
    if (payloads > options_.max_payload_frames ||
        (frames.size() > first && frames[first].size() > options_.max_header_bytes)) {
      dropped_.fetch_add(1);
      if (options_.on_dropped) {
        options_.on_dropped(in.from.ToString(),
                            payloads > options_.max_payload_frames
                                ? std::to_string(payloads) + " payload frames, at most " +
                                      std::to_string(options_.max_payload_frames)
                                : "a header of " + std::to_string(frames[first].size()) +
                                      " bytes, at most " +
                                      std::to_string(options_.max_header_bytes));
      }
      continue;
    }
    if (frames.size() > first) {
      const auto* h = frames[first].data<uint8_t>();
      in.message.header.assign(h, h + frames[first].size());
      for (size_t i = first + 1; i < frames.size(); ++i) {
        auto owned = std::make_shared<zmq::message_t>(std::move(frames[i]));
        in.message.payloads.push_back(Payload::Borrow(owned->data(), owned->size(), owned));
      }
    }
    // The queue has room (checked above) and only this thread pushes.
    queued_bytes_.fetch_add(in.message.header.size() + in.message.PayloadBytes());
    incoming_.Push(std::move(in), Deadline::Infinite()).IgnoreError();
  }
}

std::optional<std::string> ZmqTransport::Impl::Authenticate(
    const std::vector<zmq::message_t>& frames) {
  const std::string routing_id = frames[0].to_string();
  // libzmq attaches the connection's properties to each frame it reads off
  // it (the routing id frame is the router's own).
  const char* user = frames.size() > 1
                         ? zmq_msg_gets(const_cast<zmq::message_t&>(frames[1]).handle(), "User-Id")
                         : nullptr;
  const std::string bound = user != nullptr ? user : "";
  const std::optional<std::string> claimed = RoutedIdentity(routing_id);
  if (claimed && IdentityMatchesKey(*claimed, bound)) {
    std::string& latest = routing_ids_[*claimed];
    if (latest != routing_id) latest = routing_id;  // a new connection: rarely
    return claimed;
  }
  impostors_.fetch_add(1);
  if (options_.on_impostor) {
    options_.on_impostor(Escaped(routing_id, 64),
                         "a message under identity " + Escaped(claimed.value_or(routing_id), 64) +
                             " (the sender's key is bound to " +
                             (bound.empty() ? std::string("no identity") : Escaped(bound, 64)) +
                             ")");
  }
  return std::nullopt;
}

bool ZmqTransport::Impl::ApplyClientKeys(zmq::socket_t& socket, const std::string& endpoint) {
  if (!options_.curve) return false;
  if (options_.node_keys) {
    std::optional<std::string> server = options_.node_keys->ServerKeyAt(endpoint);
    if (server) {
      ApplyCurveClientOf(socket, options_.node_keys->own(), *server);
      return true;
    }
  }
  ApplyCurveClient(socket, *options_.curve);
  return false;
}

void ZmqTransport::Impl::CloseAll() {
  std::deque<std::unique_ptr<Command>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(commands_);
  }
  for (auto& [peer, cmds] : pending_) {
    for (auto& entry : cmds.order) left.push_back(std::move(entry.cmd));
  }
  pending_.clear();
  for (auto& cmd : left) cmd->Finish({CancelledError("transport is shut down"), "", -1});
  monitor_.reset();
  router_.reset();
  retry_.reset();
  dealers_.clear();
}

void ZmqTransport::Impl::CloseListening() {
  GS_LOG(ERROR) << "the ZAP handler failed: closing the listening socket; this transport "
                   "accepts no connection and receives nothing more";
  monitor_.reset();
  router_.reset();
  listen_closed_.store(true);
  incoming_.Close();  // wakes blocked receivers, who get ListenClosedError
}

Status ZmqTransport::Impl::RetryRefusedHandshakes(ConnId id, zmq::socket_t& dealer,
                                                  const std::string& endpoint) {
  if (!retry_) {
    retry_ = std::make_unique<HandshakeRetry>(context_, Millis(options_.reconnect_ivl_ms),
                                              Millis(options_.reconnect_ivl_max_ms));
  }
  dealer.set(zmq::sockopt::immediate, 1);
  return retry_->Watch(id, dealer, endpoint);
}

Status ZmqTransport::Impl::MonitorHandshakes(zmq::socket_t& router) {
  const std::string address = "inproc://gradsync-handshakes-" + options_.identity;
  const int events = ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
  if (zmq_socket_monitor(router.handle(), address.c_str(), events) != 0) {
    return InternalError("cannot monitor the listening socket's handshakes");
  }
  monitor_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pair);
  monitor_->set(zmq::sockopt::linger, 0);
  monitor_->connect(address);
  return OkStatus();
}

// Event frames: 2 bytes event, 4 bytes value; then the peer's address.
void ZmqTransport::Impl::ReadMonitor() {
  for (;;) {
    std::vector<zmq::message_t> frames;
    try {
      if (!zmq::recv_multipart(*monitor_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        return;
      }
    } catch (const zmq::error_t&) {
      return;
    }
    if (frames.size() < 2) continue;
    auth_failures_.fetch_add(1);
    if (options_.on_auth_failure) options_.on_auth_failure(frames[1].to_string());
  }
}

// ZeroMQ allocates every large message it receives and frees it once taken.
// With glibc's defaults such a buffer is often a fresh mapping, faulted in
// page by page by the kernel's copy and unmapped again: on a 2-rank 4 MiB
// all-reduce over TCP that cost 3-4x the time.
void TuneMallocForLargeMessages() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* off = std::getenv("GRADSYNC_TUNE_MALLOC");
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    if (off != nullptr && std::string(off) == "0") return;
    if (tunables != nullptr && std::string(tunables).find("glibc.malloc.") != std::string::npos) {
      return;
    }
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
  });
}

StatusOr<std::unique_ptr<ZmqTransport>> ZmqTransport::Create(ZmqOptions options) {
  TuneMallocForLargeMessages();
  auto impl = std::make_unique<Impl>(std::move(options));
  GS_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<ZmqTransport>(new ZmqTransport(std::move(impl)));
}

ZmqTransport::ZmqTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ZmqTransport::~ZmqTransport() { Shutdown(); }

const std::string& ZmqTransport::identity() const { return impl_->identity(); }
uint64_t ZmqTransport::auth_failures() const { return impl_->auth_failures(); }
uint64_t ZmqTransport::dropped() const { return impl_->dropped(); }
uint64_t ZmqTransport::impostors() const { return impl_->impostors(); }
uint64_t ZmqTransport::retry_steps() const { return impl_->retry_steps(); }
uint64_t ZmqTransport::dropped_sends() const { return impl_->dropped_sends(); }

StatusOr<std::string> ZmqTransport::Listen(const std::string& endpoint) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = Command::Kind::kListen;
  cmd->endpoint = endpoint;
  Result r = impl_->Submit(std::move(cmd));
  if (!r.status.ok()) return r.status;
  return r.endpoint;
}

StatusOr<ConnId> ZmqTransport::Connect(const std::string& endpoint) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = Command::Kind::kConnect;
  cmd->endpoint = endpoint;
  Result r = impl_->Submit(std::move(cmd));
  if (!r.status.ok()) return r.status;
  return r.conn;
}

namespace {
std::unique_ptr<Command> SendCommand(const Route& to, Message message, Deadline deadline) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = Command::Kind::kSend;
  cmd->route = to;
  cmd->message = std::move(message);
  cmd->deadline = deadline;
  return cmd;
}
}  // namespace

Status ZmqTransport::Send(const Route& to, Message message, Deadline deadline) {
  return impl_->Submit(SendCommand(to, std::move(message), deadline)).status;
}

void ZmqTransport::Post(const Route& to, Message message, Deadline deadline,
                        std::function<void(const Status&)> done) {
  auto cmd = SendCommand(to, std::move(message), deadline);
  cmd->posted = done ? std::move(done) : [](const Status&) {};
  impl_->Post(std::move(cmd));
}

StatusOr<Incoming> ZmqTransport::Receive(Deadline deadline) { return impl_->Receive(deadline); }

void ZmqTransport::Shutdown() { impl_->Shutdown(); }

Status ZmqTransport::Probe(const std::string& endpoint, Deadline deadline) {
  const std::string monitor_addr =
      "inproc://gradsync-probe-" + std::to_string(impl_->NextProbeId());
  int retries = 0;
  try {
    zmq::socket_t dealer(impl_->context(), zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::reconnect_ivl, 100);
    impl_->ApplyClientKeys(dealer, endpoint);
    const int events = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_CONNECT_RETRIED |
                       ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (zmq_socket_monitor(dealer.handle(), monitor_addr.c_str(), events) != 0) {
      return InternalError("cannot monitor probe socket");
    }
    zmq::socket_t monitor(impl_->context(), zmq::socket_type::pair);
    monitor.set(zmq::sockopt::linger, 0);
    monitor.connect(monitor_addr);
    dealer.connect(endpoint);
    while (!deadline.Expired()) {
      zmq::pollitem_t item{monitor.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::min<Millis>(deadline.Remaining(), Millis(100)));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(monitor, std::back_inserter(frames))) continue;
      if (frames.empty() || frames[0].size() < sizeof(uint16_t)) continue;
      uint16_t event;
      std::memcpy(&event, frames[0].data(), sizeof(event));
      if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) return OkStatus();
      if (event == ZMQ_EVENT_CONNECT_RETRIED) ++retries;
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
          (impl_->curve() && event != ZMQ_EVENT_CONNECT_RETRIED)) {
        return UnavailableError(endpoint +
                                " refused the handshake: it does not run CURVE "
                                "with this job's key (security, key_file)");
      }
      if (event != ZMQ_EVENT_CONNECT_RETRIED) {
        return UnavailableError(endpoint + " answered but is not a gradsync (ZeroMQ) peer");
      }
    }
  } catch (const zmq::error_t& e) {
    return ZmqError("cannot probe " + endpoint, e);
  }
  return DeadlineExceededError("cannot reach " + endpoint +
                               ": no connection within the "
                               "deadline (" +
                               std::to_string(retries) +
                               " connection attempts refused or unanswered)");
}

}  // namespace gradsync::wire

// libzmq from Debian is not built with ThreadSanitizer: its lock-free pipes
// synchronise through atomics that TSan cannot see, so TSan reports memory
// handed between libzmq's own threads as races. Only reports whose stack
// passes through libzmq are suppressed; ignored when TSan is off.
//
// With CURVE, libzmq's I/O thread decrypts each message into a buffer of its
// own with libsodium's crypto_secretbox_open_detached (its memmove is the
// write TSan records, with libsodium's frame alone on that stack: neither
// library is instrumented), then hands the buffer to the socket's owner
// through the same unseen atomics; ReadSocket reads it only after
// zmq_recv returned it. The suppression names that one function: gradsync
// does not call libsodium itself, so it hides no access of ours to memory
// that libzmq did not decrypt into.
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libzmq.so.5\n"
         "race:libzmq.so.5\n"
         "race:crypto_secretbox_open_detached\n";
}
