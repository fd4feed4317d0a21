#include "wire/same_host_transport.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "common/logging.h"
#include "wire/same_host_transport_impl.h"
#include "wire/validate.h"

namespace gradsync::wire {

namespace {

void PutU32(std::vector<uint8_t>* out, uint32_t v) {
  const size_t at = out->size();
  out->resize(at + 4);
  std::memcpy(out->data() + at, &v, 4);
}

void PutU64(std::vector<uint8_t>* out, uint64_t v) {
  const size_t at = out->size();
  out->resize(at + 8);
  std::memcpy(out->data() + at, &v, 8);
}

}  // namespace

std::string SameHostTransport::LinkName(uint64_t job, const std::string& writer,
                                        const std::string& reader) {
  char prefix[40];
  std::snprintf(prefix, sizeof(prefix), "/gradsync-%016llx-", static_cast<unsigned long long>(job));
  std::string name = prefix;
  auto add = [&name](const std::string& id) {
    for (char c : id) name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  };
  add(writer);
  name += '.';
  add(reader);
  return name;
}

SameHostTransport::SameHostTransport(std::unique_ptr<Transport> inner, SameHostOptions options)
    : SameHostTransport(inner.get(), std::move(options)) {
  owned_ = std::move(inner);
}

SameHostTransport::SameHostTransport(Transport* inner, SameHostOptions options)
    : inner_(inner),
      options_(std::move(options)),
      pool_(std::make_shared<BufferPool>(std::min<size_t>(4 * options_.link_bytes, 64 << 20))) {
  bool sends = false;
  for (const SameHostPeer& p : options_.peers) {
    const Out* out = nullptr;
    if (p.send) {
      outs_.push_back(std::make_unique<Out>(p));
      out = outs_.back().get();
      sends = true;
    }
    if (!p.receive) continue;
    const std::string name = LinkName(options_.job_id, p.identity, identity());
    auto link = ShmLink::Create(name, options_.link_bytes);
    if (!link.ok()) {
      GS_LOG(WARNING) << "not receiving through shared memory from " << p.identity << ": "
                      << link.status().message();
      continue;
    }
    ins_.push_back(std::make_unique<In>(p.identity, out, std::move(*link)));
  }
  if (sends) writer_ = std::thread([this] { WriterLoop(); });
}

SameHostTransport::~SameHostTransport() { Shutdown(); }

void SameHostTransport::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(work_mu_);
    if (stop_) return;
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& out : outs_) {
    std::lock_guard<std::mutex> lock(out->mu);
    if (out->link) out->link->Close();  // wakes the writer if it waits for room
  }
  if (writer_.joinable()) writer_.join();
  for (auto& out : outs_) {
    std::lock_guard<std::mutex> lock(out->mu);
    out->queue.clear();  // releases the payloads never written
  }
  for (auto& in : ins_) in->link->Close();  // its writer goes on over the network
  if (owned_) owned_->Shutdown();
}

size_t SameHostTransport::sending_by_shm() const {
  size_t n = 0;
  for (const auto& out : outs_) {
    std::lock_guard<std::mutex> lock(out->mu);
    n += out->state == Out::State::kOpen ? 1 : 0;
  }
  return n;
}

size_t SameHostTransport::receiving_by_shm() const {
  size_t n = 0;
  for (const auto& in : ins_) n += in->Reading() ? 1 : 0;
  return n;
}

