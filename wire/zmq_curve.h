// CURVE on ZeroMQ sockets with a job's key (wire/curve.h), and the ZAP
// handler that admits only that key. Used by ZmqTransport.
//
// A CURVE server socket enforces its ZAP domain: while no handler answers
// at inproc://zeromq.zap.01 (never started, or stopped after a fatal
// error), every client is refused, whatever key it holds.
//
// Thread-safety: ApplyCurve* run on the thread that owns the socket;
// ZapHandler runs a thread of its own.
#ifndef GRADSYNC_WIRE_ZMQ_CURVE_H_
#define GRADSYNC_WIRE_ZMQ_CURVE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "wire/curve.h"
#include "zmq.hpp"

namespace gradsync::wire {

// A listening (ROUTER) socket: CURVE server with the job's secret key, in
// the ZAP domain "gradsync", enforced (ZMQ_ZAP_ENFORCE_DOMAIN). Unavailable
// when libzmq cannot enforce it (built without its draft options): such a
// socket would admit everyone once the handler is gone.
Status ApplyCurveServer(zmq::socket_t& socket, const CurveKey& key);
// A connecting (DEALER) socket: CURVE client of a server holding the job's
// key, with the job's key pair as its own.
void ApplyCurveClient(zmq::socket_t& socket, const CurveKey& key);

// Answers ZAP requests (RFC 27) for every CURVE server socket of `context`:
// a client whose public key is `admitted` is let in, any other is refused.
// Must be started before such a socket binds; stops (and must be destroyed)
// before the context is closed.
//
// It never stops on its own while it can serve: an interrupted or
// would-block call (EINTR, EAGAIN) is retried. On any other error (the
// context shut down under it, a broken socket) it logs, closes its socket,
// so that every CURVE socket of the context refuses everyone (see above),
// and calls `on_failure` once, on its thread, with what happened; failed()
// is true from then on.
class ZapHandler {
 public:
  static StatusOr<std::unique_ptr<ZapHandler>> Start(
      zmq::context_t& context, const std::string& admitted_z85,
      std::function<void(const Status&)> on_failure = nullptr);
  ~ZapHandler();

  bool failed() const { return failed_.load(); }

 private:
  ZapHandler() = default;
  void Serve(zmq::socket_t socket);
  // Answers one request; false when the socket failed (*error says how).
  bool AnswerOne(zmq::socket_t& socket, zmq::error_t* error);

  uint8_t admitted_[32] = {};
  std::function<void(const Status&)> on_failure_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::thread thread_;
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_ZMQ_CURVE_H_
