// Communicator::Impl and what it is made of: internal to the client library
// (client/communicator.cc: start, registration, MarkReady and the public
// API; communicator_sync.cc: buckets to the engine thread, Synchronize and
// the direct collectives; communicator_epoch.cc: failures and membership
// changes). The public interface is include/gradsync/communicator.h.
#ifndef GRADSYNC_CLIENT_COMMUNICATOR_IMPL_H_
#define GRADSYNC_CLIENT_COMMUNICATOR_IMPL_H_

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "client/bucket_compression.h"
#include "client/bucketer.h"
#include "client/client_metrics.h"
#include "client/cuda_device.h"
#include "client/device_gradients.h"
#include "client/elementwise.h"
#include "client/embedding_client.h"
#include "client/ps_client.h"
#include "client/ring.h"
#include "client/session.h"
#include "client/sync_backend.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "gradsync/communicator.h"
#include "wire/message.h"
#include "wire/rejected_metrics.h"

namespace gradsync::client {

struct SyncHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  Communicator::Callback callback;

  void Complete(const Status& s) {
    Callback cb;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      done = true;
      status = s;
      cb = std::move(callback);
    }
    cv.notify_all();
    if (cb) cb(s);
  }
  using Callback = Communicator::Callback;
};

// The Communicator's settings (Config), read once at Create.
struct CommOptions {
  // collectives (path, backend, ring_shm, ring_shm_allreduce, ring_order,
  // ring_lanes, ring_algorithm), ring (ring_chunk_bytes), ring_shm_bytes, ps
  // (and ps_shm, ps_shm_bytes),
  // cuda_device, op_timeout; compression_seed is set at Start.
  SyncBackendOptions sync;
  bool cuda_gradients = false;  // gradient_device=cuda
  size_t first_bucket_bytes = 0;
  size_t bucket_bytes = 0;
  int64_t metrics_base_port = 0;
  int64_t local_rank = -1;        // -1: the worker's rank
  uint64_t compression_seed = 0;  // 0: the job id
  int embedding_replicas = 1;     // holders of each embedding partition

  static StatusOr<CommOptions> FromConfig(const Config& config) {
    CommOptions o;
    GS_ASSIGN_OR_RETURN(o.sync.collectives, CollectiveSettings::FromConfig(config));
    GS_ASSIGN_OR_RETURN(std::string gradient_device, config.GetString("gradient_device", "cpu"));
    if (gradient_device != "cpu" && gradient_device != "cuda") {
      return InvalidArgumentError("gradient_device must be cpu or cuda, got '" + gradient_device +
                                  "'");
    }
    o.cuda_gradients = gradient_device == "cuda";
    GS_ASSIGN_OR_RETURN(int64_t first, config.GetInt("first_bucket_bytes", 1 << 20));
    GS_ASSIGN_OR_RETURN(int64_t bucket, config.GetInt("bucket_bytes", 25 << 20));
    GS_ASSIGN_OR_RETURN(int64_t timeout, config.GetInt("op_timeout_ms", 60000));
    GS_ASSIGN_OR_RETURN(int64_t chunk, config.GetInt("ring_chunk_bytes", 1 << 20));
    GS_ASSIGN_OR_RETURN(int64_t device, config.GetInt("cuda_device", -1));
    GS_ASSIGN_OR_RETURN(int64_t shm_bytes, config.GetInt("ring_shm_bytes", 16 << 20));
    GS_ASSIGN_OR_RETURN(o.metrics_base_port,
                        config.GetInt("metrics_base_port", kWorkerMetricsBasePort));
    GS_ASSIGN_OR_RETURN(o.local_rank, config.GetInt("local_rank", -1));
    GS_ASSIGN_OR_RETURN(int64_t replicas, config.GetInt("embedding_replicas", 1));
    if (replicas < 1 || replicas > 2) {
      return InvalidArgumentError("embedding_replicas must be 1 or 2, got " +
                                  std::to_string(replicas));
    }
    o.embedding_replicas = static_cast<int>(replicas);
    GS_ASSIGN_OR_RETURN(int64_t seed, config.GetInt("compression_seed", 0));
    o.compression_seed = static_cast<uint64_t>(seed);
    if (device < -1 || device > 1023) {
      return InvalidArgumentError("cuda_device must be a device index (or -1: the local rank)");
    }
    if (first <= 0 || bucket <= 0 || timeout <= 0 || chunk < 64 || shm_bytes < 4096 ||
        shm_bytes > (int64_t{1} << 30)) {
      return InvalidArgumentError(
          "first_bucket_bytes, bucket_bytes and op_timeout_ms must be positive, "
          "ring_chunk_bytes at least 64 and ring_shm_bytes within [4096, 1 GiB]");
    }
    o.sync.shm_link_bytes = static_cast<size_t>(shm_bytes);
    o.first_bucket_bytes = static_cast<size_t>(first);
    o.bucket_bytes = static_cast<size_t>(bucket);
    o.sync.op_timeout = Millis(timeout);
    o.sync.ring.chunk_bytes = static_cast<size_t>(chunk);
    o.sync.cuda_device = static_cast<int>(device);
    if (o.sync.collectives.way == SyncPath::kPs) {
      GS_ASSIGN_OR_RETURN(o.sync.ps, PsClientOptions::FromConfig(config));
      GS_ASSIGN_OR_RETURN(o.sync.ps_links, cluster::PsLinkOptions::FromConfig(config));
    }
    return o;
  }
};

