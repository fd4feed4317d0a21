#include "wire/tcp_stream_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>

#include "common/logging.h"
#include "common/net.h"
#include "wire/bulk_cipher.h"
#include "wire/noise.h"
#include "wire/validate.h"

namespace gradsync::wire {
namespace {

constexpr uint32_t kHelloMagic = 0x47535448;   // "GSTH": connector -> acceptor
constexpr uint32_t kAnswerMagic = 0x47535441;  // "GSTA": acceptor -> connector
constexpr uint32_t kFrameMagic = 0x47535431;   // "GST1": a message
constexpr uint32_t kVersion = 1;               // a plain hello
// A sealed one: Noise KK's first message follows (docs/design/tcp_streams.md).
constexpr uint32_t kSealedVersion = 3;
// Magic, version, job id, then the length of the identity (plain) or of
// Noise's first message (sealed).
constexpr size_t kHelloFixed = 20;
constexpr size_t kMaxIdentity = 255;
constexpr size_t kKeyBytes = 32;  // an X25519 key, public or secret
// Noise's first message: the connector's ephemeral key and its identity
// sealed; the second: the acceptor's ephemeral key and the verdict sealed.
constexpr size_t kMaxFirst = noise::kMessageOverhead + kMaxIdentity;
constexpr size_t kSecond = noise::kMessageOverhead + 4;
// The connector's proof and the acceptor's verdict on a sealed connection:
// a 4-byte word sealed under the direction's key with counter 0.
constexpr size_t kProofBytes = kBulkTagBytes + 4;
constexpr uint32_t kProofWord = 0x464f5250;  // "PROF"
// The most frames a message may have (the header and every payload frame a
// gradsync message can carry), and so the longest frame table.
constexpr size_t kMaxFrames = Limits{}.max_payload_frames + 1;
constexpr size_t kMaxIov = kMaxFrames + 1;
// How long a refused or unreachable connect waits before it tries again.
constexpr Millis kConnectRetry{20};
// The longest a poll sleeps between looks at Shutdown and the deadlines.
constexpr Millis kPollSlice{100};
// Refusals logged one by one before only every kLogEvery-th is.
constexpr uint64_t kLogFirst = 16, kLogEvery = 1024;

enum Answer : uint32_t {
  kTaken = 0,
  kOtherJob = 1,
  kStranger = 2,
  kAlreadyConnected = 3,
  kBadHello = 4,
  kWrongKey = 5,       // sealed: the plan binds the node key shown to another identity
  kNeedsSealed = 6,    // a plain hello to a sealed acceptor
  kNeedsPlain = 7,     // a sealed hello to a plain acceptor
  kProve = 8,          // sealed: the acceptor's fresh key follows; prove the node key
  kNotReady = 9,       // the acceptor does not know its job and peers yet
  kNotListedYet = 10,  // strangers_may_wait: not an identity it takes, yet
  kNoKeyOpens = 11,    // sealed: no plan node at the connector's address has its key
};

// Verdicts the connector waits out (connecting again until its deadline):
// the acceptor not knowing its job yet, and an old connection under the
// same identity that it has not yet seen break.
bool Passing(uint32_t verdict) {
  return verdict == kNotReady || verdict == kAlreadyConnected || verdict == kNotListedYet;
}

const char* AnswerText(uint32_t a) {
  switch (a) {
    case kOtherJob:
      return "it belongs to another job";
    case kStranger:
      return "it does not take connections from this identity";
    case kAlreadyConnected:
      return "this identity is connected already";
    case kBadHello:
      return "the hello was malformed";
    case kWrongKey:
      return "the plan binds the node key shown to another identity";
    case kNeedsSealed:
      return "it takes only sealed connections (its job runs CURVE)";
    case kNeedsPlain:
      return "it takes only plain connections (its job runs without CURVE)";
    case kNotReady:
      return "it does not take connections yet (it has not joined its job)";
    case kNotListedYet:
      return "it does not take connections from this identity (yet)";
    case kNoKeyOpens:
      return "the hello opens under the key of no node of its plan at this address (another "
             "job, another plan, or not the key the plan has for this node)";
    default:
      return "unknown answer";
  }
}

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string ErrnoText(int e) { return std::strerror(e); }

// "tcp://HOST:PORT" (HOST may be [IPv6] or *) into host and port.
Status SplitEndpoint(const std::string& endpoint, std::string* host, std::string* port) {
  const std::string prefix = "tcp://";
  const size_t colon = endpoint.rfind(':');
  if (endpoint.compare(0, prefix.size(), prefix) != 0 || colon == std::string::npos ||
      colon <= prefix.size() || colon + 1 == endpoint.size()) {
    return InvalidArgumentError("not a tcp://HOST:PORT endpoint: " + endpoint);
  }
  *host = endpoint.substr(prefix.size(), colon - prefix.size());
  *port = endpoint.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return Status();
}

StatusOr<std::vector<addrinfo>> Resolve(const std::string& endpoint, bool passive,
                                        std::vector<sockaddr_storage>* storage) {
  std::string host, port;
  GS_RETURN_IF_ERROR(SplitEndpoint(endpoint, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host == "*" ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    return NotFoundError("cannot resolve " + endpoint + ": " + gai_strerror(rc));
  }
  std::vector<addrinfo> out;
  storage->reserve(16);
  for (addrinfo* a = found; a != nullptr && out.size() < 16; a = a->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, a->ai_addr, std::min<size_t>(a->ai_addrlen, sizeof(s)));
    storage->push_back(s);
    addrinfo copy = *a;
    copy.ai_addr = reinterpret_cast<sockaddr*>(&storage->back());
    copy.ai_next = nullptr;
    copy.ai_canonname = nullptr;
    out.push_back(copy);
  }
  freeaddrinfo(found);
  if (out.empty()) return NotFoundError("no address for " + endpoint);
  return out;
}

int PollMillis(Deadline deadline, Millis cap) {
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
      deadline.at() - std::chrono::steady_clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>((left.count() + 999) / 1000, cap.count()));
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Writes all of `n` bytes to a non-blocking `fd` by `deadline`.
Status WriteAll(int fd, const uint8_t* data, size_t n, Deadline deadline, const std::string& what) {
  while (n > 0) {
    const ssize_t w = send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return UnavailableError("writing to " + what + ": " + ErrnoText(errno));
    }
    if (deadline.Expired()) return DeadlineExceededError("writing to " + what + " timed out");
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, PollMillis(deadline, kPollSlice));
  }
  return Status();
}

