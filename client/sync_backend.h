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
#include <vector>

#include "client/bucket_compression.h"
#include "client/bucket_memory.h"
#include "client/bucketer.h"
#include "client/client_metrics.h"
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

// The lanes ring_lanes=auto opens and chooses among (all, or the first).
constexpr int kAutoRingLanes = 4;

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
};

struct SyncBackendOptions {
  std::string path;     // allreduce | ps
  std::string backend;  // ring | nccl (path=allreduce)
  RingOptions ring;
  // Ring neighbours on this host (the same host address) exchange their
  // messages through shared memory (wire/same_host_transport.h), links of
  // `shm_link_bytes` each.
  bool shm = true;
  size_t shm_link_bytes = size_t{4} << 20;
  // "segments": when every worker is on one host (and `shm`), all-reduces
  // go through shared-memory segments (client/host_collectives.h); "ring":
  // through the ring's links.
  std::string shm_allreduce = "segments";
  // "measured": when the workers of the job (of the membership epoch, in an
  // elastic job) span four hosts or more, the ring goes round the hosts in
  // the order its measured links favour (cluster/ring_order.h); "rank":
  // always rank order.
  std::string ring_order = "measured";
  // The ring's lanes (client/ring_lanes.h): each lane is a TCP stream of
  // its own (wire/tcp_stream_transport.h, sealed under CURVE) on a free
  // port of the worker's host, whose ports the workers exchange over a
  // first ring on the session's data transport; neighbours on one host
  // reach each other through shared-memory links of the lane's own over
  // its stream. Used by the ring backend
  // and the direct collectives of the ps path when the workers span two
  // hosts or more, or ring neighbours do not share memory (shm off).
  int ring_lanes = 1;
  // ring_lanes=auto: kAutoRingLanes lanes are opened, and the ring uses
  // them all or lane 0 alone, whichever a timed all-reduce of each favours
  // when the ring is made (client/ring_lanes.h, SetActive).
  bool ring_lanes_auto = false;
  // "halving_doubling": with TCP streams and 2^L workers (L >= 2),
  // all-reduces go by recursive halving and doubling
  // (client/halving_doubling.h), 2 L steps to the ring's 2 (2^L - 1), and
  // up to the ring's small_bytes by recursive doubling (L steps); "auto":
  // recursive doubling up to the ring's small_bytes, each larger size the
  // way its first all-reduces measured faster (HalvingDoubling's
  // `measure`); "ring": every all-reduce round the ring.
  std::string ring_algorithm = "auto";
  PsClientOptions ps;
  // Parameter-server traffic to shards on this host (cluster/ps_links.h).
  cluster::PsLinkOptions ps_links;
  int cuda_device = 0;
  Millis op_timeout{60000};
  uint64_t compression_seed = 0;  // the compressors' job-wide seed
};

// Builds the backend `options` name over `session`. `compression`,
// `memory` (the buckets) and the rejected-message metrics must outlive it; `stopped` tells the PS
// client's waits that the Communicator was shut down.
StatusOr<std::unique_ptr<SyncBackend>> MakeSyncBackend(
    const SyncBackendOptions& options, Session* session, BucketCompression* compression,
    BucketMemory* memory, wire::RejectedMetrics* ring_rejected, wire::RejectedMetrics* ps_rejected,
    std::function<bool()> stopped, Deadline deadline);

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_SYNC_BACKEND_H_