class Communicator::Impl {
 public:
  Impl(std::unique_ptr<Session> session, CommOptions options,
       std::unique_ptr<BucketCompression> compression)
      : session_(std::move(session)),
        options_(std::move(options)),
        compression_(std::move(compression)),
        metrics_(process_metrics_.registry()),
        ring_rejected_(process_metrics_.registry(), "ring"),
        ps_rejected_(process_metrics_.registry(), "ps") {}
  ~Impl() { Shutdown(); }

  // `started`: when Create began (a joiner's time to join counts from it).
  Status Start(Deadline deadline, SteadyTime started);
  // `departing` (not empty): leaves the running job before its end, for
  // that reason (Communicator::Depart).
  void Shutdown(const std::string& departing = "");

  int rank() const { return session_->rank(); }
  int world_size() const { return session_->num_workers(); }
  uint32_t epoch() const { return session_->epoch(); }
  const char* backend() const {
    std::lock_guard<std::mutex> lock(mu_);
    return backend_->name();
  }
  // Elastic jobs: after a membership change, re-forms the backend for the
  // new epoch (on the engine thread) before the caller goes on; OK when
  // there was none.
  // After a membership change: the first call that is not the recovery
  // (`recovery`: AgreeOnStep) returns the change, once, so that the trainer
  // learns of it whatever it called; later calls (and the recovery) re-form
  // the backend for the adopted epoch.
  Status EnsureEpoch(Deadline deadline, bool recovery = false);

