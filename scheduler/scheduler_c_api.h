/* The job's scheduler inside the calling process, for the Python package's
 * torchrun support (rank 0 hosts it). Same conventions as include/gradsync/c_api.h:
 * functions return a gs_code and set gs_last_error().
 */
#ifndef GRADSYNC_SCHEDULER_SCHEDULER_C_API_H_
#define GRADSYNC_SCHEDULER_SCHEDULER_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gs_scheduler gs_scheduler;

/* Starts a scheduler on a thread of this process and returns once it
 * listens. `args` holds `num_args` settings "--name=value" (port,
 * num_workers, num_servers, heartbeat_ms, missed_heartbeats,
 * rendezvous_timeout_ms, server_grace_ms); missing ones come from the
 * environment (GRADSYNC_NUM_WORKERS, ...). *out_port receives the port it
 * listens on. Errors: GS_INVALID_ARGUMENT for a bad or unknown setting,
 * GS_UNAVAILABLE when the port cannot be bound. */
int gs_scheduler_start(const char* const* args, int num_args, gs_scheduler** out, int* out_port);

/* Gives the job `timeout_ms` to end by itself (every node left), then stops
 * the scheduler, joins its thread and frees `s`. Returns the job's result:
 * GS_OK, or the error it failed with. NULL is a no-op. */
int gs_scheduler_stop(gs_scheduler* s, int64_t timeout_ms);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GRADSYNC_SCHEDULER_SCHEDULER_C_API_H_ */
