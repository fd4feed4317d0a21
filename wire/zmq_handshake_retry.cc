#include "wire/zmq_handshake_retry.h"

#include <algorithm>
#include <cstring>

#include "zmq_addon.hpp"

namespace gradsync::wire {

HandshakeRetry::HandshakeRetry(zmq::context_t& context, Millis first, Millis max)
    : context_(context), first_(first), max_(std::max(first, max)) {}

Status HandshakeRetry::Watch(int64_t id, zmq::socket_t& socket, const std::string& endpoint) {
  const std::string address =
      "inproc://gradsync-outgoing-handshakes-" + std::to_string(next_monitor_++);
  const int events = ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
  if (zmq_socket_monitor(socket.handle(), address.c_str(), events) != 0) {
    return InternalError("cannot monitor the handshakes of the connection to " + endpoint);
  }
  Watched w;
  w.socket = &socket;
  w.endpoint = endpoint;
  w.backoff = first_;
  try {
    w.monitor = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pair);
    w.monitor->set(zmq::sockopt::linger, 0);
    w.monitor->connect(address);
  } catch (const zmq::error_t& e) {
    zmq_socket_monitor(socket.handle(), nullptr, 0);
    return InternalError("cannot watch the connection to " + endpoint + ": " + e.what());
  }
  watched_[id] = std::move(w);
  return OkStatus();
}

void HandshakeRetry::Forget(int64_t id) {
  auto it = watched_.find(id);
  if (it == watched_.end()) return;
  zmq_socket_monitor(it->second.socket->handle(), nullptr, 0);
  watched_.erase(it);
}

void HandshakeRetry::AddPollItems(std::vector<zmq::pollitem_t>* items) const {
  for (const auto& [id, w] : watched_) items->push_back({w.monitor->handle(), 0, ZMQ_POLLIN, 0});
}

void HandshakeRetry::Service(const zmq::pollitem_t* items) {
  const SteadyTime now = std::chrono::steady_clock::now();
  size_t i = 0;
  for (auto& [id, w] : watched_) {
    if (items[i++].revents & ZMQ_POLLIN) ReadEvents(w);
    if (w.due && *w.due <= now) Reconnect(w);
  }
}

long HandshakeRetry::NextDueMs() const {
  long next = -1;
  const SteadyTime now = std::chrono::steady_clock::now();
  for (const auto& [id, w] : watched_) {
    if (!w.due) continue;
    const long ms = std::max<long>(0, std::chrono::duration_cast<Millis>(*w.due - now).count() + 1);
    next = next < 0 ? ms : std::min(next, ms);
  }
  return next;
}

// Event frames: 2 bytes event, 4 bytes value; then the endpoint.
void HandshakeRetry::ReadEvents(Watched& w) {
  for (;;) {
    std::vector<zmq::message_t> frames;
    try {
      if (!zmq::recv_multipart(*w.monitor, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        return;
      }
    } catch (const zmq::error_t&) {
      return;
    }
    if (frames.empty() || frames[0].size() < sizeof(uint16_t)) continue;
    uint16_t event = 0;
    std::memcpy(&event, frames[0].data(), sizeof(event));
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      w.backoff = first_;
      continue;
    }
    if (!w.due) w.due = std::chrono::steady_clock::now() + w.backoff;
  }
}

void HandshakeRetry::Reconnect(Watched& w) {
  w.due.reset();
  w.backoff = std::min(max_, w.backoff * 2);
  try {
    w.socket->disconnect(w.endpoint);
  } catch (const zmq::error_t&) {
    // The refused connection is gone already.
  }
  try {
    w.socket->connect(w.endpoint);
    ++reconnects_;
  } catch (const zmq::error_t&) {
    w.due = std::chrono::steady_clock::now() + w.backoff;  // try again later
  }
}

}  // namespace gradsync::wire