  StatusOr<TensorId> Register(const std::string& name, size_t n, DType dtype,
                              const std::vector<size_t>& shape);
  StatusOr<SyncHandle> MarkReady(TensorId id, void* data, Callback done, void* stream);
  // dst = src, each host memory or (with CUDA gradients) device memory.
  Status CopyUser(void* dst, const void* src, size_t bytes) {
    return bytes == 0 ? Status() : memory_->Copy(dst, src, bytes);
  }
  Status Synchronize(Deadline deadline);
  void SetNoSync(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    no_sync_depth_ += on ? 1 : -1;
  }
  Status Barrier(Deadline deadline);
  // Tells the backend the step its epoch goes on from (SyncBackend::ResumeAt),
  // after everything queued before.
  void ResumeAt(uint64_t completed);
  // Runs `op` on the comm engine thread after everything queued before it;
  // it is recorded in the metrics as `label`.
  // Runs `op` on the engine thread, in order with the buckets, on a buffer
  // of `staged_bytes` that the caller's data is copied into and out of.
  Status RunOnEngine(SyncOp label, size_t staged_bytes,
                     std::function<Status(Collectives&, uint64_t seq, uint8_t* staged)> op);
  // Communicator::PullRows / PushRows (client/communicator_embeddings.cc).
  Status PullRows(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n, uint64_t step,
                  float* out, Deadline deadline);
  Status PushRows(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n, const float* grads,
                  uint64_t step, Deadline deadline);
  EmbeddingClientStats embedding_stats() const;
  // One PullRows or PushRows into the metrics (embedding_mu_ held).
  void RecordRows(SyncOp op, SteadyTime start, const Status& s);
  CommunicatorStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    CommunicatorStats s = stats_;  // backend_ is swapped under mu_
    s.sent_bytes = backend_->SentBytes(s.wire_bytes);
    return s;
  }

 private:
  using Job = std::function<void()>;
  void EngineLoop();
  void Enqueue(Job job);  // requires mu_
  Status FinalizeLocked();
  void LaunchReadyLocked();
  void ReduceBucket(int bucket, uint64_t step);
  // The seed of the compressors' random draws: compression_seed, else the
  // job id (the same on every worker).
  uint64_t CompressionSeed() const {
    return options_.compression_seed != 0 ? options_.compression_seed : session_->job_id();
  }
  // Records the first failure; returns the handles to complete with it,
  // which the caller does after releasing mu_.
  std::vector<std::shared_ptr<SyncHandle::State>> FailLocked(const Status& why);
  void Fail(const Status& why);  // FailLocked, then completes the handles
  // An elastic job's failure that a membership change caused, as
  // MembershipChanged (waiting for the new epoch up to the scheduler's loss
  // deadline); any other status as it is.
  Status Classify(Status s);
  // On the engine thread: the backend for the adopted epoch, swapped in.
  Status Reform(Deadline deadline);
  Status EnterJoinedEpoch(Deadline deadline);
  // Releases a backend that another took the place of (after CloseLinks)
  // and keeps it while a send still points into it; destroys the earlier
  // ones that no send does any more.
  void Retire(std::unique_ptr<SyncBackend> backend);
  // Queues the ring's check that every rank registered the same tensors.
  void EnqueueLayoutCheckLocked();
  void ResetStepLocked();
  std::vector<wire::TensorSpecFields> LayoutLocked();
  // Each bucket's compressor spec (BucketCompression::SpecOf); after
  // FinalizeLocked.
  std::vector<std::pair<uint32_t, std::string>> BucketSpecsLocked();
  // The embedding client of the session's epoch, made on first use and
  // again in a new epoch. Requires embedding_mu_.
  StatusOr<EmbeddingClient*> EmbeddingsLocked(Deadline deadline);
  // Records one operation of the engine thread, and the retries since the last.
  void Record(SyncOp op, SyncPath path, SteadyTime start, const Status& s);

  std::unique_ptr<Session> session_;
  const CommOptions options_;
  // The sparse embedding tables' client (null until PullRows or PushRows),
  // and the counts of the clients before it; guarded by embedding_mu_.
  mutable std::mutex embedding_mu_;
  std::unique_ptr<EmbeddingClient> embeddings_;
  EmbeddingClientStats embedding_stats_;
  uint64_t embedding_resent_seen_ = 0;              // of embedding_stats().resent, in the metrics
  int cuda_device_ = 0;                             // cuda_device resolved at Start (cuda_device.h)
  std::unique_ptr<BucketCompression> compression_;  // engine thread after Finalize
  ProcessMetrics process_metrics_{"worker"};
  ClientMetrics metrics_;
  wire::RejectedMetrics ring_rejected_;
  wire::RejectedMetrics ps_rejected_;
  std::unique_ptr<BucketMemory> memory_;  // the buckets: host, or CUDA (gradient_device=cuda)
  std::unique_ptr<SyncBackend> backend_;  // set by Start; swapped under mu_
  // Backends of earlier epochs, released (SyncBackend::ReleaseRetired),
  // that failed sends still pointed into when last looked at (Retire).
  std::vector<std::unique_ptr<SyncBackend>> retired_backends_;  // engine thread only
  std::mutex reform_mu_;                                        // one re-form at a time
  SteadyTime membership_changed_at_;                            // guarded by mu_
  bool change_reported_ = true;  // the last change was returned to the trainer; guarded by mu_
  std::thread engine_;
  uint64_t seq_ = 0;          // engine thread only
  uint64_t resent_seen_ = 0;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;  // guarded by mu_
  bool stop_ = false;     // guarded by mu_
  Status failed_;         // guarded by mu_
  // Buffers of failed direct collectives that sends may still point into.
  std::vector<std::shared_ptr<std::vector<uint8_t>>> retired_;  // guarded by mu_
  Bucketer bucketer_;                                           // guarded by mu_
  bool finalized_ = false;                                      // guarded by mu_
  uint64_t step_ = 0;                                           // guarded by mu_
  int no_sync_depth_ = 0;                                       // guarded by mu_
  size_t next_launch_ = 0;                                      // guarded by mu_
  int64_t buckets_in_flight_ = 0;                               // guarded by mu_
  // The layout is checked before the first bucket of each epoch.
  bool layout_pending_ = false;  // guarded by mu_
  // A worker that joined a running job: when it started (until its first
  // completed step is recorded).
  std::optional<SteadyTime> joined_at_;  // guarded by mu_
  CommunicatorStats stats_;              // guarded by mu_
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_COMMUNICATOR_IMPL_H_