// Reads all of `n` bytes from a non-blocking `fd` by `deadline`.
Status ReadAll(int fd, uint8_t* out, size_t n, Deadline deadline, const std::string& what) {
  while (n > 0) {
    const ssize_t r = recv(fd, out, n, MSG_DONTWAIT);
    if (r > 0) {
      out += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return UnavailableError(what + " closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return UnavailableError("reading from " + what + ": " + ErrnoText(errno));
    }
    if (deadline.Expired()) return DeadlineExceededError(what + " did not answer in time");
    pollfd p{fd, POLLIN, 0};
    poll(&p, 1, PollMillis(deadline, kPollSlice));
  }
  return Status();
}

enum class Got { kAll, kMore, kClosed };
// Reads into buf[*got, want) what the non-blocking `fd` has now: kAll once
// it is full, kMore when the socket has no more yet, kClosed when the peer
// closed or the connection broke.
Got ReadUpTo(int fd, uint8_t* buf, size_t* got, size_t want) {
  while (*got < want) {
    const ssize_t r = recv(fd, buf + *got, want - *got, MSG_DONTWAIT);
    if (r > 0) {
      *got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? Got::kMore : Got::kClosed;
  }
  return Got::kAll;
}

// The two keys of a sealed connection: one for what the connector sends,
// one for what the acceptor sends.
struct ConnectionKeys {
  std::unique_ptr<BulkKey> to_acceptor, to_connector;
};

// The transport keys of a finished handshake; nullopt if the cipher cannot
// be set up.
std::optional<ConnectionKeys> SplitKeys(noise::HandshakeKK& hs, BulkCipherEngine engine) {
  noise::SecretBytes k(2 * noise::kKeyBytes);
  if (k.data() == nullptr) return std::nullopt;
  hs.Split(k.data(), k.data() + noise::kKeyBytes);
  ConnectionKeys keys{BulkKey::FromBytes(k.data(), engine),
                      BulkKey::FromBytes(k.data() + noise::kKeyBytes, engine)};
  if (keys.to_acceptor == nullptr || keys.to_connector == nullptr) return std::nullopt;
  return keys;
}

// Counts a message of `bytes` sealed or opened under `key` and renews the
// key (Noise's REKEY) once `messages` or `sealed` reach their bounds; both
// ends count the same messages, so they renew at the same one. False if
// the cipher fails.
bool CountAndRenew(std::unique_ptr<BulkKey>* key, uint64_t* messages, uint64_t* sealed,
                   uint64_t bytes, const TcpStreamOptions& o) {
  *sealed += bytes;
  if (++*messages < o.rekey_messages && *sealed < o.rekey_bytes) return true;
  *messages = *sealed = 0;
  noise::SecretBytes k(noise::kKeyBytes);
  if (k.data() == nullptr) return false;
  std::memcpy(k.data(), (*key)->bytes(), noise::kKeyBytes);
  if (!noise::Rekey(k.data())) return false;
  std::unique_ptr<BulkKey> next = BulkKey::FromBytes(k.data(), o.cipher);
  if (next == nullptr) return false;
  *key = std::move(next);
  return true;
}

// A word sealed under `key` with counter 0 (the proof, the verdict).
void SealWord(BulkKey& key, uint32_t word, uint8_t* out) {
  uint8_t plain[4];
  Put32(plain, word);
  if (!key.Seal(0, 0, plain, sizeof(plain), out).ok()) std::memset(out, 0, kProofBytes);
}
std::optional<uint32_t> OpenWord(BulkKey& key, const uint8_t* in) {
  uint8_t plain[4];
  if (!key.Open(0, 0, in, kProofBytes, plain)) return std::nullopt;
  return Get32(plain);
}

}  // namespace

std::vector<uint8_t> SealedStreamPrologue(uint64_t job) {
  static constexpr char kContext[] = "gradsync tcp stream";
  std::vector<uint8_t> p(kContext, kContext + sizeof(kContext));
  p.resize(p.size() + 12);
  Put32(p.data() + sizeof(kContext), kSealedVersion);
  Put64(p.data() + sizeof(kContext) + 4, job);
  return p;
}

struct TcpStreamTransport::Pending {
  Message message;
  uint8_t table[8 + 8 * kMaxFrames];  // magic, count, sizes
  size_t table_bytes = 0;
  size_t total = 0;  // bytes of table and frames
  size_t done = 0;   // bytes of them written
  bool sealed = false;
  Deadline deadline = Deadline::At(SteadyTime{});
  std::function<void(const Status&)> done_cb;
};

struct TcpStreamTransport::Conn {
  Conn(bool out, ConnId i, std::string e, std::string says = "")
      : outgoing(out), id(i), endpoint(std::move(e)), says(std::move(says)) {}
  ~Conn() {
    const int f = fd.load();
    if (f >= 0) close(f);
  }
  const bool outgoing;
  const ConnId id;             // outgoing: Connect's handle
  const std::string endpoint;  // outgoing: where it connects
  const std::string says;      // outgoing: the identity its hello presents
  std::string peer;            // inbound: the identity of its hello, once taken
  std::atomic<int> fd{-1};     // set once; closed by the destructor only
  std::atomic<bool> open{false};
  std::atomic<bool> broken{false};
  bool connecting = false;   // outgoing: a connector thread opens it; guarded by mu
  std::string not_open_why;  // why it is not open yet, while connecting; guarded by mu

  // Writing, guarded by mu.
  std::mutex mu;
  std::deque<Pending> queue;  // the front may be written in part

  // Sealed connections: each direction's key and next message counter
  // (set before `open`; then the sending side's under mu, the receiving
  // side's on Receive's thread).
  std::unique_ptr<BulkKey> send_key, receive_key;
  uint64_t send_counter = 1, receive_counter = 1;
  // Messages and sealed bytes under each direction's key since it was made
  // or last rekeyed.
  uint64_t sent_under_key = 0, sent_bytes_under_key = 0;
  uint64_t received_under_key = 0, received_bytes_under_key = 0;

  // Reading: Receive's thread only (the acceptor's until taken).
  std::string source;  // inbound: the peer's address, numeric
  SteadyTime hello_by{};
  uint8_t hello[kHelloFixed + kMaxFirst];
  size_t hello_got = 0;
  // Sealed, once the hello is answered (receive_key set): the identity it
  // said, and its proof as read so far.
  std::string claimed;
  uint8_t proof[kProofBytes];
  size_t proof_got = 0;
  enum class Stage { kPrefix, kSizes, kFrames } stage = Stage::kPrefix;
  uint8_t prefix[8];
  std::vector<uint8_t> sizes;
  size_t got = 0;
  size_t frame = 0;
  Message reading;
  std::vector<std::shared_ptr<uint8_t>> buffers;

  std::string Name() const { return outgoing ? endpoint : "'" + peer + "'"; }
  // "the connection to ENDPOINT" or "the connection from 'IDENTITY'".
  std::string Described() const {
    return std::string("the connection ") + (outgoing ? "to " : "from ") + Name();
  }
};

TcpStreamTransport::TcpStreamTransport(TcpStreamOptions options)
    : options_(std::move(options)), pool_(std::make_shared<BufferPool>(size_t{64} << 20)) {
  accept_set_ = !options_.accept.empty();  // whom to take is known from the start
  if (options_.identity.empty()) options_.identity = RandomIdentity("tcp");
  if (options_.identity.size() > kMaxIdentity) options_.identity.resize(kMaxIdentity);
  options_.max_frames = std::clamp<size_t>(options_.max_frames, 1, kMaxFrames);
  if (options_.node_keys != nullptr) {
    // Idempotent; it picks libsodium's implementations (each works without).
    if (sodium_init() < 0) {
      GS_LOG(WARNING) << "tcp stream transport " << options_.identity << ": sodium_init failed";
    }
    std::optional<SecretString> secret = DecodeSecretKey(options_.node_keys->own().secret_z85);
    if (secret) {
      own_secret_ = std::make_unique<noise::SecretBytes>(kKeyBytes);
      if (own_secret_->data() != nullptr) {
        std::memcpy(own_secret_->data(), secret->data(), kKeyBytes);
      } else {
        own_secret_.reset();
      }
    }
  }
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  taken_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  writer_ = std::thread([this] { WriterLoop(); });
}

TcpStreamTransport::~TcpStreamTransport() {
  Shutdown();
  if (listen_fd_.load() >= 0) close(listen_fd_.load());
  if (wake_fd_ >= 0) close(wake_fd_);
  if (taken_fd_ >= 0) close(taken_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

void TcpStreamTransport::Shutdown() {
  if (stop_.exchange(true)) return;
  uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof(one));
  Wake();
  if (writer_.joinable()) writer_.join();
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(connectors_mu_);
    for (Connector& c : connectors_) c.thread.join();  // Open sees stop_
    connectors_.clear();
  }
  std::vector<std::shared_ptr<Conn>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all = outgoing_;
    all.insert(all.end(), inbound_.begin(), inbound_.end());
  }
  for (auto& c : all) {
    if (!c) continue;
    std::deque<Pending> failed;
    {
      std::lock_guard<std::mutex> lock(c->mu);
      Break(*c, &failed);
    }
    for (Pending& p : failed) {
      if (p.done_cb) p.done_cb(CancelledError("the transport was shut down"));
    }
  }
}

