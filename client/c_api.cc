#include "gradsync/c_api.h"

#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/c_api_guard.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/time.h"
#include "gradsync/communicator.h"

extern char** environ;

using gradsync::Config;
using gradsync::Deadline;
using gradsync::DType;
using gradsync::FailedPreconditionError;
using gradsync::InvalidArgumentError;
using gradsync::OkStatus;
using gradsync::Status;
using gradsync::StatusCode;
using gradsync::StatusOr;
using gradsync::client::Communicator;
using gradsync::client::ReduceOp;
using gradsync::client::SyncHandle;
using gradsync::client::TensorId;

static_assert(GS_OK == static_cast<int>(StatusCode::kOk), "gs_code");
static_assert(GS_CANCELLED == static_cast<int>(StatusCode::kCancelled), "gs_code");
static_assert(GS_INVALID_ARGUMENT == static_cast<int>(StatusCode::kInvalidArgument), "gs_code");
static_assert(GS_DEADLINE_EXCEEDED == static_cast<int>(StatusCode::kDeadlineExceeded), "gs_code");
static_assert(GS_NOT_FOUND == static_cast<int>(StatusCode::kNotFound), "gs_code");
static_assert(GS_ALREADY_EXISTS == static_cast<int>(StatusCode::kAlreadyExists), "gs_code");
static_assert(GS_FAILED_PRECONDITION == static_cast<int>(StatusCode::kFailedPrecondition),
              "gs_code");
static_assert(GS_ABORTED == static_cast<int>(StatusCode::kAborted), "gs_code");
static_assert(GS_OUT_OF_RANGE == static_cast<int>(StatusCode::kOutOfRange), "gs_code");
static_assert(GS_UNIMPLEMENTED == static_cast<int>(StatusCode::kUnimplemented), "gs_code");
static_assert(GS_INTERNAL == static_cast<int>(StatusCode::kInternal), "gs_code");
static_assert(GS_UNAVAILABLE == static_cast<int>(StatusCode::kUnavailable), "gs_code");
static_assert(GS_MEMBERSHIP_CHANGED == static_cast<int>(StatusCode::kMembershipChanged), "gs_code");
static_assert(GS_DATA_LOSS == static_cast<int>(StatusCode::kDataLoss), "gs_code");
static_assert(GS_F32 == static_cast<int>(DType::kF32), "gs_dtype");
static_assert(GS_F16 == static_cast<int>(DType::kF16), "gs_dtype");
static_assert(GS_BF16 == static_cast<int>(DType::kBF16), "gs_dtype");

struct gs_comm {
  explicit gs_comm(std::unique_ptr<Communicator> c) : comm(std::move(c)) {}

  std::unique_ptr<Communicator> comm;
  std::mutex mu;
  std::optional<Communicator::NoSync> no_sync;  // guarded by mu
};

struct gs_handle {
  SyncHandle handle;
};

