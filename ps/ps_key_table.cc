#include "ps/ps_key_table.h"

#include <algorithm>
#include <cstring>

#include "common/placement.h"

namespace gradsync::server {

using wire::ErrorCode;
using wire::MsgType;

const char* PsModeName(PsMode mode) {
  switch (mode) {
    case PsMode::kSync:
      return "sync";
    case PsMode::kAsync:
      return "async";
    case PsMode::kSsp:
      return "ssp";
  }
  return "invalid";
}

void ShardCounters::Applied(uint64_t staleness) {
  applied_.fetch_add(1, std::memory_order_relaxed);
  staleness_sum_.fetch_add(staleness, std::memory_order_relaxed);
  uint64_t seen = max_staleness_.load(std::memory_order_relaxed);
  while (staleness > seen && !max_staleness_.compare_exchange_weak(seen, staleness)) {
  }
  if (metrics != nullptr) metrics->staleness->Observe(static_cast<double>(staleness));
}

void ShardCounters::Duplicate() {
  Add(duplicates);
  if (metrics != nullptr) metrics->duplicates->Increment();
}

void ShardCounters::EarlyPull() {
  Add(early_pulls);
  if (metrics != nullptr) metrics->early_pulls->Increment();
}

void ShardCounters::Unplanned() {
  Add(unplanned);
  if (metrics != nullptr) metrics->unplanned->Increment();
}

void ShardCounters::OtherEpoch() {
  Add(other_epoch);
  if (metrics != nullptr) metrics->other_epoch->Increment();
}

void ShardCounters::Rejected(wire::ErrorCode code) {
  Add(rejected);
  if (metrics != nullptr) metrics->rejected.Count(code);
}

void ShardCounters::RoundClosed(SteadyTime first, SteadyTime last) {
  Add(rounds_closed);
  straggler_wait_ns_.fetch_add(
      static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(last - first).count()),
      std::memory_order_relaxed);
  if (metrics == nullptr) return;
  using Seconds = std::chrono::duration<double>;
  metrics->rounds_completed->Increment();
  metrics->straggler_wait->Observe(Seconds(last - first).count());
  metrics->round_duration->Observe(Seconds(std::chrono::steady_clock::now() - first).count());
}

PsShardStats ShardCounters::Snapshot() const {
  PsShardStats s;
  s.pushes_applied = applied_.load();
  s.duplicates = duplicates.load();
  s.early_pulls = early_pulls.load();
  s.unplanned = unplanned.load();
  s.other_epoch = other_epoch.load();
  s.rejected = rejected.load();
  s.rounds_closed = rounds_closed.load();
  s.replies = replies.load();
  s.max_staleness = max_staleness_.load();
  s.staleness_sum = staleness_sum_.load();
  s.straggler_wait_s = static_cast<double>(straggler_wait_ns_.load()) * 1e-9;
  return s;
}

void TakenRounds::Add(uint64_t round) {
  if (Contains(round)) return;
  above.insert(round);
  while (!above.empty() && *above.begin() == floor + 1) {
    ++floor;
    above.erase(above.begin());
  }
}

struct KeyTable::Request {
  wire::Route from;
  MsgType type;
  int32_t worker;
  Key key;
  uint64_t num_elements, round, version, step, seq;
  wire::DType dtype;
  std::string codec;  // "": uncompressed

  std::string Name() const {
    return std::string(wire::MsgTypeName(type)) + " of bucket " + std::to_string(key.first) +
           " partition " + std::to_string(key.second) + " round " + std::to_string(round) +
           " from worker " + std::to_string(worker);
  }
};

namespace {

// The encodings a Reply may have besides fp32: element-wise, so they need
// no state and no context.
bool IsReplyCodec(const std::string& codec) { return codec == "fp16" || codec == "bf16"; }

}  // namespace

