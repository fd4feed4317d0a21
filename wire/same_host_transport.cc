#include "wire/same_host_transport.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "common/logging.h"
#include "wire/validate.h"

namespace gradsync::wire {

namespace {

constexpr uint32_t kFrameMagic = 0x47534D31;  // "GSM1": sent over a connection
constexpr uint32_t kReplyMagic = 0x47535231;  // "GSR1": an answer to an inbound route
// The largest header any receiver takes (the ZeroMQ transport's bound too).
constexpr uint64_t kMaxHeaderBytes = Limits{}.max_header_bytes;
// How long Receive waits on the link before it looks at the inner transport
// again.
constexpr Millis kInnerPollEvery{2};
// How often a Receive whose links have no writer yet looks again.
constexpr Millis kAttachEvery{5};

// The bytes skipped before a payload frame of `size` at stream position
// `at`, so that a frame the receiver may borrow does not wrap.
size_t PaddingBefore(uint64_t at, size_t size, size_t capacity) {
  const size_t offset = static_cast<size_t>(at & (capacity - 1));
  if (size == 0 || size > capacity / 2 || offset + size <= capacity) return 0;
  return capacity - offset;
}

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

// Buffers of received payloads, kept for reuse up to a bound in bytes.
class SameHostTransport::BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(size_t max_bytes) : max_bytes_(max_bytes) {}

  // A buffer of at least `n` bytes (not zeroed); it returns to the pool
  // when the last reference goes.
  std::shared_ptr<uint8_t> Get(size_t n) {
    uint8_t* buffer = nullptr;
    size_t capacity = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The smallest that fits and wastes at most half.
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->first >= n && it->first <= 2 * n + 4096 &&
            (best == free_.end() || it->first < best->first)) {
          best = it;
        }
      }
      if (best != free_.end()) {
        capacity = best->first;
        buffer = best->second.release();
        pooled_ -= capacity;
        free_.erase(best);
      }
    }
    if (buffer == nullptr) {
      capacity = std::max<size_t>(n, 1);
      buffer = new uint8_t[capacity];
    }
    std::weak_ptr<BufferPool> pool = weak_from_this();
    return std::shared_ptr<uint8_t>(buffer, [pool, capacity](uint8_t* b) {
      if (auto p = pool.lock()) {
        p->Put(b, capacity);
      } else {
        delete[] b;
      }
    });
  }

 private:
  void Put(uint8_t* b, size_t capacity) {
    std::unique_ptr<uint8_t[]> owned(b);
    std::lock_guard<std::mutex> lock(mu_);
    if (pooled_ + capacity > max_bytes_) return;  // freed
    pooled_ += capacity;
    free_.emplace_back(capacity, std::move(owned));
  }

  const size_t max_bytes_;
  std::mutex mu_;
  std::vector<std::pair<size_t, std::unique_ptr<uint8_t[]>>> free_;  // guarded by mu_
  size_t pooled_ = 0;                                                // guarded by mu_
};

struct SameHostTransport::Out {
  explicit Out(SameHostPeer p) : peer(std::move(p)) {}
  const SameHostPeer peer;
  std::atomic<ConnId> conn{-1};  // set by Connect(peer.endpoint)
  std::mutex mu;
  enum class State { kUntried, kOpen, kGone };
  State state = State::kUntried;  // guarded by mu
  std::shared_ptr<ShmLink> link;  // guarded by mu; set once, when opened
  std::deque<Framed> queue;       // guarded by mu; the front may be mid-write
  SteadyTime next_alive_check{};  // guarded by mu
};

struct SameHostTransport::In {
  In(std::string id, const Out* o, std::shared_ptr<ShmLink> l)
      : identity(std::move(id)),
        out(o),
        link(std::move(l)),
        begin(link->data()),
        bytes(link->capacity()) {}
  const std::string identity;
  // The same peer's Out, when this transport sends to it too: its answers
  // to this transport's connection come from that connection, as the inner
  // transport's do; what it sends over its own comes from its identity.
  const Out* const out;
  const std::shared_ptr<ShmLink> link;  // made at construction
  std::atomic<bool> done{false};        // given up: the peer is heard through the inner transport
  // Where the link's buffer is while it is read, for Send's threads.
  std::atomic<const uint8_t*> begin;
  const size_t bytes;

