// Communicator: the gradsync client SDK. A training process creates one,
// registers its gradient tensors, and marks each gradient ready as the
// backward pass produces it; the Communicator averages the gradients over all
// workers of the job and writes the result back in place.
//
//   auto comm = Communicator::Create(config, Deadline::AfterMs(60000));
//   TensorId w = (*comm)->RegisterTensor("fc1.weight", 784 * 256, DType::kF32);
//   ...                                           // each step:
//   (*comm)->MarkReady(w, grad_w);                 // as backward produces it
//   (*comm)->Synchronize(deadline);                // before the optimizer step
//
// Configuration (flags `--name=value` or GRADSYNC_NAME; only `scheduler` is
// required): scheduler, num_workers, rank, host, data_port (see Session),
// path=allreduce|ps, backend=ring|nccl, first_bucket_bytes (1 MiB),
// bucket_bytes (25 MiB), op_timeout_ms (60000: how long a collective may take
// before the missing rank is named), ring_chunk_bytes (1 MiB), cuda_device,
// gradient_device=cpu|cuda (cuda: the gradients are CUDA memory of
// cuda_device; buckets, packing and compression stay on the GPU, see
// client/device_gradients.h), compression_seed (the seed of the
// compressors' random draws; 0, the default, takes the job id),
// and compression, compression_min_bytes, compression_overrides (see
// client/bucket_compression.h). On path=ps the chosen compressor compresses
// each partition a shard owns, and the shard decompresses it
// (client/ps_client.h); ps_reply_compression=fp16|bf16 halves the pulls.
//
// Bucketing follows PyTorch DDP: tensors are packed into buckets in reverse
// registration order (gradients of the last layers come first in the
// backward pass), the first bucket up to first_bucket_bytes, the others up to
// bucket_bytes, one dtype per bucket. A bucket is handed to the comm engine
// thread as soon as all its tensors are ready and every earlier bucket has
// been, so communication overlaps the rest of the backward pass; buckets go
// out in the same order on every rank.
//
// Every step, every registered tensor is marked ready exactly once. Inside a
// NoSync scope, MarkReady only accumulates the gradient locally; the first
// MarkReady outside it synchronises the sum of the accumulated gradients
// (averaged over workers, summed over micro-steps: divide the loss by the
// number of micro-steps to get the large-batch gradient).
//
// Errors: registration errors are InvalidArgument / FailedPrecondition.
// A failed collective (a peer died, ranks disagree, a deadline passed) fails
// every pending and later operation with the same Status, naming the rank
// and what happened; the job cannot continue after it.
//
// Elastic jobs (the scheduler's min_workers below num_workers; backend=ring
// only so far): when a worker is lost, the operations in flight fail, within
// the scheduler's heartbeat deadline, with StatusCode::kMembershipChanged
// ("membership changed: worker rank R (identity ...) left: <reason>"), and
// rank(), world_size() and epoch() already describe the survivors' new
// epoch. The first call after the change that is not AgreeOnStep returns
// the change too (once: whatever the trainer calls next, MarkReady in its
// backward pass included, it learns of the change); after that, the next
// call re-forms the ring among the survivors (after all of them reached the
// new epoch; the layout is checked again) and goes on in it. The step that
// failed is not lost but must be redone by the trainer:
// the survivors call AgreeOnStep with the number of steps each completed,
// adopt the state (parameters, optimizer, step) of the rank it names
// (Broadcast from `root`), re-shard their data for the new rank and size,
// and redo step `step`. Gradients marked ready in the failed step are
// dropped (mark them again); NoSync accumulation restarts. Synchronize
// returns the change as the step's outcome; AgreeOnStep re-forms at once.
//
// Joining (elastic jobs below the scheduler's max_workers): a worker
// created while the job runs joins it in a new epoch, ranked last; the
// members' operations fail with kMembershipChanged naming it ("worker
// node-... joined"). The joiner's epoch() is above 0 once Create returns;
// it then calls AgreeOnStep(0) with the members and takes the state from
// `root` by Broadcast, as a survivor does.
//
// Thread-safety: all methods are thread-safe; MarkReady may be called from
// several backward threads. Blocking: only Wait, Synchronize, Barrier,
// Broadcast, AllReduce and AllGather block, each until its deadline.
// Ownership: the data pointer given to MarkReady must stay valid and
// untouched until its handle completes; the Communicator owns its threads,
// sockets and buffers, and destroying it leaves the job.
#ifndef GRADSYNC_INCLUDE_GRADSYNC_COMMUNICATOR_H_
#define GRADSYNC_INCLUDE_GRADSYNC_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/time.h"
#include "gradsync/reduce_op.h"

namespace gradsync::client {

using TensorId = int32_t;

// Completion of one MarkReady. Copyable; all copies share the state.
class SyncHandle {
 public:
  SyncHandle();
  // Blocks until the gradient has been synchronised and written back (OK),
  // the operation failed (its Status), or the deadline passed
  // (DeadlineExceeded; the operation goes on).
  Status Wait(Deadline deadline) const;
  bool Done() const;

  struct State;  // communicator.cc

 private:
  friend class Communicator;
  std::shared_ptr<State> state_;
};

struct CommunicatorStats {
  uint64_t steps = 0;  // Synchronize calls completed
  uint64_t buckets_reduced = 0;
  uint64_t bytes_reduced = 0;    // bucket bytes synchronised (before compression)
  uint64_t wire_bytes = 0;       // what this rank contributed after compression
  uint64_t sent_bytes = 0;       // payload bytes sent: by the CPU ring, or pushed to
                                 // the PS shards; 0 for nccl
  double last_sync_seconds = 0;  // duration of the last Synchronize
};

class Communicator {
 public:
  using Callback = std::function<void(const Status&)>;

