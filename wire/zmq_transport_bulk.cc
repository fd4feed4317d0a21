// ZmqTransport::Impl's sealed bulk path (wire/bulk_cipher.h): the hello,
// answer and switch over CURVE, sealing on the way out, and the bulk port's
// reads, on the I/O thread.
#include "wire/zmq_transport_impl.h"

namespace gradsync::wire {
namespace {

// At most this many tokens handed out at once (one per peer identity; an
// elastic job's parameter-server clients take one per epoch).
constexpr size_t kMaxBulkTokens = 4096;

uint64_t ReadCounter(const uint8_t* p) {
  uint64_t c = 0;
  for (int i = 0; i < 8; ++i) c |= static_cast<uint64_t>(p[i]) << (8 * i);
  return c;
}

void WriteCounter(uint64_t c, uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(c >> (8 * i));
}

// Opens the header of the sealed message in `frames` (as SealMessage made
// it) into `out`, when its counter is at least `*next`; then `*next` passes
// it. The header authenticates the counter: no forged counter moves `*next`.
// The payload frames go into `sealed` as they are, still sealed; the
// payloads of `out`, once opened in place, are the rest of those frames.
// Else false, and `why` says what was wrong.
bool OpenHeader(BulkKey& key, uint32_t direction, std::vector<zmq::message_t>& frames,
                const ZmqOptions& limits, uint64_t* next, Message* out, SealedPayloads* sealed,
                std::string* why) {
  constexpr size_t kHead = kBulkCounterBytes + kBulkTagBytes;
  if (frames.empty() || frames[0].size() < kHead || frames.size() - 1 > limits.max_payload_frames ||
      frames[0].size() - kHead > limits.max_header_bytes) {
    *why = "a sealed message of the wrong shape";
    return false;
  }
  for (size_t i = 1; i < frames.size(); ++i) {
    if (frames[i].size() < kBulkTagBytes) {
      *why = "a sealed message of the wrong shape";
      return false;
    }
  }
  const uint8_t* head = frames[0].data<uint8_t>();
  const uint64_t counter = ReadCounter(head);
  if (counter < *next) {
    *why = "a sealed message replayed or out of turn";
    return false;
  }
  out->header.resize(frames[0].size() - kHead);
  if (!key.Open(counter, direction, head + kBulkCounterBytes, frames[0].size() - kBulkCounterBytes,
                out->header.data())) {
    *why = "a sealed message that does not open under its token's key";
    return false;
  }
  *next = counter + 1;
  sealed->counter = counter;
  sealed->direction = direction;
  for (size_t i = 1; i < frames.size(); ++i) {
    auto kept = std::make_shared<zmq::message_t>(std::move(frames[i]));
    out->payloads.push_back(
        Payload::Borrow(kept->data<uint8_t>() + kBulkTagBytes, kept->size() - kBulkTagBytes, kept));
    sealed->frames.push_back(std::move(kept));
  }
  return true;
}

// Sends `frames` on `socket` (after the routing id `to`, when not empty)
// without waiting: false when nothing went because it would block; an
// error in `*failed` when it failed.
bool SendFrames(zmq::socket_t& socket, const std::string& to, std::vector<zmq::message_t>& frames,
                Status* failed) {
  const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
  try {
    if (!to.empty() && !socket.send(zmq::buffer(to), more)) return false;
    for (size_t i = 0; i < frames.size(); ++i) {
      const bool last = i + 1 == frames.size();
      if (!socket.send(std::move(frames[i]), last ? zmq::send_flags::dontwait : more)) {
        if (i == 0 && to.empty()) return false;  // nothing went: retried as it is
        // A multipart message takes its later frames once its first is in.
        *failed = InternalError("a sealed message was cut short");
        return true;
      }
    }
  } catch (const zmq::error_t& e) {
    *failed = UnavailableError(std::string("sealed send failed: ") + e.what());
  }
  return true;
}

// "tcp://host:port" -> "tcp://host:`port`".
std::string WithPort(const std::string& endpoint, uint16_t port) {
  return endpoint.substr(0, endpoint.rfind(':')) + ":" + std::to_string(port);
}

}  // namespace

Status SealMessage(BulkKey& key, uint64_t counter, uint32_t direction, const Message& m,
                   std::vector<zmq::message_t>* frames) {
  frames->reserve(1 + m.payloads.size());
  frames->emplace_back(kBulkCounterBytes + kBulkTagBytes + m.header.size());
  auto* head = frames->back().data<uint8_t>();
  WriteCounter(counter, head);
  GS_RETURN_IF_ERROR(
      key.Seal(counter, direction, m.header.data(), m.header.size(), head + kBulkCounterBytes));
  for (size_t i = 0; i < m.payloads.size(); ++i) {
    const Payload& p = m.payloads[i];
    frames->emplace_back(kBulkTagBytes + p.size);
    GS_RETURN_IF_ERROR(key.Seal(counter, direction | static_cast<uint32_t>(i + 1), p.data, p.size,
                                frames->back().data<uint8_t>()));
  }
  return OkStatus();
}

std::shared_ptr<SealJob> NewSealJob(std::shared_ptr<SealWay> way) {
  auto job = std::make_shared<SealJob>();
  job->counter = way->next.fetch_add(1, std::memory_order_relaxed);
  job->way = std::move(way);
  return job;
}

void SealInto(const Message& m, SealJob* job) {
  BulkKeyPool::Lease key = job->way->key->Take();
  job->status = key ? SealMessage(*key, job->counter, job->way->direction, m, &job->frames)
                    : InternalError("no cipher context to seal a message with");
  job->done.store(true, std::memory_order_release);
}

void SealedPayloads::Open() {
  bool opened = true;
  BulkKeyPool::Lease k = key->Take();
  if (!k) opened = false;
  for (size_t i = 0; opened && i < frames.size(); ++i) {
    uint8_t* sealed = frames[i]->data<uint8_t>();
    opened = k->Open(counter, direction | static_cast<uint32_t>(i + 1), sealed, frames[i]->size(),
                     sealed + kBulkTagBytes);
  }
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  opened_ = opened;
  cv_.notify_all();
}

bool SealedPayloads::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  return opened_;
}