  // The message being read (Receive's thread only).
  enum class Stage { kPrefix, kSizes, kFrames };
  Stage stage = Stage::kPrefix;
  uint8_t prefix[8];
  bool reply = false;  // the message answers an inbound route
  size_t got = 0;      // bytes of the current part
  std::vector<uint64_t> sizes;
  std::vector<uint8_t> header;                    // frame 0
  std::vector<std::shared_ptr<uint8_t>> frames;   // payloads copied, from the pool
  std::vector<std::shared_ptr<const void>> lent;  // payloads lent by the link
  size_t frame = 0;
  bool placed = false;     // the padding before `frame` is skipped
  bool borrowing = false;  // `frame` is lent from the link, not copied

  // Receive's thread: the link is given up.
  void Done() {
    link->Close();
    done.store(true);
    begin.store(nullptr);
  }
  bool Reading() const { return !done.load() && link->WriterAttached(); }
};

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

SameHostTransport::~SameHostTransport() {
  Shutdown();
  if (owned_) owned_->Shutdown();
}

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

SameHostTransport::Out* SameHostTransport::OutFor(const Route& to) {
  for (auto& out : outs_) {
    if (to.kind == Route::Kind::kConnection ? out->conn.load() == to.conn
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
  // In order: straight into the link only behind nothing queued.
  if (out->queue.empty() && out->link->Writable() >= total) {
    WriteSome(*out->link, f);
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

Status SameHostTransport::CheckSizes(const In& in) const {
  const auto refuse = [&](const std::string& what, uint64_t size, uint64_t limit) {
    return DataLossError("the same-host link from " + in.identity + " announces " + what + " of " +
                         std::to_string(size) + " bytes, above the limit of " +
                         std::to_string(limit));
  };
  uint64_t total = 0;
  for (uint64_t s : in.sizes) {
    if (s > options_.max_frame_bytes) return refuse("a frame", s, options_.max_frame_bytes);
    if (s > options_.max_message_bytes - total) {
      return refuse("a message", total + s, options_.max_message_bytes);
    }
    total += s;
  }
  return OkStatus();
}

StatusOr<std::optional<Incoming>> SameHostTransport::ReadSome(In& in) {
  ShmLink& link = *in.link;
  for (;;) {
    if (in.stage == In::Stage::kPrefix) {
      in.got += link.Read(in.prefix + in.got, sizeof(in.prefix) - in.got);
      if (in.got < sizeof(in.prefix)) return std::optional<Incoming>();
      uint32_t magic, count;
      std::memcpy(&magic, in.prefix, 4);
      std::memcpy(&count, in.prefix + 4, 4);
      if ((magic != kFrameMagic && magic != kReplyMagic) || count == 0 ||
          count > options_.max_frames) {
        return DataLossError("the same-host link from " + in.identity +
                             " carries a bad frame table (magic " + std::to_string(magic) + ", " +
                             std::to_string(count) + " frames)");
      }
      in.reply = magic == kReplyMagic;
      in.sizes.assign(count, 0);
      in.stage = In::Stage::kSizes;
      in.got = 0;
    }
    if (in.stage == In::Stage::kSizes) {
      auto* bytes = reinterpret_cast<uint8_t*>(in.sizes.data());
      in.got += link.Read(bytes + in.got, in.sizes.size() * 8 - in.got);
      if (in.got < in.sizes.size() * 8) return std::optional<Incoming>();
      if (in.sizes[0] > kMaxHeaderBytes) {
        return DataLossError("the same-host link from " + in.identity + " announces a header of " +
                             std::to_string(in.sizes[0]) + " bytes");
      }
      GS_RETURN_IF_ERROR(CheckSizes(in));
      in.header.resize(static_cast<size_t>(in.sizes[0]));
      in.frames.assign(in.sizes.size() - 1, nullptr);
      in.lent.assign(in.sizes.size() - 1, nullptr);
      in.stage = In::Stage::kFrames;
      in.frame = 0;
      in.got = 0;
      in.placed = false;
    }
    while (in.frame < in.sizes.size()) {
      const size_t size = static_cast<size_t>(in.sizes[in.frame]);
      if (in.frame == 0) {
        in.got += link.Read(in.header.data() + in.got, size - in.got);
        if (in.got < size) return std::optional<Incoming>();
      } else {
        if (!in.placed) {
          const size_t pad = PaddingBefore(link.Position(), size, link.capacity());
          if (link.Readable() < pad) return std::optional<Incoming>();
          link.Skip(pad);
          in.placed = true;
          in.borrowing = size > 0 && link.Pinned() + size <= link.capacity() / 2;
        }
        if (!in.borrowing && !in.frames[in.frame - 1]) {
          // Allocated once its bytes are there (all of it, or as much as
          // the link can hold), not when it is announced.
          const size_t room = link.capacity() - std::min(link.capacity(), link.Pinned());
          if (link.Readable() < std::min(size, room)) return std::optional<Incoming>();
          in.frames[in.frame - 1] = pool_->Get(size);
        }
        if (in.borrowing) {
          if (link.Readable() < size) return std::optional<Incoming>();
          const uint8_t* data = nullptr;
          in.lent[in.frame - 1] = link.Borrow(size, &data);
        } else {
          in.got += link.Read(in.frames[in.frame - 1].get() + in.got, size - in.got);
          if (in.got < size) return std::optional<Incoming>();
        }
      }
      ++in.frame;
      in.got = 0;
      in.placed = false;
    }
    Incoming got;
    const ConnId conn = in.reply && in.out != nullptr ? in.out->conn.load() : -1;
    got.from = conn >= 0 ? Route::Connection(conn) : Route::Inbound(in.identity);
    got.message.header = std::move(in.header);
    in.header = {};
    for (size_t i = 1; i < in.sizes.size(); ++i) {
      const size_t size = static_cast<size_t>(in.sizes[i]);
      if (in.lent[i - 1]) {
        const void* data = in.lent[i - 1].get();
        got.message.payloads.push_back(Payload::Borrow(data, size, std::move(in.lent[i - 1])));
      } else {
        const uint8_t* data = in.frames[i - 1].get();
        got.message.payloads.push_back(Payload::Borrow(data, size, std::move(in.frames[i - 1])));
      }
    }
    in.frames.clear();
    in.lent.clear();
    in.stage = In::Stage::kPrefix;
    return std::optional<Incoming>(std::move(got));
  }
}

StatusOr<std::optional<Incoming>> SameHostTransport::ReadLinks() {
  for (size_t k = 0; k < ins_.size(); ++k) {
    const size_t i = (next_in_ + k) % ins_.size();
    In& in = *ins_[i];
    if (!in.Reading()) continue;
    auto got = ReadSome(in);
    if (got.ok() && !got->has_value() && in.link->Broken()) {
      got = DataLossError("the same-host link from " + in.identity +
                          " was broken by its writer (a head outside the stream)");
    }
    if (!got.ok()) {
      // The stream cannot be trusted past a bad frame table or word: the
      // link is given up (the writer sees it closed and stops), the failure
      // is returned once, and the peer is heard through the inner transport.
      GS_LOG(WARNING) << got.status().message() << "; no longer reading that link";
      in.Done();
      refused_links_.fetch_add(1);
      return got.status();
    }
    if (got->has_value()) {
      next_in_ = i + 1;
      return got;
    }
    if (in.link->PeerClosed() && in.link->Readable() == 0) in.Done();  // all of it read
  }
  return std::optional<Incoming>();
}

const std::vector<ShmLink*>& SameHostTransport::Live(bool* waiting) {
  live_.clear();
  *waiting = false;
  for (auto& in : ins_) {
    if (in->done.load()) continue;
    if (in->link->WriterAttached()) {
      live_.push_back(in->link.get());
    } else {
      *waiting = true;
    }
  }
  return live_;
}

StatusOr<Incoming> SameHostTransport::Receive(Deadline deadline) {
  for (;;) {
    GS_ASSIGN_OR_RETURN(std::optional<Incoming> got, ReadLinks());
    if (got.has_value()) return std::move(*got);
    // The inner transport's messages, without waiting while a link is in
    // use; while none is but one waits for its writer, that writer is
    // looked for every 5 ms.
    bool waiting = false;
    const std::vector<ShmLink*>& live = Live(&waiting);
    if (live.empty() && !waiting) return inner_->Receive(deadline);
    const Deadline inner =
        live.empty() ? deadline.Min(Deadline::After(kAttachEvery)) : Deadline::After(Millis(0));
    auto other = inner_->Receive(inner);
    if (other.ok() || other.status().code() != StatusCode::kDeadlineExceeded) return other;
    if (deadline.Expired()) return DeadlineExceededError("nothing received before the deadline");
    if (!live.empty()) {
      ShmLink::WaitReadableAny(live, deadline.Min(Deadline::After(kInnerPollEvery)));
    }
  }
}

}  // namespace gradsync::wire