KeyTable::KeyTable(const PsRules& rules, const Optimizer* optimizer, wire::Sender self,
                   ShardCounters* counters, JobCodec* codec)
    : rules_(rules),
      optimizer_(optimizer),
      self_(self),
      counters_(counters),
      own_codec_(codec == nullptr
                     ? std::make_unique<JobCodec>(rules.compression, rules.compression_overrides)
                     : nullptr),
      codec_(codec == nullptr ? own_codec_.get() : codec) {
  compression::RegisterBuiltins(&reply_codecs_);
}

bool KeyTable::Handle(const wire::Route& from, const wire::Header& h, const wire::Message& msg,
                      std::vector<Outgoing>* out, std::vector<float>* decoded) {
  took_ = false;
  const wire::DataBody& d = *h.body_as_DataBody();
  Request r{from,
            h.type(),
            h.sender_rank(),
            {d.bucket(), d.partition()},
            d.num_elements(),
            d.round(),
            d.version(),
            h.step(),
            h.seq(),
            d.dtype(),
            d.codec() != nullptr ? d.codec()->str() : std::string()};
  if (!OfThisEpoch(r, out) || !Admit(r, h.sender_role(), d, msg, out)) return false;
  const bool known = keys_.count(r.key) > 0;
  Take(r, h, d, msg, out, decoded);
  if (!known) DropIfEmpty(r.key);
  return took_;
}

void KeyTable::Take(const Request& r, const wire::Header& h, const wire::DataBody& d,
                    const wire::Message& msg, std::vector<Outgoing>* out,
                    std::vector<float>* decoded) {
  if (r.type == MsgType::Push) {
    std::vector<float> values = TakeBuffer(r.num_elements);
    ErrorCode code = ErrorCode::Unknown;
    const compression::CompressContext ctx =
        compression::PartitionContext(h.job_id(), r.step, r.key.first, r.key.second);
    Status s = decoder_.Decode(d, msg.payloads, ctx, values.data(), &code);
    if (!s.ok()) return Reject(r, code, s.message(), out);
    if (!r.codec.empty()) codec_->Taken(r.codec, r.worker, r.key.first);
    const bool keep = decoded != nullptr && !r.codec.empty();
    if (keep) *decoded = values;
    OnPush(r, std::move(values), out);
    if (keep && !took_) decoded->clear();
  } else {
    OnPull(r, out);
  }
}

void KeyTable::DropIfEmpty(const Key& key) {
  auto it = keys_.find(key);
  if (it == keys_.end()) return;
  const KeyState& k = it->second;
  if (k.num_elements == 0 && !k.initialised && k.open.empty() && k.held.empty() &&
      k.results.empty()) {
    keys_.erase(it);
  }
}

bool KeyTable::OfThisEpoch(const Request& r, std::vector<Outgoing>* out) {
  const auto epoch = static_cast<uint32_t>(r.step >> 32);
  if (epoch == epoch_) return true;
  counters_->OtherEpoch();
  const std::string epochs =
      std::to_string(epoch) + " (this shard is in epoch " + std::to_string(epoch_) + ")";
  if (epoch < epoch_) {
    ErrorTo(r, ErrorCode::BadSequence, "is of membership epoch " + epochs + ", which ended", out);
    return false;
  }
  if (epoch > epoch_) {
    ErrorTo(r, ErrorCode::Busy, "is of membership epoch " + epochs + ": send it again", out);
    return false;
  }
  return true;
}