void ZmqTransport::Impl::PreSeal(Command& cmd, bool here) {
  if (!options_.bulk_encryption) return;  // no way is ever published: no lock per send
  std::shared_ptr<SealJob> job;
  {
    std::lock_guard<std::mutex> lock(seal_mu_);
    if (sealers_.empty()) return;
    auto it = sealers_.find(RouteKey(cmd.route));
    if (it == sealers_.end()) return;
    job = NewSealJob(it->second);
  }
  cmd.sealed = job;
  // The task keeps what it reads: the command may end (its deadline) first.
  if (here || crypto_ == nullptr || !crypto_->Run([this, job, m = cmd.message] {
        SealInto(m, job.get());
        Wake();  // the I/O thread may wait for it
      })) {
    SealInto(cmd.message, job.get());
  }
}

void ZmqTransport::Impl::Publish(const Route& to, std::shared_ptr<SealWay> way) {
  std::lock_guard<std::mutex> lock(seal_mu_);
  sealers_[RouteKey(to)] = std::move(way);
}

void ZmqTransport::Impl::Unpublish(const Route& to) {
  std::lock_guard<std::mutex> lock(seal_mu_);
  sealers_.erase(RouteKey(to));
}

void ZmqTransport::Impl::StartBulk(ConnId id, const std::string& endpoint, int handshakes) {
  std::optional<BulkToken> token = RandomBulkToken();
  std::shared_ptr<BulkKeyPool> key = BulkKeyPool::Random(options_.bulk_cipher);
  if (!token || key == nullptr) {
    GS_LOG(WARNING) << "no random key for sealed bulk messages to " << endpoint
                    << ": the connection stays on CURVE";
    return;
  }
  BulkOut& out = bulk_out_[id];
  out.token = *token;
  out.endpoint = endpoint;
  out.handshakes = handshakes;
  BulkControl hello;
  hello.kind = 'H';
  hello.token = *token;
  std::memcpy(hello.key.data(), key->bytes(), kBulkKeyBytes);
  out.key = std::move(key);
  SendControl(Route::Connection(id), hello);
}

void ZmqTransport::Impl::SendControl(const Route& to, const BulkControl& control) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = Command::Kind::kSend;
  cmd->route = to;
  cmd->control = EncodeBulkControl(control);
  // A hello waits for the connection's handshake like any first message.
  cmd->deadline = Deadline::AfterMs(60000);
  cmd->posted = [](const Status&) {};
  Execute(std::move(cmd));
}

void ZmqTransport::Impl::OnBulkHandshake(ConnId id) {
  auto out = bulk_out_.find(id);
  if (out == bulk_out_.end() || ++out->second.handshakes == 1) return;
  const std::string endpoint = out->second.endpoint;
  const int handshakes = out->second.handshakes;
  DropInbox(out->second.replies);
  Unpublish(Route::Connection(id));
  bulk_out_.erase(out);
  StartBulk(id, endpoint, handshakes);
}