namespace {

template <typename F>
int Guard(const char* function, F&& body) noexcept {
  return gradsync::CApiGuard(function, std::forward<F>(body));
}

Status NotNull(const void* p, const char* name) {
  if (p != nullptr) return OkStatus();
  return InvalidArgumentError(std::string(name) + " is NULL");
}

Deadline ToDeadline(int64_t timeout_ms) {
  return timeout_ms < 0 ? Deadline::Infinite() : Deadline::AfterMs(timeout_ms);
}

StatusOr<DType> ToDType(int dtype) {
  const int v = static_cast<int>(dtype);
  if (v == GS_F32 || v == GS_F16 || v == GS_BF16) return static_cast<DType>(v);
  return InvalidArgumentError("dtype is " + std::to_string(v) +
                              ", not GS_F32 (0), GS_F16 (1) or GS_BF16 (2)");
}

StatusOr<ReduceOp> ToReduceOp(int op) {
  const int v = static_cast<int>(op);
  if (v == GS_SUM) return ReduceOp::kSum;
  if (v == GS_AVERAGE) return ReduceOp::kAverage;
  return InvalidArgumentError("op is " + std::to_string(v) + ", not GS_SUM (0) or GS_AVERAGE (1)");
}

// argv for Config::FromArgs: a program name, then `args`, each "--name...".
StatusOr<std::vector<const char*>> ToArgv(const char* const* args, int num_args) {
  if (num_args < 0) return InvalidArgumentError("num_args is " + std::to_string(num_args));
  if (num_args > 0) GS_RETURN_IF_ERROR(NotNull(args, "args"));
  std::vector<const char*> argv = {"gradsync"};
  for (int i = 0; i < num_args; ++i) {
    const std::string name = "args[" + std::to_string(i) + "]";
    GS_RETURN_IF_ERROR(NotNull(args[i], name.c_str()));
    if (std::strncmp(args[i], "--", 2) != 0 || std::strlen(args[i]) == 2) {
      return InvalidArgumentError(name + " is '" + args[i] + "', not --name=value");
    }
    argv.push_back(args[i]);
  }
  return argv;
}

Status CheckComm(const gs_comm* comm) { return NotNull(comm, "comm"); }

}  // namespace

extern "C" {

const char* gs_last_error(void) { return gradsync::LastCApiError(); }

const char* gs_code_name(int code) {
  if (code < GS_OK || code > GS_MEMBERSHIP_CHANGED) return "unknown";
  return gradsync::StatusCodeName(static_cast<StatusCode>(code));
}

int gs_create(const char* const* args, int num_args, int64_t timeout_ms, gs_comm** out) {
  return Guard("gs_create", [&]() -> Status {
    GS_RETURN_IF_ERROR(NotNull(out, "out"));
    *out = nullptr;
    GS_ASSIGN_OR_RETURN(std::vector<const char*> argv, ToArgv(args, num_args));
    GS_ASSIGN_OR_RETURN(Config config,
                        Config::FromArgs(static_cast<int>(argv.size()), argv.data(), environ));
    GS_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                        Communicator::Create(config, ToDeadline(timeout_ms)));
    GS_RETURN_IF_ERROR(config.CheckKnownFlags("setting"));
    *out = new gs_comm(std::move(comm));
    return OkStatus();
  });
}

int gs_destroy(gs_comm* comm) {
  return Guard("gs_destroy", [&]() -> Status {
    if (comm == nullptr) return OkStatus();
    comm->comm->Shutdown();
    comm->no_sync.reset();
    delete comm;
    return OkStatus();
  });
}

int gs_rank(const gs_comm* comm, int* out) {
  return Guard("gs_rank", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    GS_RETURN_IF_ERROR(NotNull(out, "out"));
    *out = comm->comm->rank();
    return OkStatus();
  });
}

int gs_world_size(const gs_comm* comm, int* out) {
  return Guard("gs_world_size", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    GS_RETURN_IF_ERROR(NotNull(out, "out"));
    *out = comm->comm->world_size();
    return OkStatus();
  });
}

int gs_epoch(const gs_comm* comm, uint32_t* out) {
  return Guard("gs_epoch", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    GS_RETURN_IF_ERROR(NotNull(out, "out"));
    *out = comm->comm->epoch();
    return OkStatus();
  });
}

int gs_agree_step(gs_comm* comm, uint64_t completed_steps, int64_t timeout_ms, uint64_t* out_step,
                  int* out_root) {
  return Guard("gs_agree_step", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    GS_RETURN_IF_ERROR(NotNull(out_step, "out_step"));
    GS_RETURN_IF_ERROR(NotNull(out_root, "out_root"));
    GS_ASSIGN_OR_RETURN(gradsync::client::Communicator::ResumePoint at,
                        comm->comm->AgreeOnStep(completed_steps, ToDeadline(timeout_ms)));
    *out_step = at.step;
    *out_root = at.root;
    return OkStatus();
  });
}

