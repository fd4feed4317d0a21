#include "client/communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "client/bucket_compression.h"
#include "client/bucketer.h"
#include "client/client_metrics.h"
#include "client/cuda_device.h"
#include "client/device_gradients.h"
#include "client/elementwise.h"
#include "client/ps_client.h"
#include "client/ring.h"
#include "client/session.h"
#include "client/sync_backend.h"
#include "common/logging.h"
#include "common/metrics.h"
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

SyncHandle::SyncHandle() : state_(std::make_shared<State>()) {}

Status SyncHandle::Wait(Deadline deadline) const {
  std::unique_lock<std::mutex> lock(state_->mu);
  auto done = [&] { return state_->done; };
  if (deadline.infinite()) {
    state_->cv.wait(lock, done);
  } else if (!state_->cv.wait_until(lock, deadline.at(), done)) {
    return DeadlineExceededError("gradient not synchronised before the deadline");
  }
  return state_->status;
}

bool SyncHandle::Done() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

namespace {

struct CommOptions {
  // path, backend, ring (ring_chunk_bytes, ring_shm, ring_shm_bytes), ps
  // (and ps_shm, ps_shm_bytes),
  // cuda_device, op_timeout; compression_seed is set at Start.
  SyncBackendOptions sync;
  bool cuda_gradients = false;  // gradient_device=cuda
  size_t first_bucket_bytes = 0;
  size_t bucket_bytes = 0;
  int64_t metrics_base_port = 0;
  int64_t local_rank = -1;        // -1: the worker's rank
  uint64_t compression_seed = 0;  // 0: the job id

  static StatusOr<CommOptions> FromConfig(const Config& config) {
    CommOptions o;
    GS_ASSIGN_OR_RETURN(o.sync.path, config.GetString("path", "allreduce"));
    GS_ASSIGN_OR_RETURN(o.sync.backend, config.GetString("backend", "ring"));
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
    GS_ASSIGN_OR_RETURN(o.sync.shm, config.GetBool("ring_shm", true));
    GS_ASSIGN_OR_RETURN(int64_t shm_bytes, config.GetInt("ring_shm_bytes", 16 << 20));
    GS_ASSIGN_OR_RETURN(o.metrics_base_port,
                        config.GetInt("metrics_base_port", kWorkerMetricsBasePort));
    GS_ASSIGN_OR_RETURN(o.local_rank, config.GetInt("local_rank", -1));
    GS_ASSIGN_OR_RETURN(int64_t seed, config.GetInt("compression_seed", 0));
    o.compression_seed = static_cast<uint64_t>(seed);
    if (o.sync.path != "allreduce" && o.sync.path != "ps") {
      return InvalidArgumentError("path must be allreduce or ps, got '" + o.sync.path + "'");
    }
    if (o.sync.backend != "ring" && o.sync.backend != "nccl") {
      return InvalidArgumentError("backend must be ring or nccl, got '" + o.sync.backend + "'");
    }
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
    if (o.sync.path == "ps") {
      GS_ASSIGN_OR_RETURN(o.sync.ps, PsClientOptions::FromConfig(config));
      GS_ASSIGN_OR_RETURN(o.sync.ps_links, cluster::PsLinkOptions::FromConfig(config));
    }
    return o;
  }
};

}  // namespace

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
    if (bytes == 0) return Status();
    if (device_ == nullptr) {
      std::memcpy(dst, src, bytes);
      return Status();
    }
    return device_->Copy(dst, src, bytes);
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
  // Queues the ring's check that every rank registered the same tensors.
  void EnqueueLayoutCheckLocked();
  void ResetStepLocked();
  std::vector<wire::TensorSpecFields> LayoutLocked();
  // Each bucket's compressor spec (BucketCompression::SpecOf); after
  // FinalizeLocked.
  std::vector<std::pair<uint32_t, std::string>> BucketSpecsLocked();
  // Records one operation of the engine thread, and the retries since the last.
  void Record(SyncOp op, SyncPath path, SteadyTime start, const Status& s);

  std::unique_ptr<Session> session_;
  const CommOptions options_;
  int cuda_device_ = 0;                             // cuda_device resolved at Start (cuda_device.h)
  std::unique_ptr<BucketCompression> compression_;  // engine thread after Finalize
  ProcessMetrics process_metrics_{"worker"};
  ClientMetrics metrics_;
  wire::RejectedMetrics ring_rejected_;
  wire::RejectedMetrics ps_rejected_;
  std::unique_ptr<DeviceGradients> device_;  // gradient_device=cuda
  std::unique_ptr<SyncBackend> backend_;     // set by Start; swapped under mu_
  // Backends of earlier epochs: failed sends may still point into them.
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