void TcpStreamTransport::Wake() {
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void TcpStreamTransport::Break(Conn& c, std::deque<Pending>* failed) {
  c.broken.store(true);
  c.open.store(false);
  const int f = c.fd.load();
  if (f >= 0) shutdown(f, SHUT_RDWR);
  for (Pending& p : c.queue) failed->push_back(std::move(p));
  c.queue.clear();
}

StatusOr<std::string> TcpStreamTransport::Listen(const std::string& endpoint) {
  if (listen_fd_.load() >= 0) return FailedPreconditionError("this transport listens already");
  std::vector<sockaddr_storage> storage;
  GS_ASSIGN_OR_RETURN(std::vector<addrinfo> addrs, Resolve(endpoint, true, &storage));
  std::string error = "no address";
  for (const addrinfo& a : addrs) {
    const int fd = socket(a.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = ErrnoText(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a.ai_addr, a.ai_addrlen) != 0 || listen(fd, 64) != 0) {
      error = ErrnoText(errno);
      close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    char host[NI_MAXHOST], port[NI_MAXSERV];
    getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, host, sizeof(host), port, sizeof(port),
                NI_NUMERICHOST | NI_NUMERICSERV);
    listen_fd_.store(fd);
    acceptor_ = std::thread([this, fd] { AcceptLoop(fd); });
    const std::string h(host);
    return "tcp://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + port;
  }
  return UnavailableError("cannot listen on " + endpoint + ": " + error);
}

void TcpStreamTransport::BindToOwnHost(int fd, int family) {
  for (const std::string& address : options_.node_keys->OwnAddresses()) {
    addrinfo hints{};
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
    addrinfo* found = nullptr;
    if (getaddrinfo(address.c_str(), "0", &hints, &found) != 0) continue;
    const int rc = bind(fd, found->ai_addr, found->ai_addrlen);
    const int err = errno;
    freeaddrinfo(found);
    if (rc == 0) return;
    if (!bind_warned_.exchange(true)) {
      GS_LOG(WARNING) << "tcp stream transport " << options_.identity
                      << ": cannot connect from this node's address in the plan, " << address
                      << " (" << ErrnoText(err) << "): peers take connections only from it";
    }
  }
}

StatusOr<ConnId> TcpStreamTransport::Connect(const std::string& endpoint) {
  return ConnectLane(endpoint, 0);
}

StatusOr<ConnId> TcpStreamTransport::ConnectLane(const std::string& endpoint, int lane) {
  if (lane < 0 || lane >= kMaxLanes) {
    return InvalidArgumentError("lane " + std::to_string(lane) + " is not in [0, " +
                                std::to_string(kMaxLanes) + ")");
  }
  std::string host, port;
  GS_RETURN_IF_ERROR(SplitEndpoint(endpoint, &host, &port));
  std::string says = lane == 0 ? options_.identity : LaneIdentity(options_.identity, lane);
  if (says.size() > kMaxIdentity) {
    return InvalidArgumentError("the identity '" + says + "' is longer than " +
                                std::to_string(kMaxIdentity) + " bytes");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const ConnId id = static_cast<ConnId>(outgoing_.size());
  outgoing_.push_back(std::make_shared<Conn>(true, id, endpoint, std::move(says)));
  return id;
}

void TcpStreamTransport::SetAccept(uint64_t job_id, std::vector<std::string> identities) {
  std::lock_guard<std::mutex> lock(accept_mu_);
  identities.erase(std::remove(identities.begin(), identities.end(), std::string()),
                   identities.end());  // no hello says "", nor is "" a lane's base
  options_.job_id = job_id;
  options_.accept = std::move(identities);
  accept_set_ = true;
}

uint64_t TcpStreamTransport::JobId() {
  std::lock_guard<std::mutex> lock(accept_mu_);
  return options_.job_id;
}

bool TcpStreamTransport::Accepts(const std::string& identity) {
  std::lock_guard<std::mutex> lock(accept_mu_);
  const auto listed = [&](const std::string& id) {
    return std::find(options_.accept.begin(), options_.accept.end(), id) != options_.accept.end();
  };
  return listed(identity) ||
         (options_.accept_lanes && LaneOf(identity) != 0 && listed(LaneBase(identity)));
}

std::shared_ptr<TcpStreamTransport::Conn> TcpStreamTransport::ConnFor(const Route& to) {
  std::lock_guard<std::mutex> lock(mu_);
  if (to.kind == Route::Kind::kConnection) {
    if (to.conn < 0 || static_cast<size_t>(to.conn) >= outgoing_.size()) return nullptr;
    std::shared_ptr<Conn>& c = outgoing_[static_cast<size_t>(to.conn)];
    // A connection that broke is made again for the next message.
    if (c->broken.load()) c = std::make_shared<Conn>(true, c->id, c->endpoint, c->says);
    return c;
  }
  for (const auto& c : inbound_) {
    if (c->peer == to.identity && !c->broken.load()) return c;
  }
  return nullptr;
}

Status TcpStreamTransport::Send(const Route& to, Message message, Deadline deadline) {
  struct Outcome {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
  };
  auto outcome = std::make_shared<Outcome>();
  Deliver(to, std::move(message), deadline, [outcome](const Status& s) {
    std::lock_guard<std::mutex> lock(outcome->mu);
    outcome->status = s;
    outcome->done = true;
    outcome->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(outcome->mu);
  outcome->cv.wait(lock, [&] { return outcome->done; });
  return outcome->status;
}

void TcpStreamTransport::Post(const Route& to, Message message, Deadline deadline,
                              std::function<void(const Status&)> done) {
  Deliver(to, std::move(message), deadline, std::move(done));
}

Status TcpStreamTransport::Seal(Conn& c, Pending& p) {
  const std::vector<uint8_t>& header = p.message.header;
  const std::vector<Payload>& plain = p.message.payloads;
  // The sealed frames, back to back in one pooled buffer: the table names
  // each, and the header's tag covers the table.
  size_t bytes = kBulkTagBytes + header.size();
  Put64(p.table + 8, bytes);
  for (size_t i = 0; i < plain.size(); ++i) {
    Put64(p.table + 16 + 8 * i, kBulkTagBytes + plain[i].size);
    bytes += kBulkTagBytes + plain[i].size;
  }
  p.total = p.table_bytes + bytes;
  std::shared_ptr<uint8_t> buffer = pool_->Get(bytes);
  const uint64_t counter = c.send_counter++;
  uint8_t* out = buffer.get();
  GS_RETURN_IF_ERROR(
      c.send_key->Seal(counter, 0, header.data(), header.size(), out, p.table, p.table_bytes));
  out += kBulkTagBytes + header.size();
  for (size_t i = 0; i < plain.size(); ++i) {
    GS_RETURN_IF_ERROR(
        c.send_key->Seal(counter, static_cast<uint32_t>(i + 1), plain[i].data, plain[i].size, out));
    out += kBulkTagBytes + plain[i].size;
  }
  if (!CountAndRenew(&c.send_key, &c.sent_under_key, &c.sent_bytes_under_key, bytes, options_)) {
    return InternalError("the key of " + c.Described() + " cannot be renewed");
  }
  // Written as one payload after an empty header; the caller's buffers go.
  Message sealed;
  sealed.payloads.push_back(Payload::Borrow(buffer.get(), bytes, buffer));
  p.message = std::move(sealed);
  p.sealed = true;
  return Status();
}

// Writes what the socket takes of `p` now: OK with p.done short of
// p.total when the socket is full.
Status TcpStreamTransport::WriteSome(Conn& c, Pending& p) {
  if (c.send_key != nullptr && !p.sealed) GS_RETURN_IF_ERROR(Seal(c, p));
  const int fd = c.fd.load();
  while (p.done < p.total) {
    iovec iov[kMaxIov];
    size_t n = 0, skip = p.done;
    auto add = [&](const uint8_t* data, size_t size) {
      if (n == kMaxIov) return;
      if (skip >= size) {
        skip -= size;
        return;
      }
      iov[n].iov_base = const_cast<uint8_t*>(data + skip);
      iov[n].iov_len = size - skip;
      skip = 0;
      ++n;
    };
    add(p.table, p.table_bytes);
    add(p.message.header.data(), p.message.header.size());
    for (const Payload& payload : p.message.payloads) add(payload.data, payload.size);
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    const ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p.done += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status();
    return UnavailableError(c.Described() +
                            " broke: " + (w < 0 ? ErrnoText(errno) : "nothing written"));
  }
  return Status();
}

void TcpStreamTransport::Deliver(const Route& to, Message message, Deadline deadline,
                                 std::function<void(const Status&)> done) {
  auto finish = [&done](const Status& s) {
    if (done) done(s);
  };
  if (stop_.load()) return finish(CancelledError("the transport was shut down"));
  std::shared_ptr<Conn> c = ConnFor(to);
  if (c == nullptr) {
    return finish(UnavailableError("no connection for " + to.ToString()));
  }
  const size_t frames = 1 + message.payloads.size();
  if (frames > options_.max_frames) {
    return finish(InvalidArgumentError("a message of " + std::to_string(frames) +
                                       " frames (a peer takes at most " +
                                       std::to_string(options_.max_frames) + ")"));
  }
  Pending p;
  p.table_bytes = 8 + 8 * frames;
  Put32(p.table, kFrameMagic);
  Put32(p.table + 4, static_cast<uint32_t>(frames));
  Put64(p.table + 8, message.header.size());
  p.total = p.table_bytes + message.header.size();
  for (size_t i = 0; i < message.payloads.size(); ++i) {
    Put64(p.table + 16 + 8 * i, message.payloads[i].size);
    p.total += message.payloads[i].size;
  }
  p.message = std::move(message);
  p.deadline = deadline;
  std::deque<Pending> failed;
  Status status;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->broken.load()) {
      status = UnavailableError(c->Described() + " is closed");
    } else if (c->open.load() && c->queue.empty()) {
      status = WriteSome(*c, p);
      if (!status.ok()) {
        Break(*c, &failed);
      } else if (p.done < p.total) {
        p.done_cb = std::move(done);
        c->queue.push_back(std::move(p));
        Wake();
        return;
      }
    } else {
      p.done_cb = std::move(done);
      c->queue.push_back(std::move(p));
      Wake();
      return;
    }
  }
  for (Pending& f : failed) {
    if (f.done_cb) f.done_cb(status);
  }
  finish(status);
}

Status TcpStreamTransport::Hello(Conn& c, int fd, Deadline deadline) {
  const std::string what = "the peer at " + c.endpoint;
  const NodeKeys* keys = options_.node_keys.get();
  std::optional<std::string> server;
  if (keys != nullptr) {
    if (std::optional<std::string> z85 = keys->ServerKeyAt(c.endpoint)) server = DecodeKey(*z85);
    if (own_secret_ == nullptr) {
      return FailedPreconditionError("this node's own key does not decode");
    }
    if (!server) {
      return FailedPreconditionError(
          "no node of the plan serves " + c.endpoint +
          ": a sealed connection needs the key of the node it connects to");
    }
  }
  const uint64_t job = JobId();
  std::vector<uint8_t> hello;
  hello.reserve(kHelloFixed + kMaxFirst);
  hello.resize(kHelloFixed);
  Put32(hello.data(), kHelloMagic);
  Put32(hello.data() + 4, keys != nullptr ? kSealedVersion : kVersion);
  Put64(hello.data() + 8, job);
  std::optional<noise::HandshakeKK> hs;
  if (keys == nullptr) {
    hello.resize(kHelloFixed + c.says.size());
    std::memcpy(hello.data() + kHelloFixed, c.says.data(), c.says.size());
  } else {
    // Noise KK's first message: the identity, sealed to the acceptor's key.
    const std::vector<uint8_t> prologue = SealedStreamPrologue(job);
    hs.emplace(true, own_secret_->data(), reinterpret_cast<const uint8_t*>(server->data()),
               prologue.data(), prologue.size());
    if (!hs->WriteMessage(reinterpret_cast<const uint8_t*>(c.says.data()), c.says.size(), &hello)) {
      return FailedPreconditionError("the key of " + c.endpoint + "'s node makes no secret");
    }
  }
  Put32(hello.data() + 16, static_cast<uint32_t>(hello.size() - kHelloFixed));
  GS_RETURN_IF_ERROR(WriteAll(fd, hello.data(), hello.size(), deadline, what));
  uint8_t answer[8];
  GS_RETURN_IF_ERROR(ReadAll(fd, answer, sizeof(answer), deadline, what));
  const uint32_t verdict = Get32(answer + 4);
  if (keys == nullptr) {
    if (Get32(answer) != kAnswerMagic) {
      return FailedPreconditionError(what + " does not speak this protocol");
    }
    if (Passing(verdict)) {
      return UnavailableError(what + " refused this connection for now: " + AnswerText(verdict));
    }
    if (verdict != kTaken) {
      return FailedPreconditionError(
          what + " refused this connection: " +
          (verdict == kProve ? AnswerText(kNeedsSealed) : AnswerText(verdict)));
    }
    return Status();
  }
  // Sealed. An answer in clear may come from anyone on the path: it is
  // waited out (tried again until the deadline), never final.
  if (Get32(answer) != kAnswerMagic) {
    return UnavailableError(what + " does not speak this protocol");
  }
  if (verdict != kProve) {
    return UnavailableError(what + " refused this connection (in clear): " +
                            (verdict == kTaken ? AnswerText(kNeedsPlain) : AnswerText(verdict)));
  }
  // Noise's second message: the acceptor's verdict, which only the holder
  // of the key the plan has for c.endpoint can seal.
  uint8_t second[kSecond];
  GS_RETURN_IF_ERROR(ReadAll(fd, second, sizeof(second), deadline, what));
  std::vector<uint8_t> word;
  if (!hs->ReadMessage(second, sizeof(second), &word) || word.size() != 4) {
    return FailedPreconditionError(what + " did not prove that it holds the key of " + c.endpoint +
                                   "'s node");
  }
  const uint32_t said = Get32(word.data());
  if (Passing(said)) {
    return UnavailableError(what + " refused this connection for now: " + AnswerText(said));
  }
  if (said != kProve) {
    return FailedPreconditionError(what + " refused this connection: " + AnswerText(said));
  }
  std::optional<ConnectionKeys> k = SplitKeys(*hs, options_.cipher);
  if (!k) return InternalError("the cipher for " + c.endpoint + " cannot be set up");
  // The proof: a first transport message, which needs this node's own
  // secret (Noise's se), not only the acceptor's.
  uint8_t proof[kProofBytes];
  SealWord(*k->to_acceptor, kProofWord, proof);
  GS_RETURN_IF_ERROR(WriteAll(fd, proof, sizeof(proof), deadline, what));
  if (Status s = ReadAll(fd, proof, sizeof(proof), deadline, what); !s.ok()) {
    if (s.code() != StatusCode::kUnavailable) return s;
    // Closed before its verdict (it may have been shutting down, or its
    // slot was taken): tried again until the deadline.
    return UnavailableError(what + " closed the connection at this node's proof (" + s.message() +
                            ")");
  }
  const std::optional<uint32_t> taken = OpenWord(*k->to_connector, proof);
  if (!taken) {
    return FailedPreconditionError(what + " sent a verdict that does not open under its key");
  }
  if (Passing(*taken)) {
    return UnavailableError(what + " refused this connection for now: " + AnswerText(*taken));
  }
  if (*taken != kTaken) {
    return FailedPreconditionError(what + " refused this connection: " + AnswerText(*taken));
  }
  c.send_key = std::move(k->to_acceptor);
  c.receive_key = std::move(k->to_connector);
  return Status();
}

Status TcpStreamTransport::Open(Conn& c, Deadline deadline) {
  std::vector<sockaddr_storage> storage;
  GS_ASSIGN_OR_RETURN(std::vector<addrinfo> addrs, Resolve(c.endpoint, false, &storage));
  std::string error = "no attempt";
  std::string answered;  // the last verdict waited out
  auto before = [&] { return answered.empty() ? "" : " (before: " + answered + ")"; };
  for (size_t attempt = 0;; ++attempt) {
    if (stop_.load()) return CancelledError("the transport was shut down");
    const addrinfo& a = addrs[attempt % addrs.size()];
    const int fd = socket(a.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return UnavailableError("cannot make a socket: " + ErrnoText(errno));
    if (options_.node_keys != nullptr) BindToOwnHost(fd, a.ai_family);
    int rc = connect(fd, a.ai_addr, a.ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pf{fd, POLLOUT, 0};
      while (!stop_.load() && !deadline.Expired() &&
             poll(&pf, 1, PollMillis(deadline, kPollSlice)) == 0) {
      }
      int err = ETIMEDOUT;
      socklen_t len = sizeof(err);
      if (pf.revents != 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      SetNoDelay(fd);
      Status s = Hello(c, fd, deadline.Min(Deadline::After(options_.hello_wait)));
      if (!s.ok() && (s.code() != StatusCode::kUnavailable || deadline.Expired())) {
        close(fd);
        // The deadline passed in this hello: the verdict waited out before
        // is what the caller needs to hear.
        if (s.code() == StatusCode::kDeadlineExceeded) {
          return DeadlineExceededError(s.message() + before());
        }
        return s;
      }
      if (!s.ok()) {  // a verdict to wait out, or the peer went away mid-hello
        close(fd);
        answered = s.message();
        {
          std::lock_guard<std::mutex> lock(c.mu);
          c.not_open_why = answered;
        }
        std::this_thread::sleep_for(std::min<Millis>(kConnectRetry, deadline.Remaining()));
        continue;
      }
      c.fd.store(fd);
      c.open.store(true);
      return Status();
    }
    error = ErrnoText(errno);
    close(fd);
    if (deadline.Expired()) break;
    std::this_thread::sleep_for(std::min<Millis>(kConnectRetry, deadline.Remaining()));
  }
  return DeadlineExceededError("cannot connect to " + c.endpoint + ": " + error + before());
}

void TcpStreamTransport::StartConnector(const std::shared_ptr<Conn>& c, Deadline by) {
  std::lock_guard<std::mutex> lock(connectors_mu_);
  for (auto it = connectors_.begin(); it != connectors_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = connectors_.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([this, c, by, done] {
    const Status s = Open(*c, by);
    std::deque<Pending> failed;
    {
      std::lock_guard<std::mutex> conn(c->mu);
      c->connecting = false;
      if (!s.ok()) Break(*c, &failed);
    }
    for (Pending& f : failed) {
      if (f.done_cb) f.done_cb(s);
    }
    done->store(true);
    Wake();  // the writer writes what waited for the connection
  });
  connectors_.push_back(Connector{std::move(t), std::move(done)});
}

void TcpStreamTransport::WriterLoop() {
  while (!stop_.load()) {
    std::vector<std::shared_ptr<Conn>> conns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns = outgoing_;
      conns.insert(conns.end(), inbound_.begin(), inbound_.end());
    }
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
    Deadline next = Deadline::After(kPollSlice);
    std::vector<std::pair<std::function<void(const Status&)>, Status>> done;
    for (const auto& c : conns) {
      std::unique_lock<std::mutex> lock(c->mu);
      if (c->queue.empty()) continue;
      std::deque<Pending> failed;
      Status why;
      const bool closed = c->outgoing && !c->open.load() && !c->broken.load();
      if (closed && !c->connecting) {
        c->connecting = true;
        StartConnector(c, c->queue.front().deadline);
      }
      // Messages not begun whose deadline passed, wherever they wait. One
      // sealed already holds its counter: it is written or the connection
      // breaks (below), never dropped.
      for (auto it = c->queue.begin(); it != c->queue.end();) {
        if (it->done == 0 && !it->sealed && it->deadline.Expired()) {
          const std::string why =
              c->connecting && !c->not_open_why.empty() ? " (" + c->not_open_why + ")" : "";
          done.emplace_back(std::move(it->done_cb),
                            DeadlineExceededError("sending to " + c->Name() + " timed out" + why));
          it = c->queue.erase(it);
        } else {
          next = next.Min(it->deadline);
          ++it;
        }
      }
      while (!closed && why.ok() && !c->queue.empty()) {
        Pending& p = c->queue.front();
        Status s = WriteSome(*c, p);
        if (s.ok() && p.done == p.total) {
          done.emplace_back(std::move(p.done_cb), Status());
          c->queue.pop_front();
          continue;
        }
        if (s.ok() && p.deadline.Expired()) {
          // Part of it is on the wire, or it is sealed: the stream cannot
          // go on without it.
          s = DeadlineExceededError("sending to " + c->Name() + " timed out " +
                                    (p.done > 0 ? "mid-message" : "after it was sealed"));
        }
        if (!s.ok()) {
          why = s;
          Break(*c, &failed);
          break;
        }
        fds.push_back({c->fd.load(), POLLOUT, 0});
        break;
      }
      for (Pending& f : failed) done.emplace_back(std::move(f.done_cb), why);
    }
    for (auto& [cb, s] : done) {
      if (cb) cb(s);
    }
    poll(fds.data(), fds.size(), PollMillis(next, kPollSlice));
    if (fds[0].revents & POLLIN) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof(count));
    }
  }
}

void TcpStreamTransport::AcceptLoop(int listening) {
  std::vector<std::shared_ptr<Conn>> pending;  // no hello yet, oldest first
  while (!stop_.load()) {
    Deadline next = Deadline::After(kPollSlice);
    // Connections that have not said hello: the ones past hello_wait go.
    const SteadyTime now = std::chrono::steady_clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      if ((*it)->hello_by <= now) {
        Refused("closed a connection that said no hello in " +
                std::to_string(options_.hello_wait.count()) + " ms");
        it = pending.erase(it);
      } else {
        next = next.Min(Deadline::At((*it)->hello_by));
        ++it;
      }
    }
    std::vector<pollfd> fds{{stop_fd_, POLLIN, 0}, {listening, POLLIN, 0}};
    for (const auto& c : pending) fds.push_back({c->fd.load(), POLLIN, 0});
    if (poll(fds.data(), fds.size(), PollMillis(next, kPollSlice)) <= 0) continue;
    std::vector<std::shared_ptr<Conn>> hellos;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (fds[2 + i].revents != 0) hellos.push_back(pending[i]);
    }
    for (const auto& c : hellos) {
      if (!ReadHello(c)) pending.erase(std::find(pending.begin(), pending.end(), c));
    }
    if (fds[1].revents != 0) Accept(listening, &pending);
  }
}

