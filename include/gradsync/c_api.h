/* gradsync C API: the client SDK (include/gradsync/communicator.h) for C and for
 * languages that call C (Python ctypes/cffi, Rust, Julia).
 *
 *   const char* args[] = {"--scheduler=10.0.0.1:9000", "--num_workers=4"};
 *   gs_comm* comm;
 *   if (gs_create(args, 2, 60000, &comm) != GS_OK) die(gs_last_error());
 *   int32_t w;
 *   gs_register_tensor(comm, "fc1.weight", 784 * 256, GS_F32, &w);
 *   ...                                          each step:
 *   gs_mark_ready(comm, w, grad_w, NULL, NULL, NULL);
 *   gs_synchronize(comm, 60000);
 *   ...
 *   gs_destroy(comm);
 *
 * Errors: every function returns an int, GS_OK (0) on success or a gs_code.
 * The codes mirror gradsync::StatusCode. After each call, gs_last_error()
 * returns a human-readable message for the calling thread: "" after success,
 * the reason after a failure (naming the argument, tensor, address or rank at
 * fault). The string belongs to the library and stays valid until the next
 * gs_ call on the same thread; copy it to keep it. A null pointer where one
 * is required, or an enum value out of range, is GS_INVALID_ARGUMENT naming
 * the argument. No C++ exception ever leaves this API; an unexpected one is
 * GS_INTERNAL.
 *
 * Timeouts are in milliseconds; a negative timeout (GS_NO_TIMEOUT) waits
 * without limit, 0 only checks.
 *
 * Thread-safety: every function may be called from any thread, concurrently
 * on the same gs_comm, except gs_destroy, which must not overlap any other
 * call on that gs_comm (call gs_shutdown to make blocked calls return first).
 * A gs_handle may be waited on from several threads; gs_handle_free must not
 * overlap other calls on that handle.
 *
 * Blocking: only gs_create, gs_destroy, gs_handle_wait, gs_synchronize,
 * gs_barrier, gs_broadcast, gs_allreduce, gs_allgather and gs_shutdown
 * block; each is bounded by its timeout or by the job's op_timeout_ms.
 */
#ifndef GRADSYNC_INCLUDE_GRADSYNC_C_API_H_
#define GRADSYNC_INCLUDE_GRADSYNC_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A member of a gradsync job. Created by gs_create, freed by gs_destroy. */
typedef struct gs_comm gs_comm;
/* The completion of one gs_mark_ready. Freed by gs_handle_free. */
typedef struct gs_handle gs_handle;

/* Mirrors gradsync::StatusCode. The ones a caller meets: GS_CANCELLED (the
 * communicator was shut down), GS_INVALID_ARGUMENT (a bad argument; nothing
 * happened), GS_DEADLINE_EXCEEDED (the timeout passed), GS_FAILED_PRECONDITION
 * (a call out of order), GS_ABORTED (ranks disagree, or a peer gave up),
 * GS_UNAVAILABLE (a peer or the scheduler is unreachable or died),
 * GS_INTERNAL (a bug in gradsync). */
typedef enum gs_code {
  GS_OK = 0,
  GS_CANCELLED = 1,
  GS_INVALID_ARGUMENT = 2,
  GS_DEADLINE_EXCEEDED = 3,
  GS_NOT_FOUND = 4,
  GS_ALREADY_EXISTS = 5,
  GS_FAILED_PRECONDITION = 6,
  GS_ABORTED = 7,
  GS_OUT_OF_RANGE = 8,
  GS_UNIMPLEMENTED = 9,
  GS_INTERNAL = 10,
  GS_UNAVAILABLE = 11,
  GS_DATA_LOSS = 12,
  /* An elastic job lost or gained a worker: gs_rank, gs_world_size and gs_epoch
   * already give the new epoch; gs_agree_step says which step to redo
   * (include/gradsync/communicator.h). */
  GS_MEMBERSHIP_CHANGED = 13
} gs_code;

/* Element types; values match gradsync::DType. Functions take the value as
   an int, so an out-of-range value is reported, not undefined. */
typedef enum gs_dtype { GS_F32 = 0, GS_F16 = 1, GS_BF16 = 2 } gs_dtype;

typedef enum gs_reduce_op { GS_SUM = 0, GS_AVERAGE = 1 } gs_reduce_op;

#define GS_NO_TIMEOUT (-1)

/* Called once when a gradient's synchronisation completes: `code` is GS_OK
 * or the error, `message` is "" or the reason and is valid only during the
 * call. Runs on the communicator's engine thread: it must return quickly and
 * must not block or call gs_ functions on the same gs_comm, except
 * gs_handle_done. */
