#include "wire/same_host_transport.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "common/logging.h"
#include "wire/validate.h"

namespace gradsync::wire {

namespace {

constexpr uint32_t kFrameMagic = 0x47534D31;  // "GSM1"
// The largest header any receiver takes (the ZeroMQ transport's bound too).
constexpr uint64_t kMaxHeaderBytes = Limits{}.max_header_bytes;
// How long Receive waits on the link before it looks at the inner transport
// again.
constexpr Millis kInnerPollEvery{2};
// How often a Receive whose left link does not exist yet tries to open it.
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
  size_t pooled_ = 0;                                                 // guarded by mu_
};

std::string SameHostTransport::LinkName(uint64_t job, const std::string& identity) {
  char prefix[40];
  std::snprintf(prefix, sizeof(prefix), "/gradsync-%016llx-",
                static_cast<unsigned long long>(job));
  std::string name = prefix;
  for (char c : identity) name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  return name;
}

SameHostTransport::SameHostTransport(Transport* inner, SameHostOptions options)
    : inner_(inner), options_(std::move(options)), shm_left_(options_.shm_left),
      pool_(std::make_shared<BufferPool>(std::min<size_t>(4 * options_.link_bytes, 64 << 20))) {}

SameHostTransport::~SameHostTransport() { Shutdown(); }

void SameHostTransport::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (out_) out_->Close();  // wakes the writer if it waits for room
  if (writer_.joinable()) writer_.join();
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();  // releases the payloads never written
}

StatusOr<ConnId> SameHostTransport::Connect(const std::string& endpoint) {
  GS_ASSIGN_OR_RETURN(ConnId id, inner_->Connect(endpoint));
  if (options_.shm_right && endpoint == options_.right_endpoint && out_ == nullptr) {
    auto link = ShmLink::Create(LinkName(options_.job_id, identity()), options_.link_bytes);
    if (!link.ok()) {
      // The neighbour hears this transport through the inner one instead.
      GS_LOG(WARNING) << "no shared memory to the neighbour at " << endpoint
                      << ", sending through the network: " << link.status().message();
      return id;
    }
    out_ = std::move(*link);
    out_conn_ = id;
    writer_ = std::thread([this] { WriterLoop(); });
  }
  return id;
}

bool SameHostTransport::WriteSome(Framed& f) {
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
        if (!out_->Pad(PaddingBefore(out_->Position(), size, out_->capacity()))) return false;
        f.placed = true;
      }
    } else {
      return true;
    }
    f.done += out_->Write(data + f.done, size - f.done);
    if (f.done < size) return false;
    if (f.frame >= 2) f.message.payloads[f.frame - 2] = Payload();  // its bytes are in
    ++f.frame;
    f.done = 0;
    f.placed = false;
  }
}

Status SameHostTransport::Send(const Route& to, Message message, Deadline deadline) {
  if (!ToLink(to)) return inner_->Send(to, std::move(message), deadline);
  if (message.payloads.size() + 1 > options_.max_frames) {
    return InvalidArgumentError("a message of " + std::to_string(message.payloads.size() + 1) +
                                " frames does not fit the same-host link");
  }
  Framed f;
  PutU32(&f.table, kFrameMagic);
  PutU32(&f.table, static_cast<uint32_t>(message.payloads.size() + 1));
  PutU64(&f.table, message.header.size());
  size_t total = f.table.size() + message.header.size();
  for (const Payload& p : message.payloads) {
    PutU64(&f.table, p.size);
    total += p.size;
  }
  f.message = std::move(message);
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return CancelledError("transport is shut down");
  if (out_->PeerClosed()) return UnavailableError("the same-host neighbour closed its link");
  // In order: straight into the link only behind nothing queued.
  if (queue_.empty() && out_->Writable() >= total) {
    WriteSome(f);
    return Status();
  }
  // Queued: a payload lent by the link from the left neighbour is copied,
  // so that what waits for the right neighbour never holds the left link.
  if (const uint8_t* in = in_begin_.load(); in != nullptr) {
    for (Payload& p : f.message.payloads) {
      if (p.size > 0 && p.data >= in && p.data < in + in_bytes_.load()) {
        std::shared_ptr<uint8_t> copy = pool_->Get(p.size);
        std::memcpy(copy.get(), p.data, p.size);
        const uint8_t* data = copy.get();
        p = Payload::Borrow(data, p.size, std::move(copy));
      }
    }
  }
  queue_.push_back(std::move(f));
  lock.unlock();
  cv_.notify_all();
  return Status();
}

