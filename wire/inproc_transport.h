// Transport in memory, for tests that run every rank as a thread of one
// process. Same semantics as ZmqTransport (see transport.h): an InProcNetwork
// plays the part of the network, endpoints are names ("inproc://rank3").
//
// Differences: sends complete at once (the receiver's queue is unbounded), and
// a Send on a Connection whose endpoint nobody listens on fails with
// Unavailable instead of waiting for the listener.
//
// Thread-safety: all methods are thread-safe. The network must outlive every
// transport made on it.
#ifndef GRADSYNC_WIRE_INPROC_TRANSPORT_H_
#define GRADSYNC_WIRE_INPROC_TRANSPORT_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/blocking_queue.h"
#include "wire/transport.h"

namespace gradsync::wire {

class InProcTransport;

class InProcNetwork {
 public:
  // A transport attached to this network; empty identity picks a random one.
  std::unique_ptr<InProcTransport> NewTransport(std::string identity = "");

 private:
  friend class InProcTransport;
  Status Bind(const std::string& endpoint, InProcTransport* t);
  void Detach(InProcTransport* t);
  InProcTransport* Listener(const std::string& endpoint);    // requires mu_
  InProcTransport* ByIdentity(const std::string& identity);  // requires mu_

  std::mutex mu_;
  std::map<std::string, InProcTransport*> listeners_;   // guarded by mu_
  std::map<std::string, InProcTransport*> identities_;  // guarded by mu_
};

class InProcTransport : public Transport {
 public:
  ~InProcTransport() override;

  const std::string& identity() const override { return identity_; }
  StatusOr<std::string> Listen(const std::string& endpoint) override;
  StatusOr<ConnId> Connect(const std::string& endpoint) override;
  StatusOr<ConnId> ConnectLane(const std::string& endpoint, int lane) override;
  Status Send(const Route& to, Message message, Deadline deadline) override;
  StatusOr<Incoming> Receive(Deadline deadline) override;
  Status Probe(const std::string& endpoint, Deadline deadline) override;
  void Shutdown() override;

 private:
  friend class InProcNetwork;
  InProcTransport(InProcNetwork* network, std::string identity);
  // The connection this transport holds to `endpoint` in `lane`, or -1.
  ConnId ConnTo(const std::string& endpoint, int lane);

  InProcNetwork* const network_;
  const std::string identity_;
  BlockingQueue<Incoming> incoming_;
  std::mutex mu_;
  std::string listen_endpoint_;                          // guarded by mu_
  std::map<ConnId, std::pair<std::string, int>> conns_;  // guarded by mu_; (endpoint, lane)
  bool shut_down_ = false;                               // guarded by mu_
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_INPROC_TRANSPORT_H_