int gs_register_tensor(gs_comm* comm, const char* name, size_t num_elements, int dtype,
                       int32_t* out_id) {
  return gs_register_tensor_shaped(comm, name, num_elements, dtype, nullptr, 0, out_id);
}

int gs_register_tensor_shaped(gs_comm* comm, const char* name, size_t num_elements, int dtype,
                              const size_t* shape, int ndim, int32_t* out_id) {
  return Guard("gs_register_tensor", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    GS_RETURN_IF_ERROR(NotNull(name, "name"));
    GS_RETURN_IF_ERROR(NotNull(out_id, "out_id"));
    GS_ASSIGN_OR_RETURN(DType d, ToDType(dtype));
    if (ndim < 0 || ndim > 16 || (ndim > 0 && shape == nullptr)) {
      return InvalidArgumentError("shape: " + std::to_string(ndim) +
                                  " dimensions (0 to 16, with a shape array)");
    }
    const std::vector<size_t> dims(shape, shape + ndim);
    GS_ASSIGN_OR_RETURN(TensorId id, comm->comm->RegisterTensor(name, num_elements, d, dims));
    *out_id = id;
    return OkStatus();
  });
}

int gs_mark_ready(gs_comm* comm, int32_t id, void* data, gs_callback callback, void* user,
                  gs_handle** out_handle) {
  return gs_mark_ready_on_stream(comm, id, data, nullptr, callback, user, out_handle);
}

int gs_mark_ready_on_stream(gs_comm* comm, int32_t id, void* data, void* stream,
                            gs_callback callback, void* user, gs_handle** out_handle) {
  return Guard("gs_mark_ready", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    GS_RETURN_IF_ERROR(NotNull(data, "data"));
    if (out_handle != nullptr) *out_handle = nullptr;
    Communicator::Callback done;
    if (callback != nullptr) {
      done = [callback, user](const Status& s) {
        callback(static_cast<int>(s.code()), s.message().c_str(), user);
      };
    }
    auto handle = out_handle != nullptr ? std::make_unique<gs_handle>() : nullptr;
    GS_ASSIGN_OR_RETURN(SyncHandle h, comm->comm->MarkReady(id, data, std::move(done), stream));
    if (out_handle != nullptr) {
      handle->handle = std::move(h);
      *out_handle = handle.release();
    }
    return OkStatus();
  });
}

int gs_handle_wait(const gs_handle* handle, int64_t timeout_ms) {
  return Guard("gs_handle_wait", [&]() -> Status {
    GS_RETURN_IF_ERROR(NotNull(handle, "handle"));
    return handle->handle.Wait(ToDeadline(timeout_ms));
  });
}

int gs_handle_done(const gs_handle* handle, int* out_done) {
  return Guard("gs_handle_done", [&]() -> Status {
    GS_RETURN_IF_ERROR(NotNull(handle, "handle"));
    GS_RETURN_IF_ERROR(NotNull(out_done, "out_done"));
    *out_done = handle->handle.Done() ? 1 : 0;
    return OkStatus();
  });
}

int gs_handle_free(gs_handle* handle) {
  return Guard("gs_handle_free", [&]() -> Status {
    delete handle;
    return OkStatus();
  });
}

int gs_synchronize(gs_comm* comm, int64_t timeout_ms) {
  return Guard("gs_synchronize", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    return comm->comm->Synchronize(ToDeadline(timeout_ms));
  });
}

int gs_no_sync_begin(gs_comm* comm) {
  return Guard("gs_no_sync_begin", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    std::lock_guard<std::mutex> lock(comm->mu);
    if (comm->no_sync.has_value()) {
      return FailedPreconditionError("already inside a no-sync scope");
    }
    comm->no_sync.emplace(comm->comm->StartNoSync());
    return OkStatus();
  });
}

int gs_no_sync_end(gs_comm* comm) {
  return Guard("gs_no_sync_end", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    std::lock_guard<std::mutex> lock(comm->mu);
    if (!comm->no_sync.has_value()) {
      return FailedPreconditionError("no no-sync scope to end: gs_no_sync_begin was not called");
    }
    comm->no_sync.reset();
    return OkStatus();
  });
}