typedef void (*gs_callback)(int code, const char* message, void* user);

typedef struct gs_stats {
  uint64_t steps;           /* gs_synchronize calls completed */
  uint64_t buckets_reduced; /* buckets all-reduced */
  uint64_t bytes_reduced;   /* bucket bytes handed to the backend */
  double last_sync_seconds; /* duration of the last gs_synchronize */
} gs_stats;

/* The message of the calling thread's last gs_ call: "" after success.
 * Never NULL; valid until the next gs_ call on this thread. */
const char* gs_last_error(void);

/* "ok", "invalid_argument", ...: a stable name for `code`, "unknown" for a
 * value that is not a gs_code. Static storage; does not touch
 * gs_last_error(). */
const char* gs_code_name(int code);

/* Joins the job and builds the backend; blocks until every worker has
 * joined, or `timeout_ms`. `args` holds `num_args` settings "--name=value"
 * (see include/gradsync/communicator.h: scheduler, num_workers, rank, backend, ...);
 * settings missing there are read from the process environment
 * (GRADSYNC_SCHEDULER, ...). `args` may be NULL when `num_args` is 0; the
 * strings are not kept. On success *out is a new gs_comm owned by the
 * caller. Errors: GS_INVALID_ARGUMENT for an argument not of the form
 * "--name=value" or a setting no component reads (a typo); GS_UNAVAILABLE or
 * GS_DEADLINE_EXCEEDED naming the scheduler address when it cannot be
 * reached. */
int gs_create(const char* const* args, int num_args, int64_t timeout_ms, gs_comm** out);

/* Leaves the job (as gs_shutdown) and frees `comm`. NULL is a no-op.
 * Handles from gs_mark_ready stay valid (pending ones end GS_CANCELLED) and
 * must still be freed. Always GS_OK. */
int gs_destroy(gs_comm* comm);

/* This worker's rank in [0, world size), and the number of workers. */
int gs_rank(const gs_comm* comm, int* out);
int gs_world_size(const gs_comm* comm, int* out);
/* The membership epoch: 0 until an elastic job loses or gains a worker;
 * above 0 right after gs_create for a worker that joined a running job
 * (it then calls gs_agree_step with 0 and takes the state by broadcast). */
int gs_epoch(const gs_comm* comm, uint32_t* out);
/* After GS_MEMBERSHIP_CHANGED: every survivor passes the number of steps it
 * completed; *out_step gets the most, *out_root the lowest rank that
 * completed that many (the others take its state, e.g. by gs_broadcast
 * from it, and redo step *out_step). Blocks as gs_allgather. */
int gs_agree_step(gs_comm* comm, uint64_t completed_steps, int64_t timeout_ms, uint64_t* out_step,
                  int* out_root);

/* Registers a gradient tensor of `num_elements` elements and sets *out_id.
 * Only before the first gs_mark_ready; every worker registers the same
 * tensors in the same order. `name` is copied. Errors: GS_INVALID_ARGUMENT
 * for an empty or duplicate name, zero elements or a bad dtype;
 * GS_FAILED_PRECONDITION after the first gs_mark_ready. */
int gs_register_tensor(gs_comm* comm, const char* name, size_t num_elements, int dtype,
                       int32_t* out_id);

/* gs_register_tensor with the tensor's shape: `ndim` (0 to 16) dimensions
 * whose product is `num_elements`. PowerSGD then approximates a tensor of 2
 * or more dimensions as its own shape[0] x (the rest) matrix. ndim 0 is no
 * shape. GS_INVALID_ARGUMENT also for a shape whose product differs. */
int gs_register_tensor_shaped(gs_comm* comm, const char* name, size_t num_elements, int dtype,
                              const size_t* shape, int ndim, int32_t* out_id);

/* Hands over the gradient of tensor `id` for this step; does not block.
 * `data` holds the tensor's elements and receives the gradient averaged over
 * the workers; it must stay valid and untouched until the operation
 * completes. `callback` (may be NULL) is called once on completion with
 * `user`. `out_handle` (may be NULL) receives a new handle owned by the
 * caller. Errors: GS_INVALID_ARGUMENT for an unknown id or NULL data;
 * GS_FAILED_PRECONDITION when `id` was already marked ready this step; the
 * job's error once a collective failed. On error no callback runs and no
 * handle is made. */
int gs_mark_ready(gs_comm* comm, int32_t id, void* data, gs_callback callback, void* user,
                  gs_handle** out_handle);

