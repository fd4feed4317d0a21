// PsClient::Exchange: one PushPull's pushes, pulls, resends and answers.
#include "client/ps_client_exchange.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>

#include "client/ps_client.h"
#include "common/placement.h"

namespace gradsync::client {

using wire::MsgType;

Status PsClient::Exchange::Run(std::vector<PartitionSpan> plan, BucketState* bucket) {
  plan_ = std::move(plan);
  parts_.resize(plan_.size());
  remaining_ = plan_.size();
  // A shard's partitions take its lanes in turn, each partition the same
  // lane in every round.
  std::vector<size_t> per_shard(c_->conns_.size(), 0);
  lane_.resize(plan_.size());
  for (size_t p = 0; p < plan_.size(); ++p) {
    lane_[p] = per_shard[static_cast<size_t>(plan_[p].shard)]++;
  }
  push_ = round_ > 0 || c_->peers_.rank == 0;
  std::vector<uint64_t>* versions = &bucket->versions;
  if (push_ && round_ > 0) GS_RETURN_IF_ERROR(Compress(bucket));
  GS_RETURN_IF_ERROR(SendAll(*versions, false));
  Millis interval = c_->options_.resend_after;
  SteadyTime next_resend = std::chrono::steady_clock::now() + interval;
  while (remaining_ > 0) {
    GS_RETURN_IF_ERROR(posted_.first_failure());
    if (c_->health_) GS_RETURN_IF_ERROR(c_->health_());
    const SteadyTime now = std::chrono::steady_clock::now();
    if (deadline_.Expired()) {
      return DeadlineExceededError("bucket " + std::to_string(bucket_) + " round " +
                                   std::to_string(round_) + ": no answer from " + Missing());
    }
    if (now >= next_resend) {
      GS_RETURN_IF_ERROR(SendAll(*versions, true));
      interval = std::min(interval * 2, c_->options_.resend_after * 8);
      next_resend = now + interval;
    }
    const SteadyTime until =
        std::min({next_resend, now + c_->options_.poll_interval, deadline_.at()});
    auto in = c_->transport_->Receive(Deadline::At(until));
    if (!in.ok() && in.status().code() == StatusCode::kDeadlineExceeded) continue;
    if (!in.ok()) return in.status();
    GS_RETURN_IF_ERROR(OnMessage(std::move(*in)));
    if (busy_) {  // a shard did not take something: again soon, not later and later
      busy_ = false;
      interval = c_->options_.resend_after;
      next_resend = std::min(next_resend, std::chrono::steady_clock::now() + interval);
    }
  }
  if (!holds_->WaitReleased(deadline_)) {
    return DeadlineExceededError("the transport did not release the pushes of bucket " +
                                 std::to_string(bucket_) + " before the deadline");
  }
  for (size_t p = 0; p < plan_.size(); ++p) {
    GS_RETURN_IF_ERROR(Decode(p));
    (*versions)[p] = parts_[p].version;
  }
  return Status();
}

// Every partition once, before the first send: a resend sends the same bytes
// and the error-feedback residuals move once per round.
Status PsClient::Exchange::Compress(BucketState* bucket) {
  if (bucket->encoders.empty()) return Status();
  for (auto& encoder : bucket->encoders) encoder->BeginStep(tag_.step);
  uint32_t threshold = 0;
  const std::vector<size_t> keep = SharedBudget(bucket, &threshold);
  for (size_t p = 0; p < plan_.size(); ++p) {
    const PartitionSpan& span = plan_[p];
    const compression::CompressContext ctx =
        compression::PartitionContext(c_->peers_.sender.job_id, tag_.step, bucket_, span.partition);
    // A budget shared over partitions is chosen here, on the whole bucket.
    if (c_->partition_encoder_ && keep.empty()) {
      GS_ASSIGN_OR_RETURN(
          wire::Payload payload,
          c_->partition_encoder_(bucket_, span.partition, span.offset, span.count, ctx));
      parts_[p].encoding.codec = bucket->encoders[p]->spec();
      parts_[p].compressed = std::move(payload);
      continue;
    }
    const float* values = reinterpret_cast<const float*>(data_) + span.offset;
    GS_ASSIGN_OR_RETURN(
        wire::Payload payload,
        keep.empty() ? bucket->encoders[p]->Encode(values, span.count, ctx, &parts_[p].encoding)
                     : bucket->encoders[p]->EncodeKeeping(values, span.count, keep[p], ctx,
                                                          &parts_[p].encoding, threshold));
    parts_[p].compressed = std::move(payload);
  }
  return Status();
}

// Top-k over several partitions: how many elements each keeps so that the
// bucket's k largest travel, wherever they lie (compression/wire_codec.h).
// Empty: every partition keeps its own ratio.
std::vector<size_t> PsClient::Exchange::SharedBudget(BucketState* bucket,
                                                     uint32_t* threshold) const {
  const std::optional<double> ratio = bucket->encoders[0]->shared_budget_ratio();
  if (!ratio || plan_.size() < 2) return {};
  std::vector<size_t> sizes;
  for (const PartitionSpan& span : plan_) sizes.push_back(span.count);
  std::vector<uint32_t>& keys = bucket->keys;
  keys.resize(std::accumulate(sizes.begin(), sizes.end(), size_t{0}));
  size_t at = 0;
  for (size_t p = 0; p < plan_.size(); ++p) {
    const PartitionSpan& span = plan_[p];
    const compression::CompressContext ctx =
        compression::PartitionContext(c_->peers_.sender.job_id, tag_.step, bucket_, span.partition);
    bucket->encoders[p]->MagnitudeKeys(reinterpret_cast<const float*>(data_) + span.offset,
                                       span.count, ctx, keys.data() + at);
    at += span.count;
  }
  return compression::SharedKeepCounts(keys, sizes, *ratio, threshold);
}

// The reply of partition p into the caller's buffer.
Status PsClient::Exchange::Decode(size_t p) {
  const wire::Message& reply = parts_[p].reply;
  float* dst = reinterpret_cast<float*>(data_) + plan_[p].offset;
  traffic_.received += reply.PayloadBytes();
  wire::ErrorCode code;
  Status s =
      c_->decoder_.Decode(*reply.header_view()->body_as_DataBody(), reply.payloads, {}, dst, &code);
  if (!s.ok()) {
    c_->CountRejected(code);
    return AbortedError("server " + std::to_string(plan_[p].shard) + " answered partition " +
                        std::to_string(plan_[p].partition) + " of bucket " +
                        std::to_string(bucket_) + " with a reply that " + s.message());
  }
  return Status();
}

Status PsClient::Exchange::SendAll(const std::vector<uint64_t>& versions, bool resend) {
  // Each partition's pull goes right behind its push (the shard still sees
  // the push first), so a shard can answer one partition while the pushes
  // of the next ones are still arriving.
  for (size_t p = 0; p < plan_.size(); ++p) {
    const Part& part = parts_[p];
    if (part.replied) continue;
    const bool push = push_ && !part.acked;
    if (push) GS_RETURN_IF_ERROR(Send(p, MsgType::Push, versions[p]));
    GS_RETURN_IF_ERROR(Send(p, MsgType::Pull, versions[p]));
    if (resend) c_->resent_ += push ? 2 : 1;
  }
  return Status();
}

Status PsClient::Exchange::Send(size_t p, MsgType type, uint64_t version) {
  const PartitionSpan& span = plan_[p];
  const Part& part = parts_[p];
  wire::DataFields f;
  f.bucket = bucket_;
  f.partition = span.partition;
  f.dtype = wire::DType::F32;
  f.num_elements = span.count;
  f.names_hash = tag_.names_hash;
  f.round = round_;
  f.base_version = version;
  std::vector<wire::Payload> payloads;
  if (type == MsgType::Push && part.compressed) {
    payloads.push_back(*part.compressed);
    f.codec = part.encoding.codec;
  } else if (type == MsgType::Push) {
    payloads.push_back(wire::Payload::Borrow(data_ + span.offset * sizeof(float),
                                             span.count * sizeof(float),
                                             PsSendHolds::Hold(holds_)));
  } else {
    f.codec = c_->options_.reply_codec;
  }
  if (type == MsgType::Push) {
    c_->pushes_++;
    if (!part.acked) traffic_.sent += payloads.back().size;
  } else {
    c_->pulls_++;
  }
  wire::Message msg = wire::MakeData(c_->peers_.sender, type, f, std::move(payloads), tag_.step,
                                     ++c_->seq_, tag_.epoch);
  const std::vector<wire::ConnId>& lanes = c_->conns_[static_cast<size_t>(span.shard)];
  const wire::Route to = wire::Route::Connection(lanes[lane_[p] % lanes.size()]);
  // Posted: the pushes and pulls of every partition go out without waiting
  // on each other; a send that fails is seen by the loop in Run. One lost
  // with a connection that broke (a TCP stream to a shard that went away)
  // is lost as a network may lose it: the resends send it again, to the
  // shard restarted in its place, until the health check names a shard the
  // job declared dead or the deadline passes.
  auto posted = posted_.callback();
  c_->transport_->Post(to, std::move(msg), deadline_, [posted](const Status& s) {
    posted(s.code() == StatusCode::kUnavailable ? Status() : s);
  });
  return Status();
}

Status PsClient::Exchange::OnMessage(wire::Incoming in) {
  wire::Verdict v = wire::Validate(in.message, c_->policy_);
  if (!v.ok()) {
    c_->CountRejected(v.code);
    if (v.ShouldAnswer()) {
      c_->transport_
          ->Send(in.from,
                 wire::MakeError(c_->peers_.sender, v.code, v.detail,
                                 v.type_known ? v.type : MsgType::Error),
                 Deadline::AfterMs(1000))
          .IgnoreError();
    }
    return Status();
  }
  const int shard = ShardOf(in.from);
  if (v.type == MsgType::Error) {
    const auto* e = v.header->body_as_ErrorBody();
    if (e->code() == wire::ErrorCode::Busy) {
      c_->busy_++;
      busy_ = true;
      return Status();
    }
    return AbortedError("server " + std::to_string(shard) +
                        " refused: " + (e->message() ? e->message()->str() : "no reason given"));
  }
  const wire::DataBody* d = v.header->body_as_DataBody();
  if (d->bucket() != bucket_ || d->round() != round_ || d->partition() >= plan_.size() ||
      plan_[d->partition()].shard != shard) {
    c_->stray_++;
    return Status();
  }
  Part& part = parts_[d->partition()];
  part.acked = true;
  if (v.type != MsgType::Reply || part.replied) return Status();
  const PartitionSpan& span = plan_[d->partition()];
  const std::string codec = d->codec() != nullptr ? d->codec()->str() : "";
  if (d->num_elements() != span.count ||
      in.message.PayloadBytes() != span.count * c_->reply_elem_bytes_ ||
      d->dtype() != wire::DType::F32 || codec != c_->options_.reply_codec) {
    c_->CountRejected(wire::ErrorCode::SizeMismatch);
    const std::string want = c_->options_.reply_codec.empty() ? "f32" : c_->options_.reply_codec;
    return AbortedError("server " + std::to_string(shard) + " answered partition " +
                        std::to_string(span.partition) + " of bucket " + std::to_string(bucket_) +
                        " with " + std::to_string(d->num_elements()) + " elements in " +
                        std::to_string(in.message.PayloadBytes()) + " bytes" +
                        (codec.empty() ? "" : " of " + codec) + ", expected " +
                        std::to_string(span.count) + " " + want);
  }
  part.replied = true;
  part.version = d->key_version();
  part.reply = std::move(in.message);
  --remaining_;
  return Status();
}

std::string PsClient::Exchange::Missing() const {
  std::vector<bool> waiting(c_->conns_.size(), false);
  for (size_t p = 0; p < plan_.size(); ++p) {
    if (!parts_[p].replied) waiting[static_cast<size_t>(plan_[p].shard)] = true;
  }
  std::string out;
  for (size_t s = 0; s < waiting.size(); ++s) {
    if (waiting[s]) out += (out.empty() ? "server " : ", server ") + std::to_string(s);
  }
  return out;
}

int PsClient::Exchange::ShardOf(const wire::Route& from) const {
  if (from.kind != wire::Route::Kind::kConnection) return -1;
  for (size_t s = 0; s < c_->conns_.size(); ++s) {
    for (wire::ConnId id : c_->conns_[s]) {
      if (id == from.conn) return static_cast<int>(s);
    }
  }
  return -1;
}

}  // namespace gradsync::client
