// A worker's Prometheus metrics, resolved once at setup so that recording
// an operation allocates nothing:
//   gradsync_client_sync_latency_seconds{op,path}  histogram (LatencyBuckets)
//   gradsync_client_requests_total{op,path}        operations started
//   gradsync_client_failures_total{reason}         timeout, peer_dead, mismatch,
//                                                  rejected, unavailable, other
//   gradsync_client_retries_total                  messages sent again
//   gradsync_client_raw_bytes_total{direction}     gradient bytes before compression
//   gradsync_client_wire_bytes_total{direction}    the same after compression
//   gradsync_client_buckets_in_flight              buckets handed to the engine
//   gradsync_client_last_completed_step            steps synchronised
//   gradsync_client_world_size                     workers in this worker's epoch
//   gradsync_client_membership_epoch               its membership epoch (elastic jobs)
//   gradsync_client_collectives{path,algorithm,lanes,order,same_host}  1: how
//                                                  this epoch's collectives go
//                                                  (client/collective_plan.h)
//   gradsync_client_recovery_seconds               histogram: from a membership
//                                                  change to the re-formed ring
//   gradsync_client_join_seconds                   a worker that joined a running
//                                                  job: from its start to its
//                                                  first completed step
//   gradsync_client_embedding_replication_lag_seconds  histogram: with
//                                                  embedding_replicas, from the
//                                                  first holder's ack of a pushed
//                                                  part to the last's
// op: push, pull, push_pull, allreduce, allgather, broadcast, barrier,
// pull_rows, push_rows (the sparse embedding tables' rows, path ps);
// path: ring, nccl, ps; direction: sent, received. raw / wire of `sent` is
// the compression ratio.
//
// Thread-safety: every method is thread-safe.
#ifndef GRADSYNC_CLIENT_CLIENT_METRICS_H_
#define GRADSYNC_CLIENT_CLIENT_METRICS_H_

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "common/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace gradsync::client {

enum class SyncOp {
  kPush,
  kPull,
  kPushPull,
  kAllReduce,
  kAllGather,
  kBroadcast,
  kBarrier,
  kPullRows,
  kPushRows
};
constexpr int kNumSyncOps = 9;
enum class SyncPath { kRing, kNccl, kPs };
constexpr int kNumSyncPaths = 3;
enum class FailureReason { kTimeout, kPeerDead, kMismatch, kRejected, kUnavailable, kOther };
constexpr int kNumFailureReasons = 6;

const char* SyncOpLabel(SyncOp op);
const char* SyncPathLabel(SyncPath path);
const char* FailureReasonLabel(FailureReason reason);
// "ring", "nccl" or "ps" (a Collectives name) to its path; ring otherwise.
SyncPath SyncPathOf(const std::string& backend_name);
// The reason an operation on `path` failed with `s`. A peer's refusal on
// the PS path arrives as Aborted (rejected); on the ring, Aborted and
// FailedPrecondition are ranks that disagree (mismatch); Unavailable
// naming a dead node is peer_dead, and so is an elastic job's membership
// change (a worker was lost).
FailureReason ReasonOf(const Status& s, SyncPath path);

class ClientMetrics {
 public:
  explicit ClientMetrics(prometheus::Registry& registry);

  // One operation that took `seconds`; `s` not OK counts a failure by
  // reason, except Cancelled (a shutdown).
  void Record(SyncOp op, SyncPath path, double seconds, const Status& s);
  void Traffic(uint64_t raw_sent, uint64_t wire_sent, uint64_t raw_received,
               uint64_t wire_received);
  void Retried(uint64_t n) { retries_->Increment(static_cast<double>(n)); }
  void SetBucketsInFlight(int64_t n) { in_flight_->Set(static_cast<double>(n)); }
  void SetDeviceBytes(size_t n) { device_bytes_->Set(static_cast<double>(n)); }
  void SetLastCompletedStep(uint64_t step) { last_step_->Set(static_cast<double>(step)); }
  void SetMembership(uint32_t epoch, int world_size) {
    epoch_->Set(static_cast<double>(epoch));
    world_size_->Set(static_cast<double>(world_size));
  }
  // The plan's labels (CollectivePlan::Labels) on gradsync_client_collectives,
  // in place of the last epoch's.
  void SetCollectives(const std::map<std::string, std::string>& labels);
  void Recovered(double seconds) { recovery_->Observe(seconds); }
  void Joined(double seconds) { join_->Set(seconds); }
  prometheus::Histogram& recovery() { return *recovery_; }  // for tests
  prometheus::Histogram& replication_lag() { return *replication_lag_; }

  // For tests.
  prometheus::Histogram& latency(SyncOp op, SyncPath path) {
    return *latency_[static_cast<int>(op)][static_cast<int>(path)];
  }
  prometheus::Counter& failures(FailureReason r) { return *failures_[static_cast<int>(r)]; }

 private:
  std::array<std::array<prometheus::Histogram*, kNumSyncPaths>, kNumSyncOps> latency_{};
  std::array<std::array<prometheus::Counter*, kNumSyncPaths>, kNumSyncOps> requests_{};
  std::array<prometheus::Counter*, kNumFailureReasons> failures_{};
  prometheus::Counter* retries_ = nullptr;
  prometheus::Counter* raw_sent_ = nullptr;
  prometheus::Counter* raw_received_ = nullptr;
  prometheus::Counter* wire_sent_ = nullptr;
  prometheus::Counter* wire_received_ = nullptr;
  prometheus::Gauge* in_flight_ = nullptr;
  prometheus::Gauge* device_bytes_ = nullptr;
  prometheus::Gauge* last_step_ = nullptr;
  prometheus::Gauge* world_size_ = nullptr;
  prometheus::Gauge* epoch_ = nullptr;
  prometheus::Family<prometheus::Gauge>* collectives_ = nullptr;
  prometheus::Gauge* collectives_now_ = nullptr;  // guarded by collectives_mu_
  std::mutex collectives_mu_;
  prometheus::Histogram* recovery_ = nullptr;
  prometheus::Gauge* join_ = nullptr;
  prometheus::Histogram* replication_lag_ = nullptr;
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_CLIENT_METRICS_H_
