// NcclComm: one rank's NCCL communicator, with collectives on device memory
// that never wait past their deadline. Only built with --config=cuda.
//
// The communicator is created non-blocking (ncclConfig_t::blocking = 0): no
// NCCL call waits for the other ranks. Create and every collective poll for
// completion (ncclCommGetAsyncError, cudaStreamQuery) with short sleeps, so a
// rank that never joins, a peer that dies, or a peer that calls something
// else makes the call fail by its deadline instead of hanging. On a failure
// the communicator is aborted (ncclCommAbort) and the NcclComm is broken:
// every later call returns the first error again.
//
// Errors (common/status.h): InvalidArgument (bad arguments; nothing was
// enqueued), DeadlineExceeded (the operation did not finish in time; the
// message names it, e.g. "ncclAllReduce of 4096 f32 elements did not finish
// within 5.00 s; communicator aborted"), Unavailable (NCCL reported a remote
// or network error), Internal (any other CUDA or NCCL failure; the message
// names the call and its error string), or the status a health check
// returned. No runtime error aborts the process.
//
// Blocking: every collective returns only once its result is in device
// memory (the comm's stream is idle again), or with an error.
// Thread-safety: one call at a time (the caller serialises); status(),
// rank(), world_size() and device() may be called from any thread.
// Ownership: the NcclComm owns the NCCL communicator and its stream; device
// buffers passed to a collective stay owned by the caller and must not be
// touched until the call returns.
#ifndef GRADSYNC_CLIENT_NCCL_COMM_H_
#define GRADSYNC_CLIENT_NCCL_COMM_H_

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "common/time.h"

struct ncclComm;

namespace gradsync::kernels {

enum class NcclReduceOp { kSum, kAverage };

struct NcclCommOptions {
  // Polled while waiting (at most every `health_interval`); a non-OK status
  // aborts the communicator and fails the call with that code. May be null.
  std::function<Status()> health;
  Millis health_interval{100};
  // Upper bound on the clean shutdown (ncclCommFinalize) in the destructor;
  // past it the communicator is aborted instead.
  Millis finalize_grace{5000};
};

class NcclComm {
 public:
  static constexpr size_t kUniqueIdBytes = 128;

  // A fresh NCCL unique id (ncclGetUniqueId), kUniqueIdBytes long. Made by
  // one rank (rank 0) and handed to all the others out of band. Internal on
  // failure.
  static StatusOr<std::vector<uint8_t>> MakeUniqueId();

  // Joins the communicator named by `unique_id` as `rank` of `world_size` on
  // CUDA device `device`; every rank must call it with the same id and world
  // size. Returns once all ranks have joined. InvalidArgument for a bad id,
  // rank, world size or device; DeadlineExceeded naming ncclCommInitRank when
  // the others do not all join by `deadline` (the half-made communicator is
  // aborted); Internal for CUDA or NCCL failures.
  static StatusOr<std::unique_ptr<NcclComm>> Create(const std::vector<uint8_t>& unique_id, int rank,
                                                    int world_size, int device, Deadline deadline,
                                                    NcclCommOptions options = {});

  // Finalizes and destroys the communicator (bounded by finalize_grace),
  // or aborts it when broken; then destroys the stream. Never throws.
  ~NcclComm();

  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  // The non-blocking stream every collective runs on. Work the caller puts
  // on it (copies into or out of the buffers) is ordered with the
  // collectives; Synchronize waits for it.
  cudaStream_t stream() const { return stream_; }
  // OK, or the first error (the communicator has been aborted).
  Status status() const;

  // recv[0, count) = sum (or average) over all ranks of send[0, count).
  // dtype is f32, f16 or bf16; send == recv is in place, otherwise they
  // must not overlap. fp16/bf16 sums are computed by NCCL in fp32 and
  // rounded back; the average is NCCL's ncclAvg, whose last bit may differ
  // from sum / world_size. count == 0 returns OK at once.
  Status AllReduce(const void* send, void* recv, size_t count, DType dtype, NcclReduceOp op,
                   Deadline deadline);
  // recv[r * bytes, (r + 1) * bytes) = rank r's send[0, bytes). `recv` holds
  // world_size() * bytes; send may be recv + rank() * bytes (in place).
  // `wait` false: returns once the gather is queued on stream() (what is
  // queued after it runs after it).
  Status AllGather(const void* send, void* recv, size_t bytes, Deadline deadline, bool wait = true);
  // recv[0, bytes) on every rank = send[0, bytes) of rank `root`. `send` is
  // only read on the root and may equal `recv`.
  Status Broadcast(const void* send, void* recv, size_t bytes, int root, Deadline deadline);
  // Waits until everything enqueued on stream() so far has finished; `what`
  // names the work in errors ("cudaMemcpyAsync of 4096 bytes").
  Status Synchronize(const std::string& what, Deadline deadline);

 private:
  NcclComm(int rank, int world_size, int device, NcclCommOptions options);

  Status Init(const std::vector<uint8_t>& unique_id, Deadline deadline);
  // Runs `enqueue` (one NCCL collective on stream_) and waits for it.
  Status Run(const std::string& what, Deadline deadline,
             const std::function<int(ncclComm*)>& enqueue, bool wait_stream = true);
  // Polls until NCCL's state is no longer in progress and, when
  // `wait_stream`, stream_ is idle.
  Status Wait(const std::string& what, SteadyTime start, Deadline deadline, bool wait_stream);
  // Runs options_.health when health_interval has passed since *last_check.
  Status CheckHealth(const std::string& what, SteadyTime* last_check);
  // Checks the comm may be used, the deadline has not passed, and selects
  // the device for this thread.
  Status Begin(const std::string& what, Deadline deadline);
  // Records `error` as the first error (unless one is already recorded),
  // aborts the communicator, and returns the recorded error.
  Status Fail(Status error);
  // ncclCommFinalize, polled for at most `grace`; false when it failed or
  // did not finish.
  bool FinalizeWithin(Millis grace);
  void Shutdown();

  const int rank_;
  const int world_size_;
  const int device_;
  const NcclCommOptions options_;
  cudaStream_t stream_ = nullptr;
  ncclComm* comm_ = nullptr;  // null once aborted or destroyed

  mutable std::mutex mu_;
  Status error_;  // guarded by mu_
};

}  // namespace gradsync::kernels

#endif  // GRADSYNC_CLIENT_NCCL_COMM_H_
