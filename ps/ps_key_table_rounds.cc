// KeyTable's rounds: pushes taken into them, rounds closed, and the pulls
// they answer (ps/ps_key_table.h).
#include <algorithm>
#include <cstring>
#include <utility>

#include "ps/ps_key_table_request.h"

namespace gradsync::server {

using wire::ErrorCode;
using wire::MsgType;

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
  Retire(std::exchange(k.latest, Snapshot{}));
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
    Recycle(std::move(avg));
    k.results[round] = CopySnapshot(k.params, k.version);
  } else {
    k.results[round] = MakeSnapshot(std::move(avg), k.version);
  }
  while (k.results.size() > rules_.kept_results) {
    Retire(std::move(k.results.begin()->second));
    k.results.erase(k.results.begin());
  }
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
    if (!k.latest.values) k.latest = CopySnapshot(k.params, k.version);
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
  f.key_version = snap.version;
  f.codec = pull.codec;
  out->push_back(
      {pull.to, wire::MakeData(self_, MsgType::Reply, f, {ReplyPayload(k, snap, pull.codec)},
                               pull.step, pull.seq, epoch_)});
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

}  // namespace gradsync::server