Status Communicator::Impl::Start(Deadline deadline, SteadyTime started) {
  const int r = session_->rank();
  process_metrics_.AddTransportRefusals(session_->refusals());
  if (options_.metrics_base_port > 0) {
    process_metrics_.ServeOrWarn(
        session_->host(),
        options_.metrics_base_port + (options_.local_rank >= 0 ? options_.local_rank : r));
  }
  if (options_.cuda_gradients || options_.sync.backend == "nccl") {
    GS_ASSIGN_OR_RETURN(cuda_device_, ResolveCudaDevice(options_.sync.cuda_device,
                                                        options_.local_rank, VisibleCudaDevices()));
  }
  if (options_.cuda_gradients) {
    GS_ASSIGN_OR_RETURN(device_, MakeDeviceGradients(cuda_device_));
  }
  if (session_->epoch() > 0) {
    GS_RETURN_IF_ERROR(EnterJoinedEpoch(deadline));
    std::lock_guard<std::mutex> lock(mu_);
    joined_at_ = started;
  }
  SyncBackendOptions backend = options_.sync;
  backend.cuda_device = cuda_device_;
  backend.compression_seed = CompressionSeed();
  GS_ASSIGN_OR_RETURN(backend_, MakeSyncBackend(
                                    backend, session_.get(), compression_.get(), device_.get(),
                                    &ring_rejected_, &ps_rejected_,
                                    [this] {
                                      std::lock_guard<std::mutex> lock(mu_);
                                      return stop_;
                                    },
                                    deadline));
  bucketer_ = Bucketer(options_.first_bucket_bytes, options_.bucket_bytes);
  metrics_.SetMembership(session_->epoch(), session_->num_workers());
  engine_ = std::thread([this] { EngineLoop(); });
  return Status();
}

// A worker that joined a running job enters its epoch's barrier with the
// members (after a later epoch, if one began meanwhile).
Status Communicator::Impl::EnterJoinedEpoch(Deadline deadline) {
  for (;;) {
    session_->AdoptEpoch();
    Status s = session_->EpochBarrier(deadline);
    if (s.code() != StatusCode::kMembershipChanged || deadline.Expired()) return s;
  }
}

void Communicator::Impl::Shutdown(const std::string& departing) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  // The scheduler first: the others re-form while this one winds down.
  if (!departing.empty()) session_->Leave(departing, /*departing=*/true);
  cv_.notify_all();  // the engine thread leaves once its queue is empty
  Fail(CancelledError("the communicator was shut down"));
  // An operation in flight ends at its deadline, or at once when the
  // transport goes away.
  session_->data().Shutdown();
  if (engine_.joinable()) engine_.join();
  session_->Leave("communicator shut down");
}

void Communicator::Impl::EngineLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void Communicator::Impl::Enqueue(Job job) {
  jobs_.push_back(std::move(job));
  cv_.notify_all();
}

std::vector<std::shared_ptr<SyncHandle::State>> Communicator::Impl::FailLocked(const Status& why) {
  std::vector<std::shared_ptr<SyncHandle::State>> pending;
  if (!failed_.ok()) return pending;
  failed_ = why;
  if (why.code() != StatusCode::kCancelled) {
    GS_LOG(ERROR) << "worker " << session_->rank() << ": " << why.ToString();
  }
  for (Bucket& b : bucketer_.buckets()) {
    for (TensorId id : b.tensors) {
      Tensor& t = bucketer_.tensor(id);
      if (t.handle) pending.push_back(std::move(t.handle));
      t.handle.reset();
    }
    b.in_flight = false;
  }
  buckets_in_flight_ = 0;
  metrics_.SetBucketsInFlight(0);
  cv_.notify_all();
  return pending;
}