/* gs_mark_ready for CUDA gradients (setting gradient_device=cuda): `data` is
 * memory of the device cuda_device and `stream` the cudaStream_t (NULL: the
 * default stream) on which the work producing the gradient was queued.
 * gradsync's own stream waits for that work; `stream` itself is never
 * synchronised and the call does not block. When the handle completes, the
 * averaged gradient is in `data`. GS_INVALID_ARGUMENT for host memory or
 * memory of another device, and for a non-NULL stream on a communicator of
 * host gradients. */
int gs_mark_ready_on_stream(gs_comm* comm, int32_t id, void* data, void* stream,
                            gs_callback callback, void* user, gs_handle** out_handle);

/* Blocks until the gradient of `handle` is synchronised (GS_OK), its
 * operation failed (that error), or `timeout_ms` passed
 * (GS_DEADLINE_EXCEEDED; the operation goes on). */
int gs_handle_wait(const gs_handle* handle, int64_t timeout_ms);

/* Sets *out_done to 1 when the operation has completed, else 0. */
int gs_handle_done(const gs_handle* handle, int* out_done);

/* Frees `handle` without waiting; the operation goes on. NULL is a no-op.
 * Always GS_OK. */
int gs_handle_free(gs_handle* handle);

/* Blocks until every gradient of this step is synchronised and ends the
 * step. GS_FAILED_PRECONDITION names the tensors never marked ready. */
int gs_synchronize(gs_comm* comm, int64_t timeout_ms);

/* Between gs_no_sync_begin and gs_no_sync_end, gs_mark_ready only
 * accumulates gradients locally; the first step after gs_no_sync_end
 * synchronises the sum. Begin twice, or end without begin, is
 * GS_FAILED_PRECONDITION. */
int gs_no_sync_begin(gs_comm* comm);
int gs_no_sync_end(gs_comm* comm);

/* Collectives outside the gradient buckets (initial parameters, metrics).
 * Every worker calls them in the same order with the same count and dtype;
 * when workers disagree, every one fails with GS_ABORTED naming the
 * difference. Each blocks until done on this worker or `timeout_ms`; after a
 * failure the job cannot continue.
 *
 * Blocks until every worker reached its n-th barrier of the membership
 * epoch; GS_MEMBERSHIP_CHANGED when the epoch changes meanwhile. */
int gs_barrier(gs_comm* comm, int64_t timeout_ms);

/* Copies rank `root`'s data[0, count) to every worker's `data`.
 * GS_INVALID_ARGUMENT for a root outside [0, world size). */
int gs_broadcast(gs_comm* comm, void* data, size_t count, int dtype, int root, int64_t timeout_ms);

/* In place: data[0, count) becomes the sum or the average over workers. */
int gs_allreduce(gs_comm* comm, void* data, size_t count, int dtype, int op, int64_t timeout_ms);

/* Every worker contributes in[0, bytes); out[r * bytes, (r + 1) * bytes)
 * receives rank r's. `out` holds world size * bytes and does not overlap
 * `in`. */
int gs_allgather(gs_comm* comm, const void* in, size_t bytes, void* out, int64_t timeout_ms);

/* Sparse embedding tables on the parameter servers (Communicator::PullRows
 * and PushRows): rows of `dim` floats of table `table`, keyed by 64-bit
 * ids. gs_pull_rows writes the row of ids[i] to out[i * dim, (i + 1) * dim)
 * as of training step `step`; gs_push_rows pushes the gradient rows
 * grads[i * dim, ...) of ids[i] for `step` (every worker pushes every step,
 * n may be 0). GS_FAILED_PRECONDITION in a job without servers. */
int gs_pull_rows(gs_comm* comm, uint32_t table, uint32_t dim, const uint64_t* ids, size_t n,
                 uint64_t step, float* out, int64_t timeout_ms);
int gs_push_rows(gs_comm* comm, uint32_t table, uint32_t dim, const uint64_t* ids, size_t n,
                 const float* grads, uint64_t step, int64_t timeout_ms);

/* Copies the communicator's counters into *out. */
int gs_get_stats(const gs_comm* comm, gs_stats* out);

/* Leaves the job: pending and later operations end GS_CANCELLED; calls
 * blocked on other threads return by their timeout or sooner. Idempotent;
 * `comm` must still be destroyed. */
int gs_shutdown(gs_comm* comm);

/* Leaves a running elastic job before its end (Communicator::Depart): the
 * other workers go on in a new epoch at once, their operation in flight
 * ending GS_MEMBERSHIP_CHANGED naming `reason` (NULL: "departed"). Then as
 * gs_shutdown. */
int gs_depart(gs_comm* comm, const char* reason);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GRADSYNC_INCLUDE_GRADSYNC_C_API_H_ */
