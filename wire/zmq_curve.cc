#include "wire/zmq_curve.h"

#include <cstring>
#include <vector>

#include "zmq_addon.hpp"

namespace gradsync::wire {

namespace {

void SetKey(zmq::socket_t& socket, int option, const std::string& z85) {
  zmq_setsockopt(socket.handle(), option, z85.data(), z85.size());  // 40 Z85 characters
}

}  // namespace

void ApplyCurveServer(zmq::socket_t& socket, const CurveKey& key) {
  socket.set(zmq::sockopt::curve_server, 1);
  SetKey(socket, ZMQ_CURVE_SECRETKEY, key.secret_z85);
  socket.set(zmq::sockopt::zap_domain, "gradsync");
}

void ApplyCurveClient(zmq::socket_t& socket, const CurveKey& key) {
  SetKey(socket, ZMQ_CURVE_SERVERKEY, key.public_z85);
  SetKey(socket, ZMQ_CURVE_PUBLICKEY, key.public_z85);
  SetKey(socket, ZMQ_CURVE_SECRETKEY, key.secret_z85);
}

StatusOr<std::unique_ptr<ZapHandler>> ZapHandler::Start(zmq::context_t& context,
                                                        const std::string& admitted_z85) {
  std::unique_ptr<ZapHandler> h(new ZapHandler());
  if (admitted_z85.size() != 40 || zmq_z85_decode(h->admitted_, admitted_z85.c_str()) == nullptr) {
    return InvalidArgumentError("the admitted CURVE key is not 40 Z85 characters");
  }
  try {
    zmq::socket_t socket(context, zmq::socket_type::rep);
    socket.set(zmq::sockopt::linger, 0);
    socket.bind("inproc://zeromq.zap.01");
    h->thread_ = std::thread([raw = h.get(), s = std::move(socket)]() mutable {
      raw->Serve(std::move(s));
    });
  } catch (const zmq::error_t& e) {
    return UnavailableError(std::string("cannot start the ZAP handler: ") + e.what());
  }
  return h;
}

ZapHandler::~ZapHandler() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

// Request frames: version, request id, domain, address, identity,
// mechanism, then the mechanism's credentials (CURVE: the client's 32-byte
// public key). Reply: version, request id, status code, status text, user
// id, metadata.
void ZapHandler::Serve(zmq::socket_t socket) {
  while (!stop_.load()) {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(socket, std::back_inserter(req))) continue;
      const bool admit = req.size() >= 7 && req[5].to_string() == "CURVE" &&
                         req[6].size() == 32 && std::memcmp(req[6].data(), admitted_, 32) == 0;
      std::vector<zmq::message_t> reply;
      reply.emplace_back(std::string("1.0"));
      reply.emplace_back(req.size() >= 2 ? req[1].to_string() : std::string());
      reply.emplace_back(std::string(admit ? "200" : "400"));
      reply.emplace_back(std::string(admit ? "OK" : "not a key of this job"));
      reply.emplace_back(std::string());
      reply.emplace_back(std::string());
      zmq::send_multipart(socket, reply);
    } catch (const zmq::error_t&) {
      return;  // the context is closing
    }
  }
}

}  // namespace gradsync::wire
