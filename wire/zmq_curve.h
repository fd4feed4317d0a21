// CURVE on ZeroMQ sockets with a job's key (wire/curve.h), and the ZAP
// handler that admits only that key. Used by ZmqTransport.
//
// Thread-safety: ApplyCurve* run on the thread that owns the socket;
// ZapHandler runs a thread of its own.
#ifndef GRADSYNC_WIRE_ZMQ_CURVE_H_
#define GRADSYNC_WIRE_ZMQ_CURVE_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "wire/curve.h"
#include "zmq.hpp"

namespace gradsync::wire {

// A listening (ROUTER) socket: CURVE server with the job's secret key.
void ApplyCurveServer(zmq::socket_t& socket, const CurveKey& key);
// A connecting (DEALER) socket: CURVE client of a server holding the job's
// key, with the job's key pair as its own.
void ApplyCurveClient(zmq::socket_t& socket, const CurveKey& key);

// Answers ZAP requests (RFC 27) for every CURVE server socket of `context`:
// a client whose public key is `admitted` is let in, any other is refused.
// Must be started before such a socket binds; stops (and must be destroyed)
// before the context is closed.
class ZapHandler {
 public:
  static StatusOr<std::unique_ptr<ZapHandler>> Start(zmq::context_t& context,
                                                     const std::string& admitted_z85);
  ~ZapHandler();

 private:
  ZapHandler() = default;
  void Serve(zmq::socket_t socket);

  uint8_t admitted_[32] = {};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_ZMQ_CURVE_H_