  // Joins the job described by `config` and builds the backend.
  static StatusOr<std::unique_ptr<Communicator>> Create(const Config& config, Deadline deadline);
  ~Communicator();

  int rank() const;
  int world_size() const;
  // The membership epoch (0 until an elastic job loses or gains a worker;
  // above 0 at once for a worker that joined a running job).
  uint32_t epoch() const;
  const char* backend() const;  // "ring" or "nccl"

  // Registers a gradient tensor. Only before the first MarkReady.
  // InvalidArgument for an empty or duplicate name, zero elements or a dtype
  // other than f32/f16/bf16.
  StatusOr<TensorId> RegisterTensor(const std::string& name, size_t num_elements, DType dtype);
  // The same with the tensor's shape (its product is num_elements), which
  // lets PowerSGD approximate the tensor as its own matrix
  // (client/bucket_compression.h). An empty shape is no shape.
  StatusOr<TensorId> RegisterTensor(const std::string& name, size_t num_elements, DType dtype,
                                    const std::vector<size_t>& shape);

  // Hands over the gradient of `id` for this step. `data` holds the tensor's
  // elements and receives the synchronised gradient. `done`, if set, runs on
  // the comm engine thread when the handle completes; it must not block.
  // Every callback of a step has run when Synchronize returns.
  // InvalidArgument for an unregistered id or null data; FailedPrecondition
  // when `id` was already marked ready this step (or micro-step).
  //
  // With gradient_device=cuda, `data` is memory of the CUDA device
  // cuda_device and `stream` (a cudaStream_t; null: the default stream) the
  // stream whose queued work produces the gradient: gradsync's own stream
  // waits for it, the caller's is never synchronised. The synchronised
  // gradient is in `data` when the handle completes. InvalidArgument for
  // host memory, memory of another device, or a stream with host gradients.
  StatusOr<SyncHandle> MarkReady(TensorId id, void* data, Callback done = nullptr,
                                 void* stream = nullptr);

  // Waits until every gradient of this step is synchronised and ends the
  // step. FailedPrecondition naming the tensors never marked ready.
  Status Synchronize(Deadline deadline);

  // While a NoSync is alive, MarkReady accumulates locally and its handle
  // completes at once; Synchronize ends the micro-step without
  // communicating (call it once per micro-step, as outside the scope).
  // Scopes may nest; the outermost one ends accumulation.
  class NoSync {
   public:
    NoSync(NoSync&& other) noexcept : comm_(other.comm_) { other.comm_ = nullptr; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    ~NoSync();

   private:
    friend class Communicator;
    explicit NoSync(Communicator* comm) : comm_(comm) {}
    Communicator* comm_;
  };
  NoSync StartNoSync();

  // Blocks until every worker reached its n-th Barrier of the membership
  // epoch (a worker that joined counts from its first epoch, as the others
  // do from theirs). MembershipChanged when the epoch changes meanwhile.
  Status Barrier(Deadline deadline);
  // Copies rank `root`'s data[0, num_elements) to every rank (initial
  // parameters).
  Status Broadcast(void* data, size_t num_elements, DType dtype, int root, Deadline deadline);
  // Direct collectives outside the bucket machinery (metrics, evaluation).
  Status AllReduce(void* data, size_t num_elements, DType dtype, ReduceOp op, Deadline deadline);
  Status AllGather(const void* in, size_t bytes, void* out, Deadline deadline);

  // Sparse embedding tables on the parameter servers (num_servers > 0,
  // docs/embeddings.md), whatever `path` the dense gradients take.
  // A table is named by an id of the job's choosing and has rows of `dim`
  // floats, keyed by 64-bit ids with no vocabulary size; a row is created
  // on the shards when first pushed (after embedding_admit_after pushes)
  // and reads as its deterministic initializer before.
  //
  // PullRows: out[i * dim, (i + 1) * dim) = the row of ids[i] (duplicates
  // fetched once) as of training step `step`: with ps_mode=sync after every
  // worker's push of the steps before it. PushRows: the gradient rows
  // grads[i * dim, ...) of ids[i] for `step` (duplicates summed); every
  // worker pushes every step (n may be 0), and the shards apply each
  // step's rows, averaged over the workers, with the row-wise optimizer
  // (embedding_optimizer). Errors as AllReduce's; FailedPrecondition
  // without servers.
  Status PullRows(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n, uint64_t step,
                  float* out, Deadline deadline);
  Status PushRows(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n, const float* grads,
                  uint64_t step, Deadline deadline);

  // Where an elastic job's survivors resume after a membership change: the
  // most steps any of them completed (`completed_steps` of each) and the
  // lowest rank that completed that many, whose state the others adopt.
  // Blocks like AllGather, and fails as it does.
  struct ResumePoint {
    uint64_t step = 0;
    int root = 0;
  };
  StatusOr<ResumePoint> AgreeOnStep(uint64_t completed_steps, Deadline deadline);

  CommunicatorStats stats() const;
  // Leaves the job; pending operations fail with Cancelled. Idempotent.
  // After a failure of this communicator's own (not Cancelled nor
  // kMembershipChanged) it leaves as Depart does, naming the failure: the
  // other workers hear of it at once instead of at their deadlines.
  void Shutdown();
  // Leaves a running elastic job on purpose before its end (a node about to
  // be preempted, a job scaled down): the scheduler removes this worker at
  // once and the others go on in a new epoch (their operation in flight
  // fails with kMembershipChanged naming `reason`), without waiting for a
  // heartbeat deadline. Then as Shutdown. In a job that is not elastic, the
  // others fail as when a worker dies.
  void Depart(const std::string& reason);

  class Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradsync::client

#endif  // GRADSYNC_INCLUDE_GRADSYNC_COMMUNICATOR_H_
