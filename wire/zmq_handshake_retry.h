// HandshakeRetry: outgoing ZeroMQ connections whose handshake the peer
// refused are made again. libzmq 4.3 never reconnects after a refused
// handshake (ZMQ_EVENT_HANDSHAKE_FAILED_*): a connection to a node whose
// plan does not name this node's key yet, or whose ZAP handler holds as many
// unknown keys as it may (a flood of strangers' handshakes), would stay shut
// for good. Each watched socket's monitor reports its failed handshakes;
// after a backoff (`first`, doubled after each failure up to `max`, back to
// `first` after a handshake that succeeds) the socket disconnects from its
// endpoint and connects to it again, for as long as it is watched.
//
// A watched socket should run with ZMQ_IMMEDIATE: a refused connection's
// pipe is dropped with what it holds, so a message should enter a pipe only
// once its connection is up.
//
// Thread-safety: none; the thread that owns the watched sockets calls every
// method. The watched sockets must outlive their watch (Forget, or the
// HandshakeRetry's destruction, which closes the monitors).
#ifndef GRADSYNC_WIRE_ZMQ_HANDSHAKE_RETRY_H_
#define GRADSYNC_WIRE_ZMQ_HANDSHAKE_RETRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "zmq.hpp"

namespace gradsync::wire {

class HandshakeRetry {
 public:
  HandshakeRetry(zmq::context_t& context, Millis first, Millis max);

  // Watches `socket`, connected (or about to be) to `endpoint`, under `id`
  // (unique among those watched). Internal when libzmq cannot monitor it.
  Status Watch(int64_t id, zmq::socket_t& socket, const std::string& endpoint);
  void Forget(int64_t id);

  // The monitors' poll items (ZMQ_POLLIN), appended to `items` in a fixed
  // order; Service takes them back after the poll.
  void AddPollItems(std::vector<zmq::pollitem_t>* items) const;
  // Reads what the monitors reported (`items`: those AddPollItems appended,
  // after the poll) and connects again the sockets whose backoff is over.
  void Service(const zmq::pollitem_t* items);
  // Milliseconds until the next connection is due again; -1 when none is.
  long NextDueMs() const;
  // Connections made again so far.
  uint64_t reconnects() const { return reconnects_; }

 private:
  struct Watched {
    zmq::socket_t* socket = nullptr;
    std::string endpoint;
    std::unique_ptr<zmq::socket_t> monitor;
    Millis backoff{0};
    std::optional<SteadyTime> due;  // set after a refused handshake
  };
  void ReadEvents(Watched& w);
  void Reconnect(Watched& w);

  zmq::context_t& context_;
  const Millis first_, max_;
  std::map<int64_t, Watched> watched_;
  uint64_t next_monitor_ = 0;
  uint64_t reconnects_ = 0;
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_ZMQ_HANDSHAKE_RETRY_H_
