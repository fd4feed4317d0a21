// Link timing for the measured ring order (cluster/ring_order.h), over the
// TCP streams the ring itself uses: each host's first worker answers echoes
// on a stream port of its own (LinkEcho) while the other hosts' first
// workers time their round trips to it (TimeLink). With node keys the
// connections are sealed (Noise KK), as the ring's are, so only the plan's
// nodes are answered; an echo carries a small header back whatever the
// request held.
#ifndef GRADSYNC_CLIENT_LINK_PROBE_H_
#define GRADSYNC_CLIENT_LINK_PROBE_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/time.h"
#include "wire/tcp_stream_transport.h"

namespace gradsync::client {

struct LinkTiming {
  std::chrono::microseconds empty{0};  // round trip of an empty message
  std::chrono::microseconds full{0};   // round trip of a message of the probe's bytes
};

// Answers link-timing echoes at a stream port of its own until destroyed.
class LinkEcho {
 public:
  // Listens at `endpoint` (port 0: a free one) with `options` (its accept
  // list: the probers' identities, ProbeIdentity of theirs).
  static StatusOr<std::unique_ptr<LinkEcho>> Listen(wire::TcpStreamOptions options,
                                                    const std::string& endpoint);
  ~LinkEcho();
  uint16_t port() const { return port_; }
  bool sealed() const { return transport_->sealed(); }

 private:
  LinkEcho() = default;
  void Run();
  std::unique_ptr<wire::TcpStreamTransport> transport_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Times the link to the LinkEcho at `endpoint` (a transport of its own
// with `options`): the fastest of a few round trips of an empty message
// and of one carrying `bytes`, after one that opens the connection.
StatusOr<LinkTiming> TimeLink(wire::TcpStreamOptions options, const std::string& endpoint,
                              size_t bytes, Deadline deadline);

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_LINK_PROBE_H_