void Communicator::Impl::Fail(const Status& why) {
  // The new epoch's rank and size are the trainer's to read as soon as it
  // sees the failure.
  if (why.code() == StatusCode::kMembershipChanged) session_->AdoptEpoch();
  std::vector<std::shared_ptr<SyncHandle::State>> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.ok() && why.code() == StatusCode::kMembershipChanged) {
      membership_changed_at_ = std::chrono::steady_clock::now();
      change_reported_ = false;
    }
    pending = FailLocked(why);
  }
  // Callbacks may call back into the Communicator: never under mu_.
  for (auto& h : pending) h->Complete(why);
}

StatusOr<TensorId> Communicator::Impl::Register(const std::string& name, size_t n, DType dtype,
                                                const std::vector<size_t>& shape) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finalized_) {
    return FailedPreconditionError("tensor '" + name +
                                   "' registered after the first MarkReady; register every "
                                   "tensor before training starts");
  }
  size_t product = shape.empty() ? n : 1;
  for (size_t d : shape) product *= d;
  if (product != n) {
    std::string dims;
    for (size_t d : shape) dims += (dims.empty() ? "" : " x ") + std::to_string(d);
    return InvalidArgumentError("tensor '" + name + "' has shape " + dims + " but " +
                                std::to_string(n) + " elements");
  }
  GS_ASSIGN_OR_RETURN(TensorId id, bucketer_.Add(name, n, dtype));
  if (shape.size() >= 2) {
    Tensor& t = bucketer_.tensor(id);
    t.rows = shape[0];
    t.cols = n / shape[0];
  }
  return id;
}

Status Communicator::Impl::FinalizeLocked() {
  if (finalized_) return Status();
  if (bucketer_.tensors().empty()) return FailedPreconditionError("no tensor is registered");
  bucketer_.Build(/*host_buffers=*/device_ == nullptr);
  if (device_ != nullptr) {
    std::vector<size_t> bytes;  // by bucket id, which is the bucket's index
    for (const Bucket& b : bucketer_.buckets()) bytes.push_back(b.bytes());
    GS_RETURN_IF_ERROR(device_->Allocate(bytes));
  }
  std::vector<BucketInfo> infos;
  for (const Bucket& b : bucketer_.buckets()) {
    BucketInfo info{b.id, b.dtype, b.bytes(), {}, {}};
    for (TensorId id : b.tensors) {
      const Tensor& t = bucketer_.tensor(id);
      info.tensor_names.push_back(t.name);
      info.tensors.push_back(BucketTensor{t.offset, t.count, t.rows, t.cols});
    }
    infos.push_back(std::move(info));
  }
  GS_RETURN_IF_ERROR(compression_->Assign(infos));
  finalized_ = true;
  // On the engine thread, before any bucket (the PS client compresses each
  // partition itself, so that the shards decompress what they own).
  Enqueue([this, specs = BucketSpecsLocked()] {
    Status s = backend_->PrepareBuckets(specs);
    if (!s.ok()) Fail(s);
  });
  layout_pending_ = true;
  return Status();
}

void Communicator::Impl::EnqueueLayoutCheckLocked() {
  layout_pending_ = false;
  Enqueue([this, layout = LayoutLocked()] {
    Status s = backend_->CheckLayout(layout, Deadline::After(options_.sync.op_timeout));
    if (!s.ok()) Fail(Classify(s));
  });
}

