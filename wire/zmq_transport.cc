#include "wire/zmq_transport.h"

#include "wire/zmq_transport_impl.h"

namespace gradsync::wire {

void ZmqTransport::Impl::Configure(zmq::socket_t& socket) {
  socket.set(zmq::sockopt::maxmsgsize, options_.max_frame_bytes);
  socket.set(zmq::sockopt::sndhwm, options_.send_hwm);
  socket.set(zmq::sockopt::rcvhwm, options_.recv_hwm);
  socket.set(zmq::sockopt::linger, options_.linger_ms);
  socket.set(zmq::sockopt::reconnect_ivl, options_.reconnect_ivl_ms);
  socket.set(zmq::sockopt::reconnect_ivl_max, options_.reconnect_ivl_max_ms);
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
    case Command::Kind::kDisconnect:
      DoDisconnect(*cmd);
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
      // A data transport serves with its node's key; the scheduler's (no
      // node keys) with the scheduler's own.
      StatusOr<CurveKey> serving = options_.node_keys
                                       ? StatusOr<CurveKey>(options_.node_keys->own())
                                       : SchedulerServerKey(*options_.curve);
      Status watched = serving.ok() ? ApplyCurveServer(*router, *serving) : serving.status();
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
  auto known = conn_by_endpoint_.find({cmd.endpoint, cmd.lane});
  if (known != conn_by_endpoint_.end()) {
    cmd.done.set_value({OkStatus(), cmd.endpoint, known->second});
    return;
  }
  try {
    auto dealer = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
    Configure(*dealer);
    const bool node = ApplyClientKeys(*dealer, cmd.endpoint);
    const std::string identity =
        cmd.lane == 0 ? options_.identity : LaneIdentity(options_.identity, cmd.lane);
    dealer->set(zmq::sockopt::routing_id, node ? RoutingIdFor(identity) : identity);
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
    conn_by_endpoint_[{cmd.endpoint, cmd.lane}] = id;
    cmd.done.set_value({OkStatus(), cmd.endpoint, id});
  } catch (const zmq::error_t& e) {
    cmd.done.set_value({ZmqError("cannot connect to " + cmd.endpoint, e), "", -1});
  }
}

void ZmqTransport::Impl::DoDisconnect(Command& cmd) {
  for (auto it = conn_by_endpoint_.begin(); it != conn_by_endpoint_.end();) {
    if (it->first.first != cmd.endpoint) {
      ++it;
      continue;
    }
    const ConnId id = it->second;
    const Route route = Route::Connection(id);
    it = conn_by_endpoint_.erase(it);
    auto waiting = pending_.find(RouteKey(route));
    if (waiting != pending_.end()) {
      for (auto& entry : waiting->second.order) {
        entry.cmd->Finish(
            {CancelledError("the connection to " + cmd.endpoint + " was closed"), "", -1});
      }
      pending_.erase(waiting);
    }
    if (retry_) retry_->Forget(id);
    auto dealer = dealers_.find(id);
    if (dealer != dealers_.end()) {
      dealer->second->set(zmq::sockopt::linger, 0);  // what it queued goes now
      dealers_.erase(dealer);
    }
  }
  cmd.done.set_value({OkStatus(), cmd.endpoint, -1});
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
  return ConnectLane(endpoint, 0);
}

StatusOr<ConnId> ZmqTransport::ConnectLane(const std::string& endpoint, int lane) {
  if (lane < 0 || lane >= kMaxLanes) {
    return InvalidArgumentError("lane " + std::to_string(lane) + " is not in [0, " +
                                std::to_string(kMaxLanes) + ")");
  }
  auto cmd = std::make_unique<Command>();
  cmd->kind = Command::Kind::kConnect;
  cmd->endpoint = endpoint;
  cmd->lane = lane;
  Result r = impl_->Submit(std::move(cmd));
  if (!r.status.ok()) return r.status;
  return r.conn;
}

void ZmqTransport::Disconnect(const std::string& endpoint) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = Command::Kind::kDisconnect;
  cmd->endpoint = endpoint;
  (void)impl_->Submit(std::move(cmd));  // Cancelled once the transport is shut down
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
  auto cmd = SendCommand(to, std::move(message), deadline);
  return impl_->Submit(std::move(cmd)).status;
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
                                "with this job's key (security, key_file), or does not hold "
                                "the scheduler key that key_file pins");
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