void SameHostTransport::Post(const Route& to, Message message, Deadline deadline,
                             std::function<void(const Status&)> done) {
  if (!ToLink(to)) return inner_->Post(to, std::move(message), deadline, std::move(done));
  Status s = Send(to, std::move(message), deadline);  // never waits on the link
  if (done) done(s);
}

void SameHostTransport::WriterLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    // Only this thread takes the front off, and Send writes only when the
    // queue is empty: the front is this thread's to write.
    Framed* f = &queue_.front();
    lock.unlock();
    while (!WriteSome(*f)) {
      if (out_->PeerClosed()) {
        // The reader is gone: nothing queued will be read.
        lock.lock();
        queue_.clear();
        break;
      }
      out_->WaitWritable(Deadline::After(Millis(50)));
      std::lock_guard<std::mutex> check(mu_);
      if (stop_) return;
    }
    if (!lock.owns_lock()) lock.lock();
    if (queue_.empty()) continue;
    queue_.pop_front();
  }
}

StatusOr<std::optional<Incoming>> SameHostTransport::ReadSome() {
  for (;;) {
    if (stage_ == Stage::kPrefix) {
      got_ += in_->Read(prefix_ + got_, sizeof(prefix_) - got_);
      if (got_ < sizeof(prefix_)) return std::optional<Incoming>();
      uint32_t magic, count;
      std::memcpy(&magic, prefix_, 4);
      std::memcpy(&count, prefix_ + 4, 4);
      if (magic != kFrameMagic || count == 0 || count > options_.max_frames) {
        return DataLossError("the same-host link from " + options_.left_identity +
                             " carries a bad frame table (magic " + std::to_string(magic) +
                             ", " + std::to_string(count) + " frames)");
      }
      sizes_.assign(count, 0);
      stage_ = Stage::kSizes;
      got_ = 0;
    }
    if (stage_ == Stage::kSizes) {
      auto* bytes = reinterpret_cast<uint8_t*>(sizes_.data());
      got_ += in_->Read(bytes + got_, sizes_.size() * 8 - got_);
      if (got_ < sizes_.size() * 8) return std::optional<Incoming>();
      if (sizes_[0] > kMaxHeaderBytes) {
        return DataLossError("the same-host link from " + options_.left_identity +
                             " announces a header of " + std::to_string(sizes_[0]) + " bytes");
      }
      for (uint64_t s : sizes_) {
        if (s > options_.max_frame_bytes) {
          return DataLossError("the same-host link from " + options_.left_identity +
                               " announces a frame of " + std::to_string(s) +
                               " bytes, above the limit of " +
                               std::to_string(options_.max_frame_bytes));
        }
      }
      header_.resize(static_cast<size_t>(sizes_[0]));
      frames_.assign(sizes_.size() - 1, nullptr);
      lent_.assign(sizes_.size() - 1, nullptr);
      stage_ = Stage::kFrames;
      frame_ = 0;
      got_ = 0;
      placed_ = false;
    }
    while (frame_ < sizes_.size()) {
      const size_t size = static_cast<size_t>(sizes_[frame_]);
      if (frame_ == 0) {
        got_ += in_->Read(header_.data() + got_, size - got_);
        if (got_ < size) return std::optional<Incoming>();
      } else {
        if (!placed_) {
          const size_t pad = PaddingBefore(in_->Position(), size, in_->capacity());
          if (in_->Readable() < pad) return std::optional<Incoming>();
          in_->Skip(pad);
          placed_ = true;
          borrowing_ = size > 0 && in_->Pinned() + size <= in_->capacity() / 2;
          if (!borrowing_) frames_[frame_ - 1] = pool_->Get(size);
        }
        if (borrowing_) {
          if (in_->Readable() < size) return std::optional<Incoming>();
          const uint8_t* data = nullptr;
          lent_[frame_ - 1] = in_->Borrow(size, &data);
        } else {
          got_ += in_->Read(frames_[frame_ - 1].get() + got_, size - got_);
          if (got_ < size) return std::optional<Incoming>();
        }
      }
      ++frame_;
      got_ = 0;
      placed_ = false;
    }
    Incoming in;
    in.from = Route::Inbound(options_.left_identity);
    in.message.header = std::move(header_);
    header_ = {};
    for (size_t i = 1; i < sizes_.size(); ++i) {
      const size_t size = static_cast<size_t>(sizes_[i]);
      if (lent_[i - 1]) {
        const void* data = lent_[i - 1].get();
        in.message.payloads.push_back(Payload::Borrow(data, size, std::move(lent_[i - 1])));
      } else {
        const uint8_t* data = frames_[i - 1].get();
        in.message.payloads.push_back(Payload::Borrow(data, size, std::move(frames_[i - 1])));
      }
    }
    frames_.clear();
    lent_.clear();
    stage_ = Stage::kPrefix;
    return std::optional<Incoming>(std::move(in));
  }
}

