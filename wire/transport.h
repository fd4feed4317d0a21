// The transport: how a node sends and receives messages.
//
// A Transport has at most one listening endpoint (Listen) that any peer may
// send to, and any number of outgoing connections (Connect). A message that
// arrives on the listening endpoint comes from an Inbound route (the peer's
// identity) and can be answered on it; a message on an outgoing connection
// comes from that Connection.
//
// Implementations: ZmqTransport (ROUTER + DEALERs over TCP,
// zmq_transport.h: the scheduler's port and the node agents' connections to
// it, and each node's data port), TcpStreamTransport (one TCP connection a
// peer, sealed by Noise KK under CURVE, tcp_stream_transport.h: every
// byte of data between nodes: the ring's lanes, the halving-and-doubling
// pairs, the ring order's link probes and the parameter server),
// SameHostTransport (shared-memory links to the peers of this machine over
// another transport, same_host_transport.h) and InProcTransport (in memory,
// for ranks-as-threads tests, inproc_transport.h). All have the same
// semantics:
//   - Send blocks until the message is handed to the network, or the deadline
//     passes; sending to an identity that is not connected fails at once
//     with Unavailable (nothing is dropped silently).
//   - Receive blocks until a message arrives, or the deadline passes
//     (DeadlineExceeded), or the transport is shut down (Cancelled).
//   - Messages on one route arrive in the order they were sent.
//
// Thread-safety: every method may be called from any thread.
#ifndef GRADSYNC_WIRE_TRANSPORT_H_
#define GRADSYNC_WIRE_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "common/time.h"
#include "wire/message.h"

namespace gradsync::wire {

using ConnId = int32_t;

// Where a message comes from or goes to.
struct Route {
  enum class Kind { kConnection, kInbound };
  Kind kind = Kind::kConnection;
  ConnId conn = -1;      // kConnection: the handle Connect returned
  std::string identity;  // kInbound: the peer's transport identity

  static Route Connection(ConnId id) { return Route{Kind::kConnection, id, ""}; }
  static Route Inbound(std::string identity) {
    return Route{Kind::kInbound, -1, std::move(identity)};
  }
  std::string ToString() const;
};

// The endpoint to listen on at `host`: "tcp://ADDRESS:PORT" with the
// numeric address `host` resolves to (common/net.h BindAddress), never a
// wildcard for a name. NotFound when `host` does not resolve.
StatusOr<std::string> ListenEndpoint(const std::string& host, int64_t port);

struct Incoming {
  Route from;
  Message message;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // This transport's identity, as peers see it on an Inbound route.
  virtual const std::string& identity() const = 0;
  // Binds the listening endpoint ("tcp://*:5000"; port 0 picks a free one).
  // Returns the bound endpoint with the real port. At most once.
  virtual StatusOr<std::string> Listen(const std::string& endpoint) = 0;
  // Opens an outgoing connection. Does not wait for the peer: messages queue
  // until it is reachable, and a lost connection is re-established.
  virtual StatusOr<ConnId> Connect(const std::string& endpoint) = 0;
  // As Connect, over a connection of its own that presents the identity
  // LaneIdentity(identity(), lane) (message.h): a further TCP connection to
  // the same peer, FIFO on its own (lane 0 is Connect's). Unimplemented for
  // lanes past 0 where the transport has no such thing (in-process).
  virtual StatusOr<ConnId> ConnectLane(const std::string& endpoint, int lane) {
    if (lane == 0) return Connect(endpoint);
    return UnimplementedError("this transport has no lanes");
  }
  virtual Status Send(const Route& to, Message message, Deadline deadline) = 0;
  // Sends without waiting: returns at once, and `done` (may be empty) is
  // called once with what Send would have returned, on a thread of the
  // transport's (or before Post returns). Messages to one peer keep their
  // order with each other and with Send's. The payloads are held until the
  // message has been handed to the network or has failed.
  virtual void Post(const Route& to, Message message, Deadline deadline,
                    std::function<void(const Status&)> done) {
    Status s = Send(to, std::move(message), deadline);
    if (done) done(s);
  }
  virtual StatusOr<Incoming> Receive(Deadline deadline) = 0;
  // Checks that a peer listens at `endpoint`: OK once a connection and
  // protocol handshake succeed, DeadlineExceeded naming the endpoint if not.
  virtual Status Probe(const std::string& endpoint, Deadline deadline) = 0;
  // Closes this transport's connections to `endpoint` (every lane), for a
  // peer that left: sends still waiting for it end with Cancelled, and
  // what it still queued is dropped, its payloads released. A later
  // Connect to the endpoint opens a new connection. Does nothing where a
  // transport's connections end only with it.
  virtual void Disconnect(const std::string& endpoint) { (void)endpoint; }
  // Stops I/O; blocked and later calls return Cancelled. Idempotent.
  virtual void Shutdown() = 0;
};

// The first failure among sends posted with callback(): the state is shared
// with the transport's threads, which may report after the poster is gone.
// Thread-safe.
class PostedSends {
 public:
  // The `done` to give Transport::Post.
  std::function<void(const Status&)> callback() const;
  // The first failure reported so far; OK while there is none.
  Status first_failure() const;

 private:
  struct State {
    std::mutex mu;
    Status first;  // guarded by mu
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// What the transports of one process refused before a message reached its
// receiver, for /metrics (cluster::TransportOptions fills it).
struct TransportRefusals {
  std::atomic<uint64_t> handshakes{0};     // failed handshakes (CURVE, a TCP stream hello)
  std::atomic<uint64_t> dropped{0};        // messages dropped as they were read
  std::atomic<uint64_t> impostors{0};      // messages under another node's identity
  std::atomic<uint64_t> sends_dropped{0};  // sends to a peer that was not reading
};

// A random identity for a transport ("<prefix>-<16 hex digits>").
std::string RandomIdentity(const std::string& prefix);

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_TRANSPORT_H_