StatusOr<SyncHandle> Communicator::Impl::MarkReady(TensorId id, void* data, Callback done,
                                                   void* stream) {
  if (data == nullptr) return InvalidArgumentError("MarkReady needs the gradient's data");
  GS_RETURN_IF_ERROR(EnsureEpoch(Deadline::After(options_.sync.op_timeout)));
  if (stream != nullptr && device_ == nullptr) {
    return InvalidArgumentError(
        "MarkReady got a CUDA stream, but this communicator's gradients "
        "are host memory (set gradient_device=cuda)");
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  if (id < 0 || static_cast<size_t>(id) >= bucketer_.tensors().size()) {
    return InvalidArgumentError("tensor id " + std::to_string(id) + " is not registered");
  }
  GS_RETURN_IF_ERROR(FinalizeLocked());
  if (layout_pending_) EnqueueLayoutCheckLocked();
  Tensor& t = bucketer_.tensor(id);
  Bucket& b = bucketer_.buckets()[static_cast<size_t>(t.bucket)];
  if (t.marked) {
    return FailedPreconditionError("tensor '" + t.name + "' was already marked ready in step " +
                                   std::to_string(step_));
  }
  // The bucket's previous reduction must be done with its buffer.
  cv_.wait(lock, [&] { return !b.in_flight || !failed_.ok(); });
  if (!failed_.ok()) return failed_;
  if (device_ != nullptr)
    GS_RETURN_IF_ERROR(device_->CheckPointer(data, "tensor '" + t.name + "'"));
  t.marked = true;
  const bool add = t.holds_sum;
  const size_t offset = t.offset * DTypeSize(t.dtype);
  uint8_t* region = b.data();  // null for CUDA gradients
  lock.unlock();
  if (device_ != nullptr) {
    // Queued on gradsync's stream after the trainer's work on `stream`.
    Status s = device_->Stage(t.bucket, offset, data, t.count, t.dtype, add, stream);
    if (!s.ok()) {
      Fail(s);
      return s;
    }
  } else if (add) {
    AddInto(region + offset, static_cast<const uint8_t*>(data), t.count, t.dtype);
  } else {
    std::memcpy(region + offset, data, t.count * DTypeSize(t.dtype));
  }
  SyncHandle handle;
  handle.state_->callback = std::move(done);
  lock.lock();
  if (!failed_.ok()) {
    lock.unlock();
    handle.state_->Complete(failed_);
    return handle;
  }
  if (no_sync_depth_ > 0) {
    t.holds_sum = true;
    if (device_ != nullptr) {
      // The addition into the bucket still reads `data` on the GPU: the
      // handle completes once it has.
      Enqueue([this, state = handle.state_, bucket = t.bucket] {
        state->Complete(device_->WaitStaged(bucket, Deadline::After(options_.sync.op_timeout)));
      });
      return handle;
    }
    lock.unlock();
    handle.state_->Complete(Status());
    return handle;
  }
  t.holds_sum = false;
  t.data = data;
  t.handle = handle.state_;
  if (--b.pending == 0) LaunchReadyLocked();
  return handle;
}

// Buckets go to the engine strictly in bucket order, the same on every rank.
void Communicator::Impl::LaunchReadyLocked() {
  auto& buckets = bucketer_.buckets();
  while (next_launch_ < buckets.size() && buckets[next_launch_].pending == 0) {
    buckets[next_launch_].in_flight = true;
    metrics_.SetBucketsInFlight(++buckets_in_flight_);
    const int index = static_cast<int>(next_launch_++);
    const uint64_t step = step_;
    Enqueue([this, index, step] { ReduceBucket(index, step); });
  }
}

void Communicator::Impl::ReduceBucket(int index, uint64_t step) {
  Bucket* b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return;  // its handles were completed with the failure
    b = &bucketer_.buckets()[static_cast<size_t>(index)];
  }
  const OpTag tag{step, b->id, seq_++, b->names_hash};
  const SteadyTime start = std::chrono::steady_clock::now();
  const Deadline deadline = Deadline::After(options_.sync.op_timeout);
  BucketCompression::Traffic traffic{b->bytes(), b->bytes(), false};
  Status s;
  if (device_ == nullptr) {
    s = backend_->ReduceHost(*b, b->data(), tag, deadline, &traffic);
  } else {
    auto host = [&](uint8_t* data, BucketCompression::Traffic* t) {
      return backend_->ReduceHost(*b, data, tag, deadline, t);
    };
    s = backend_->ReduceDevice(*device_, index, *b, tag, deadline, &traffic, host);
  }
  Record(backend_->BucketOp(traffic), backend_->path(), start, s);
  if (!s.ok()) return Fail(Classify(s));
  metrics_.Traffic(b->bytes(), traffic.sent, b->bytes(), traffic.received);
  // The bucket is in flight: its tensors' destinations and handles are this
  // thread's until it is handed back, so the copies need no lock. A failure
  // meanwhile (Shutdown, a dead peer) completed the handles with it and gave
  // the tensors back to the caller: nothing is copied into them then.
  std::vector<std::shared_ptr<SyncHandle::State>> handles;
  std::vector<Tensor*> tensors;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok() || !b->in_flight) return;
    for (TensorId id : b->tensors) {
      Tensor* t = &bucketer_.tensor(id);
      handles.push_back(std::move(t->handle));
      t->handle.reset();
      tensors.push_back(t);
    }
  }
  const size_t es = DTypeSize(b->dtype);
  if (device_ == nullptr) {
    for (Tensor* t : tensors) std::memcpy(t->data, b->data() + t->offset * es, t->count * es);
  } else {
    Status copied;
    for (Tensor* t : tensors) {
      if (copied.ok()) copied = device_->Unstage(index, t->offset * es, t->data, t->count * es);
    }
    if (copied.ok()) copied = device_->Wait(deadline);
    if (!copied.ok()) {
      for (auto& h : handles) {
        if (h) h->Complete(copied);
      }
      return Fail(copied);
    }
  }
  // Callbacks run before Synchronize can see the bucket finished.
  for (auto& h : handles) {
    if (h) h->Complete(Status());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (b->in_flight) metrics_.SetBucketsInFlight(--buckets_in_flight_);  // else failed meanwhile
    b->in_flight = false;
    b->pending = static_cast<int>(b->tensors.size());
    stats_.buckets_reduced++;
    stats_.bytes_reduced += b->bytes();
    stats_.wire_bytes += traffic.sent;
  }
  cv_.notify_all();
}