StatusOr<Incoming> SameHostTransport::Receive(Deadline deadline) {
  if (!shm_left_) return inner_->Receive(deadline);
  for (;;) {
    if (!shm_left_) return inner_->Receive(deadline);
    if (in_ == nullptr) {
      auto link = ShmLink::Open(LinkName(options_.job_id, options_.left_identity));
      if (link.ok()) {
        in_ = std::move(*link);
        in_bytes_.store(in_->capacity());
        in_begin_.store(in_->data());
      } else if (link.status().code() != StatusCode::kNotFound) {
        // Not a link this process can use: the neighbour is heard through
        // the inner transport only.
        GS_LOG(WARNING) << "not receiving through shared memory from " << options_.left_identity
                        << ": " << link.status().message();
        shm_left_ = false;
        return inner_->Receive(deadline);
      }
    }
    if (in_ != nullptr) {
      auto got = ReadSome();
      if (!got.ok()) {
        // The stream cannot be trusted past a bad frame table: the link is
        // given up (the writer sees it closed and stops), the failure is
        // returned once, and the transport goes on with the inner one.
        GS_LOG(WARNING) << got.status().message() << "; no longer reading that link";
        in_->Close();
        in_.reset();
        in_begin_.store(nullptr);
        shm_left_ = false;
        return got.status();
      }
      if (got->has_value()) return std::move(**got);
    }
    // The inner transport's messages (without waiting while the link is up).
    const Deadline inner = in_ != nullptr ? Deadline::After(Millis(0))
                                          : deadline.Min(Deadline::After(kAttachEvery));
    auto other = inner_->Receive(inner);
    if (other.ok() || other.status().code() != StatusCode::kDeadlineExceeded) return other;
    if (deadline.Expired()) return DeadlineExceededError("nothing received before the deadline");
    if (in_ != nullptr) {
      if (in_->PeerClosed() && in_->Readable() == 0) {
        // The neighbour is gone; what comes now comes through the inner transport.
        auto rest = inner_->Receive(deadline.Min(Deadline::After(kInnerPollEvery)));
        if (rest.ok() || rest.status().code() != StatusCode::kDeadlineExceeded) return rest;
        continue;
      }
      in_->WaitReadable(deadline.Min(Deadline::After(kInnerPollEvery)));
    }
  }
}

}  // namespace gradsync::wire
