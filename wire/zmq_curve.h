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
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/time.h"
#include "wire/curve.h"
#include "zmq.hpp"

namespace gradsync::wire {

// A listening (ROUTER) socket: CURVE server with the job's secret key, in
// the ZAP domain "gradsync", enforced (ZMQ_ZAP_ENFORCE_DOMAIN). Unavailable
// when libzmq cannot enforce it (built without its draft options): such a
// socket would admit everyone once the handler is gone.
Status ApplyCurveServer(zmq::socket_t& socket, const CurveKey& key);
// A connecting (DEALER) socket: CURVE client of the scheduler (its pinned
// key, SchedulerPublicKey), with the job's key pair as its own.
void ApplyCurveClient(zmq::socket_t& socket, const CurveKey& key);
// A connecting socket with its own pair `own`, talking only to a server
// whose public key is `server_public_z85` (the handshake fails otherwise).
void ApplyCurveClientOf(zmq::socket_t& socket, const CurveKey& own,
                        const std::string& server_public_z85);

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
  // Who is let in: the User-Id to answer for a client's 32-byte public key,
  // nullopt to refuse it. Called on the handler's thread.
  using Admit = std::function<std::optional<std::string>(const uint8_t* key)>;

  static StatusOr<std::unique_ptr<ZapHandler>> Start(
      zmq::context_t& context, const std::string& admitted_z85,
      std::function<void(const Status&)> on_failure = nullptr);
  // As above, admitting whom `admit` names, under the User-Id it returns
  // (receivers read it with zmq_msg_gets(msg, "User-Id")). A key `admit`
  // does not know yet is asked about again while the client waits, for up
  // to `hold` (a peer that has not received the plan naming it yet; libzmq
  // does not reconnect after a refusal); at most kMaxHeld are held, others
  // are refused at once.
  static StatusOr<std::unique_ptr<ZapHandler>> Start(zmq::context_t& context, Admit admit,
                                                     Millis hold,
                                                     std::function<void(const Status&)> on_failure);
  static constexpr size_t kMaxHeld = 256;
  ~ZapHandler();

  bool failed() const { return failed_.load(); }

 private:
  ZapHandler() = default;
  void Serve(zmq::socket_t socket);
  struct Request {
    std::string routing_id;  // of the requesting socket's ZAP pipe
    std::string request_id;
    std::string key;  // 32 bytes; empty: not a CURVE request
    SteadyTime since;
  };
  // Answers what came and what is held; false when the socket failed
  // (*error says how).
  bool AnswerOne(zmq::socket_t& socket, zmq::error_t* error);
  static Request TakeRequest(std::vector<zmq::message_t>& req);
  void Decide(zmq::socket_t& socket, Request r);
  void ReviewHeld(zmq::socket_t& socket);
  static void Answer(zmq::socket_t& socket, const Request& r,
                     const std::optional<std::string>& user);

  Admit admit_;
  Millis hold_{0};
  std::list<Request> held_;  // the handler's thread only
  std::function<void(const Status&)> on_failure_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::thread thread_;
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_ZMQ_CURVE_H_
