#include "client/ps_client.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>

#include "common/placement.h"

namespace gradsync::client {
namespace {

using wire::MsgType;

// Counts the sends that still point into the caller's buffer. Shared with
// the payload owners, which may outlive the operation.
class SendHolds {
 public:
  static std::shared_ptr<const void> Hold(const std::shared_ptr<SendHolds>& self) {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      ++self->held_;
    }
    return std::shared_ptr<const void>(nullptr, [self](const void*) { self->Release(); });
  }

  bool WaitReleased(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline.at(), [&] { return held_ == 0; });
  }

 private:
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    --held_;
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  int held_ = 0;
};

}  // namespace

StatusOr<PsClientOptions> PsClientOptions::FromConfig(const Config& config) {
  PsClientOptions o;
  GS_ASSIGN_OR_RETURN(int64_t partition, config.GetInt("partition_bytes", 4 << 20));
  GS_ASSIGN_OR_RETURN(std::string optimizer, config.GetString("optimizer", "none"));
  GS_ASSIGN_OR_RETURN(int64_t resend, config.GetInt("ps_resend_ms", 1000));
  GS_ASSIGN_OR_RETURN(std::string reply, config.GetString("ps_reply_compression", "none"));
  if (reply != "none" && reply != "fp16" && reply != "bf16") {
    return InvalidArgumentError("ps_reply_compression must be none, fp16 or bf16, got '" + reply +
                                "'");
  }
  o.reply_codec = reply == "none" ? "" : reply;
  if (partition < 4) return InvalidArgumentError("partition_bytes must be at least 4");
  if (resend <= 0) return InvalidArgumentError("ps_resend_ms must be positive");
  o.partition_bytes = static_cast<size_t>(partition);
  o.server_optimizer = optimizer != "none";
  o.resend_after = Millis(resend);
  return o;
}

// One AllReduce: pushes and pulls for every partition, resends, answers.
class PsClient::Exchange {
 public:
  Exchange(PsClient* client, uint32_t bucket, uint8_t* data, uint64_t round, const OpTag& tag,
           Deadline deadline)
      : c_(client),
        bucket_(bucket),
        data_(data),
        round_(round),
        tag_(tag),
        deadline_(deadline),
        holds_(std::make_shared<SendHolds>()) {}

  // `encoders`: one per partition, or none (uncompressed).
  Status Run(std::vector<PartitionSpan> plan, BucketState* bucket);
  Traffic traffic() const { return traffic_; }

 private:
  struct Part {
    bool acked = false;
    bool replied = false;
    wire::Message reply;
    uint64_t version = 0;
    // A compressed push: its bytes and how they are encoded.
    std::optional<wire::Payload> compressed;
    wire::DataFields encoding;
  };

  Status Compress(BucketState* bucket);
  // `threshold`: the bucket's k-th largest magnitude key (0 when none).
  std::vector<size_t> SharedBudget(BucketState* bucket, uint32_t* threshold) const;
  Status SendAll(const std::vector<uint64_t>& versions, bool resend);
  Status Send(size_t p, MsgType type, uint64_t version);
  Status Decode(size_t p);
  Status OnMessage(wire::Incoming in);
  std::string Missing() const;
  int ShardOf(const wire::Route& from) const;

  PsClient* const c_;
  const uint32_t bucket_;
  uint8_t* const data_;
  const uint64_t round_;
  const OpTag tag_;
  const Deadline deadline_;
  std::shared_ptr<SendHolds> holds_;
  wire::PostedSends posted_;  // the pushes and pulls of this exchange
  std::vector<PartitionSpan> plan_;
  std::vector<Part> parts_;
  size_t remaining_ = 0;
  bool push_ = true;
  bool busy_ = false;  // a shard answered Busy since the loop last looked
  Traffic traffic_;
};

