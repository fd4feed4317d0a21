#include "client/nccl_comm.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

namespace gradsync::kernels {
namespace {

Status CudaError(const std::string& call, cudaError_t err) {
  return InternalError(call + " failed: " + cudaGetErrorString(err));
}

StatusCode NcclCode(ncclResult_t result) {
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return StatusCode::kInvalidArgument;
    case ncclSystemError:
    case ncclRemoteError:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

// "<call> failed: <NCCL error string> (<NCCL's last error message>)".
Status NcclError(const std::string& call, ncclResult_t result, ncclComm_t comm) {
  std::string message = call + " failed: " + ncclGetErrorString(result);
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') message += " (" + std::string(detail) + ")";
  return Status(NcclCode(result), message);
}

StatusOr<ncclDataType_t> NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    default:
      return InvalidArgumentError(std::string("NCCL all-reduce supports f32, f16 and bf16, not ") +
                                  DTypeName(dtype));
  }
}

// Sleeps between polls: a few microseconds at first, growing to 64 us, so
// that the wake-up after a long operation is late by no more than that (a
// step waits on several NCCL calls).
class Backoff {
 public:
  void Sleep() {
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, std::chrono::microseconds(64));
  }

 private:
  std::chrono::microseconds delay_{4};
};

}  // namespace

StatusOr<std::vector<uint8_t>> NcclComm::MakeUniqueId() {
  static_assert(sizeof(ncclUniqueId) == kUniqueIdBytes, "NCCL unique id size changed");
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) return NcclError("ncclGetUniqueId", result, nullptr);
  const auto* bytes = reinterpret_cast<const uint8_t*>(id.internal);
  return std::vector<uint8_t>(bytes, bytes + kUniqueIdBytes);
}

StatusOr<std::unique_ptr<NcclComm>> NcclComm::Create(const std::vector<uint8_t>& unique_id,
                                                     int rank, int world_size, int device,
                                                     Deadline deadline, NcclCommOptions options) {
  if (unique_id.size() != kUniqueIdBytes) {
    return InvalidArgumentError("an NCCL unique id has " + std::to_string(kUniqueIdBytes) +
                                " bytes, got " + std::to_string(unique_id.size()));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " is not in a world of " +
                                std::to_string(world_size));
  }
  if (device < 0) return InvalidArgumentError("bad CUDA device " + std::to_string(device));
  std::unique_ptr<NcclComm> comm(new NcclComm(rank, world_size, device, std::move(options)));
  GS_RETURN_IF_ERROR(comm->Init(unique_id, deadline));
  return StatusOr<std::unique_ptr<NcclComm>>(std::move(comm));
}

NcclComm::NcclComm(int rank, int world_size, int device, NcclCommOptions options)
    : rank_(rank), world_size_(world_size), device_(device), options_(std::move(options)) {}

NcclComm::~NcclComm() { Shutdown(); }

Status NcclComm::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

Status NcclComm::Init(const std::vector<uint8_t>& unique_id, Deadline deadline) {
  const std::string what = "ncclCommInitRank (rank " + std::to_string(rank_) + " of " +
                           std::to_string(world_size_) + ", device " + std::to_string(device_) +
                           ")";
  const SteadyTime start = std::chrono::steady_clock::now();
  GS_RETURN_IF_ERROR(Begin(what, deadline));
  const cudaError_t err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  if (err != cudaSuccess) return Fail(CudaError(what + ": cudaStreamCreateWithFlags", err));

  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), kUniqueIdBytes);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, world_size_, id, rank_, &config);
  comm_ = comm;
  if (result != ncclSuccess && result != ncclInProgress) {
    return Fail(NcclError(what, result, comm_));
  }
  return Wait(what, start, deadline, /*wait_stream=*/false);
}

Status NcclComm::Begin(const std::string& what, Deadline deadline) {
  GS_RETURN_IF_ERROR(status());
  if (deadline.Expired()) {
    return Fail(DeadlineExceededError("the deadline for " + what + " passed before it started"));
  }
  const cudaError_t err = cudaSetDevice(device_);
  if (err != cudaSuccess) {
    return Fail(CudaError(what + ": cudaSetDevice(" + std::to_string(device_) + ")", err));
  }
  return OkStatus();
}

Status NcclComm::Run(const std::string& what, Deadline deadline,
                     const std::function<int(ncclComm*)>& enqueue, bool wait_stream) {
  GS_RETURN_IF_ERROR(Begin(what, deadline));
  const SteadyTime start = std::chrono::steady_clock::now();
  const auto result = static_cast<ncclResult_t>(enqueue(comm_));
  if (result != ncclSuccess && result != ncclInProgress) {
    return Fail(NcclError(what, result, comm_));
  }
  return Wait(what, start, deadline, wait_stream);
}