bool KeyTable::Admit(const Request& r, wire::Role role, const wire::DataBody& d,
                     const wire::Message& msg, std::vector<Outgoing>* out) {
  if (role != wire::Role::Worker || r.worker < 0 || r.worker >= rules_.num_workers) {
    Reject(r, ErrorCode::BadSender, "the sender is not a worker of this job", out);
    return false;
  }
  if (r.type != MsgType::Push && r.type != MsgType::Pull) {
    Reject(r, ErrorCode::WrongType, "a shard takes Push and Pull only", out);
    return false;
  }
  const auto w = static_cast<size_t>(r.worker);
  if (w < rules_.worker_identities.size() && !rules_.worker_identities[w].empty() &&
      (r.from.kind != wire::Route::Kind::kInbound ||
       r.from.identity != rules_.worker_identities[w])) {
    Reject(r, ErrorCode::BadSender,
           "comes over another connection than worker " + std::to_string(r.worker) + "'s own", out);
    return false;
  }
  if (r.dtype != wire::DType::F32) {
    Reject(r, ErrorCode::WrongType,
           std::string("carries ") + wire::EnumNameDType(r.dtype) +
               " data; this shard takes f32 (compressed or not)",
           out);
    return false;
  }
  if (rules_.num_shards > 0 &&
      ShardOf(r.key.first, r.key.second, rules_.num_shards) != rules_.shard) {
    Reject(r, ErrorCode::Mismatch,
           "names a key placed on shard " +
               std::to_string(ShardOf(r.key.first, r.key.second, rules_.num_shards)) +
               ", this is shard " + std::to_string(rules_.shard),
           out);
    return false;
  }
  const auto it = keys_.find(r.key);
  const uint64_t held = it == keys_.end() ? 0 : it->second.num_elements;
  if (r.num_elements == 0 || r.num_elements > rules_.max_elements ||
      (held != 0 && r.num_elements != held)) {
    const std::string limit = held != 0
                                  ? "the key holds " + std::to_string(held)
                                  : "a partition holds at most " +
                                        std::to_string(rules_.max_elements) + " (partition_bytes)";
    Reject(r, ErrorCode::SizeMismatch,
           "carries " + std::to_string(r.num_elements) + " elements, " + limit, out);
    return false;
  }
  if (it == keys_.end() && keys_.size() >= rules_.max_keys) {
    Reject(r, ErrorCode::Oversized,
           "would be key number " + std::to_string(keys_.size() + 1) +
               " of a table that holds at most " + std::to_string(rules_.max_keys),
           out);
    return false;
  }
  if (r.type == MsgType::Push && !r.codec.empty()) {
    Status s = codec_->Admit(r.codec, r.worker, r.key.first);
    if (s.code() == StatusCode::kUnavailable) {  // flow control, not a refusal
      ErrorTo(r, ErrorCode::Busy, s.message(), out);
      return false;
    }
    if (!s.ok()) {
      Reject(r, ErrorCode::WrongType, s.message(), out);
      return false;
    }
  }
  if (r.type == MsgType::Push) {
    ErrorCode code = ErrorCode::Unknown;
    Status s = decoder_.Check(d, msg.payloads, &code);
    if (!s.ok()) {
      Reject(r, code, s.message(), out);
      return false;
    }
  }
  if (r.type == MsgType::Pull && !AdmitPull(r, out)) return false;
  return Planned(r, out);
}

bool KeyTable::AdmitPull(const Request& r, std::vector<Outgoing>* out) {
  if (r.round == 0 && optimizer_ == nullptr) {
    Reject(r, ErrorCode::WrongType,
           "this shard only aggregates (optimizer=none): there is no round 0", out);
    return false;
  }
  if (!r.codec.empty() && !IsReplyCodec(r.codec)) {
    Reject(r, ErrorCode::WrongType,
           "asks for replies encoded as \"" + r.codec + "\"; replies are fp32, fp16 or bf16", out);
    return false;
  }
  return true;
}

int32_t KeyTable::PlanAuthor() const {
  for (int32_t w = 0; w < rules_.num_workers; ++w) {
    if (Live(w)) return w;
  }
  return 0;
}

