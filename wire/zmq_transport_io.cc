// ZmqTransport::Impl on its I/O thread: the loop, sends that wait for their
// peer, what is read and whose it is.
#include "wire/zmq_transport_impl.h"

namespace gradsync::wire {

void ZmqTransport::Impl::IoLoop() {
  pthread_setname_np(pthread_self(), "gradsync-io");  // in top -H, perf and gdb
  for (;;) {
    // Whatever was queued before Shutdown is sent (a last broadcast
    // included): Enqueue takes nothing once stopping_ is set, so the batch
    // run after reading it holds every command that came before.
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping = stopping_;
    }
    RunCommands();
    if (stopping) break;
    if (router_ && zap_ && zap_->failed()) CloseListening();
    std::vector<zmq::pollitem_t> items;
    items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    bool room = Room();
    if (!room) {
      reading_paused_.store(true);
      room = Room();  // a receiver that took one before the store wakes no one
    }
    if (room) reading_paused_.store(false);
    const short in = room ? ZMQ_POLLIN : 0;
    if (router_) items.push_back({router_->handle(), 0, in, 0});
    if (monitor_) items.push_back({monitor_->handle(), 0, ZMQ_POLLIN, 0});
    std::vector<ConnId> ids;
    for (auto& [id, sock] : dealers_) {
      items.push_back({sock->handle(), 0, in, 0});
      ids.push_back(id);
    }
    const size_t retry_at = items.size();
    long timeout_ms = pending_.empty() && room ? -1 : 1;
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
  if (claimed && IdentityMatchesKey(*claimed, bound, options_.node_keys->epoch())) {
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

}  // namespace gradsync::wire
