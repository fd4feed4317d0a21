#include "client/ps_client.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>

#include "client/ps_client_exchange.h"
#include "common/placement.h"

namespace gradsync::client {

using wire::MsgType;

StatusOr<PsClientOptions> PsClientOptions::FromConfig(const Config& config) {
  PsClientOptions o;
  GS_ASSIGN_OR_RETURN(int64_t partition, config.GetInt("partition_bytes", 4 << 20));
  GS_ASSIGN_OR_RETURN(std::string optimizer, config.GetString("optimizer", "none"));
  GS_ASSIGN_OR_RETURN(int64_t resend, config.GetInt("ps_resend_ms", 1000));
  GS_ASSIGN_OR_RETURN(std::string reply, config.GetString("ps_reply_compression", "none"));
  GS_ASSIGN_OR_RETURN(int64_t lanes, config.GetInt("ps_lanes", 2));
  // The last lane is the embedding client's (client/ps_transport.h).
  if (lanes < 1 || lanes > wire::kMaxLanes - 1) {
    return InvalidArgumentError("ps_lanes must be in [1, " + std::to_string(wire::kMaxLanes - 1) +
                                "], got " + std::to_string(lanes));
  }
  o.lanes = static_cast<int>(lanes);
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

PsClient::PsClient(std::unique_ptr<wire::Transport> transport, const PsPeers& peers,
                   const PsClientOptions& options, Health health)
    : transport_(std::move(transport)),
      peers_(peers),
      options_(options),
      health_(std::move(health)),
      policy_(wire::Policy::Accepting({MsgType::Ack, MsgType::Reply, MsgType::Error})) {
  policy_.job_id = peers.sender.job_id;
  compression::RegisterBuiltins(&registry_);
  if (!options_.reply_codec.empty()) reply_elem_bytes_ = 2;  // fp16, bf16
}

StatusOr<std::unique_ptr<PsClient>> PsClient::Create(std::unique_ptr<wire::Transport> transport,
                                                     const PsPeers& peers,
                                                     const PsClientOptions& options,
                                                     Health health) {
  if (peers.server_endpoints.empty()) {
    return FailedPreconditionError(
        "path=ps needs server shards, and the job has none "
        "(num_servers=0)");
  }
  std::unique_ptr<PsClient> c(
      new PsClient(std::move(transport), peers, options, std::move(health)));
  for (const std::string& endpoint : peers.server_endpoints) {
    std::vector<wire::ConnId> lanes;
    for (int lane = 0; lane < std::max(1, options.lanes); ++lane) {
      GS_ASSIGN_OR_RETURN(wire::ConnId id, c->transport_->ConnectLane(endpoint, lane));
      lanes.push_back(id);
    }
    c->conns_.push_back(std::move(lanes));
  }
  return c;
}

PsClient::~PsClient() { transport_->Shutdown(); }

Status PsClient::PushPull(void* data, size_t count, DType dtype, const OpTag& tag,
                          Deadline deadline) {
  if (!broken_.ok()) return broken_;
  if (dtype != DType::kF32) {
    return InvalidArgumentError(std::string("the parameter-server path averages f32 buckets "
                                            "only; bucket ") +
                                std::to_string(tag.bucket) + " is " + DTypeName(dtype));
  }
  if (peers_.epoch > 0 && !resume_at_) {
    return FailedPreconditionError(
        "membership epoch " + std::to_string(peers_.epoch) +
        ": the parameter-server path goes on from the step the workers agree "
        "on; call "
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
  in_epoch.epoch = peers_.epoch;
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