bool KeyTable::Planned(const Request& r, std::vector<Outgoing>* out) {
  if (keys_.count(r.key) > 0) return true;
  const int32_t author = PlanAuthor();
  // Anyone else's round 0 is refused by OnInit, which makes no key.
  if (r.type == MsgType::Push && (r.worker == author || r.round == 0)) return true;
  if (r.type == MsgType::Pull) {
    // A PS client pushes a key before it pulls it over the same connection
    // (round 0: worker 0 pushes the initial parameters first): a pull of a
    // key no push made is behind a push answered Busy, or outside the plan.
    counters_->EarlyPull();
    ErrorTo(r, ErrorCode::Busy, "names a key no worker pushed yet; push it first", out);
    return false;
  }
  counters_->Unplanned();
  ErrorTo(r, ErrorCode::Busy,
          "names a key worker " + std::to_string(author) +
              " has not pushed: the job's keys are those it pushes; push again once it has",
          out);
  return false;
}

std::map<KeyTable::Key, KeyState> KeyTable::SaveKeys() const {
  std::map<Key, KeyState> out;
  for (const auto& [key, k] : keys_) {
    KeyState& saved = out.emplace_hint(out.end(), key, k)->second;
    saved.held.clear();
  }
  return out;
}

void KeyTable::RestoreKeys(std::map<Key, KeyState> keys) { keys_ = std::move(keys); }

Status KeyTable::Replay(const Key& key, int32_t worker, uint64_t round, uint64_t version,
                        const std::vector<float>& values) {
  const std::string name = "push of bucket " + std::to_string(key.first) + " partition " +
                           std::to_string(key.second) + " round " + std::to_string(round) +
                           " from worker " + std::to_string(worker);
  const auto it = keys_.find(key);
  const uint64_t held = it == keys_.end() ? 0 : it->second.num_elements;
  if (worker < 0 || worker >= rules_.num_workers || values.empty() ||
      (held != 0 && values.size() != held)) {
    return DataLossError("cannot replay the " + name + ": " + std::to_string(values.size()) +
                         " elements, the key holds " + std::to_string(held) + ", the job has " +
                         std::to_string(rules_.num_workers) + " workers");
  }
  Request r{wire::Route{},    MsgType::Push, worker, key, values.size(), round, version, 0, 0,
            wire::DType::F32, std::string()};
  std::vector<Outgoing> answers;
  OnPush(r, values, &answers);
  for (const Outgoing& o : answers) {
    const wire::Header* h = o.message.header_view();
    if (h->type() != MsgType::Error) continue;
    const auto* e = h->body_as_ErrorBody();
    return DataLossError("cannot replay the " + name + ": " +
                         (e->message() ? e->message()->str() : "refused"));
  }
  return OkStatus();
}

std::vector<float> KeyTable::TakeBuffer(size_t n) {
  for (size_t i = 0; i < spare_.size(); ++i) {
    if (spare_[i].size() != n) continue;
    std::vector<float> buffer = std::move(spare_[i]);
    spare_[i] = std::move(spare_.back());
    spare_.pop_back();
    spare_bytes_ -= n * sizeof(float);
    return buffer;
  }
  return std::vector<float>(n);
}

void KeyTable::Recycle(std::vector<float> buffer) {
  const size_t bytes = buffer.size() * sizeof(float);
  if (bytes == 0 || spare_bytes_ + bytes > kSpareBytes) return;
  spare_bytes_ += bytes;
  spare_.push_back(std::move(buffer));
}

void KeyTable::OnPush(const Request& r, std::vector<float> values, std::vector<Outgoing>* out) {
  if (r.round == 0) return OnInit(r, std::move(values), out);
  KeyState& k = keys_[r.key];
  if (optimizer_ != nullptr && !k.initialised) {
    return Reject(r, ErrorCode::BadSequence,
                  "the key has no parameters yet: worker 0 pushes them first (round 0)", out);
  }
  // async: a worker's first push of a later epoch (PushAsync).
  const bool first_of_epoch = epoch_ > 0 && k.taken.count(r.worker) == 0;
  if (k.taken[r.worker].Contains(r.round)) {
    counters_->Duplicate();
    return Ack(r, k, out);
  }
  if (rules_.mode == PsMode::kAsync) {
    return PushAsync(r, std::move(values), first_of_epoch, out);
  }
  PushRound(r, std::move(values), out);
}

