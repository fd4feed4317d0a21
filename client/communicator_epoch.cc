// Communicator::Impl: failures, their classification, and membership
// changes (the backend re-formed for a new epoch).
#include "client/communicator_impl.h"

namespace gradsync::client {

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

void Communicator::Impl::Retire(std::unique_ptr<SyncBackend> backend) {
  backend->ReleaseRetired();
  retired_backends_.push_back(std::move(backend));
  const size_t before = retired_backends_.size();
  retired_backends_.erase(
      std::remove_if(retired_backends_.begin(), retired_backends_.end(),
                     [](const std::unique_ptr<SyncBackend>& b) { return !b->SendsOut(); }),
      retired_backends_.end());
  if (!retired_backends_.empty()) {
    GS_LOG(INFO) << "kept " << retired_backends_.size() << " backend(s) of earlier epochs until "
                 << "their sends are let go of (" << before - retired_backends_.size()
                 << " destroyed)";
  }
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
          backend, session_.get(), compression_.get(), memory_.get(), &ring_rejected_,
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
      std::unique_ptr<SyncBackend> old;
      {
        std::lock_guard<std::mutex> lock(mu_);
        old = std::move(backend_);
        backend_ = std::move(*next);
        ResetStepLocked();
        const auto now = std::chrono::steady_clock::now();
        metrics_.SetMembership(epoch, session_->num_workers());
        metrics_.SetCollectives(backend_->plan().Labels());
        metrics_.Recovered(std::chrono::duration<double>(now - membership_changed_at_).count());
        GS_LOG(WARNING) << "epoch " << epoch << ": re-formed " << backend_->name() << " as worker "
                        << session_->rank() << " of " << session_->num_workers() << " in "
                        << std::chrono::duration<double>(now - start).count() << " s";
      }
      Retire(std::move(old));  // closed at the loop's start
      return Status();
    }
    if (next.ok()) {
      (*next)->CloseLinks();
      Retire(std::move(*next));
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

}  // namespace gradsync::client