void Communicator::Impl::Record(SyncOp op, SyncPath path, SteadyTime start, const Status& s) {
  metrics_.Record(
      op, path, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), s);
  const uint64_t resent = backend_->Resent();
  metrics_.Retried(resent - resent_seen_);
  resent_seen_ = resent;
}

Status Communicator::Impl::Synchronize(Deadline deadline) {
  // A membership change is the step's outcome (its gradients were
  // dropped): the trainer's next call re-forms.
  const SteadyTime start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (!failed_.ok()) {
    change_reported_ = true;
    return failed_;
  }
  std::vector<std::string> missing;
  for (const Tensor& t : bucketer_.tensors()) {
    if (!t.marked) missing.push_back("'" + t.name + "'");
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) list += " and " + std::to_string(missing.size() - 5) + " more";
    return FailedPreconditionError("step " + std::to_string(step_) +
                                   ": tensors never marked ready: " + list);
  }
  auto& buckets = bucketer_.buckets();
  if (no_sync_depth_ == 0) {
    // Every tensor is marked, so every bucket was launched
    // (next_launch_ == buckets.size()); wait for the last to come back.
    auto done = [&] {
      if (!failed_.ok()) return true;
      return std::none_of(buckets.begin(), buckets.end(),
                          [](const Bucket& b) { return b.in_flight; });
    };
    if (deadline.infinite()) {
      cv_.wait(lock, done);
    } else if (!cv_.wait_until(lock, deadline.at(), done)) {
      return DeadlineExceededError("step " + std::to_string(step_) +
                                   ": gradients not synchronised before the deadline");
    }
    if (!failed_.ok()) {
      change_reported_ = true;
      return failed_;
    }
    next_launch_ = 0;
    ++step_;
    stats_.steps++;
    metrics_.SetLastCompletedStep(stats_.steps);
    if (joined_at_) {
      metrics_.Joined(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - *joined_at_).count());
      joined_at_.reset();
    }
    stats_.last_sync_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  for (Tensor& t : bucketer_.tensors()) t.marked = false;
  return Status();
}

Status Communicator::Impl::Barrier(Deadline deadline) {
  GS_RETURN_IF_ERROR(EnsureEpoch(deadline));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return failed_;
  }
  const SteadyTime start = std::chrono::steady_clock::now();
  Status s = session_->Barrier(deadline);
  metrics_.Record(SyncOp::kBarrier, backend_->path(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                  s);
  return s;
}