void SameHostTransport::Open(Out& out, Deadline wait) {
  const std::string name = LinkName(options_.job_id, identity(), out.peer.identity);
  for (;;) {
    auto link = ShmLink::Open(name);
    if (link.ok()) {
      out.link = std::move(*link);
      out.state = Out::State::kOpen;
      return;
    }
    if (link.status().code() != StatusCode::kNotFound || wait.Expired()) {
      GS_LOG(WARNING) << "sending to " << out.peer.identity
                      << " through the network, not shared memory: " << link.status().message();
      out.state = Out::State::kGone;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

StatusOr<ConnId> SameHostTransport::Connect(const std::string& endpoint) {
  GS_ASSIGN_OR_RETURN(ConnId id, inner_->Connect(endpoint));
  for (auto& out : outs_) {
    if (out->peer.endpoint != endpoint || out->conn.load() >= 0) continue;
    std::lock_guard<std::mutex> lock(out->mu);
    out->conn.store(id);
    if (out->state == Out::State::kUntried) Open(*out, Deadline::After(options_.open_wait));
    break;
  }
  return id;
}

StatusOr<ConnId> SameHostTransport::ConnectLane(const std::string& endpoint, int lane) {
  if (lane == 0) return Connect(endpoint);
  GS_ASSIGN_OR_RETURN(ConnId id, inner_->ConnectLane(endpoint, lane));
  for (auto& out : outs_) {
    // A shared-memory link is one: its peer's lanes are the link, and each
    // lane's own connection carries that lane once the link is given up.
    if (out->peer.endpoint != endpoint) continue;
    out->lanes[lane].store(id);
    break;
  }
  return id;
}

SameHostTransport::Out* SameHostTransport::OutFor(const Route& to) {
  for (auto& out : outs_) {
    if (to.kind == Route::Kind::kConnection ? out->Owns(to.conn)
                                            : out->peer.identity == to.identity) {
      return out.get();
    }
  }
  return nullptr;
}

bool SameHostTransport::Usable(Out& out, const Route& to) {
  if (out.state == Out::State::kUntried && to.kind == Route::Kind::kInbound) {
    Open(out, Deadline::Past());
  }
  if (out.state != Out::State::kOpen) return false;
  const SteadyTime now = std::chrono::steady_clock::now();
  bool gone = out.link->PeerClosed();
  if (!gone && now >= out.next_alive_check) {
    out.next_alive_check = now + options_.alive_every;
    gone = !out.link->ReaderAlive();
  }
  if (!gone) return true;
  // What is queued is the writer thread's to drop (it may be writing it).
  GS_LOG(WARNING) << "the reader of the shared-memory link to " << out.peer.identity
                  << (out.link->Broken() ? " broke it (a tail outside the stream)"
                                         : " is gone (closed or died)")
                  << "; sending through the network";
  out.state = Out::State::kGone;
  return false;
}

bool SameHostTransport::WriteSome(ShmLink& link, Framed& f) {
  for (;;) {
    const uint8_t* data;
    size_t size;
    if (f.frame == 0) {
      data = f.table.data();
      size = f.table.size();
    } else if (f.frame == 1) {
      data = f.message.header.data();
      size = f.message.header.size();
    } else if (f.frame - 2 < f.message.payloads.size()) {
      const Payload& p = f.message.payloads[f.frame - 2];
      data = p.data;
      size = p.size;
      if (!f.placed) {
        if (!link.Pad(PaddingBefore(link.Position(), size, link.capacity()))) return false;
        f.placed = true;
      }
    } else {
      return true;
    }
    f.done += link.Write(data + f.done, size - f.done);
    if (f.done < size) return false;
    if (f.frame >= 2) f.message.payloads[f.frame - 2] = Payload();  // its bytes are in
    ++f.frame;
    f.done = 0;
    f.placed = false;
  }
}

bool SameHostTransport::InLink(const void* p) const {
  for (const auto& in : ins_) {
    const uint8_t* begin = in->begin.load();
    if (begin != nullptr && p >= begin && p < begin + in->bytes) return true;
  }
  return false;
}

Status SameHostTransport::Send(const Route& to, Message message, Deadline deadline) {
  return Deliver(to, std::move(message), deadline, nullptr);
}

Status SameHostTransport::Deliver(const Route& to, Message message, Deadline deadline,
                                  std::function<void(const Status&)>* post) {
  Out* out = OutFor(to);
  if (out == nullptr) return inner_->Send(to, std::move(message), deadline);
  if (message.payloads.size() + 1 > options_.max_frames) {
    return InvalidArgumentError("a message of " + std::to_string(message.payloads.size() + 1) +
                                " frames does not fit the same-host link");
  }
  Framed f;
  PutU32(&f.table, to.kind == Route::Kind::kInbound ? kReplyMagic : kFrameMagic);
  PutU32(&f.table, static_cast<uint32_t>(message.payloads.size() + 1));
  PutU64(&f.table, message.header.size());
  size_t total = f.table.size() + message.header.size();
  for (const Payload& p : message.payloads) {
    PutU64(&f.table, p.size);
    total += p.size;
  }
  f.message = std::move(message);
  std::unique_lock<std::mutex> lock(out->mu);
  if (!Usable(*out, to)) {
    lock.unlock();
    if (post != nullptr) {  // a post stays one: the network may hold it until its deadline
      inner_->Post(to, std::move(f.message), deadline, std::move(*post));
      *post = nullptr;
      return Status();
    }
    return inner_->Send(to, std::move(f.message), deadline);
  }
  // In order: straight into the link only behind nothing queued. The
  // padding before a payload that would wrap is not in `total`: a message
  // that fits only without it is queued with what it has written, and the
  // writer thread goes on from there.
  if (out->queue.empty() && out->link->Writable() >= total && WriteSome(*out->link, f)) {
    return Status();
  }
  // Queued: a payload lent by a link this transport reads is copied, so
  // that what waits for one peer never holds another's link.
  for (Payload& p : f.message.payloads) {
    if (p.size > 0 && InLink(p.data)) {
      std::shared_ptr<uint8_t> copy = pool_->Get(p.size);
      std::memcpy(copy.get(), p.data, p.size);
      const uint8_t* data = copy.get();
      p = Payload::Borrow(data, p.size, std::move(copy));
    }
  }
  {
    // Counted before the writer thread can see it in the queue.
    std::lock_guard<std::mutex> work(work_mu_);
    if (stop_) return CancelledError("transport is shut down");
    ++queued_;
  }
  out->queue.push_back(std::move(f));
  lock.unlock();
  work_cv_.notify_all();
  return Status();
}

void SameHostTransport::Post(const Route& to, Message message, Deadline deadline,
                             std::function<void(const Status&)> done) {
  if (OutFor(to) == nullptr) {
    return inner_->Post(to, std::move(message), deadline, std::move(done));
  }
  // Never waits: not on a link, nor on the network it falls back to.
  Status s = Deliver(to, std::move(message), deadline, &done);
  if (done) done(s);
}

void SameHostTransport::WriterLoop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> work(work_mu_);
      work_cv_.wait(work, [&] { return stop_ || queued_ > 0; });
      if (stop_) return;
    }
    size_t written = 0;
    std::shared_ptr<ShmLink> blocked;  // a link with no room for its front
    for (auto& out : outs_) {
      std::unique_lock<std::mutex> lock(out->mu);
      while (!out->queue.empty()) {
        if (out->state == Out::State::kGone) {  // its reader is gone
          written += out->queue.size();
          out->queue.clear();
          break;
        }
        // Only this thread takes a front off, and Send writes only when
        // the queue is empty: the front is this thread's to write.
        Framed* f = &out->queue.front();
        std::shared_ptr<ShmLink> link = out->link;
        lock.unlock();
        const bool whole = WriteSome(*link, *f);
        lock.lock();
        if (!whole) {
          if (!Usable(*out, Route::Connection(out->conn.load()))) continue;
          blocked = link;
          break;
        }
        out->queue.pop_front();
        ++written;
      }
    }
    std::unique_lock<std::mutex> work(work_mu_);
    queued_ -= written;
    if (written == 0 && blocked) {
      work.unlock();
      blocked->WaitWritable(Deadline::After(Millis(2)));
    }
  }
}

}  // namespace gradsync::wire