void ZmqTransport::Impl::OnBulkControl(const std::string& identity, ConnId conn,
                                       const zmq::message_t& frame) {
  std::optional<BulkControl> c = ParseBulkControl(frame.data<uint8_t>(), frame.size());
  if (!c) return;
  if (conn >= 0 && c->kind == 'R') {  // replies come sealed from now on
    auto out = bulk_out_.find(conn);
    if (out == bulk_out_.end() || out->second.token != c->token || out->second.replies.on) return;
    out->second.replies.on = true;
    if (!out->second.replies.early.empty()) bulk_replies_draining_.insert(conn);
    return;
  }
  if (conn >= 0) {  // on an outgoing connection: the answer to its hello
    auto out = bulk_out_.find(conn);
    if (c->kind != 'A' || out == bulk_out_.end() || out->second.token != c->token ||
        out->second.state != BulkOut::State::kHello) {
      return;
    }
    try {
      auto socket = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
      Configure(*socket);
      socket->set(zmq::sockopt::routing_id, BulkRoutingId(c->token));
      // As on the CURVE connection: a message waits in the transport for a
      // connection that is up, not in one to a peer that is gone (a
      // restarted peer gets it over CURVE once a new token is handed).
      socket->set(zmq::sockopt::immediate, 1);
      socket->connect(WithPort(out->second.endpoint, c->port));
      out->second.socket = std::move(socket);
    } catch (const zmq::error_t& e) {
      GS_LOG(WARNING) << "cannot reach the bulk port of " << out->second.endpoint << ": "
                      << e.what() << "; the connection stays on CURVE";
      bulk_out_.erase(out);
      return;
    }
    // 'S' once the bulk connection is up (CheckBulkConnections).
    out->second.state = BulkOut::State::kConnecting;
    out->second.connecting_since = std::chrono::steady_clock::now();
    bulk_connecting_.insert(conn);
    return;
  }
  if (c->kind == 'H') {
    if (!options_.bulk_encryption || !EnsureBulkListener()) return;  // stays on CURVE
    const std::string rid = BulkRoutingId(c->token);
    auto old = bulk_token_of_.find(identity);
    if (old != bulk_token_of_.end()) {  // a new connection of it
      auto gone = bulk_in_.find(old->second);
      if (gone != bulk_in_.end()) {
        DropInbox(gone->second.inbox);
        Unpublish(Route::Inbound(identity));
        bulk_in_.erase(gone);
      }
    }
    if (bulk_in_.count(rid) > 0) return;
    if (bulk_in_.size() >= kMaxBulkTokens) {  // that peer stays on CURVE
      bulk_refused_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    std::shared_ptr<BulkKeyPool> key = BulkKeyPool::Of(c->key.data(), options_.bulk_cipher);
    if (key == nullptr) return;
    BulkIn& in = bulk_in_[rid];
    in.identity = identity;
    in.key = std::move(key);
    bulk_token_of_[identity] = rid;
    BulkControl answer;
    answer.kind = 'A';
    answer.token = c->token;
    answer.port = bulk_port_;
    SendControl(Route::Inbound(identity), answer);
    return;
  }
  if (c->kind == 'S') {
    auto in = bulk_in_.find(BulkRoutingId(c->token));
    if (in == bulk_in_.end() || in->second.identity != identity || in->second.inbox.on) return;
    in->second.inbox.on = true;
    if (!in->second.inbox.early.empty()) bulk_draining_.insert(in->first);
    BulkControl back;
    back.kind = 'R';
    back.token = c->token;
    SendControl(Route::Inbound(identity), back);  // behind the replies before it
  }
}

void ZmqTransport::Impl::DrainBulk() {
  // True when nothing is left waiting in `box`.
  auto drain = [this](SealedInbox& box, const InboxSource& source) {
    while (!box.early.empty() && Room()) {
      std::vector<zmq::message_t> frames = std::move(box.early.front());
      box.early.pop_front();
      for (const zmq::message_t& f : frames) {
        box.early_bytes -= f.size();
        bulk_early_bytes_ -= f.size();
      }
      DeliverSealed(box, source, frames);
    }
    return box.early.empty();
  };
  for (auto rid = bulk_draining_.begin(); rid != bulk_draining_.end();) {
    auto in = bulk_in_.find(*rid);
    const bool done =
        in == bulk_in_.end() ||
        drain(in->second.inbox,
              {in->second.key, 0, Route::Inbound(in->second.identity), in->second.identity});
    rid = done ? bulk_draining_.erase(rid) : std::next(rid);
  }
  for (auto id = bulk_replies_draining_.begin(); id != bulk_replies_draining_.end();) {
    auto out = bulk_out_.find(*id);
    const bool done = out == bulk_out_.end() ||
                      drain(out->second.replies, {out->second.key, kBulkReplyDirection,
                                                  Route::Connection(*id), out->second.endpoint});
    id = done ? bulk_replies_draining_.erase(id) : std::next(id);
  }
}

void ZmqTransport::Impl::DropInbox(SealedInbox& box) {
  bulk_early_bytes_ -= box.early_bytes;
  box.early.clear();
  box.early_bytes = 0;
}

void ZmqTransport::Impl::CheckBulkConnections() {
  const SteadyTime now = std::chrono::steady_clock::now();
  for (auto id = bulk_connecting_.begin(); id != bulk_connecting_.end();) {
    auto out = bulk_out_.find(*id);
    if (out == bulk_out_.end() || out->second.state != BulkOut::State::kConnecting) {
      id = bulk_connecting_.erase(id);
      continue;
    }
    BulkOut& b = out->second;
    if (b.socket->get(zmq::sockopt::events) & ZMQ_POLLOUT) {  // up (ZMQ_IMMEDIATE)
      b.state = BulkOut::State::kSwitching;
      BulkControl go;
      go.kind = 'S';
      go.token = b.token;
      SendControl(Route::Connection(*id), go);  // behind what waits for the peer
      id = bulk_connecting_.erase(id);
      continue;
    }
    if (now - b.connecting_since > Millis(options_.bulk_connect_timeout_ms)) {
      GS_LOG(WARNING) << "the bulk port of " << b.endpoint << " took no connection within "
                      << options_.bulk_connect_timeout_ms
                      << " ms (a firewall?): this connection stays on CURVE; "
                         "bulk_encryption=false keeps every connection there";
      b.state = BulkOut::State::kOff;
      b.socket.reset();
      id = bulk_connecting_.erase(id);
      continue;
    }
    ++id;
  }
}

bool ZmqTransport::Impl::EnsureBulkListener() {
  if (bulk_router_) return true;
  if (!router_ || bulk_listen_failed_) return false;
  const std::string listening = router_->get(zmq::sockopt::last_endpoint);
  const size_t colon = listening.rfind(':');
  std::string port = "*";
  if (options_.bulk_port_offset > 0) {
    const int fixed = std::atoi(listening.c_str() + colon + 1) + options_.bulk_port_offset;
    if (fixed > 65535) {
      GS_LOG(WARNING) << "no bulk port beside " << listening << ": the data port plus "
                      << options_.bulk_port_offset << " is past 65535; peers stay on CURVE";
      bulk_listen_failed_ = true;
      return false;
    }
    port = std::to_string(fixed);
  }
  try {
    auto socket = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::router);
    Configure(*socket);
    socket->set(zmq::sockopt::maxmsgsize,
                options_.max_frame_bytes + static_cast<int64_t>(kBulkCounterBytes + kBulkTagBytes));
    socket->set(zmq::sockopt::router_mandatory, 1);  // a reply to a gone peer fails
    socket->bind(listening.substr(0, colon) + ":" + port);
    const std::string bound = socket->get(zmq::sockopt::last_endpoint);
    bulk_port_ = static_cast<uint16_t>(std::atoi(bound.c_str() + bound.rfind(':') + 1));
    bulk_router_ = std::move(socket);
    {
      std::lock_guard<std::mutex> lock(mu_);
      bulk_endpoint_ = bound;
    }
    GS_LOG(INFO) << "sealed bulk messages from peers on " << bound << " (beside the data port "
                 << listening << ")";
  } catch (const zmq::error_t& e) {
    GS_LOG(WARNING) << "cannot open a bulk port (" << port << ") beside " << listening << ": "
                    << e.what() << "; peers stay on CURVE";
    bulk_listen_failed_ = true;
    return false;
  }
  return true;
}