void TcpStreamTransport::Refused(const std::string& what,
                                 std::atomic<uint64_t> TransportRefusals::*counter) {
  const uint64_t n = refused_.fetch_add(1) + 1;
  if (options_.refusals != nullptr) ((*options_.refusals).*counter).fetch_add(1);
  if (n <= kLogFirst || n % kLogEvery == 0) {
    GS_LOG(WARNING) << "tcp stream transport " << options_.identity << ": " << what << " (" << n
                    << " refused so far)";
  }
}

void TcpStreamTransport::Accept(int listening, std::vector<std::shared_ptr<Conn>>* pending) {
  for (;;) {
    sockaddr_storage from{};
    socklen_t from_len = sizeof(from);
    const int fd = accept4(listening, reinterpret_cast<sockaddr*>(&from), &from_len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    auto c = std::make_shared<Conn>(false, -1, "");
    c->fd.store(fd);
    c->source = NumericAddress(reinterpret_cast<const sockaddr*>(&from));
    if (options_.node_keys != nullptr && options_.node_keys->HasPlan() &&
        options_.node_keys->KeysAt(c->source).empty()) {
      // Sealed: only plan nodes can say a hello that opens; nothing from
      // elsewhere is read.
      Refused("closed a connection from " + c->source + ": no node of the plan is at that address");
      continue;
    }
    SetNoDelay(fd);
    c->hello_by = std::chrono::steady_clock::now() + options_.hello_wait;
    if (pending->size() >= options_.max_pending) {
      // The oldest that has not passed its hello goes; one that has (a plan
      // node proving its key) is never closed for a newcomer.
      auto oldest = std::find_if(pending->begin(), pending->end(),
                                 [](const auto& p) { return p->receive_key == nullptr; });
      Refused("closed a connection that had not said hello: " +
              std::to_string(options_.max_pending) + " were waiting");
      if (oldest == pending->end()) continue;  // the newcomer goes
      pending->erase(oldest);
    }
    pending->push_back(std::move(c));
  }
}

bool TcpStreamTransport::ReadHello(const std::shared_ptr<Conn>& c) {
  if (c->receive_key != nullptr) return ReadProof(c);  // the hello was answered
  const int fd = c->fd.load();
  const bool sealing = options_.node_keys != nullptr;
  // The hello's length once its fixed part is in: 0 when that part is bad.
  auto length = [&]() -> size_t {
    const uint32_t version = Get32(c->hello + 4), n = Get32(c->hello + 16);
    if (Get32(c->hello) != kHelloMagic || (version != kVersion && version != kSealedVersion) ||
        n == 0 || n > (version == kSealedVersion ? kMaxFirst : kMaxIdentity) ||
        (version == kSealedVersion && n <= noise::kMessageOverhead)) {
      return 0;
    }
    return kHelloFixed + n;
  };
  Got got = ReadUpTo(fd, c->hello, &c->hello_got, kHelloFixed);
  size_t want = 0;
  if (got == Got::kAll) {
    want = length();
    if (want != 0) got = ReadUpTo(fd, c->hello, &c->hello_got, want);
  }
  if (got == Got::kClosed) {
    Refused("a connection closed before its hello");
    return false;
  }
  if (got == Got::kMore) return true;
  const uint32_t version = Get32(c->hello + 4);
  uint32_t answer = kTaken;
  bool ready = false;
  uint64_t job = 0;
  {
    std::lock_guard<std::mutex> lock(accept_mu_);
    ready = accept_set_;
    job = options_.job_id;
  }
  const uint8_t* body = c->hello + kHelloFixed;
  const size_t body_bytes = want - kHelloFixed;
  std::string identity;
  std::optional<noise::HandshakeKK> hs;  // sealed: the one the first message opened under
  std::optional<std::string> bound;      // sealed: the identity bound to the connector's key
  if (want == 0) {
    answer = kBadHello;
  } else if ((version == kSealedVersion) != sealing) {
    answer = sealing ? kNeedsSealed : kNeedsPlain;
  } else if (!ready) {
    answer = kNotReady;
  } else if (Get64(c->hello + 8) != job) {
    answer = kOtherJob;
  } else if (sealing && own_secret_ == nullptr) {
    answer = kNoKeyOpens;  // this node's own key does not decode: nothing opens
  } else if (!sealing) {
    identity.assign(reinterpret_cast<const char*>(body), body_bytes);
  } else {
    // Noise KK: the responder must know the initiator's key, which the
    // hello does not say. It is the key of a plan node at the connector's
    // address under which the first message opens.
    const std::vector<uint8_t> prologue = SealedStreamPrologue(job);
    std::vector<uint8_t> payload;
    for (const std::string& key : options_.node_keys->KeysAt(c->source)) {
      hs.emplace(false, own_secret_->data(), reinterpret_cast<const uint8_t*>(key.data()),
                 prologue.data(), prologue.size());
      if (hs->ReadMessage(body, body_bytes, &payload)) {
        bound = options_.node_keys->IdentityOf(reinterpret_cast<const uint8_t*>(key.data()));
        break;
      }
      hs.reset();
    }
    if (!hs || !bound) {
      answer = kNoKeyOpens;
    } else {
      identity.assign(payload.begin(), payload.end());
    }
  }
  if (answer == kTaken) {
    if (!Accepts(identity)) {
      answer = options_.strangers_may_wait ? kNotListedYet : kStranger;
    } else if (sealing && !IdentityMatchesKey(identity, *bound, options_.node_keys->epoch())) {
      answer = kWrongKey;
    }
  }
  uint8_t reply[8];
  Put32(reply, kAnswerMagic);
  if (hs) {
    // Noise's second message carries the verdict, sealed; a connection
    // that may be taken then proves its key (ReadProof).
    const uint32_t verdict = answer == kTaken ? kProve : answer;
    uint8_t word[4];
    Put32(word, verdict);
    std::vector<uint8_t> out(reply, reply + 8);
    Put32(out.data() + 4, kProve);
    std::optional<ConnectionKeys> k;
    if (hs->WriteMessage(word, sizeof(word), &out)) k = SplitKeys(*hs, options_.cipher);
    if (!k) {
      Refused("refused a connection: its handshake makes no secret");
      return false;
    }
    (void)!send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (verdict == kProve) {
      c->send_key = std::move(k->to_connector);
      c->receive_key = std::move(k->to_acceptor);
      c->claimed = identity;
      return true;
    }
  } else if (answer == kTaken) {
    std::lock_guard<std::mutex> lock(mu_);
    answer = Take(c, identity, [&](uint32_t verdict) {
      Put32(reply + 4, verdict);
      (void)!send(fd, reply, 8, MSG_NOSIGNAL | MSG_DONTWAIT);
    });
  } else {
    Put32(reply + 4, answer);
    (void)!send(fd, reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  if (answer == kNotReady) {
    // Not a refusal of the peer: it connects again (counted here only).
    refused_.fetch_add(1);
    return false;
  }
  if (answer != kTaken) Refused(std::string("refused a connection: ") + AnswerText(answer));
  return false;
}

bool TcpStreamTransport::ReadProof(const std::shared_ptr<Conn>& c) {
  const int fd = c->fd.load();
  const Got got = ReadUpTo(fd, c->proof, &c->proof_got, kProofBytes);
  if (got == Got::kClosed) {
    Refused("a connection closed before it proved its key");
    return false;
  }
  if (got == Got::kMore) return true;
  if (OpenWord(*c->receive_key, c->proof) != std::optional<uint32_t>(kProofWord)) {
    Refused("closed a connection that did not prove it holds the node key it showed");
    return false;
  }
  uint32_t answer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    answer = Take(c, c->claimed, [&](uint32_t verdict) {
      uint8_t sealed[kProofBytes];
      SealWord(*c->send_key, verdict, sealed);
      (void)!send(fd, sealed, sizeof(sealed), MSG_NOSIGNAL | MSG_DONTWAIT);
    });
  }
  if (answer != kTaken) Refused(std::string("refused a connection: ") + AnswerText(answer));
  return false;
}

uint32_t TcpStreamTransport::Take(const std::shared_ptr<Conn>& c, const std::string& identity,
                                  const std::function<void(uint32_t)>& answer) {
  inbound_.erase(std::remove_if(inbound_.begin(), inbound_.end(),
                                [](const auto& in) { return in->broken.load(); }),
                 inbound_.end());
  for (const auto& in : inbound_) {
    if (in->peer == identity) {
      answer(kAlreadyConnected);
      return kAlreadyConnected;
    }
  }
  answer(kTaken);  // before any reply can be written on the connection
  c->peer = identity;
  c->open.store(true);
  inbound_.push_back(c);
  uint64_t one = 1;
  (void)!write(taken_fd_, &one, sizeof(one));
  return kTaken;
}

bool TcpStreamTransport::OpenSealed(Conn& c) const {
  uint8_t table[8 + 8 * kMaxFrames];
  std::memcpy(table, c.prefix, sizeof(c.prefix));
  std::memcpy(table + sizeof(c.prefix), c.sizes.data(), c.sizes.size());
  const uint64_t counter = c.receive_counter++;
  std::vector<uint8_t>& header = c.reading.header;
  if (!c.receive_key->Open(counter, 0, header.data(), header.size(), header.data() + kBulkTagBytes,
                           table, sizeof(c.prefix) + c.sizes.size())) {
    return false;
  }
  header.erase(header.begin(), header.begin() + kBulkTagBytes);
  for (size_t i = 0; i < c.reading.payloads.size(); ++i) {
    Payload& payload = c.reading.payloads[i];
    uint8_t* frame = c.buffers[i].get();
    if (!c.receive_key->Open(counter, static_cast<uint32_t>(i + 1), frame, payload.size,
                             frame + kBulkTagBytes)) {
      return false;
    }
    payload.data = frame + kBulkTagBytes;
    payload.size -= kBulkTagBytes;
  }
  uint64_t bytes = kBulkTagBytes + header.size();
  for (const Payload& payload : c.reading.payloads) bytes += kBulkTagBytes + payload.size;
  return CountAndRenew(&c.receive_key, &c.received_under_key, &c.received_bytes_under_key, bytes,
                       options_);
}

StatusOr<std::optional<Incoming>> TcpStreamTransport::ReadSome(Conn& c) {
  const int fd = c.fd.load();
  auto broke = [&](const std::string& why) -> StatusOr<std::optional<Incoming>> {
    std::deque<Pending> failed;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      Break(c, &failed);
    }
    const Status s = UnavailableError(c.Described() + " " + why);
    for (Pending& f : failed) {
      if (f.done_cb) f.done_cb(s);
    }
    return std::optional<Incoming>();
  };
  auto bad = [&](const std::string& why) -> StatusOr<std::optional<Incoming>> {
    Refused("closed " + c.Described() + ": " + why, &TransportRefusals::dropped);
    (void)broke("broke the framing");
    return DataLossError(c.Described() + " broke the framing: " + why);
  };
  // Sealed: every frame carries a tag besides what it seals.
  const size_t tag = c.receive_key != nullptr ? kBulkTagBytes : 0;
  for (;;) {
    uint8_t* target = nullptr;
    size_t want = 0;
    switch (c.stage) {
      case Conn::Stage::kPrefix:
        target = c.prefix;
        want = sizeof(c.prefix);
        break;
      case Conn::Stage::kSizes:
        target = c.sizes.data();
        want = c.sizes.size();
        break;
      case Conn::Stage::kFrames:
        if (c.frame == 0) {
          target = c.reading.header.data();
          want = c.reading.header.size();
        } else {
          target = c.buffers[c.frame - 1].get();
          want = c.reading.payloads[c.frame - 1].size;
        }
        break;
    }
    while (c.got < want) {
      const ssize_t r = recv(fd, target + c.got, want - c.got, MSG_DONTWAIT);
      if (r > 0) {
        c.got += static_cast<size_t>(r);
        continue;
      }
      if (r == 0) return broke("was closed by the peer");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::optional<Incoming>();
      return broke("broke: " + ErrnoText(errno));
    }
    c.got = 0;
    switch (c.stage) {
      case Conn::Stage::kPrefix: {
        const uint32_t count = Get32(c.prefix + 4);
        if (Get32(c.prefix) != kFrameMagic) return bad("a frame table without its magic");
        if (count == 0 || count > options_.max_frames) {
          return bad(std::to_string(count) + " frames (at most " +
                     std::to_string(options_.max_frames) + ")");
        }
        c.sizes.resize(8 * size_t{count});
        c.stage = Conn::Stage::kSizes;
        break;
      }
      case Conn::Stage::kSizes: {
        const size_t count = c.sizes.size() / 8;
        const uint64_t header = Get64(c.sizes.data());
        if (header <= tag || header - tag > options_.max_header_bytes) {
          return bad("a header of " + std::to_string(header) + " bytes");
        }
        uint64_t sum = header - tag;
        for (size_t i = 1; i < count; ++i) {
          const uint64_t size = Get64(c.sizes.data() + 8 * i);
          if (size < tag || size - tag > options_.max_frame_bytes ||
              sum + (size - tag) > options_.max_message_bytes) {
            return bad("a frame of " + std::to_string(size) + " bytes");
          }
          sum += size - tag;
        }
        c.reading = Message();
        c.reading.header.resize(header);
        c.buffers.clear();
        for (size_t i = 1; i < count; ++i) {
          const size_t size = Get64(c.sizes.data() + 8 * i);
          c.buffers.push_back(pool_->Get(size));
          Payload payload;
          payload.data = c.buffers.back().get();
          payload.size = size;
          c.reading.payloads.push_back(payload);
        }
        c.frame = 0;
        c.stage = Conn::Stage::kFrames;
        break;
      }
      case Conn::Stage::kFrames:
        if (++c.frame <= c.reading.payloads.size()) break;
        if (tag != 0 && !OpenSealed(c)) {
          Refused("closed " + c.Described() + ": a sealed message did not open",
                  &TransportRefusals::impostors);
          (void)broke("sent a message that did not open");
          return DataLossError(c.Described() +
                               " sent a message that does not open under its key (altered, "
                               "replayed or out of order)");
        }
        for (size_t i = 0; i < c.buffers.size(); ++i) {
          c.reading.payloads[i].owner = std::move(c.buffers[i]);
        }
        c.buffers.clear();
        c.stage = Conn::Stage::kPrefix;
        std::optional<Incoming> in(std::in_place);
        in->from = c.outgoing ? Route::Connection(c.id) : Route::Inbound(c.peer);
        in->message = std::move(c.reading);
        return in;
    }
  }
}

StatusOr<Incoming> TcpStreamTransport::Receive(Deadline deadline) {
  std::vector<std::shared_ptr<Conn>>& readers = readers_;
  std::vector<pollfd>& fds = poll_fds_;
  for (;;) {
    if (stop_.load()) return CancelledError("the transport was shut down");
    readers.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto* list : {&inbound_, &outgoing_}) {
        for (const auto& c : *list) {
          if (c->open.load() && !c->broken.load()) readers.push_back(c);
        }
      }
    }
    // Whatever is readable now first, without a poll of its own.
    if (!readers.empty()) {
      const size_t start = next_reader_++ % readers.size();
      for (size_t k = 0; k < readers.size(); ++k) {
        GS_ASSIGN_OR_RETURN(std::optional<Incoming> in,
                            ReadSome(*readers[(start + k) % readers.size()]));
        if (in) return std::move(*in);
      }
    }
    if (deadline.Expired()) return DeadlineExceededError("nothing received in time");
    fds.assign({{stop_fd_, POLLIN, 0}, {taken_fd_, POLLIN, 0}});
    for (const auto& c : readers) fds.push_back({c->fd.load(), POLLIN, 0});
    if (poll(fds.data(), fds.size(), PollMillis(deadline, kPollSlice)) <= 0) continue;
    if (fds[0].revents != 0) return CancelledError("the transport was shut down");
    if (fds[1].revents != 0) {  // a connection was taken: poll it too
      uint64_t count;
      (void)!read(taken_fd_, &count, sizeof(count));
    }
  }
}

Status TcpStreamTransport::Probe(const std::string& endpoint, Deadline deadline) {
  Conn c(true, -1, endpoint, options_.identity);
  return Open(c, deadline);
}

}  // namespace gradsync::wire