Status PsClient::Exchange::Run(std::vector<PartitionSpan> plan, BucketState* bucket) {
  plan_ = std::move(plan);
  parts_.resize(plan_.size());
  remaining_ = plan_.size();
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
  f.version = version;
  std::vector<wire::Payload> payloads;
  if (type == MsgType::Push && part.compressed) {
    payloads.push_back(*part.compressed);
    f.codec = part.encoding.codec;
  } else if (type == MsgType::Push) {
    payloads.push_back(wire::Payload::Borrow(data_ + span.offset * sizeof(float),
                                             span.count * sizeof(float), SendHolds::Hold(holds_)));
  } else {
    f.codec = c_->options_.reply_codec;
  }
  if (type == MsgType::Push) {
    c_->pushes_++;
    if (!part.acked) traffic_.sent += payloads.back().size;
  } else {
    c_->pulls_++;
  }
  wire::Message msg =
      wire::MakeData(c_->peers_.sender, type, f, std::move(payloads), tag_.step, ++c_->seq_);
  const wire::Route to = wire::Route::Connection(c_->conns_[static_cast<size_t>(span.shard)]);
  // Posted: the pushes and pulls of every partition go out without waiting
  // on each other; a send that fails is seen by the loop in Run.
  c_->transport_->Post(to, std::move(msg), deadline_, posted_.callback());
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
  part.version = d->version();
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
  for (size_t s = 0; s < c_->conns_.size(); ++s) {
    if (from.kind == wire::Route::Kind::kConnection && c_->conns_[s] == from.conn) {
      return static_cast<int>(s);
    }
  }
  return -1;
}

PsClient::PsClient(std::unique_ptr<wire::Transport> transport, const PsPeers& peers,
                   const PsClientOptions& options, Collectives* fallback, Health health)
    : transport_(std::move(transport)),
      peers_(peers),
      options_(options),
      fallback_(fallback),
      health_(std::move(health)),
      policy_(wire::Policy::Accepting({MsgType::Ack, MsgType::Reply, MsgType::Error})) {
  policy_.job_id = peers.sender.job_id;
  compression::RegisterBuiltins(&registry_);
  if (!options_.reply_codec.empty()) reply_elem_bytes_ = 2;  // fp16, bf16
}

StatusOr<std::unique_ptr<PsClient>> PsClient::Create(std::unique_ptr<wire::Transport> transport,
                                                     const PsPeers& peers,
                                                     const PsClientOptions& options,
                                                     Collectives* fallback, Health health) {
  if (peers.server_endpoints.empty()) {
    return FailedPreconditionError(
        "path=ps needs server shards, and the job has none "
        "(num_servers=0)");
  }
  std::unique_ptr<PsClient> c(
      new PsClient(std::move(transport), peers, options, fallback, std::move(health)));
  for (const std::string& endpoint : peers.server_endpoints) {
    GS_ASSIGN_OR_RETURN(wire::ConnId id, c->transport_->Connect(endpoint));
    c->conns_.push_back(id);
  }
  return c;
}

PsClient::~PsClient() { transport_->Shutdown(); }