Status Communicator::Impl::RunOnEngine(SyncOp label, size_t staged_bytes,
                                       std::function<Status(Collectives&, uint64_t, uint8_t*)> op) {
  // The operation runs on a copy: the sends of an operation that fails may
  // still point into its buffer after the call returned, when the caller's
  // buffer is the caller's again. A failed operation's copy is kept.
  GS_RETURN_IF_ERROR(EnsureEpoch(Deadline::After(options_.sync.op_timeout)));
  // With CUDA gradients and a backend that takes device memory (NCCL) the
  // copy is device memory of the communicator's, reused by the next
  // operation (a failed one aborted NCCL, which touches it no more).
  auto staged = std::make_shared<std::vector<uint8_t>>();
  auto result = std::make_shared<std::promise<Status>>();
  std::future<Status> done = result->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return failed_;
    if (stop_) return CancelledError("the communicator was shut down");
    Enqueue([this, label, op = std::move(op), result, staged, staged_bytes] {
      const SteadyTime start = std::chrono::steady_clock::now();
      Collectives& collectives = backend_->direct();
      StatusOr<uint8_t*> buffer = static_cast<uint8_t*>(nullptr);
      if (device_ != nullptr && collectives.takes_device_memory()) {
        buffer = device_->Scratch(staged_bytes);
      } else {
        staged->resize(staged_bytes);
        buffer = staged->data();
      }
      Status s = buffer.ok() ? op(collectives, seq_++, *buffer) : buffer.status();
      Record(label, backend_->direct_path(), start, s);
      if (!s.ok()) {
        s = Classify(s);
        Fail(s);
        std::lock_guard<std::mutex> lock(mu_);
        retired_.push_back(staged);
      }
      result->set_value(s);
    });
  }
  return done.get();  // the engine runs every job queued before it stops
}

std::vector<std::pair<uint32_t, std::string>> Communicator::Impl::BucketSpecsLocked() {
  std::vector<std::pair<uint32_t, std::string>> specs;
  for (const Bucket& b : bucketer_.buckets()) specs.emplace_back(b.id, compression_->SpecOf(b.id));
  return specs;
}

std::vector<wire::TensorSpecFields> Communicator::Impl::LayoutLocked() {
  std::vector<wire::TensorSpecFields> layout;
  for (const Tensor& t : bucketer_.tensors()) {
    layout.push_back({t.name, t.count, static_cast<wire::DType>(t.dtype)});
  }
  return layout;
}

Status Communicator::Impl::Classify(Status s) {
  if (s.ok() || s.code() == StatusCode::kCancelled || s.code() == StatusCode::kMembershipChanged ||
      !session_->elastic()) {
    return s;
  }
  // A neighbour's abort, or a send to the lost worker, can fail an
  // operation before this worker hears of the new epoch.
  for (const Deadline until = Deadline::After(session_->loss_deadline()); !until.Expired();) {
    Status changed = session_->MembershipStatus();
    if (!changed.ok()) return changed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return s;
}

Status Communicator::Impl::EnsureEpoch(Deadline deadline, bool recovery) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.code() != StatusCode::kMembershipChanged) return Status();
    if (!recovery && !change_reported_) {
      change_reported_ = true;
      return failed_;
    }
    change_reported_ = true;
  }
  // A handle's callback runs on the engine thread: it re-forms in place.
  if (std::this_thread::get_id() == engine_.get_id()) return Reform(deadline);
  std::lock_guard<std::mutex> one_at_a_time(reform_mu_);
  auto result = std::make_shared<std::promise<Status>>();
  std::future<Status> done = result->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.code() != StatusCode::kMembershipChanged) return failed_;  // re-formed meanwhile
    if (stop_) return CancelledError("the communicator was shut down");
    Enqueue([this, deadline, result] { result->set_value(Reform(deadline)); });
  }
  return done.get();
}

void Communicator::Impl::ResumeAt(uint64_t completed) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> resumed = done->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    Enqueue([this, completed, done] {
      backend_->ResumeAt(completed);  // swapped on this thread only
      done->set_value();
    });
  }
  resumed.wait();
}