Status NcclComm::Wait(const std::string& what, SteadyTime start, Deadline deadline,
                      bool wait_stream) {
  Backoff backoff;
  SteadyTime last_health_check = start;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) {
      return Fail(NcclError(what + ": ncclCommGetAsyncError", result, comm_));
    }
    if (state != ncclSuccess && state != ncclInProgress) {
      return Fail(NcclError(what, state, comm_));
    }
    if (state == ncclSuccess) {
      if (!wait_stream) return OkStatus();
      const cudaError_t err = cudaStreamQuery(stream_);
      if (err == cudaSuccess) return OkStatus();
      if (err != cudaErrorNotReady) return Fail(CudaError(what + ": cudaStreamQuery", err));
    }
    if (deadline.Expired()) {
      return Fail(DeadlineExceededError(what + " did not finish within " +
                                        FormatSeconds(deadline.at() - start)));
    }
    GS_RETURN_IF_ERROR(CheckHealth(what, &last_health_check));
    backoff.Sleep();
  }
}

Status NcclComm::CheckHealth(const std::string& what, SteadyTime* last_check) {
  if (!options_.health) return OkStatus();
  const SteadyTime now = std::chrono::steady_clock::now();
  if (now - *last_check < options_.health_interval) return OkStatus();
  *last_check = now;
  const Status health = options_.health();
  if (health.ok()) return health;
  return Fail(Status(health.code(), what + " abandoned: " + health.message()));
}

Status NcclComm::Fail(Status error) {
  if (comm_ != nullptr) {
    // The error is already being reported; nothing more to do if this fails.
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    error = Status(error.code(), error.message() + "; communicator aborted");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = std::move(error);
  return error_;
}

bool NcclComm::FinalizeWithin(Millis grace) {
  const ncclResult_t result = ncclCommFinalize(comm_);
  if (result != ncclSuccess && result != ncclInProgress) return false;
  const Deadline deadline = Deadline::After(grace);
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return false;
    if (state == ncclSuccess) return true;
    if (state != ncclInProgress || deadline.Expired()) return false;
    backoff.Sleep();
  }
}

void NcclComm::Shutdown() {
  (void)cudaSetDevice(device_);
  if (comm_ != nullptr) {
    if (FinalizeWithin(options_.finalize_grace)) {
      (void)ncclCommDestroy(comm_);
    } else {
      (void)ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  if (stream_ != nullptr) {
    (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
}

Status NcclComm::AllReduce(const void* send, void* recv, size_t count, DType dtype, NcclReduceOp op,
                           Deadline deadline) {
  const std::string what =
      "ncclAllReduce of " + std::to_string(count) + " " + DTypeName(dtype) + " elements";
  const StatusOr<ncclDataType_t> type = NcclType(dtype);
  if (!type.ok()) return Fail(type.status().WithPrefix(what));
  if (count > 0 && (send == nullptr || recv == nullptr)) {
    return Fail(InvalidArgumentError(what + ": null buffer"));
  }
  GS_RETURN_IF_ERROR(status());
  if (count == 0) return OkStatus();
  const ncclRedOp_t nccl_op = op == NcclReduceOp::kAverage ? ncclAvg : ncclSum;
  return Run(what, deadline, [&](ncclComm* comm) {
    return static_cast<int>(ncclAllReduce(send, recv, count, *type, nccl_op, comm, stream_));
  });
}

Status NcclComm::AllGather(const void* send, void* recv, size_t bytes, Deadline deadline,
                           bool wait) {
  const std::string what = "ncclAllGather of " + std::to_string(bytes) + " bytes per rank";
  if (bytes > 0 && (send == nullptr || recv == nullptr)) {
    return Fail(InvalidArgumentError(what + ": null buffer"));
  }
  GS_RETURN_IF_ERROR(status());
  if (bytes == 0) return OkStatus();
  return Run(
      what, deadline,
      [&](ncclComm* comm) {
        return static_cast<int>(ncclAllGather(send, recv, bytes, ncclUint8, comm, stream_));
      },
      wait);
}

Status NcclComm::Broadcast(const void* send, void* recv, size_t bytes, int root,
                           Deadline deadline) {
  const std::string what =
      "ncclBroadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root);
  if (root < 0 || root >= world_size_) {
    return Fail(
        InvalidArgumentError(what + ": root is not in a world of " + std::to_string(world_size_)));
  }
  if (bytes > 0 && (recv == nullptr || (rank_ == root && send == nullptr))) {
    return Fail(InvalidArgumentError(what + ": null buffer"));
  }
  GS_RETURN_IF_ERROR(status());
  if (bytes == 0) return OkStatus();
  if (send == nullptr) send = recv;  // not read off the root
  return Run(what, deadline, [&](ncclComm* comm) {
    return static_cast<int>(ncclBroadcast(send, recv, bytes, ncclUint8, root, comm, stream_));
  });
}

Status NcclComm::Synchronize(const std::string& what, Deadline deadline) {
  GS_RETURN_IF_ERROR(Begin(what, deadline));
  return Wait(what, std::chrono::steady_clock::now(), deadline,
              /*wait_stream=*/true);
}

}  // namespace gradsync::kernels
