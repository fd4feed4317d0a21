#include "ps/ps_key_table.h"

#include <algorithm>
#include <cstring>

#include "common/placement.h"
#include "ps/ps_key_table_request.h"

namespace gradsync::server {

using wire::ErrorCode;
using wire::MsgType;

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
            d.base_version(),
            h.step(),
            h.seq(),
            h.epoch(),
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
  const uint32_t epoch = r.epoch;
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
       wire::LaneBase(r.from.identity) != rules_.worker_identities[w])) {
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
  Request r{wire::Route{}, MsgType::Push,    worker,       key, values.size(), round, version, 0, 0,
            epoch_,        wire::DType::F32, std::string()};
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

Snapshot KeyTable::CopySnapshot(const std::vector<float>& values, uint64_t version) {
  std::vector<float> copy = TakeBuffer(values.size());
  std::copy(values.begin(), values.end(), copy.begin());
  return MakeSnapshot(std::move(copy), version);
}

void KeyTable::Retire(Snapshot snap) {
  // Only this table hands out references to a snapshot, so a count of one
  // cannot grow again; the vector was made mutable (MakeSnapshot).
  if (snap.values == nullptr || snap.values.use_count() != 1) return;
  Recycle(std::move(const_cast<std::vector<float>&>(*snap.values)));
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
  k.results[0] = k.latest = CopySnapshot(k.params, k.version);
  Ack(r, k, out);
  AnswerHeld(r.key, k, out);
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
  f.key_version = k.version;
  out->push_back({r.from, wire::MakeData(self_, MsgType::Ack, f, {}, r.step, r.seq, epoch_)});
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
  if (from.kind != wire::Route::Kind::kInbound || from.identity.empty()) return false;
  // A worker's lanes (PsClientOptions::lanes) are the worker.
  const std::string worker = wire::LaneBase(from.identity);
  return std::find(worker_identities.begin(), worker_identities.end(), worker) !=
         worker_identities.end();
}

}  // namespace gradsync::server