Status PsClient::AllReduce(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
                           Deadline deadline) {
  if (tag.bucket == kDirectOpBucket) {
    if (fallback_ == nullptr) return UnimplementedError("no collectives for direct operations");
    return fallback_->AllReduce(data, count, dtype, op, tag, deadline);
  }
  if (!broken_.ok()) return broken_;
  if (dtype != DType::kF32 || op != ReduceOp::kAverage) {
    return InvalidArgumentError(std::string("the parameter-server path averages f32 buckets "
                                            "only; bucket ") +
                                std::to_string(tag.bucket) + " is " + DTypeName(dtype));
  }
  if (peers_.epoch > 0 && !resume_at_) {
    return FailedPreconditionError(
        "membership epoch " + std::to_string(peers_.epoch) +
        ": the parameter-server path goes on from the step the workers agree on; call "
        "AgreeOnStep (gs_agree_step) before the epoch's first step");
  }
  BucketState& b = buckets_[tag.bucket];
  const int32_t shards = static_cast<int32_t>(conns_.size());
  auto plan = PlanPartitions(tag.bucket, count, sizeof(float), options_.partition_bytes, shards);
  if (b.count == 0) {
    b.count = count;
    b.next_round = FirstRound();
    b.versions.assign(plan.size(), resume_at_.value_or(0));
  }
  if (b.count != count) {
    return InvalidArgumentError("bucket " + std::to_string(tag.bucket) + " had " +
                                std::to_string(b.count) + " elements, now " +
                                std::to_string(count));
  }
  if (b.encoders.empty() && b.spec != "none") {
    for (size_t p = 0; p < plan.size(); ++p) {
      GS_ASSIGN_OR_RETURN(auto encoder, compression::PayloadEncoder::Create(registry_, b.spec));
      b.encoders.push_back(std::move(encoder));
    }
  }
  OpTag in_epoch = tag;
  in_epoch.step |= static_cast<uint64_t>(peers_.epoch) << 32;
  Exchange exchange(this, tag.bucket, static_cast<uint8_t*>(data), b.next_round, in_epoch,
                    deadline);
  Status s = exchange.Run(std::move(plan), &b);
  last_traffic_ = exchange.traffic();
  if (!s.ok()) {
    broken_ = s;
    return s;
  }
  b.next_round++;
  return Status();
}

Status PsClient::AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                           Deadline deadline) {
  if (fallback_ == nullptr) return UnimplementedError("no collectives for AllGather");
  return fallback_->AllGather(in, bytes, out, tag, deadline);
}

Status PsClient::Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                           Deadline deadline) {
  if (fallback_ == nullptr) return UnimplementedError("no collectives for Broadcast");
  return fallback_->Broadcast(data, bytes, root, tag, deadline);
}

Status PsClient::SetCompression(uint32_t bucket, const std::string& spec) {
  BucketState& b = buckets_[bucket];
  if (b.count != 0) {
    return FailedPreconditionError("bucket " + std::to_string(bucket) +
                                   " was pushed already; its compression is set before");
  }
  if (spec != "none") {
    StatusOr<std::unique_ptr<compression::PayloadEncoder>> made =
        compression::PayloadEncoder::Create(registry_, spec);
    if (!made.ok()) {
      return InvalidArgumentError(
          "bucket " + std::to_string(bucket) + ": compression \"" + spec +
          "\" is not available on the parameter-server path: " + made.status().message());
    }
    b.shared_budget = (*made)->shared_budget_ratio().has_value();
  }
  b.spec = spec;
  return Status();
}

bool PsClient::PushesRaw(uint32_t bucket, size_t count) const {
  auto it = buckets_.find(bucket);
  if (it == buckets_.end() || it->second.spec == "none") return true;
  const BucketState& b = it->second;
  if (b.shared_budget) {  // several partitions: encoded here, from the buffer
    const int32_t shards = static_cast<int32_t>(conns_.size());
    if (PlanPartitions(bucket, count, sizeof(float), options_.partition_bytes, shards).size() > 1) {
      return true;
    }
  }
  return (b.count == 0 ? FirstRound() : b.next_round) == 0;
}

uint64_t PsClient::FirstRound() const {
  const uint64_t completed = resume_at_.value_or(0);
  return completed == 0 && options_.server_optimizer ? 0 : completed + 1;
}

void PsClient::ResumeAt(uint64_t completed) {
  if (peers_.epoch > 0) resume_at_ = completed;
}

void PsClient::Close() { transport_->Shutdown(); }

void PsClient::CountRejected(wire::ErrorCode code) {
  rejected_++;
  if (options_.rejected != nullptr) options_.rejected->Count(code);
}

PsClientStats PsClient::stats() const {
  return PsClientStats{pushes_.load(),   pulls_.load(), resent_.load(),
                       rejected_.load(), stray_.load(), busy_.load()};
}

}  // namespace gradsync::client