Status Communicator::Impl::Reform(Deadline deadline) {
  const SteadyTime start = std::chrono::steady_clock::now();
  Status s;
  while (backend_->CanReform()) {
    const uint32_t epoch = session_->AdoptEpoch();
    backend_->CloseLinks();
    s = session_->EpochBarrier(deadline);
    if (s.ok()) s = session_->MembershipStatus();  // a later epoch began meanwhile
    StatusOr<std::unique_ptr<SyncBackend>> next = InternalError("no backend was made");
    if (s.ok()) {
      SyncBackendOptions backend = options_.sync;
      backend.cuda_device = cuda_device_;
      backend.compression_seed = CompressionSeed();
      next = MakeSyncBackend(
          backend, session_.get(), compression_.get(), device_.get(), &ring_rejected_,
          &ps_rejected_, [] { return false; }, deadline);
      s = next.status();
    }
    if (s.ok()) {  // the buckets keep their compression in the new backend
      std::vector<std::pair<uint32_t, std::string>> specs;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (finalized_) specs = BucketSpecsLocked();
      }
      if (!specs.empty()) s = (*next)->PrepareBuckets(specs);
    }
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      retired_backends_.push_back(std::move(backend_));
      backend_ = std::move(*next);
      ResetStepLocked();
      const auto now = std::chrono::steady_clock::now();
      metrics_.SetMembership(epoch, session_->num_workers());
      metrics_.Recovered(std::chrono::duration<double>(now - membership_changed_at_).count());
      GS_LOG(WARNING) << "epoch " << epoch << ": re-formed " << backend_->name() << " as worker "
                      << session_->rank() << " of " << session_->num_workers() << " in "
                      << std::chrono::duration<double>(now - start).count() << " s";
      return Status();
    }
    if (next.ok()) {
      (*next)->CloseLinks();
      retired_backends_.push_back(std::move(*next));
    }
    if (s.code() != StatusCode::kMembershipChanged || deadline.Expired()) break;
  }
  if (s.ok()) {
    s = UnimplementedError(std::string("after a membership change backend=ring and path=ps "
                                       "re-form, not backend=") +
                           backend_->name());
  }
  std::lock_guard<std::mutex> lock(mu_);
  failed_ = s;  // no handle is pending: the change completed them all
  return s;
}