void KeyTable::OnInit(const Request& r, std::vector<float> values, std::vector<Outgoing>* out) {
  if (optimizer_ == nullptr) {
    return Reject(r, ErrorCode::WrongType,
                  "this shard only aggregates (optimizer=none) and takes no initial "
                  "parameters",
                  out);
  }
  if (r.worker != 0) {
    return Reject(r, ErrorCode::BadSender, "only worker 0 pushes initial parameters", out);
  }
  KeyState& k = keys_[r.key];
  if (k.initialised) {
    counters_->Duplicate();
    return Ack(r, k, out);
  }
  k.num_elements = r.num_elements;
  k.params = std::move(values);
  k.initialised = true;
  took_ = true;
  k.results[0] = k.latest = MakeSnapshot(k.params, k.version);
  Ack(r, k, out);
  AnswerHeld(r.key, k, out);
}

void KeyTable::PushRound(const Request& r, std::vector<float> values, std::vector<Outgoing>* out) {
  KeyState& k = keys_[r.key];
  if (rules_.mode == PsMode::kSsp && !ResumeRounds(r.key, r.round, k)) {
    return Reject(r, ErrorCode::BadSequence,
                  "is the first of membership epoch " + std::to_string(epoch_) +
                      " but more than staleness + 1 rounds ahead of the " +
                      std::to_string(k.closed) + " closed",
                  out);
  }
  if (r.round <= k.closed) {
    // Taken rounds were acknowledged as duplicates before this point: the
    // round closed without this worker, which was then declared dead.
    return Reject(
        r, ErrorCode::BadSequence,
        "is for a round this key closed without it (" + std::to_string(k.closed) + " closed)", out);
  }
  const uint64_t limit = k.closed + rules_.staleness + 1;
  if (r.round > limit) {
    return Reject(r, ErrorCode::BadSequence,
                  "is ahead of the rounds this key allows (" + std::to_string(k.closed) +
                      " closed, at most round " + std::to_string(limit) + " may be pushed)",
                  out);
  }
  k.num_elements = r.num_elements;
  k.open[r.round][r.worker] = Contribution{std::move(values), r.version};
  k.taken[r.worker].Add(r.round);
  took_ = true;
  Ack(r, k, out);
  TryClose(k);
  AnswerHeld(r.key, k, out);
}

void KeyTable::PushAsync(const Request& r, std::vector<float> grad, bool first_of_epoch,
                         std::vector<Outgoing>* out) {
  KeyState& k = keys_[r.key];
  // A worker's first push of a later epoch: its rounds go on from there,
  // and the parameters it computed from came from another worker at the
  // change (their version unknown here): counted as fresh.
  if (first_of_epoch) k.taken[r.worker].floor = r.round - 1;
  const TakenRounds& taken = k.taken[r.worker];
  if (r.round > taken.floor + rules_.async_window || r.version > k.version) {
    return Reject(r, ErrorCode::BadSequence,
                  "is implausible (key version " + std::to_string(k.version) + ", push version " +
                      std::to_string(r.version) + ", rounds up to " + std::to_string(taken.floor) +
                      " taken)",
                  out);
  }
  const uint64_t staleness = first_of_epoch ? 0 : k.version - r.version;
  const float scale =
      rules_.staleness_lr ? 1.0f / static_cast<float>(std::max<uint64_t>(1, staleness)) : 1.0f;
  optimizer_->Step(k.params.data(), grad.data(), k.params.size(), &k.slots, scale);
  Recycle(std::move(grad));
  k.version++;
  k.latest = Snapshot{};
  k.taken[r.worker].Add(r.round);
  took_ = true;
  counters_->Applied(staleness);
  Ack(r, k, out);
  AnswerHeld(r.key, k, out);
}

