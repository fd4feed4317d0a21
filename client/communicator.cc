#include "gradsync/communicator.h"

#include <cstring>

#include "client/communicator_impl.h"

namespace gradsync::client {

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

Status Communicator::Impl::Start(Deadline deadline, SteadyTime started) {
  const int r = session_->rank();
  process_metrics_.AddTransportRefusals(session_->refusals());
  if (options_.metrics_base_port > 0) {
    process_metrics_.ServeOrWarn(
        session_->host(),
        options_.metrics_base_port + (options_.local_rank >= 0 ? options_.local_rank : r));
  }
  if (options_.cuda_gradients || options_.sync.collectives.way == SyncPath::kNccl) {
    GS_ASSIGN_OR_RETURN(cuda_device_, ResolveCudaDevice(options_.sync.cuda_device,
                                                        options_.local_rank, VisibleCudaDevices()));
  }
  if (options_.cuda_gradients) {
    GS_ASSIGN_OR_RETURN(memory_, MakeDeviceGradients(cuda_device_));
  } else {
    memory_ = MakeHostBuckets();
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
                                    backend, session_.get(), compression_.get(), memory_.get(),
                                    &ring_rejected_, &ps_rejected_,
                                    [this] {
                                      std::lock_guard<std::mutex> lock(mu_);
                                      return stop_;
                                    },
                                    deadline));
  bucketer_ = Bucketer(options_.first_bucket_bytes, options_.bucket_bytes);
  metrics_.SetMembership(session_->epoch(), session_->num_workers());
  metrics_.SetCollectives(backend_->plan().Labels());
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
  std::string leaving = departing;
  wire::ErrorCode failure = wire::ErrorCode::Unknown;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    // Shut down after a failure of its own (a trainer that ends on the
    // error): this worker leaves as one that departs, so that the job hears
    // of it at once rather than at its operations' deadlines.
    if (leaving.empty() && !failed_.ok() && failed_.code() != StatusCode::kCancelled &&
        failed_.code() != StatusCode::kMembershipChanged) {
      leaving = "its communicator failed: " + failed_.ToString();
      failure = wire::FailureCode(failed_);
    }
  }
  // The scheduler first: the others re-form while this one winds down.
  if (!leaving.empty()) session_->Leave(leaving, /*departing=*/true, failure);
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
  bucketer_.Build();
  std::vector<size_t> bytes;  // by bucket id, which is the bucket's index
  for (const Bucket& b : bucketer_.buckets()) bytes.push_back(b.bytes());
  GS_RETURN_IF_ERROR(memory_->Allocate(bytes));
  if (memory_->device()) metrics_.SetDeviceBytes(memory_->DeviceBytes());
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
  if (stream != nullptr && !memory_->device()) {
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
  GS_RETURN_IF_ERROR(memory_->CheckPointer(data, "tensor '" + t.name + "'"));
  t.marked = true;
  const bool add = t.holds_sum;
  // Under NoSync each handle waits for its own copy: copied at once.
  // Otherwise gathered, and packed at the bucket's last tensor (unless
  // another thread marks one of its tensors meanwhile: then the bucket's
  // reduction packs what is left).
  using Staging = BucketMemory::Staging;
  const Staging how = no_sync_depth_ > 0 ? Staging::kNow
                      : b.pending == 1   ? Staging::kGatherLast
                                         : Staging::kGather;
  const size_t offset = t.offset * DTypeSize(t.dtype);
  lock.unlock();
  // On a device, queued on gradsync's stream after the trainer's work on
  // `stream`; in host memory, copied now.
  Status staged = memory_->Stage(t.bucket, offset, data, t.count, t.dtype, add, stream, how);
  if (!staged.ok()) {
    Fail(staged);
    return staged;
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
    if (memory_->device()) {
      // The addition into the bucket still reads `data` on the GPU: the
      // handle completes once it has.
      Enqueue([this, state = handle.state_, bucket = t.bucket] {
        state->Complete(memory_->WaitStaged(bucket, Deadline::After(options_.sync.op_timeout)));
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

StatusOr<std::unique_ptr<Communicator>> Communicator::Create(const Config& config,
                                                             Deadline deadline) {
  const SteadyTime started = std::chrono::steady_clock::now();
  GS_ASSIGN_OR_RETURN(CommOptions options, CommOptions::FromConfig(config));
  GS_ASSIGN_OR_RETURN(auto compression, BucketCompression::FromConfig(config));
  // The data port takes the ring's messages only.
  GS_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Join(config, deadline));
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