// A step that failed is redone from its start: every tensor is marked
// again, every bucket goes out again.
void Communicator::Impl::ResetStepLocked() {
  failed_ = Status();
  step_ = 0;
  seq_ = 0;
  next_launch_ = 0;
  buckets_in_flight_ = 0;
  metrics_.SetBucketsInFlight(0);
  for (Bucket& b : bucketer_.buckets()) {
    b.in_flight = false;
    b.pending = static_cast<int>(b.tensors.size());
  }
  for (Tensor& t : bucketer_.tensors()) {
    t.marked = false;
    t.holds_sum = false;
    t.handle.reset();
  }
  // Checked again with the new epoch's ring, at its first bucket: a worker
  // that joined checks it there too.
  layout_pending_ = finalized_;
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() { Shutdown(); }

StatusOr<std::unique_ptr<Communicator>> Communicator::Create(const Config& config,
                                                             Deadline deadline) {
  const SteadyTime started = std::chrono::steady_clock::now();
  GS_ASSIGN_OR_RETURN(CommOptions options, CommOptions::FromConfig(config));
  GS_ASSIGN_OR_RETURN(auto compression, BucketCompression::FromConfig(config));
  // The data port takes the ring's messages only.
  GS_ASSIGN_OR_RETURN(std::unique_ptr<Session> session,
                      Session::Join(config, deadline, RingFrameBytes(options.sync.ring)));
  auto impl =
      std::make_unique<Impl>(std::move(session), std::move(options), std::move(compression));
  GS_RETURN_IF_ERROR(impl->Start(deadline, started));
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

int Communicator::rank() const { return impl_->rank(); }
int Communicator::world_size() const { return impl_->world_size(); }
uint32_t Communicator::epoch() const { return impl_->epoch(); }
const char* Communicator::backend() const { return impl_->backend(); }

StatusOr<TensorId> Communicator::RegisterTensor(const std::string& name, size_t num_elements,
                                                DType dtype) {
  return impl_->Register(name, num_elements, dtype, {});
}

StatusOr<TensorId> Communicator::RegisterTensor(const std::string& name, size_t num_elements,
                                                DType dtype, const std::vector<size_t>& shape) {
  return impl_->Register(name, num_elements, dtype, shape);
}

StatusOr<SyncHandle> Communicator::MarkReady(TensorId id, void* data, Callback done, void* stream) {
  return impl_->MarkReady(id, data, std::move(done), stream);
}

Status Communicator::Synchronize(Deadline deadline) { return impl_->Synchronize(deadline); }

Communicator::NoSync Communicator::StartNoSync() {
  impl_->SetNoSync(true);
  return NoSync(this);
}

Communicator::NoSync::~NoSync() {
  if (comm_ != nullptr) comm_->impl_->SetNoSync(false);
}

Status Communicator::Barrier(Deadline deadline) { return impl_->Barrier(deadline); }

namespace {
constexpr uint32_t kDirectBucket = 0xFFFFFFFFu;
}  // namespace

Status Communicator::Broadcast(void* data, size_t num_elements, DType dtype, int root,
                               Deadline deadline) {
  const size_t bytes = num_elements * DTypeSize(dtype);
  return impl_->RunOnEngine(
      SyncOp::kBroadcast, bytes, [=](Collectives& c, uint64_t seq, uint8_t* staged) {
        GS_RETURN_IF_ERROR(impl_->CopyUser(staged, data, bytes));
        GS_RETURN_IF_ERROR(
            c.Broadcast(staged, bytes, root, OpTag{0, kDirectBucket, seq, num_elements}, deadline));
        GS_RETURN_IF_ERROR(impl_->CopyUser(data, staged, bytes));
        return Status();
      });
}

Status Communicator::AllReduce(void* data, size_t num_elements, DType dtype, ReduceOp op,
                               Deadline deadline) {
  const size_t bytes = num_elements * DTypeSize(dtype);
  return impl_->RunOnEngine(
      SyncOp::kAllReduce, bytes, [=](Collectives& c, uint64_t seq, uint8_t* staged) {
        GS_RETURN_IF_ERROR(impl_->CopyUser(staged, data, bytes));
        GS_RETURN_IF_ERROR(c.AllReduce(staged, num_elements, dtype, op,
                                       OpTag{0, kDirectBucket, seq, 0}, deadline));
        GS_RETURN_IF_ERROR(impl_->CopyUser(data, staged, bytes));
        return Status();
      });
}

Status Communicator::AllGather(const void* in, size_t bytes, void* out, Deadline deadline) {
  GS_RETURN_IF_ERROR(impl_->EnsureEpoch(deadline));
  const int world = world_size();
  const size_t gathered = bytes * static_cast<size_t>(world);
  return impl_->RunOnEngine(
      SyncOp::kAllGather, bytes + gathered, [=](Collectives& c, uint64_t seq, uint8_t* staged) {
        if (c.world_size() != world) {  // another epoch began meanwhile
          return MembershipChangedError("the world size changed from " + std::to_string(world) +
                                        " to " + std::to_string(c.world_size()));
        }
        GS_RETURN_IF_ERROR(impl_->CopyUser(staged, in, bytes));
        GS_RETURN_IF_ERROR(
            c.AllGather(staged, bytes, staged + bytes, OpTag{0, kDirectBucket, seq, 0}, deadline));
        GS_RETURN_IF_ERROR(impl_->CopyUser(out, staged + bytes, gathered));
        return Status();
      });
}

StatusOr<Communicator::ResumePoint> Communicator::AgreeOnStep(uint64_t completed_steps,
                                                              Deadline deadline) {
  GS_RETURN_IF_ERROR(impl_->EnsureEpoch(deadline, /*recovery=*/true));
  std::vector<uint64_t> steps(static_cast<size_t>(world_size()));
  GS_RETURN_IF_ERROR(AllGather(&completed_steps, sizeof(uint64_t), steps.data(), deadline));
  ResumePoint point;
  for (size_t r = 0; r < steps.size(); ++r) {
    if (steps[r] > point.step) point = ResumePoint{steps[r], static_cast<int>(r)};
  }
  impl_->ResumeAt(point.step);
  return point;
}

CommunicatorStats Communicator::stats() const { return impl_->stats(); }
void Communicator::Shutdown() { impl_->Shutdown(); }
void Communicator::Depart(const std::string& reason) {
  impl_->Shutdown(reason.empty() ? "departed" : reason);
}

}  // namespace gradsync::client
