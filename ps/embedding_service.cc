#include "ps/embedding_service.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

namespace gradsync::server {

namespace {

using wire::ErrorCode;
using wire::MsgType;

// How far ahead of the last closed round a sync push may be: a worker
// pushes round r, then waits for round r to close before it pulls r + 1.
constexpr uint64_t kRoundsAhead = 2;
// The messages one worker's push of a round to a shard may be cut into.
constexpr uint32_t kMaxParts = 4096;
// The pulls a table holds at most, per worker of the epoch.
constexpr size_t kHeldPullsPerWorker = 16;

// A sync round that has not closed: the pushes taken into it.
// One part of one worker's push of a round.
struct Part {
  std::vector<uint64_t> ids;
  std::vector<float> grads;
};

// A sync round that has not closed: the pushes taken into it, by (rank,
// part), so that a round sums its gradients in one order whatever order
// they came in (every run, and every copy of a shard, computes the same).
struct Round {
  std::map<int32_t, std::set<uint32_t>> parts;  // by rank, the parts taken
  std::set<int32_t> pushed;                     // ranks whose every part was taken
  std::map<std::pair<int32_t, uint32_t>, Part> taken;
  size_t bytes = 0;  // of ids and grads, in round_bytes_
};

// The ids and the gradients times `scale` of every part of `round`, in
// (rank, part) order.
void Gather(const Round& round, uint32_t dim, float scale, std::vector<uint64_t>* ids,
            std::vector<float>* grads) {
  size_t n = 0;
  for (const auto& [key, part] : round.taken) n += part.ids.size();
  ids->reserve(n);
  grads->reserve(n * dim);
  for (const auto& [key, part] : round.taken) {
    ids->insert(ids->end(), part.ids.begin(), part.ids.end());
    for (float g : part.grads) grads->push_back(g * scale);
  }
}

// What one part of `n` ids of rows of `dim` holds in an open round.
size_t PartBytes(size_t n, uint32_t dim) { return n * (sizeof(uint64_t) + dim * sizeof(float)); }

std::vector<uint64_t> IdsOf(const wire::Payload& frame) {
  std::vector<uint64_t> ids(frame.size / sizeof(uint64_t));
  if (!ids.empty()) std::memcpy(ids.data(), frame.data, ids.size() * sizeof(uint64_t));
  return ids;
}

}  // namespace

EmbeddingTableStats& operator+=(EmbeddingTableStats& sum, const EmbeddingTableStats& s) {
  sum.rows += s.rows;
  sum.pulled += s.pulled;
  sum.pushed += s.pushed;
  sum.admitted += s.admitted;
  sum.not_admitted += s.not_admitted;
  sum.evicted_idle += s.evicted_idle;
  sum.evicted_memory += s.evicted_memory;
  sum.refused_memory += s.refused_memory;
  sum.refused_nonfinite += s.refused_nonfinite;
  sum.steps += s.steps;
  return sum;
}

EmbeddingServiceStats& operator+=(EmbeddingServiceStats& sum, const EmbeddingServiceStats& s) {
  sum.rows += s.rows;
  sum.tables += s.tables;
  sum.refused += s.refused;
  sum.held_pulls += s.held_pulls;
  sum.rounds += s.rounds;
  return sum;
}

struct EmbeddingService::Table {
  Table(uint32_t id, uint32_t partition, uint32_t dim, const EmbeddingOptions& options,
        MemoryBudget* budget)
      : partition(partition), rows(id, dim, options, budget) {}
  const uint32_t partition;
  EmbeddingTable rows;
  uint64_t closed = 0;             // sync: rounds 0 .. closed - 1 have closed
  std::map<uint64_t, Round> open;  // sync: rounds with pushes, not closed
  // async and ssp: each rank's latest round and part applied.
  std::map<int32_t, std::pair<int64_t, uint32_t>> applied;
  std::vector<HeldPull> held;
};

EmbeddingService::EmbeddingService(const EmbeddingServiceOptions& options, MemoryBudget* budget,
                                   wire::Sender self, int32_t num_workers,
                                   std::vector<std::string> worker_identities)
    : options_(options),
      budget_(budget),
      self_(self),
      num_workers_(num_workers),
      worker_identities_(std::move(worker_identities)) {}

EmbeddingService::~EmbeddingService() = default;

void EmbeddingService::Refuse(const wire::Route& from, const wire::Header& h, ErrorCode code,
                              const std::string& why, std::vector<Outgoing>* out) {
  ++refused_;
  const wire::EmbeddingBody& b = *h.body_as_EmbeddingBody();
  const std::string what = std::string(wire::MsgTypeName(h.type())) + " of table " +
                           std::to_string(b.table()) + " round " + std::to_string(b.round());
  out->push_back(
      {from, wire::MakeError(wire::AnswerAs(self_, IsJobWorker(worker_identities_, from)), code,
                             what + ": " + why, h.type(), h.seq())});
}

int32_t EmbeddingService::LiveWorkers() const {
  int32_t live = 0;
  for (int32_t r = 0; r < num_workers_; ++r) live += dead_.count(r) == 0 ? 1 : 0;
  return live;
}

EmbeddingService::Table* EmbeddingService::Find(uint32_t table, uint32_t partition, uint32_t dim,
                                                ErrorCode* code, std::string* why) {
  auto it = tables_.find({table, partition});
  if (it != tables_.end()) {
    if (dim != it->second->rows.dim()) {
      *code = ErrorCode::Mismatch;
      *why = "rows of " + std::to_string(dim) + " elements, the table's are " +
             std::to_string(it->second->rows.dim());
      return nullptr;
    }
    return it->second.get();
  }
  if (dim == 0 || dim > options_.table.max_dim) {
    *code = ErrorCode::SizeMismatch;
    *why = "a row width of " + std::to_string(dim) + " elements, not within [1, " +
           std::to_string(options_.table.max_dim) + "]";
    return nullptr;
  }
  if (tables_.size() >= options_.max_tables) {
    *code = ErrorCode::Oversized;
    *why = "more than " + std::to_string(options_.max_tables) +
           " tables (and partitions) on this shard thread";
    return nullptr;
  }
  auto made = std::make_unique<Table>(table, partition, dim, options_.table, budget_);
  Table* t = made.get();
  tables_.emplace(std::make_pair(table, partition), std::move(made));
  return t;
}

EmbeddingService::Table* EmbeddingService::TableFor(const wire::Route& from, const wire::Header& h,
                                                    std::vector<Outgoing>* out) {
  const wire::EmbeddingBody& b = *h.body_as_EmbeddingBody();
  ErrorCode code = ErrorCode::Malformed;
  std::string why;
  Table* t = Find(b.table(), b.partition(), b.dim(), &code, &why);
  if (t == nullptr) Refuse(from, h, code, why, out);
  return t;
}

bool EmbeddingService::Handle(const wire::Route& from, const wire::Header& h,
                              const wire::Message& msg, std::vector<Outgoing>* out) {
  const int32_t rank = h.sender_rank();
  if (h.sender_role() != wire::Role::Worker || rank < 0 || rank >= num_workers_) {
    Refuse(from, h, ErrorCode::BadSender,
           "from a sender that is no worker of this epoch's " + std::to_string(num_workers_), out);
    return false;
  }
  const size_t r = static_cast<size_t>(rank);
  if (r < worker_identities_.size() && !worker_identities_[r].empty() &&
      (from.kind != wire::Route::Kind::kInbound ||
       wire::LaneBase(from.identity) != worker_identities_[r])) {
    Refuse(from, h, ErrorCode::BadSender,
           "under worker " + std::to_string(rank) + "'s rank from another identity", out);
    return false;
  }
  if (h.epoch() < epoch_) {
    Refuse(from, h, ErrorCode::BadSequence,
           "of membership epoch " + std::to_string(h.epoch()) + ", the job is in epoch " +
               std::to_string(epoch_),
           out);
    return false;
  }
  if (h.epoch() > epoch_) {
    Refuse(from, h, ErrorCode::Busy,
           "of membership epoch " + std::to_string(h.epoch()) +
               ", which this shard has not "
               "started yet: send it again",
           out);
    return false;
  }
  Table* t = TableFor(from, h, out);
  if (t == nullptr) return false;
  if (h.type() == MsgType::EmbeddingPull) {
    Pull(*t, from, h, msg, out);
    return false;
  }
  return Push(*t, from, h, msg, out);
}

bool EmbeddingService::Ready(const Table& t, uint64_t round) const {
  switch (options_.mode) {
    case PsMode::kSync:
      return round <= t.closed;
    case PsMode::kAsync:
      return true;
    case PsMode::kSsp:
      return static_cast<int64_t>(round) - 1 - static_cast<int64_t>(options_.staleness) <=
             static_cast<int64_t>(PushedByAll(t));
  }
  return true;
}

uint64_t EmbeddingService::PushedByAll(const Table& t) const {
  int64_t low = std::numeric_limits<int64_t>::max();
  for (int32_t r = 0; r < num_workers_; ++r) {
    if (dead_.count(r) != 0) continue;
    auto it = t.applied.find(r);
    low = std::min(low, it == t.applied.end() ? int64_t{-1} : it->second.first);
  }
  return static_cast<uint64_t>(low);  // -1 (nobody pushed) reads as far below any round
}

void EmbeddingService::Answer(Table& t, const wire::Route& to, uint64_t round, uint64_t seq,
                              const std::vector<uint64_t>& ids, std::vector<Outgoing>* out) {
  const uint32_t dim = t.rows.dim();
  auto rows = std::make_shared<std::vector<float>>(ids.size() * dim);
  t.rows.Pull(ids.data(), ids.size(), round, rows->data());
  wire::EmbeddingFields f{t.rows.id(), dim, ids.size(), round, 0, 1, t.partition};
  std::vector<wire::Payload> payloads;
  payloads.push_back(wire::Payload::Borrow(rows->data(), rows->size() * sizeof(float), rows));
  out->push_back({to, wire::MakeEmbedding(wire::AnswerAs(self_, true), MsgType::EmbeddingRows, f,
                                          std::move(payloads), seq, epoch_)});
}

void EmbeddingService::Pull(Table& t, const wire::Route& from, const wire::Header& h,
                            const wire::Message& msg, std::vector<Outgoing>* out) {
  const wire::EmbeddingBody& b = *h.body_as_EmbeddingBody();
  std::vector<uint64_t> ids = IdsOf(msg.payloads[0]);
  if (Ready(t, b.round())) {
    Answer(t, from, b.round(), h.seq(), ids, out);
    return;
  }
  // Held pulls are bounded: a worker waits for one round at a time.
  if (options_.mode == PsMode::kSync && b.round() > t.closed + kRoundsAhead) {
    Refuse(from, h, ErrorCode::BadSequence,
           "is more than " + std::to_string(kRoundsAhead) +
               " rounds ahead of the last closed one (" + std::to_string(t.closed) + ")",
           out);
    return;
  }
  if (t.held.size() >= kHeldPullsPerWorker * static_cast<size_t>(std::max(1, num_workers_))) {
    Refuse(from, h, ErrorCode::Busy,
           std::to_string(t.held.size()) + " pulls wait for their rounds already: send it again",
           out);
    return;
  }
  ++held_pulls_;
  t.held.push_back(HeldPull{from, b.round(), h.seq(), std::move(ids)});
}

EmbeddingService::Take EmbeddingService::TakePush(Table& t, int32_t rank, uint64_t round,
                                                  uint32_t part, uint32_t parts, size_t n,
                                                  const void* ids, const void* grads, bool replay,
                                                  ErrorCode* code, std::string* why) {
  const uint32_t dim = t.rows.dim();
  // `ids` and `grads` may be a frame's bytes, of any alignment: each is
  // copied once, into the round or into the scratch Apply reads.
  auto copy_into = [&](std::vector<uint64_t>* to_ids, std::vector<float>* to_grads) {
    to_ids->resize(n);
    to_grads->resize(n * dim);
    if (n == 0) return;
    std::memcpy(to_ids->data(), ids, n * sizeof(uint64_t));
    std::memcpy(to_grads->data(), grads, n * dim * sizeof(float));
  };
  if (options_.mode != PsMode::kSync) {
    auto [last, made] = t.applied.try_emplace(rank, std::make_pair(int64_t{-1}, uint32_t{0}));
    const std::pair<int64_t, uint32_t> now{static_cast<int64_t>(round), part};
    // A worker's parts come in order: in a replay, one at or before the
    // latest the checkpoint holds was applied before it.
    if (replay && !made && now <= last->second) return Take::kDuplicate;
    copy_into(&scratch_ids_, &scratch_grads_);
    t.rows.Apply(scratch_ids_.data(), n, scratch_grads_.data(), round);
    last->second = std::max(last->second, now);
    return Take::kTaken;
  }
  if (round < t.closed) return Take::kDuplicate;  // a resend of a round that closed
  if (round >= t.closed + kRoundsAhead) {
    *code = ErrorCode::BadSequence;
    *why = "is more than " + std::to_string(kRoundsAhead - 1) +
           " round(s) ahead of the last closed one (" + std::to_string(t.closed) + ")";
    return Take::kRefused;
  }
  if (parts == 0 || parts > kMaxParts || part >= parts) {
    *code = ErrorCode::BadSequence;
    *why = "is part " + std::to_string(part) + " of " + std::to_string(parts) + " (at most " +
           std::to_string(kMaxParts) + " parts)";
    return Take::kRefused;
  }
  const size_t bytes = PartBytes(n, dim);
  Round& open = t.open[round];
  std::set<uint32_t>& taken = open.parts[rank];
  // A part taken before (a resend after a lost ack) is acknowledged again.
  if (open.pushed.count(rank) || taken.count(part)) return Take::kDuplicate;
  if (round_bytes_ + bytes > options_.max_round_bytes) {
    *code = ErrorCode::Oversized;
    *why = "would take the rounds that have not closed past " +
           std::to_string(options_.max_round_bytes) + " bytes";
    return Take::kRefused;
  }
  taken.insert(part);
  round_bytes_ += bytes;
  open.bytes += bytes;
  if (taken.size() >= parts) open.pushed.insert(rank);
  Part& p = open.taken[{rank, part}];
  copy_into(&p.ids, &p.grads);
  return Take::kTaken;
}

bool EmbeddingService::Push(Table& t, const wire::Route& from, const wire::Header& h,
                            const wire::Message& msg, std::vector<Outgoing>* out) {
  const wire::EmbeddingBody& b = *h.body_as_EmbeddingBody();
  ErrorCode code = ErrorCode::Malformed;
  std::string why;
  // The verifier checked the frames' sizes against num_ids and the width.
  const Take took =
      TakePush(t, h.sender_rank(), b.round(), b.part(), b.parts(), static_cast<size_t>(b.num_ids()),
               msg.payloads[0].data, msg.payloads[1].data, false, &code, &why);
  if (took == Take::kRefused) {
    Refuse(from, h, code, why, out);
    return false;
  }
  wire::EmbeddingFields f{t.rows.id(), t.rows.dim(), 0, b.round(), 0, 1, t.partition};
  out->push_back({from, wire::MakeEmbedding(wire::AnswerAs(self_, true), MsgType::EmbeddingAck, f,
                                            {}, h.seq(), epoch_)});
  if (took == Take::kTaken) Progress(t, out);
  return took == Take::kTaken;
}

Status EmbeddingService::Replay(const EmbeddingPushRecord& p) {
  const std::string what = "a journalled push of table " + std::to_string(p.table) + " round " +
                           std::to_string(p.round) + " by worker " + std::to_string(p.rank);
  if (p.rank < 0 || p.rank >= num_workers_) {
    return InvalidArgumentError(what + ": no worker of " + std::to_string(num_workers_));
  }
  ErrorCode code = ErrorCode::Malformed;
  std::string why;
  Table* t = Find(p.table, p.partition, p.dim, &code, &why);
  if (t != nullptr && TakePush(*t, p.rank, p.round, p.part, p.parts, p.num_ids, p.ids, p.grads,
                               true, &code, &why) != Take::kRefused) {
    std::vector<Outgoing> none;  // nobody waits yet
    Progress(*t, &none);
    return OkStatus();
  }
  return InvalidArgumentError(what + ": " + why);
}

void EmbeddingService::Progress(Table& t, std::vector<Outgoing>* out) {
  if (options_.mode == PsMode::kSync) {
    const int32_t live = LiveWorkers();
    for (;;) {
      auto it = t.open.find(t.closed);
      if (it == t.open.end()) break;
      Round& round = it->second;
      int32_t pushed_live = 0;
      for (int32_t r : round.pushed) pushed_live += dead_.count(r) == 0 ? 1 : 0;
      if (pushed_live < live) break;
      const float scale = 1.0f / static_cast<float>(round.pushed.size());
      std::vector<uint64_t> ids;
      std::vector<float> grads;
      Gather(round, t.rows.dim(), scale, &ids, &grads);
      t.rows.Apply(ids.data(), ids.size(), grads.data(), t.closed);
      round_bytes_ -= round.bytes;
      t.open.erase(it);
      ++t.closed;
      ++rounds_;
    }
  }
  auto waiting = std::move(t.held);
  t.held.clear();
  for (HeldPull& p : waiting) {
    if (Ready(t, p.round)) {
      Answer(t, p.from, p.round, p.seq, p.ids, out);
    } else {
      t.held.push_back(std::move(p));
    }
  }
}

void EmbeddingService::SetDead(const std::set<int32_t>& dead, std::vector<Outgoing>* out) {
  dead_ = dead;
  for (auto& [id, t] : tables_) Progress(*t, out);
}

void EmbeddingService::StartEpoch(uint32_t epoch, int32_t num_workers,
                                  std::vector<std::string> identities) {
  if (epoch <= epoch_) return;
  epoch_ = epoch;
  num_workers_ = num_workers;
  worker_identities_ = std::move(identities);
  dead_.clear();
  round_bytes_ = 0;
  for (auto& [id, t] : tables_) {
    t->open.clear();  // the rounds that did not close are pushed again
    t->applied.clear();
    t->held.clear();  // their workers' pulls are sent again
  }
}

std::vector<EmbeddingPartState> EmbeddingService::Save() const {
  std::vector<EmbeddingPartState> saved;
  for (const auto& [key, t] : tables_) {
    EmbeddingPartState s;
    s.table = key.first;
    s.partition = key.second;
    s.dim = t->rows.dim();
    s.optimizer = options_.table.optimizer;
    s.rows = t->rows.Save();
    s.closed = t->closed;
    for (const auto& [round, r] : t->open) {
      EmbeddingPartState::OpenRound o;
      o.round = round;
      o.pushed = r.pushed;
      for (const auto& [at, part] : r.taken) {
        o.parts.push_back({at.first, at.second, part.ids, part.grads});
      }
      s.open.push_back(std::move(o));
    }
    s.applied = t->applied;
    saved.push_back(std::move(s));
  }
  return saved;
}

Status EmbeddingService::Restore(const EmbeddingPartState& saved) {
  const std::string what = "saved embedding table " + std::to_string(saved.table) + " partition " +
                           std::to_string(saved.partition) + ": ";
  if (saved.optimizer != options_.table.optimizer) {
    return InvalidArgumentError(
        what + "holds embedding_optimizer=" + RowOptimizerName(saved.optimizer) +
        " state, this shard runs " + RowOptimizerName(options_.table.optimizer));
  }
  if (tables_.count({saved.table, saved.partition}) != 0) {
    return InvalidArgumentError(what + "restored twice");
  }
  auto in_range = [&](int32_t rank) { return rank >= 0 && rank < num_workers_; };
  for (const auto& o : saved.open) {
    if (o.round < saved.closed) return InvalidArgumentError(what + "an open round that closed");
    for (int32_t r : o.pushed) {
      if (!in_range(r)) return InvalidArgumentError(what + "rank " + std::to_string(r));
    }
    for (const auto& p : o.parts) {
      if (!in_range(p.rank)) return InvalidArgumentError(what + "rank " + std::to_string(p.rank));
      if (p.grads.size() != p.ids.size() * saved.dim) {
        return InvalidArgumentError(what + "a part's gradients do not match its ids");
      }
    }
  }
  for (const auto& [rank, last] : saved.applied) {
    if (!in_range(rank)) return InvalidArgumentError(what + "rank " + std::to_string(rank));
  }
  ErrorCode code = ErrorCode::Malformed;
  std::string why;
  Table* t = Find(saved.table, saved.partition, saved.dim, &code, &why);
  if (t == nullptr) return InvalidArgumentError(what + why);
  if (Status s = t->rows.Restore(saved.rows); !s.ok()) {
    tables_.erase({saved.table, saved.partition});
    return s;
  }
  t->closed = saved.closed;
  for (const auto& o : saved.open) {
    Round& r = t->open[o.round];
    r.pushed = o.pushed;
    for (const auto& p : o.parts) {
      r.parts[p.rank].insert(p.part);
      r.taken[{p.rank, p.part}] = Part{p.ids, p.grads};
      r.bytes += PartBytes(p.ids.size(), saved.dim);
    }
    round_bytes_ += r.bytes;
  }
  t->applied = saved.applied;
  return OkStatus();
}

EmbeddingServiceStats EmbeddingService::stats() const {
  EmbeddingServiceStats s;
  s.tables = tables_.size();
  s.refused = refused_;
  s.held_pulls = held_pulls_;
  s.rounds = rounds_;
  for (const auto& [id, t] : tables_) s.rows += t->rows.stats();
  return s;
}

std::map<uint32_t, EmbeddingTableStats> EmbeddingService::TableStats() const {
  std::map<uint32_t, EmbeddingTableStats> out;
  for (const auto& [key, t] : tables_) out[key.first] += t->rows.stats();
  return out;
}

}  // namespace gradsync::server