void KeyTable::TryClose(KeyState& k) {
  while (!k.open.empty() && k.open.begin()->first == k.closed + 1) {
    const auto& contributions = k.open.begin()->second;
    for (int32_t w = 0; w < rules_.num_workers; ++w) {
      if (Live(w) && contributions.count(w) == 0) return;
    }
    Close(k, k.closed + 1);
  }
}

void KeyTable::Close(KeyState& k, uint64_t round) {
  auto& contributions = k.open[round];
  // The rank-order sum starts from the first gradient itself (moved, not
  // added to zeros) and the division by n is done in the pass of the last
  // addition; with one contributor the average is its gradient.
  const size_t n = contributions.size();
  std::vector<float> avg;
  size_t added = 0;
  SteadyTime first = SteadyTime::max(), last = SteadyTime::min();
  for (auto& [worker, c] : contributions) {  // rank order
    first = std::min(first, c.arrived);
    last = std::max(last, c.arrived);
    counters_->Applied(k.version >= c.version ? k.version - c.version : 0);
    if (++added == 1) {
      avg = std::move(c.grad);
      continue;
    }
    if (added < n) {
      for (size_t i = 0; i < avg.size(); ++i) avg[i] += c.grad[i];
    } else {
      const float divisor = static_cast<float>(n);
      for (size_t i = 0; i < avg.size(); ++i) avg[i] = (avg[i] + c.grad[i]) / divisor;
    }
    Recycle(std::move(c.grad));
  }
  k.open.erase(round);
  counters_->RoundClosed(first, last);
  k.closed = round;
  k.version++;
  if (optimizer_ != nullptr) {
    optimizer_->Step(k.params.data(), avg.data(), avg.size(), &k.slots, 1.0f);
    k.results[round] = MakeSnapshot(k.params, k.version);
  } else {
    k.results[round] = MakeSnapshot(std::move(avg), k.version);
  }
  while (k.results.size() > rules_.kept_results) k.results.erase(k.results.begin());
}

void KeyTable::OnPull(const Request& r, std::vector<Outgoing>* out) {
  KeyState& k = keys_[r.key];
  const bool async = rules_.mode == PsMode::kAsync;
  const uint64_t limit =
      async ? k.taken[r.worker].floor + rules_.async_window : k.closed + rules_.staleness + 1;
  if (r.round > limit) {
    return Reject(r, ErrorCode::BadSequence,
                  "is ahead of the rounds this key allows (at most " + std::to_string(limit) + ")",
                  out);
  }
  HeldPull pull{r.from, r.worker, r.round, r.step, r.seq, r.codec};
  if (Answer(r.key, k, pull, out)) return;
  for (HeldPull& h : k.held) {
    if (h.worker == pull.worker && h.round == pull.round) {
      h = pull;  // a resent pull replaces the one held
      return;
    }
  }
  k.held.push_back(pull);
}

bool KeyTable::Answer(const Key& key, KeyState& k, const HeldPull& pull,
                      std::vector<Outgoing>* out) {
  if (optimizer_ != nullptr && !k.initialised) return false;
  Snapshot snap;
  auto initial = pull.round == 0 ? k.results.find(0) : k.results.end();
  if (initial != k.results.end()) {
    snap = initial->second;  // round 0 answers with the initial parameters
  } else if (rules_.mode == PsMode::kAsync) {
    if (pull.round != 0 && !k.taken[pull.worker].Contains(pull.round)) return false;
    if (!k.latest.values) k.latest = MakeSnapshot(k.params, k.version);
    snap = k.latest;
  } else if (rules_.mode == PsMode::kSsp) {
    if (k.closed + rules_.staleness < pull.round || k.results.empty()) return false;
    snap = k.results.rbegin()->second;
  } else {
    if (k.closed < pull.round) return false;
    auto it = k.results.find(pull.round);
    if (it == k.results.end()) {
      out->push_back({pull.to, wire::MakeError(self_, ErrorCode::BadSequence,
                                               "round " + std::to_string(pull.round) +
                                                   " of bucket " + std::to_string(key.first) +
                                                   " partition " + std::to_string(key.second) +
                                                   " is too old to be answered again",
                                               MsgType::Pull)});
      counters_->Rejected(ErrorCode::BadSequence);
      return true;
    }
    snap = it->second;
  }
  wire::DataFields f;
  f.bucket = key.first;
  f.partition = key.second;
  f.num_elements = k.num_elements;
  f.round = pull.round;
  f.version = snap.version;
  f.codec = pull.codec;
  out->push_back(
      {pull.to, wire::MakeData(self_, MsgType::Reply, f, {ReplyPayload(k, snap, pull.codec)},
                               pull.step, pull.seq)});
  counters_->Add(counters_->replies);
  return true;
}

