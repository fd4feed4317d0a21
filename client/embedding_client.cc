#include "client/embedding_client.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/id_dedup.h"
#include "common/seeded_random.h"
#include "wire/validate.h"

namespace gradsync::client {

namespace {

using wire::MsgType;

// The unique ids of ids[0, n) in first-seen order, and for each id its
// index among them.
struct Unique {
  std::vector<uint64_t> ids;
  std::vector<uint32_t> index;
};

Unique Dedup(IdDedup& dedup, const uint64_t* ids, size_t n) {
  Unique u;
  u.index.resize(n);
  dedup.Reset(n);
  for (size_t i = 0; i < n; ++i) {
    bool fresh;
    u.index[i] = dedup.FindOrInsert(ids[i], static_cast<uint32_t>(u.ids.size()), &fresh);
    if (fresh) u.ids.push_back(ids[i]);
  }
  return u;
}

wire::Payload PayloadOf(const std::shared_ptr<std::vector<uint8_t>>& bytes) {
  return wire::Payload::Borrow(bytes->data(), bytes->size(), bytes);
}

}  // namespace

int EmbeddingClient::ShardOf(uint64_t id, int num_shards) {
  // Salted, so that a shard's ids are not all alike in the bits the shard's
  // own tables hash them by (SplitMix64 of the id, ps/embedding_table.cc).
  constexpr uint64_t kPlacementSalt = 0x656D62506C616365ull;  // "embPlace"
  return num_shards <= 1 ? 0
                         : static_cast<int>(SplitMix64(id ^ kPlacementSalt) %
                                            static_cast<uint64_t>(num_shards));
}

StatusOr<std::unique_ptr<EmbeddingClient>> EmbeddingClient::Create(
    std::unique_ptr<wire::Transport> transport, EmbeddingPeers peers,
    EmbeddingClientOptions options, Health health, DeadShards dead_shards) {
  if (peers.shards.empty()) return FailedPreconditionError("the job has no parameter servers");
  if (options.replicas < 1 || options.replicas > 2 ||
      options.replicas > static_cast<int>(peers.shards.size())) {
    return InvalidArgumentError("embedding_replicas must be 1 or 2 and at most the servers (" +
                                std::to_string(peers.shards.size()) + "), got " +
                                std::to_string(options.replicas));
  }
  std::unique_ptr<EmbeddingClient> c(new EmbeddingClient(
      std::move(transport), std::move(peers), options, std::move(health), std::move(dead_shards)));
  for (size_t s = 0; s < c->peers_.shards.size(); ++s) {
    if (c->peers_.shards[s].empty()) {
      return FailedPreconditionError("server " + std::to_string(s) + " gave no endpoint");
    }
    GS_ASSIGN_OR_RETURN(wire::ConnId id, c->transport_->Connect(c->peers_.shards[s]));
    c->conns_.push_back(id);
  }
  return c;
}

EmbeddingClient::~EmbeddingClient() { Close(); }

void EmbeddingClient::Close() {
  if (transport_) transport_->Shutdown();
}

void EmbeddingClient::Rejected(wire::ErrorCode code) {
  ++stats_.rejected;
  if (options_.rejected != nullptr) options_.rejected->Count(code);
}

int EmbeddingClient::Holder(uint32_t partition, int k) const {
  return static_cast<int>((partition + static_cast<uint32_t>(k)) % conns_.size());
}

int EmbeddingClient::LiveHolder(uint32_t partition, int k, const std::vector<bool>& dead) const {
  for (; k < options_.replicas; ++k) {
    const int s = Holder(partition, k);
    if (!dead[static_cast<size_t>(s)]) return s;
  }
  return -1;
}

std::vector<bool> EmbeddingClient::Dead() const {
  std::vector<bool> dead(conns_.size(), false);
  if (dead_shards_) {
    for (int s : dead_shards_()) {
      if (s >= 0 && static_cast<size_t>(s) < dead.size()) dead[static_cast<size_t>(s)] = true;
    }
  }
  return dead;
}

Status EmbeddingClient::Lost(uint32_t partition) const {
  std::string holders;
  for (int k = 0; k < options_.replicas; ++k) {
    holders += (k == 0 ? "server " : " and server ") + std::to_string(Holder(partition, k));
  }
  return UnavailableError("embedding rows of partition " + std::to_string(partition) +
                          ": every shard that holds them died (" + holders + ")");
}

StatusOr<size_t> EmbeddingClient::DropDead(std::vector<Request>& requests) {
  const std::vector<bool> dead = Dead();
  size_t ended = 0;
  for (Request& r : requests) {
    if (r.done || !dead[static_cast<size_t>(r.shard)]) continue;
    int k = 0;
    while (Holder(r.partition, k) != r.shard) ++k;
    const int next = LiveHolder(r.partition, k + 1, dead);
    if (r.message.header_view()->type() == MsgType::EmbeddingPull && r.ids == 0) {
      r.done = true;  // it read nothing: the other holders' answers stand
      ++ended;
      continue;
    }
    if (r.message.header_view()->type() == MsgType::EmbeddingPull) {
      if (next < 0) return Lost(r.partition);
      r.shard = next;  // the copy answers in its place
      SendOne(r);
      continue;
    }
    // A push: every live holder has a request of its own.
    bool held = false;
    for (int j = 0; j < options_.replicas; ++j)
      held |= !dead[static_cast<size_t>(Holder(r.partition, j))];
    if (!held) return Lost(r.partition);
    r.done = true;
    ++ended;
  }
  return ended;
}

size_t EmbeddingClient::IdsPerMessage(uint32_t dim, bool rows) const {
  const size_t per_id = sizeof(uint64_t) + (rows ? dim * sizeof(float) : 0);
  return std::max<size_t>(1, options_.max_message_bytes / per_id);
}

void EmbeddingClient::SendOne(Request& r) {
  r.sent = std::chrono::steady_clock::now();
  r.busy = false;
  wire::Message copy = r.message;  // kept for a resend; the payloads are shared
  transport_->Post(wire::Route::Connection(conns_[static_cast<size_t>(r.shard)]), std::move(copy),
                   Deadline::After(options_.resend_after), nullptr);
}

Status EmbeddingClient::Exchange(std::vector<Request>& requests, Deadline deadline) {
  for (Request& r : requests) SendOne(r);
  wire::Policy policy =
      wire::Policy::Accepting({MsgType::EmbeddingRows, MsgType::EmbeddingAck, MsgType::Error});
  policy.job_id = peers_.sender.job_id;
  size_t left = requests.size();
  while (left > 0) {
    GS_RETURN_IF_ERROR(health_());
    GS_ASSIGN_OR_RETURN(size_t dropped, DropDead(requests));
    left -= dropped;
    if (left == 0) break;
    const SteadyTime now = std::chrono::steady_clock::now();
    for (Request& r : requests) {
      if (!r.done && now - r.sent >= options_.resend_after) {
        ++stats_.resent;
        SendOne(r);
      }
    }
    if (deadline.Expired()) {
      std::string missing;
      for (const Request& r : requests) {
        if (!r.done)
          missing += (missing.empty() ? "server " : ", server ") + std::to_string(r.shard);
      }
      return DeadlineExceededError("embedding rows: no answer from " + missing);
    }
    auto in = transport_->Receive(deadline.Min(Deadline::After(Millis(50))));
    if (!in.ok()) {
      if (in.status().code() == StatusCode::kDeadlineExceeded) continue;
      if (in.status().code() == StatusCode::kCancelled) return in.status();
      continue;  // a connection that broke: its requests are sent again
    }
    const wire::Verdict v = wire::Validate(in->message, policy);
    if (!v.ok()) {
      Rejected(v.code);  // what no shard of the job sends: counted, not taken
      continue;
    }
    const wire::Header& h = *v.header;
    Request* r = nullptr;
    for (Request& q : requests) {
      if (!q.done && q.seq == h.seq() && in->from.kind == wire::Route::Kind::kConnection &&
          in->from.conn == conns_[static_cast<size_t>(q.shard)]) {
        r = &q;
      }
    }
    if (r == nullptr) continue;  // an answer to a request already answered
    if (h.type() == MsgType::Error) {
      const wire::ErrorBody& e = *h.body_as_ErrorBody();
      if (e.code() == wire::ErrorCode::Busy) {
        // Sent again once resend_after has passed.
        continue;
      }
      failed_ = AbortedError("server " + std::to_string(r->shard) + ": " +
                             (e.message() ? e.message()->str() : std::string()));
      return failed_;
    }
    const wire::MsgType want = r->message.header_view()->type() == MsgType::EmbeddingPull
                                   ? MsgType::EmbeddingRows
                                   : MsgType::EmbeddingAck;
    if (h.type() != want ||
        (want == MsgType::EmbeddingRows && h.body_as_EmbeddingBody()->num_ids() != r->ids)) {
      // Not this request's answer: what a shard would never send.
      Rejected(h.type() != want ? wire::ErrorCode::WrongType : wire::ErrorCode::SizeMismatch);
      continue;
    }
    r->done = true;
    r->answered = true;
    r->answered_at = std::chrono::steady_clock::now();
    r->answer = std::move(in->message);
    --left;
  }
  return Status();
}

Status EmbeddingClient::Pull(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n,
                             uint64_t round, float* out, Deadline deadline) {
  GS_RETURN_IF_ERROR(failed_);
  if (dim == 0) return InvalidArgumentError("embedding rows of 0 elements");
  if (IdsPerMessage(dim, true) == 1 &&
      sizeof(uint64_t) + dim * sizeof(float) > options_.max_message_bytes) {
    return InvalidArgumentError("a row of " + std::to_string(dim) +
                                " elements is larger than a message (partition_bytes)");
  }
  const Unique u = Dedup(dedup_, ids, n);
  const int shards = static_cast<int>(conns_.size());
  std::vector<std::vector<size_t>> of(static_cast<size_t>(shards));  // unique indices by partition
  for (size_t i = 0; i < u.ids.size(); ++i) of[ShardOf(u.ids[i], shards)].push_back(i);
  std::vector<Request> requests;
  std::vector<std::vector<size_t>> spans;  // by request: the unique indices it asks for
  const size_t per = IdsPerMessage(dim, true);
  const std::vector<bool> dead = Dead();
  auto ask = [&](int shard, uint32_t partition, const size_t* from, size_t count) {
    auto bytes = std::make_shared<std::vector<uint8_t>>(count * sizeof(uint64_t));
    for (size_t k = 0; k < count; ++k) {
      std::memcpy(bytes->data() + k * sizeof(uint64_t), &u.ids[from[k]], sizeof(uint64_t));
    }
    Request r;
    r.shard = shard;
    r.partition = partition;
    r.seq = next_seq_++;
    r.ids = count;
    r.message =
        wire::MakeEmbedding(peers_.sender, MsgType::EmbeddingPull,
                            wire::EmbeddingFields{table, dim, count, round, 0, 1, partition},
                            {PayloadOf(bytes)}, r.seq, peers_.epoch);
    requests.push_back(std::move(r));
    spans.emplace_back(from, from + count);
  };
  for (int s = 0; s < shards; ++s) {
    const std::vector<size_t>& mine = of[static_cast<size_t>(s)];
    const uint32_t partition = static_cast<uint32_t>(s);
    const int reader = LiveHolder(partition, 0, dead);
    if (reader < 0 && !mine.empty()) return Lost(partition);
    for (size_t at = 0; at < mine.size(); at += per) {
      ask(reader, partition, mine.data() + at, std::min(per, mine.size() - at));
    }
    // Every live holder that reads nothing is asked for no rows: its answer
    // waits, as the reader's does, for the rounds before `round`, so that the
    // next push (which goes to every holder) is never too far ahead of one.
    for (int k = 0; k < options_.replicas; ++k) {
      const int holder = Holder(partition, k);
      if (dead[static_cast<size_t>(holder)] || (holder == reader && !mine.empty())) continue;
      ask(holder, partition, nullptr, 0);
    }
  }
  GS_RETURN_IF_ERROR(Exchange(requests, deadline));
  const size_t row = dim * sizeof(float);
  std::vector<float> rows(u.ids.size() * dim);
  for (size_t q = 0; q < requests.size(); ++q) {
    if (spans[q].empty()) continue;
    const wire::Payload& got = requests[q].answer.payloads[0];
    for (size_t k = 0; k < spans[q].size(); ++k) {
      std::memcpy(rows.data() + spans[q][k] * dim, got.data + k * row, row);
    }
  }
  for (size_t i = 0; i < n; ++i)
    std::memcpy(out + i * dim, rows.data() + size_t{u.index[i]} * dim, row);
  stats_.pulled_rows += u.ids.size();
  stats_.asked_rows += n;
  return Status();
}

Status EmbeddingClient::Push(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n,
                             const float* grads, uint64_t round, Deadline deadline) {
  GS_RETURN_IF_ERROR(failed_);
  if (dim == 0) return InvalidArgumentError("embedding rows of 0 elements");
  if (sizeof(uint64_t) + dim * sizeof(float) > options_.max_message_bytes) {
    return InvalidArgumentError("a row of " + std::to_string(dim) +
                                " elements is larger than a message (partition_bytes)");
  }
  const Unique u = Dedup(dedup_, ids, n);
  std::vector<float> sums(u.ids.size() * dim, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    float* to = sums.data() + size_t{u.index[i]} * dim;
    const float* from = grads + i * dim;
    for (uint32_t j = 0; j < dim; ++j) to[j] += from[j];
  }
  const int shards = static_cast<int>(conns_.size());
  std::vector<std::vector<size_t>> of(static_cast<size_t>(shards));
  for (size_t i = 0; i < u.ids.size(); ++i) of[ShardOf(u.ids[i], shards)].push_back(i);
  std::vector<Request> requests;
  const size_t per = IdsPerMessage(dim, true);
  const std::vector<bool> dead = Dead();
  for (int s = 0; s < shards; ++s) {
    const std::vector<size_t>& mine = of[static_cast<size_t>(s)];
    const uint32_t partition = static_cast<uint32_t>(s);
    if (LiveHolder(partition, 0, dead) < 0) return Lost(partition);
    // Every holder hears of the round, in one part at least.
    const size_t parts = std::max<size_t>(1, (mine.size() + per - 1) / per);
    for (size_t p = 0; p < parts; ++p) {
      const size_t at = p * per;
      const size_t count = std::min(per, mine.size() - std::min(at, mine.size()));
      auto id_bytes = std::make_shared<std::vector<uint8_t>>(count * sizeof(uint64_t));
      auto row_bytes = std::make_shared<std::vector<uint8_t>>(count * dim * sizeof(float));
      for (size_t k = 0; k < count; ++k) {
        const size_t i = mine[at + k];
        std::memcpy(id_bytes->data() + k * sizeof(uint64_t), &u.ids[i], sizeof(uint64_t));
        std::memcpy(row_bytes->data() + k * dim * sizeof(float), sums.data() + i * dim,
                    dim * sizeof(float));
      }
      for (int k = 0; k < options_.replicas; ++k) {
        const int holder = Holder(partition, k);
        if (dead[static_cast<size_t>(holder)]) continue;
        Request r;
        r.shard = holder;
        r.partition = partition;
        r.part = static_cast<uint32_t>(p);
        r.seq = next_seq_++;
        r.message = wire::MakeEmbedding(
            peers_.sender, MsgType::EmbeddingPush,
            wire::EmbeddingFields{table, dim, count, round, static_cast<uint32_t>(p),
                                  static_cast<uint32_t>(parts), partition},
            {PayloadOf(id_bytes), PayloadOf(row_bytes)}, r.seq, peers_.epoch);
        requests.push_back(std::move(r));
      }
    }
  }
  GS_RETURN_IF_ERROR(Exchange(requests, deadline));
  RecordReplicationLag(requests);
  stats_.pushed_rows += u.ids.size();
  return Status();
}

void EmbeddingClient::RecordReplicationLag(const std::vector<Request>& requests) const {
  if (options_.replicas < 2 || options_.replication_lag == nullptr) return;
  // The holders' requests of one part are side by side.
  for (size_t i = 0; i < requests.size();) {
    size_t j = i;
    SteadyTime first = SteadyTime::max(), last = SteadyTime::min();
    int answered = 0;
    for (; j < requests.size() && requests[j].partition == requests[i].partition &&
           requests[j].part == requests[i].part;
         ++j) {
      if (!requests[j].answered) continue;
      ++answered;
      first = std::min(first, requests[j].answered_at);
      last = std::max(last, requests[j].answered_at);
    }
    if (answered > 1) {
      options_.replication_lag->Observe(std::chrono::duration<double>(last - first).count());
    }
    i = j;
  }
}

}  // namespace gradsync::client
