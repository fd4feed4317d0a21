// libFuzzer target over what a TCP stream's listening port reads from a
// stranger (wire/tcp_stream_transport.h). Each input makes a fresh
// transport listening on loopback, plain or sealed (a CURVE job's node keys,
// taking "left"), connects to it with a raw socket and writes the input's
// bytes in the chunks it says: after a good hello from "left" (plain: the
// frames that follow are read as messages; sealed: the hello is Noise KK's
// first message as left writes it, with left's key, so what follows is read
// as its proof) or
// as they are (a hello of the input's own). The transport must never crash,
// hand out a message outside its bounds, or keep a connection the input
// cannot prove (a sealed one hands out no message: nothing here can seal
// for it); its Receive runs until the connection is closed or nothing more
// comes.
//
// Input: byte 0: bit 0 sealed, bit 1 a good hello first; then chunks, each
// a length byte and that many bytes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "wire/curve.h"
#include "wire/node_keys.h"
#include "wire/noise.h"
#include "wire/tcp_stream_transport.h"

namespace gradsync::fuzz {
namespace {

constexpr uint64_t kJob = 0x7e57;
constexpr size_t kMaxFrame = (size_t{1} << 20) + (64 << 10);

void Check(bool ok) {
  if (!ok) std::abort();
}

// The job's keys, made once: "left" and "right" in every plan.
struct Keys {
  Keys() {
    const auto job = wire::GenerateCurveKey();
    const auto left_pair = wire::GenerateCurveKey();
    const auto right_pair = wire::GenerateCurveKey();
    Check(job.ok() && left_pair.ok() && right_pair.ok());
    right = std::make_shared<wire::NodeKeys>(*job, *right_pair);
    std::vector<wire::NodeInfo> plan(2);
    plan[0].identity = "left";
    plan[0].public_key = left_pair->public_z85;
    plan[1].identity = "right";
    plan[1].public_key = right_pair->public_z85;
    for (auto& p : plan) {
      p.host = "127.0.0.1";
      p.data_port = 1;
    }
    right->SetPlan(plan);
    left_secret = *wire::DecodeKey(left_pair->secret_z85);
    right_public = *wire::DecodeKey(right_pair->public_z85);
  }
  std::shared_ptr<wire::NodeKeys> right;
  std::string left_secret, right_public;
};

void Put32(std::vector<uint8_t>* b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> GoodHello(bool sealed, const Keys& keys) {
  std::vector<uint8_t> b;
  Put32(&b, 0x47535448);
  Put32(&b, sealed ? 3 : 1);
  Put32(&b, static_cast<uint32_t>(kJob));
  Put32(&b, static_cast<uint32_t>(kJob >> 32));
  if (!sealed) {
    Put32(&b, 4);
    b.insert(b.end(), {'l', 'e', 'f', 't'});
    return b;
  }
  const std::vector<uint8_t> prologue = wire::SealedStreamPrologue(kJob);
  wire::noise::HandshakeKK hs(true, reinterpret_cast<const uint8_t*>(keys.left_secret.data()),
                              reinterpret_cast<const uint8_t*>(keys.right_public.data()),
                              prologue.data(), prologue.size());
  std::vector<uint8_t> first;
  Check(hs.WriteMessage(reinterpret_cast<const uint8_t*>("left"), 4, &first));
  Put32(&b, static_cast<uint32_t>(first.size()));
  b.insert(b.end(), first.begin(), first.end());
  return b;
}

// A connection to the listener at `endpoint`. A loaded machine may have no
// local port free for a moment (EADDRNOTAVAIL: the suite's other tests hold
// them, many in TIME_WAIT): that is waited out, anything else aborts.
int ConnectTo(const std::string& endpoint) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1))));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int attempt = 0;; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    Check(fd >= 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    const int error = errno;
    close(fd);
    if ((error != EADDRNOTAVAIL && error != EINTR && error != EAGAIN) || attempt == 5000) {
      std::fprintf(stderr, "connect to %s: %s\n", endpoint.c_str(), std::strerror(error));
      std::abort();
    }
    usleep(1000);
  }
}

// Whether the transport closed `fd` (reads and drops its answers).
bool ClosedByPeer(int fd) {
  uint8_t sink[512];
  for (;;) {
    const ssize_t r = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (r > 0) continue;
    return r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
}

}  // namespace
}  // namespace gradsync::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  using namespace gradsync::fuzz;
  static Keys* keys = [] {
    Check(sodium_init() >= 0);
    return new Keys();
  }();
  if (size < 1) return 0;
  const bool sealed = (data[0] & 1) != 0;
  const bool hello = (data[0] & 2) != 0;
  wire::TcpStreamOptions o;
  o.job_id = kJob;
  o.identity = "right";
  o.accept = {"left"};
  o.max_frame_bytes = kMaxFrame;
  o.max_message_bytes = kMaxFrame + (64 << 10);
  o.hello_wait = Millis(30);
  o.max_pending = 4;
  o.refusals = std::make_shared<wire::TransportRefusals>();
  if (sealed) o.node_keys = keys->right;
  wire::TcpStreamTransport t(o);
  auto endpoint = t.Listen("tcp://127.0.0.1:0");
  Check(endpoint.ok());
  const int fd = ConnectTo(*endpoint);
  std::vector<uint8_t> bytes = hello ? GoodHello(sealed, *keys) : std::vector<uint8_t>();
  for (size_t at = 1; at < size;) {
    const size_t n = std::min<size_t>(data[at], size - at - 1);
    bytes.insert(bytes.end(), data + at + 1, data + at + 1 + n);
    at += 1 + n;
  }
  (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);
  // Until the transport closes the connection, refuses what it read, or
  // nothing more comes for a while.
  for (int quiet = 0; quiet < 4;) {
    StatusOr<wire::Incoming> got = t.Receive(Deadline::After(Millis(10)));
    if (got.ok()) {
      // A message only from the one identity it takes, within its bounds;
      // and never from a sealed acceptor, which nothing here can seal for.
      Check(!sealed);
      Check(got->from.identity == "left");
      Check(!got->message.header.empty() && got->message.header.size() <= o.max_header_bytes);
      Check(got->message.payloads.size() + 1 <= o.max_frames);
      size_t sum = got->message.header.size();
      for (const wire::Payload& p : got->message.payloads) {
        Check(p.size <= o.max_frame_bytes);
        sum += p.size;
      }
      Check(sum <= o.max_message_bytes);
      quiet = 0;
      continue;
    }
    if (got.status().code() == StatusCode::kDataLoss) break;
    Check(got.status().code() == StatusCode::kDeadlineExceeded);
    if (ClosedByPeer(fd)) break;
    ++quiet;
  }
  close(fd);
  return 0;
}
