#include "wire/inproc_transport.h"

#include <limits>

namespace gradsync::wire {

std::unique_ptr<InProcTransport> InProcNetwork::NewTransport(std::string identity) {
  if (identity.empty()) identity = RandomIdentity("inproc");
  std::unique_ptr<InProcTransport> t(new InProcTransport(this, identity));
  std::lock_guard<std::mutex> lock(mu_);
  identities_[identity] = t.get();
  return t;
}

Status InProcNetwork::Bind(const std::string& endpoint, InProcTransport* t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (listeners_.count(endpoint)) return AlreadyExistsError(endpoint + " is already bound");
  listeners_[endpoint] = t;
  return OkStatus();
}

void InProcNetwork::Detach(InProcTransport* t) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = listeners_.begin(); it != listeners_.end();) {
    it = it->second == t ? listeners_.erase(it) : std::next(it);
  }
  auto id = identities_.find(t->identity());
  if (id != identities_.end() && id->second == t) identities_.erase(id);
}

InProcTransport* InProcNetwork::Listener(const std::string& endpoint) {
  auto it = listeners_.find(endpoint);
  return it == listeners_.end() ? nullptr : it->second;
}

InProcTransport* InProcNetwork::ByIdentity(const std::string& identity) {
  auto it = identities_.find(identity);
  return it == identities_.end() ? nullptr : it->second;
}

InProcTransport::InProcTransport(InProcNetwork* network, std::string identity)
    : network_(network),
      identity_(std::move(identity)),
      incoming_(std::numeric_limits<size_t>::max()) {}

InProcTransport::~InProcTransport() { Shutdown(); }

StatusOr<std::string> InProcTransport::Listen(const std::string& endpoint) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return CancelledError("transport is shut down");
    if (!listen_endpoint_.empty()) return FailedPreconditionError("already listening");
    listen_endpoint_ = endpoint;
  }
  GS_RETURN_IF_ERROR(network_->Bind(endpoint, this));
  return endpoint;
}

StatusOr<ConnId> InProcTransport::Connect(const std::string& endpoint) {
  return ConnectLane(endpoint, 0);
}

StatusOr<ConnId> InProcTransport::ConnectLane(const std::string& endpoint, int lane) {
  if (lane < 0 || lane >= kMaxLanes) return InvalidArgumentError("no lane " + std::to_string(lane));
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return CancelledError("transport is shut down");
  const std::pair<std::string, int> key(endpoint, lane);
  for (const auto& [id, conn] : conns_) {
    if (conn == key) return id;
  }
  ConnId id = static_cast<ConnId>(conns_.size());
  conns_[id] = key;
  return id;
}

ConnId InProcTransport::ConnTo(const std::string& endpoint, int lane) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, conn] : conns_) {
    if (conn.first == endpoint && conn.second == lane) return id;
  }
  return -1;
}

Status InProcTransport::Send(const Route& to, Message message, Deadline /*deadline*/) {
  std::string endpoint;
  int lane = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return CancelledError("transport is shut down");
    if (to.kind == Route::Kind::kConnection) {
      auto it = conns_.find(to.conn);
      if (it == conns_.end()) return UnavailableError("no socket for " + to.ToString());
      endpoint = it->second.first;
      lane = it->second.second;
    } else {
      endpoint = listen_endpoint_;
    }
  }
  std::lock_guard<std::mutex> net_lock(network_->mu_);
  if (to.kind == Route::Kind::kConnection) {
    InProcTransport* peer = network_->Listener(endpoint);
    if (peer == nullptr) return UnavailableError("nobody listens on " + endpoint);
    return peer->incoming_.Push(
        {Route::Inbound(lane == 0 ? identity_ : LaneIdentity(identity_, lane)), std::move(message)},
        Deadline::Infinite());
  }
  // A lane's identity names its transport's and the lane.
  InProcTransport* peer = network_->ByIdentity(LaneBase(to.identity));
  ConnId back = peer ? peer->ConnTo(endpoint, LaneOf(to.identity)) : -1;
  if (back < 0) return UnavailableError(to.ToString() + " is not connected");
  return peer->incoming_.Push({Route::Connection(back), std::move(message)}, Deadline::Infinite());
}

StatusOr<Incoming> InProcTransport::Receive(Deadline deadline) {
  auto item = incoming_.Pop(deadline);
  if (!item.ok() && item.status().code() == StatusCode::kCancelled) {
    return CancelledError("transport is shut down");
  }
  return item;
}

Status InProcTransport::Probe(const std::string& endpoint, Deadline /*deadline*/) {
  std::lock_guard<std::mutex> lock(network_->mu_);
  if (network_->Listener(endpoint) == nullptr) {
    return DeadlineExceededError("cannot reach " + endpoint + ": nobody listens there");
  }
  return OkStatus();
}

void InProcTransport::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  network_->Detach(this);
  incoming_.Close();
}

}  // namespace gradsync::wire
