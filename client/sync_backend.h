// SyncBackend: what a Communicator synchronises its buckets and its direct
// collectives through, chosen once when it starts (MakeSyncBackend). The
// Communicator never asks which one it holds:
//   - ring (path=allreduce, backend=ring): RingCollectives over the
//     session's transport; buckets go through BucketCompression (compressed
//     or not), direct collectives and the layout check through the ring.
//   - nccl (path=allreduce, backend=nccl): NCCL for buckets and direct
//     collectives; the ring only checks the layout (its refusal names the
//     tensor that differs).
//   - ps (path=ps): the parameter-server client for buckets (it compresses
//     each partition itself); the ring for the layout check and the direct
//     collectives.
// A new transport plugs in as another SyncBackend.
//
// Thread-safety: the Communicator's engine thread calls everything but
// SentBytes, which any thread may call.
#ifndef GRADSYNC_CLIENT_SYNC_BACKEND_H_
#define GRADSYNC_CLIENT_SYNC_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/bucket_compression.h"
#include "client/bucket_memory.h"
#include "client/bucketer.h"
#include "client/client_metrics.h"
#include "client/collective_plan.h"
#include "client/collectives.h"
#include "client/host_collectives.h"
#include "client/ps_client.h"
#include "client/ring.h"
#include "client/ring_lanes.h"
#include "client/session.h"
#include "cluster/ps_links.h"
#include "common/status.h"
#include "common/time.h"
#include "wire/message.h"
#include "wire/rejected_metrics.h"

namespace gradsync::client {

class SyncBackend {
 public:
  virtual ~SyncBackend() = default;

  // "ring", "nccl" or "ps": the Communicator's backend().
  virtual const char* name() const = 0;
  // The path bucket operations are recorded under.
  virtual SyncPath path() const = 0;
  // Where Broadcast, AllGather and AllReduce of the caller's buffers run,
  // and the path they are recorded under.
  virtual Collectives& direct() = 0;
  virtual SyncPath direct_path() const { return path(); }
  // Fails on every worker when the workers registered different tensors.
  virtual Status CheckLayout(const std::vector<wire::TensorSpecFields>& layout,
                             Deadline deadline) = 0;
  // Once, on the engine thread, before any bucket: the buckets and the
  // compressor spec of each (BucketCompression::SpecOf).
  virtual Status PrepareBuckets(const std::vector<std::pair<uint32_t, std::string>>& specs) {
    (void)specs;
    return Status();
  }
  // Averages bucket `b`, the `index`th of `memory`; `*traffic` gets the
  // bytes sent and received.
  virtual Status Reduce(BucketMemory& memory, int index, const Bucket& b, const OpTag& tag,
                        Deadline deadline, WireTraffic* traffic) = 0;
  // The operation a bucket reduce is recorded as.
  virtual SyncOp BucketOp(const WireTraffic& traffic) const {
    return traffic.gathered ? SyncOp::kAllGather : SyncOp::kAllReduce;
  }
  // Payload bytes this worker sent; `wire_bytes`: the bucket bytes it sent
  // after compression, as the Communicator counted them.
  virtual uint64_t SentBytes(uint64_t wire_bytes) const = 0;
  // Operations sent again after a timeout, since the start.
  virtual uint64_t Resent() const { return 0; }
  // Whether a new backend can take this one's place in a later membership
  // epoch of an elastic job (the CPU ring and PS: yes; NCCL: not yet).
  virtual bool CanReform() const { return false; }
  // The workers of this backend's epoch go on from step `completed`
  // (Communicator::AgreeOnStep); before its first bucket.
  virtual void ResumeAt(uint64_t completed) { (void)completed; }
  // Before a re-form: closes this backend's shared-memory links, so the
  // next epoch's can take their names. The backend is not used again.
  virtual void CloseLinks() {}
  // Once a backend of a later epoch took this one's place (after
  // CloseLinks): gives back at once what no send can still point into (its
  // segments, links, own transports, the parameter-server client), so that
  // a job whose membership keeps changing does not grow its workers. What
  // is left, the rings and their buffers, stays while SendsOut.
  virtual void ReleaseRetired() {}
  // Whether a send still points into what ReleaseRetired left: one queued
  // on the session's transport to a neighbour that has not taken it. The
  // Communicator destroys a retired backend once this is false.
  virtual bool SendsOut() const { return false; }

  // What MakeSyncBackend built this backend to (client/collective_plan.h).
  const CollectivePlan& plan() const { return plan_; }
  void set_plan(CollectivePlan plan) { plan_ = std::move(plan); }

 private:
  CollectivePlan plan_;
};

struct SyncBackendOptions {
  // The all-reduce settings (client/collective_plan.h): MakeSyncBackend
  // plans the collectives from them and the job's shape, once per epoch.
  CollectiveSettings collectives;
  RingOptions ring;
  // The shared-memory links between ring neighbours on one host
  // (wire/same_host_transport.h, collectives.shm): `shm_link_bytes` each.
  size_t shm_link_bytes = size_t{4} << 20;
  PsClientOptions ps;
  // Parameter-server traffic to shards on this host (cluster/ps_links.h).
  cluster::PsLinkOptions ps_links;
  int cuda_device = 0;
  Millis op_timeout{60000};
  uint64_t compression_seed = 0;  // the compressors' job-wide seed
};

// The one choice point: plans the collectives from `options.collectives`
// and the shape of `session`'s epoch (PlanCollectives; worker 0 logs the
// plan in one line), then builds the backend the plan names over
// `session`. `compression`,
// `memory` (the buckets) and the rejected-message metrics must outlive it; `stopped` tells the PS
// client's waits that the Communicator was shut down.
StatusOr<std::unique_ptr<SyncBackend>> MakeSyncBackend(
    const SyncBackendOptions& options, Session* session, BucketCompression* compression,
    BucketMemory* memory, wire::RejectedMetrics* ring_rejected, wire::RejectedMetrics* ps_rejected,
    std::function<bool()> stopped, Deadline deadline);

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_SYNC_BACKEND_H_