ZmqTransport::Impl::BulkIn* ZmqTransport::Impl::SealedRepliesTo(const std::string& identity) {
  auto token = bulk_token_of_.find(identity);
  if (token == bulk_token_of_.end()) return nullptr;
  auto in = bulk_in_.find(token->second);
  return in != bulk_in_.end() && in->second.replies != nullptr ? &in->second : nullptr;
}

bool ZmqTransport::Impl::TrySendSealed(Command& cmd, zmq::socket_t& socket, const std::string& to,
                                       const std::shared_ptr<SealWay>& way) {
  SealJob* job = cmd.sealed.get();
  const bool usable = job != nullptr && job->way == way && job->counter >= way->floor;
  if (usable && !job->done.load(std::memory_order_acquire)) return false;  // still sealing
  if (!usable || !job->status.ok()) {  // sealed here, under a counter of now
    cmd.sealed = NewSealJob(way);
    SealInto(cmd.message, cmd.sealed.get());
    job = cmd.sealed.get();
    if (!job->status.ok()) {
      cmd.Finish({job->status, "", -1});
      return true;
    }
  }
  Status status;
  // Nothing went: the frames stay for the retry, under the same counter
  // (sends to this peer wait behind this one).
  if (!SendFrames(socket, to, job->frames, &status)) return false;
  way->floor = job->counter + 1;
  if (status.ok()) bulk_sent_.fetch_add(1, std::memory_order_relaxed);
  cmd.Finish({status, "", -1});
  return true;
}