int gs_barrier(gs_comm* comm, int64_t timeout_ms) {
  return Guard("gs_barrier", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    return comm->comm->Barrier(ToDeadline(timeout_ms));
  });
}

int gs_broadcast(gs_comm* comm, void* data, size_t count, int dtype, int root, int64_t timeout_ms) {
  return Guard("gs_broadcast", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    GS_RETURN_IF_ERROR(NotNull(data, "data"));
    GS_ASSIGN_OR_RETURN(DType d, ToDType(dtype));
    const int n = comm->comm->world_size();
    if (root < 0 || root >= n) {
      return InvalidArgumentError("root is " + std::to_string(root) + ", not a rank in [0, " +
                                  std::to_string(n) + ")");
    }
    return comm->comm->Broadcast(data, count, d, root, ToDeadline(timeout_ms));
  });
}

int gs_allreduce(gs_comm* comm, void* data, size_t count, int dtype, int op, int64_t timeout_ms) {
  return Guard("gs_allreduce", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    GS_RETURN_IF_ERROR(NotNull(data, "data"));
    GS_ASSIGN_OR_RETURN(DType d, ToDType(dtype));
    GS_ASSIGN_OR_RETURN(ReduceOp o, ToReduceOp(op));
    return comm->comm->AllReduce(data, count, d, o, ToDeadline(timeout_ms));
  });
}

int gs_allgather(gs_comm* comm, const void* in, size_t bytes, void* out, int64_t timeout_ms) {
  return Guard("gs_allgather", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    GS_RETURN_IF_ERROR(NotNull(in, "in"));
    GS_RETURN_IF_ERROR(NotNull(out, "out"));
    return comm->comm->AllGather(in, bytes, out, ToDeadline(timeout_ms));
  });
}

int gs_pull_rows(gs_comm* comm, uint32_t table, uint32_t dim, const uint64_t* ids, size_t n,
                 uint64_t step, float* out, int64_t timeout_ms) {
  return Guard("gs_pull_rows", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    if (n > 0) {
      GS_RETURN_IF_ERROR(NotNull(ids, "ids"));
      GS_RETURN_IF_ERROR(NotNull(out, "out"));
    }
    return comm->comm->PullRows(table, dim, ids, n, step, out, ToDeadline(timeout_ms));
  });
}

int gs_push_rows(gs_comm* comm, uint32_t table, uint32_t dim, const uint64_t* ids, size_t n,
                 const float* grads, uint64_t step, int64_t timeout_ms) {
  return Guard("gs_push_rows", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    if (n > 0) {
      GS_RETURN_IF_ERROR(NotNull(ids, "ids"));
      GS_RETURN_IF_ERROR(NotNull(grads, "grads"));
    }
    return comm->comm->PushRows(table, dim, ids, n, grads, step, ToDeadline(timeout_ms));
  });
}

int gs_get_stats(const gs_comm* comm, gs_stats* out) {
  return Guard("gs_get_stats", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    GS_RETURN_IF_ERROR(NotNull(out, "out"));
    const gradsync::client::CommunicatorStats s = comm->comm->stats();
    out->steps = s.steps;
    out->buckets_reduced = s.buckets_reduced;
    out->bytes_reduced = s.bytes_reduced;
    out->last_sync_seconds = s.last_sync_seconds;
    return OkStatus();
  });
}

int gs_shutdown(gs_comm* comm) {
  return Guard("gs_shutdown", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    comm->comm->Shutdown();
    return OkStatus();
  });
}

int gs_depart(gs_comm* comm, const char* reason) {
  return Guard("gs_depart", [&]() -> Status {
    GS_RETURN_IF_ERROR(CheckComm(comm));
    comm->comm->Depart(reason != nullptr ? reason : "");
    return OkStatus();
  });
}

}  // extern "C"
