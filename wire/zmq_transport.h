// Transport over ZeroMQ: one ROUTER socket for the listening endpoint and one
// DEALER per outgoing connection, all owned by a single I/O thread. Callers on
// other threads hand work to it through a queue and an eventfd wake-up.
//
// - ROUTER_MANDATORY: a send to an unknown identity fails with Unavailable.
// - No ROUTER_HANDOVER: a connection under an identity that is already
//   connected is refused (it cannot take that peer's route); a peer that
//   reconnects gets its route back once its old connection is gone.
// - ZMQ_MAXMSGSIZE: frames larger than max_frame_bytes are refused by ZeroMQ
//   itself (the connection is dropped); validate.h limits apply below that.
// - With ZmqOptions::curve, CURVE on every socket and a ZAP handler that
//   admits only the job's key (wire/zmq_curve.h). Should the handler fail,
//   the transport fails closed: the listening socket closes (no handshake
//   succeeds from then on), and Receive returns Unavailable at once, also
//   to callers already waiting; outgoing connections keep working.
// - With ZmqOptions::node_keys (a data transport of a CURVE job), each node
//   is known by its own key (wire/node_keys.h): the listening socket serves
//   with the node's secret key and admits only the plan's keys; a message
//   on it is taken only when the identity it comes under (its routing id)
//   is the one bound to its sender's key (ZAP User-Id), else it is dropped,
//   counted in impostors() and reported to on_impostor. Outgoing
//   connections to the plan's nodes require the peer's own key of the
//   server and present a routing id no other node can guess
//   (RoutingIdFor), so nobody can take a node's route first.
//   Such a connection whose handshake is refused (the peer's plan does not
//   name this node yet, or strangers fill its hold of unknown keys) is made
//   again after a backoff (wire/zmq_handshake_retry.h), and a message to it
//   waits in the transport, until its deadline, for a handshake that
//   succeeded (ZMQ_IMMEDIATE): Send to such a connection returns once the
//   message is handed to a connection that is up.
// - Payload frames are sent zero-copy (zmq_msg_init_data with a free
//   callback that releases Payload::owner).
// - A message of more than max_payload_frames payload frames, or whose
//   header frame exceeds max_header_bytes, is dropped as it is read (no
//   byte of it copied, nothing queued), counted in dropped() and reported
//   to on_dropped: no gradsync message is like that, and its header cannot
//   be trusted to answer. (libzmq holds a multipart message whole before
//   handing it over; ZMQ_MAXMSGSIZE bounds each of its frames only.)
// - The first transport of a process tunes glibc's malloc for large
//   messages (TuneMallocForLargeMessages below).
// - Incoming messages wait in a queue bounded in messages and in bytes; when
//   it is full the I/O thread stops reading and ZeroMQ's high-water marks
//   push back on the senders, so what peers send cannot grow the process
//   past the bound (plus one message of at most max_frame_bytes per frame).
//
// Thread-safety: all public methods are thread-safe.
#ifndef GRADSYNC_WIRE_ZMQ_TRANSPORT_H_
#define GRADSYNC_WIRE_ZMQ_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "wire/curve.h"
#include "wire/node_keys.h"
#include "wire/transport.h"
#include "wire/validate.h"

namespace gradsync::wire {

struct ZmqOptions {
  std::string identity;  // empty: RandomIdentity("node")
  int64_t max_frame_bytes = (int64_t{1} << 30) + (64 << 10);
  int send_hwm = 1000;  // messages per connection
  int recv_hwm = 1000;
  int reconnect_ivl_ms = 100;
  int reconnect_ivl_max_ms = 2000;
  int linger_ms = 1000;  // flush time at shutdown
  // Sends waiting for one peer that does not take them (its connection at
  // send_hwm): past this many a send to it fails at once (Unavailable), so
  // a peer that never reads cannot grow this process by what it is sent.
  size_t max_pending_sends_per_peer = 4096;
  size_t max_queued_incoming = 4096;                        // messages received, not yet taken
  size_t max_queued_incoming_bytes = size_t{256} << 20;     // their bytes
  size_t max_payload_frames = Limits{}.max_payload_frames;  // per message
  size_t max_header_bytes = Limits{}.max_header_bytes;      // of the header frame
  // Set: every socket runs CURVE with the job's key, and only peers holding
  // it get in (wire/curve.h); a failed handshake on the listening socket
  // calls on_auth_failure (on the I/O thread) with the peer's address.
  std::optional<CurveKey> curve;
  std::function<void(const std::string& peer)> on_auth_failure;
  // Set (with curve): per-node identity, see above. Shared with the node
  // that updates its plan.
  std::shared_ptr<const NodeKeys> node_keys;
  // Called (on the I/O thread) for each message whose identity is not the
  // one bound to its sender's key, with the route and why.
  std::function<void(const std::string& peer, const std::string& why)> on_impostor;
  // Called (on the I/O thread) for each message dropped as it was read,
  // with the route it came on and why.
  std::function<void(const std::string& peer, const std::string& why)> on_dropped;
  // Called (on the I/O thread) for each send failed at once because its peer
  // had max_pending_sends_per_peer sends waiting (it is not reading).
  std::function<void(const std::string& peer)> on_send_dropped;
};

// Once per process, unless GRADSYNC_TUNE_MALLOC=0 or GLIBC_TUNABLES sets
// malloc itself: allocations up to 32 MiB come from the heap and up to
// 128 MiB of freed heap is kept, so that the buffers ZeroMQ allocates for
// large received messages are not fresh mappings faulted in page by page.
// ZmqTransport::Create calls it.
void TuneMallocForLargeMessages();

class ZmqTransport : public Transport {
 public:
  // Starts the I/O thread. Fails only if ZeroMQ cannot be initialised.
  static StatusOr<std::unique_ptr<ZmqTransport>> Create(ZmqOptions options);
  ~ZmqTransport() override;  // Shutdown()

  const std::string& identity() const override;
  StatusOr<std::string> Listen(const std::string& endpoint) override;
  StatusOr<ConnId> Connect(const std::string& endpoint) override;
  StatusOr<ConnId> ConnectLane(const std::string& endpoint, int lane) override;
  void Disconnect(const std::string& endpoint) override;
  Status Send(const Route& to, Message message, Deadline deadline) override;
  // Hands the message to the I/O thread without waiting for it.
  void Post(const Route& to, Message message, Deadline deadline,
            std::function<void(const Status&)> done) override;
  StatusOr<Incoming> Receive(Deadline deadline) override;
  Status Probe(const std::string& endpoint, Deadline deadline) override;
  void Shutdown() override;
  // Handshakes refused on the listening socket (no, wrong or another job's
  // CURVE key, or not ZeroMQ at all).
  uint64_t auth_failures() const;
  // Messages dropped as they were read (too many frames, header too large).
  uint64_t dropped() const;
  // Messages refused because their identity is not their key's (node keys).
  uint64_t impostors() const;
  // Sends the I/O thread looked at while retrying those that would block,
  // besides each blocked peer's first (tried once per pass): one per send
  // that goes or expires, however many wait behind a peer that does not
  // read and however often they are retried.
  uint64_t retry_steps() const;
  // Sends dropped because their peer had max_pending_sends_per_peer waiting.
  uint64_t dropped_sends() const;

  class Impl;

 private:
  explicit ZmqTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_ZMQ_TRANSPORT_H_