void ZmqTransport::Impl::ReadBulk() {
  for (int budget = 64; budget > 0 && Room(); --budget) {
    std::vector<zmq::message_t> frames;
    std::optional<size_t> got;
    try {
      got =
          zmq::recv_multipart(*bulk_router_, std::back_inserter(frames), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      GS_LOG(WARNING) << "bulk receive failed: " << e.what();
      return;
    }
    if (!got) return;
    auto in = bulk_in_.find(frames[0].to_string());
    if (in == bulk_in_.end()) {
      RefuseBulk(Escaped(frames[0].to_string(), 64),
                 "a message on the bulk port under no token this node handed out");
      continue;
    }
    frames.erase(frames.begin());  // the routing id: the token
    BulkIn& b = in->second;
    TakeSealed(b.inbox, {b.key, 0, Route::Inbound(b.identity), b.identity}, std::move(frames));
  }
}

void ZmqTransport::Impl::ReadBulkReplies(ConnId id) {
  auto out = bulk_out_.find(id);
  if (out == bulk_out_.end() || !out->second.socket) return;
  BulkOut& b = out->second;
  for (int budget = 64; budget > 0 && Room(); --budget) {
    std::vector<zmq::message_t> frames;
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(*b.socket, std::back_inserter(frames), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      GS_LOG(WARNING) << "bulk receive failed: " << e.what();
      return;
    }
    if (!got) return;
    TakeSealed(b.replies, {b.key, kBulkReplyDirection, Route::Connection(id), b.endpoint},
               std::move(frames));
  }
}

void ZmqTransport::Impl::TakeSealed(SealedInbox& box, const InboxSource& source,
                                    std::vector<zmq::message_t> frames) {
  if (box.on && box.early.empty()) {
    DeliverSealed(box, source, frames);
    return;
  }
  // Overtook the peer's marker on the CURVE connection (or follows those
  // that did): waits, bounded over every inbox together.
  size_t bytes = 0;
  for (const zmq::message_t& f : frames) bytes += f.size();
  if (box.early.size() >= options_.max_queued_incoming ||
      bulk_early_bytes_ + bytes > options_.max_queued_incoming_bytes) {
    RefuseBulk(source.who, "sealed messages ahead of the switch past the bound");
    return;
  }
  box.early_bytes += bytes;
  bulk_early_bytes_ += bytes;
  box.early.push_back(std::move(frames));
}

void ZmqTransport::Impl::DeliverSealed(SealedInbox& box, const InboxSource& source,
                                       std::vector<zmq::message_t>& frames) {
  Queued q;
  q.in.from = source.from;
  auto sealed = std::make_shared<SealedPayloads>();
  std::string why;
  BulkKeyPool::Lease key = source.key->Take();
  if (!key || !OpenHeader(*key, source.direction, frames, options_, &box.next, &q.in.message,
                          sealed.get(), &why)) {
    RefuseBulk(source.who, key ? why : "no cipher context to open a sealed message with");
    return;
  }
  sealed->key = source.key;
  sealed->who = source.who;
  if (crypto_ == nullptr || !crypto_->Run([sealed] { sealed->Open(); })) sealed->Open();
  q.sealed = std::move(sealed);
  queued_bytes_.fetch_add(q.in.message.header.size() + q.in.message.PayloadBytes());
  incoming_.Push(std::move(q), Deadline::Infinite()).IgnoreError();
}

void ZmqTransport::Impl::RefuseBulk(const std::string& from, const std::string& why) {
  bulk_refused_.fetch_add(1, std::memory_order_relaxed);
  if (options_.on_impostor) options_.on_impostor(from, why);
}

}  // namespace gradsync::wire