wire::Payload KeyTable::ReplyPayload(KeyState& k, const Snapshot& snap, const std::string& codec) {
  const auto& values = snap.values;
  if (codec.empty()) {
    return wire::Payload::Borrow(values->data(), values->size() * sizeof(float), values);
  }
  EncodedReply& cached = k.encoded[codec];
  if (cached.source != values) {
    // fp16/bf16 take every size and need no context: Compress cannot fail.
    std::unique_ptr<compression::Compressor>& c = reply_encoders_[codec];
    if (c == nullptr) c = std::move(reply_codecs_.Create(codec)).value();
    auto bytes = std::make_shared<std::vector<uint8_t>>(c->WireBytes(values->size()));
    c->Compress(values->data(), values->size(), {}, bytes->data(), bytes->size()).IgnoreError();
    cached = EncodedReply{values, wire::Payload::Borrow(bytes->data(), bytes->size(), bytes)};
  }
  return cached.payload;
}

void KeyTable::AnswerHeld(const Key& key, KeyState& k, std::vector<Outgoing>* out) {
  auto answered = [&](const HeldPull& p) { return Answer(key, k, p, out); };
  k.held.erase(std::remove_if(k.held.begin(), k.held.end(), answered), k.held.end());
}

void KeyTable::SetDead(const std::set<int32_t>& dead, std::vector<Outgoing>* out) {
  dead_ = dead;
  for (auto& [key, k] : keys_) {
    if (rules_.mode != PsMode::kAsync) TryClose(k);
    AnswerHeld(key, k, out);
  }
}

void KeyTable::Ack(const Request& r, const KeyState& k, std::vector<Outgoing>* out) {
  wire::DataFields f;
  f.bucket = r.key.first;
  f.partition = r.key.second;
  f.num_elements = r.num_elements;
  f.round = r.round;
  f.version = k.version;
  out->push_back({r.from, wire::MakeData(self_, MsgType::Ack, f, {}, r.step, r.seq)});
}

void KeyTable::Reject(const Request& r, ErrorCode code, const std::string& why,
                      std::vector<Outgoing>* out) {
  counters_->Rejected(code);
  ErrorTo(r, code, why, out);
}

void KeyTable::ErrorTo(const Request& r, ErrorCode code, const std::string& why,
                       std::vector<Outgoing>* out) {
  out->push_back({r.from, wire::MakeError(wire::AnswerAs(self_, rules_.IsJobWorker(r.from)), code,
                                          r.Name() + " " + why, r.type)});
}

bool PsRules::IsJobWorker(const wire::Route& from) const {
  return server::IsJobWorker(worker_identities, from);
}

bool IsJobWorker(const std::vector<std::string>& worker_identities, const wire::Route& from) {
  const bool checked = std::any_of(worker_identities.begin(), worker_identities.end(),
                                   [](const std::string& id) { return !id.empty(); });
  if (!checked) return true;
  return from.kind == wire::Route::Kind::kInbound && !from.identity.empty() &&
         std::find(worker_identities.begin(), worker_identities.end(), from.identity) !=
             worker_identities.end();
}

}  // namespace gradsync::server
