#include "client/client_metrics.h"

#include "common/metrics.h"

namespace gradsync::client {

const char* SyncOpLabel(SyncOp op) {
  static const char* const kNames[kNumSyncOps] = {"push",      "pull",      "push_pull",
                                                  "allreduce", "allgather", "broadcast",
                                                  "barrier",   "pull_rows", "push_rows"};
  return kNames[static_cast<int>(op)];
}

const char* SyncPathLabel(SyncPath path) {
  static const char* const kNames[kNumSyncPaths] = {"ring", "nccl", "ps"};
  return kNames[static_cast<int>(path)];
}

const char* FailureReasonLabel(FailureReason reason) {
  static const char* const kNames[kNumFailureReasons] = {"timeout",  "peer_dead",   "mismatch",
                                                         "rejected", "unavailable", "other"};
  return kNames[static_cast<int>(reason)];
}

SyncPath SyncPathOf(const std::string& backend_name) {
  if (backend_name == "nccl") return SyncPath::kNccl;
  if (backend_name == "ps") return SyncPath::kPs;
  return SyncPath::kRing;
}

FailureReason ReasonOf(const Status& s, SyncPath path) {
  switch (s.code()) {
    case StatusCode::kDeadlineExceeded:
      return FailureReason::kTimeout;
    case StatusCode::kAborted:
      return path == SyncPath::kPs ? FailureReason::kRejected : FailureReason::kMismatch;
    case StatusCode::kFailedPrecondition:
      return FailureReason::kMismatch;
    case StatusCode::kMembershipChanged:
      return FailureReason::kPeerDead;
    case StatusCode::kUnavailable: {
      const std::string& m = s.message();
      const bool dead =
          m.find(" died") != std::string::npos || m.find(" dead") != std::string::npos;
      return dead ? FailureReason::kPeerDead : FailureReason::kUnavailable;
    }
    default:
      return FailureReason::kOther;
  }
}

ClientMetrics::ClientMetrics(prometheus::Registry& registry) {
  auto& latency = prometheus::BuildHistogram()
                      .Name("gradsync_client_sync_latency_seconds")
                      .Help("Duration of a synchronisation operation, by op and path.")
                      .Register(registry);
  auto& requests = prometheus::BuildCounter()
                       .Name("gradsync_client_requests_total")
                       .Help("Synchronisation operations, by op and path.")
                       .Register(registry);
  for (int o = 0; o < kNumSyncOps; ++o) {
    for (int p = 0; p < kNumSyncPaths; ++p) {
      const prometheus::Labels labels{{"op", SyncOpLabel(static_cast<SyncOp>(o))},
                                      {"path", SyncPathLabel(static_cast<SyncPath>(p))}};
      latency_[o][p] = &latency.Add(labels, LatencyBuckets());
      requests_[o][p] = &requests.Add(labels);
    }
  }
  auto& failures = prometheus::BuildCounter()
                       .Name("gradsync_client_failures_total")
                       .Help("Synchronisation operations that failed, by reason.")
                       .Register(registry);
  for (int r = 0; r < kNumFailureReasons; ++r) {
    failures_[r] = &failures.Add({{"reason", FailureReasonLabel(static_cast<FailureReason>(r))}});
  }
  retries_ = &prometheus::BuildCounter()
                  .Name("gradsync_client_retries_total")
                  .Help("Messages sent again after no answer came in time.")
                  .Register(registry)
                  .Add({});
  auto& raw = prometheus::BuildCounter()
                  .Name("gradsync_client_raw_bytes_total")
                  .Help("Gradient bytes synchronised, before compression, by direction.")
                  .Register(registry);
  auto& wire = prometheus::BuildCounter()
                   .Name("gradsync_client_wire_bytes_total")
                   .Help("Gradient bytes synchronised, after compression, by direction.")
                   .Register(registry);
  raw_sent_ = &raw.Add({{"direction", "sent"}});
  raw_received_ = &raw.Add({{"direction", "received"}});
  wire_sent_ = &wire.Add({{"direction", "sent"}});
  wire_received_ = &wire.Add({{"direction", "received"}});
  in_flight_ = &prometheus::BuildGauge()
                    .Name("gradsync_client_buckets_in_flight")
                    .Help("Gradient buckets handed to the comm engine and not yet back.")
                    .Register(registry)
                    .Add({});
  device_bytes_ = &prometheus::BuildGauge()
                       .Name("gradsync_client_device_memory_bytes")
                       .Help("GPU memory gradsync holds in this process (CUDA gradients).")
                       .Register(registry)
                       .Add({});
  last_step_ = &prometheus::BuildGauge()
                    .Name("gradsync_client_last_completed_step")
                    .Help("Training steps whose gradients are synchronised.")
                    .Register(registry)
                    .Add({});
  world_size_ = &prometheus::BuildGauge()
                     .Name("gradsync_client_world_size")
                     .Help("Workers in this worker's membership epoch.")
                     .Register(registry)
                     .Add({});
  epoch_ = &prometheus::BuildGauge()
                .Name("gradsync_client_membership_epoch")
                .Help("This worker's membership epoch (0 until an elastic job loses a worker).")
                .Register(registry)
                .Add({});
  collectives_ = &prometheus::BuildGauge()
                      .Name("gradsync_client_collectives")
                      .Help(
                          "1 under the labels that say how this epoch's collectives go: path, "
                          "algorithm, lanes, ring order, same-host all-reduces.")
                      .Register(registry);
  recovery_ = &prometheus::BuildHistogram()
                   .Name("gradsync_client_recovery_seconds")
                   .Help("From a membership change to the ring re-formed for the new epoch.")
                   .Register(registry)
                   .Add({}, LatencyBuckets());
  join_ = &prometheus::BuildGauge()
               .Name("gradsync_client_join_seconds")
               .Help(
                   "A worker that joined a running job: from its start to its first "
                   "completed step (0 otherwise).")
               .Register(registry)
               .Add({});
  replication_lag_ =
      &prometheus::BuildHistogram()
           .Name("gradsync_client_embedding_replication_lag_seconds")
           .Help(
               "embedding_replicas: from the first holder's acknowledgement of a pushed part to "
               "the last's (the push is done at the last).")
           .Register(registry)
           .Add({}, LatencyBuckets());
}

void ClientMetrics::Record(SyncOp op, SyncPath path, double seconds, const Status& s) {
  const int o = static_cast<int>(op);
  const int p = static_cast<int>(path);
  requests_[o][p]->Increment();
  if (s.ok()) {
    latency_[o][p]->Observe(seconds);
  } else if (s.code() != StatusCode::kCancelled) {
    failures_[static_cast<int>(ReasonOf(s, path))]->Increment();
  }
}

void ClientMetrics::Traffic(uint64_t raw_sent, uint64_t wire_sent, uint64_t raw_received,
                            uint64_t wire_received) {
  raw_sent_->Increment(static_cast<double>(raw_sent));
  wire_sent_->Increment(static_cast<double>(wire_sent));
  raw_received_->Increment(static_cast<double>(raw_received));
  wire_received_->Increment(static_cast<double>(wire_received));
}

void ClientMetrics::SetCollectives(const std::map<std::string, std::string>& labels) {
  std::lock_guard<std::mutex> lock(collectives_mu_);
  prometheus::Gauge* now = &collectives_->Add(labels);
  if (collectives_now_ != nullptr && collectives_now_ != now)
    collectives_->Remove(collectives_now_);
  collectives_now_ = now;
  now->Set(1);
}

}  // namespace gradsync::client
