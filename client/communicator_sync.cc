// Communicator::Impl: buckets to the engine thread in order, their
// reduction, Synchronize, Barrier and the direct collectives' engine runs.
#include <algorithm>
#include <cstring>

#include "client/communicator_impl.h"

namespace gradsync::client {

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
  WireTraffic traffic{b->bytes(), b->bytes(), false};
  Status s = backend_->Reduce(*memory_, index, *b, tag, deadline, &traffic);
  Record(backend_->BucketOp(traffic), backend_->path(), start, s);
  if (!s.ok()) return Fail(Classify(s));
  metrics_.Traffic(b->bytes(), traffic.sent, b->bytes(), traffic.received);
  if (memory_->device()) metrics_.SetDeviceBytes(memory_->DeviceBytes());
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
  std::vector<BucketMemory::Slice> slices;
  slices.reserve(tensors.size());
  for (Tensor* t : tensors) slices.push_back({t->offset * es, t->data, t->count * es});
  Status copied = memory_->Unstage(index, slices, b->dtype);
  if (copied.ok()) copied = memory_->Wait(deadline);
  if (!copied.ok()) {
    for (auto& h : handles) {
      if (h) h->Complete(copied);
    }
    return Fail(copied);
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
      if (collectives.takes_device_memory()) {
        buffer = memory_->Scratch(staged_bytes);
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

}  // namespace gradsync::client
