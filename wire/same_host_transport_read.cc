// SameHostTransport reading: a link's frame table checked before anything
// is allocated, messages read whole, and Receive over links and the network.
#include <cctype>
#include <cstdio>

#include "common/logging.h"
#include "wire/same_host_transport_impl.h"

namespace gradsync::wire {

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
      if (options_.refusals != nullptr) options_.refusals->dropped.fetch_add(1);
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
