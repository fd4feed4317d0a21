#include "wire/zmq_curve.h"

#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "common/logging.h"

namespace gradsync::wire {

namespace {

void SetKey(zmq::socket_t& socket, int option, std::string_view z85) {
  zmq_setsockopt(socket.handle(), option, z85.data(), z85.size());  // 40 Z85 characters
}

// Receives a whole multipart message without waiting; false when none is
// there. A part that a signal interrupted is read again, so that the
// socket never loses its place between request and reply.
bool RecvRequest(zmq::socket_t& socket, std::vector<zmq::message_t>* frames) {
  bool more = true;
  while (more) {
    zmq::message_t part;
    std::optional<size_t> got;
    try {
      got = socket.recv(part, frames->empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    if (!got) return false;
    more = part.more();
    frames->push_back(std::move(part));
  }
  return true;
}

// Sends `frames` whole, sending again a part that a signal interrupted.
void SendReply(zmq::socket_t& socket, std::vector<zmq::message_t>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    for (;;) {
      try {
        socket.send(frames[i], flags);
        break;
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;
      }
    }
  }
}

// ZMQ_ZAP_ENFORCE_DOMAIN, a draft option of libzmq 4.3 (zmq.h declares it
// only for draft builds; Debian's library is one).
constexpr int kZapEnforceDomain = 93;

}  // namespace

Status ApplyCurveServer(zmq::socket_t& socket, const CurveKey& key) {
  socket.set(zmq::sockopt::curve_server, 1);
  SetKey(socket, ZMQ_CURVE_SECRETKEY, key.secret_z85);
  socket.set(zmq::sockopt::zap_domain, "gradsync");
  const int enforce = 1;
  if (zmq_setsockopt(socket.handle(), kZapEnforceDomain, &enforce, sizeof(enforce)) != 0) {
    return UnavailableError(
        "this libzmq cannot enforce the ZAP domain (ZMQ_ZAP_ENFORCE_DOMAIN): a CURVE server "
        "would admit every client should its ZAP handler stop");
  }
  return OkStatus();
}

void ApplyCurveClient(zmq::socket_t& socket, const CurveKey& key) {
  SetKey(socket, ZMQ_CURVE_SERVERKEY, SchedulerPublicKey(key));
  SetKey(socket, ZMQ_CURVE_PUBLICKEY, key.public_z85);
  SetKey(socket, ZMQ_CURVE_SECRETKEY, key.secret_z85);
}

void ApplyCurveClientOf(zmq::socket_t& socket, const CurveKey& own,
                        const std::string& server_public_z85) {
  SetKey(socket, ZMQ_CURVE_SERVERKEY, server_public_z85);
  SetKey(socket, ZMQ_CURVE_PUBLICKEY, own.public_z85);
  SetKey(socket, ZMQ_CURVE_SECRETKEY, own.secret_z85);
}

StatusOr<std::unique_ptr<ZapHandler>> ZapHandler::Start(
    zmq::context_t& context, const std::string& admitted_z85,
    std::function<void(const Status&)> on_failure) {
  std::array<uint8_t, 32> admitted;
  if (admitted_z85.size() != 40 ||
      zmq_z85_decode(admitted.data(), admitted_z85.c_str()) == nullptr) {
    return InvalidArgumentError("the admitted CURVE key is not 40 Z85 characters");
  }
  Admit admit = [admitted](const uint8_t* key) -> std::optional<std::string> {
    if (std::memcmp(key, admitted.data(), admitted.size()) != 0) return std::nullopt;
    return std::string();
  };
  return Start(context, std::move(admit), Millis(0), std::move(on_failure));
}

StatusOr<std::unique_ptr<ZapHandler>> ZapHandler::Start(
    zmq::context_t& context, Admit admit, Millis hold,
    std::function<void(const Status&)> on_failure) {
  std::unique_ptr<ZapHandler> h(new ZapHandler());
  h->admit_ = std::move(admit);
  h->hold_ = hold;
  h->on_failure_ = std::move(on_failure);
  try {
    zmq::socket_t socket(context, zmq::socket_type::router);
    socket.set(zmq::sockopt::linger, 0);
    socket.bind("inproc://zeromq.zap.01");
    h->thread_ =
        std::thread([raw = h.get(), s = std::move(socket)]() mutable { raw->Serve(std::move(s)); });
  } catch (const zmq::error_t& e) {
    return UnavailableError(std::string("cannot start the ZAP handler: ") + e.what());
  }
  return h;
}

ZapHandler::~ZapHandler() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ZapHandler::Serve(zmq::socket_t socket) {
  zmq::error_t error;
  while (!stop_.load()) {
    if (AnswerOne(socket, &error)) continue;
    if (error.num() == EINTR || error.num() == EAGAIN) continue;
    if (stop_.load()) return;
    break;
  }
  if (stop_.load()) return;
  socket.close();  // from now on every CURVE socket of the context refuses everyone
  failed_.store(true);
  const Status failure = UnavailableError(std::string("the ZAP handler failed (") + error.what() +
                                          "): CURVE connections are refused from now on");
  GS_LOG(ERROR) << failure.message();
  if (on_failure_) on_failure_(failure);
}

// Request frames (on the ROUTER: after the requester's routing id and an
// empty delimiter): version, request id, domain, address, identity,
// mechanism, then the mechanism's credentials (CURVE: the client's 32-byte
// public key). Reply, after the same envelope: version, request id, status
// code, status text, user id, metadata. True when nothing failed (a poll
// that timed out included).
bool ZapHandler::AnswerOne(zmq::socket_t& socket, zmq::error_t* error) {
  try {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(100));
    if (item.revents & ZMQ_POLLIN) {
      std::vector<zmq::message_t> req;
      if (RecvRequest(socket, &req)) Decide(socket, TakeRequest(req));
    }
    ReviewHeld(socket);
    return true;
  } catch (const zmq::error_t& e) {
    *error = e;
    return false;
  }
}

ZapHandler::Request ZapHandler::TakeRequest(std::vector<zmq::message_t>& req) {
  Request r;
  r.since = std::chrono::steady_clock::now();
  if (req.size() >= 2) r.routing_id = req[0].to_string();
  if (req.size() >= 4) r.request_id = req[3].to_string();
  if (req.size() >= 9 && req[7].to_string() == "CURVE" && req[8].size() == 32) {
    r.key = req[8].to_string();
  }
  return r;
}

void ZapHandler::Decide(zmq::socket_t& socket, Request r) {
  std::optional<std::string> user;
  if (!r.key.empty()) user = admit_(reinterpret_cast<const uint8_t*>(r.key.data()));
  if (user || r.key.empty() || hold_.count() <= 0 || held_.size() >= kMaxHeld) {
    Answer(socket, r, user);
    return;
  }
  held_.push_back(std::move(r));
}

void ZapHandler::ReviewHeld(zmq::socket_t& socket) {
  const SteadyTime now = std::chrono::steady_clock::now();
  for (auto it = held_.begin(); it != held_.end();) {
    std::optional<std::string> user = admit_(reinterpret_cast<const uint8_t*>(it->key.data()));
    if (!user && now - it->since < hold_) {
      ++it;
      continue;
    }
    Answer(socket, *it, user);
    it = held_.erase(it);
  }
}

void ZapHandler::Answer(zmq::socket_t& socket, const Request& r,
                        const std::optional<std::string>& user) {
  const bool admit = user.has_value();
  std::vector<zmq::message_t> reply;
  reply.emplace_back(r.routing_id);
  reply.emplace_back();
  reply.emplace_back(std::string("1.0"));
  reply.emplace_back(r.request_id);
  reply.emplace_back(std::string(admit ? "200" : "400"));
  reply.emplace_back(std::string(admit ? "OK" : "not a key of this job"));
  reply.emplace_back(user.value_or(std::string()));
  reply.emplace_back();
  SendReply(socket, reply);
}

}  // namespace gradsync::wire
