/* Calls from C: proves that client/c_api.h is a valid C header and that the
 * API works from a C translation unit. Used by c_api_test.cc. */
#include <stddef.h>
#include <string.h>

#include "gradsync/c_api.h"

/* Returns 0, or the line of the first failed check. */
int gs_c_check_argument_errors(void) {
  int rank = -1;
  gs_comm* comm = NULL;
  const char* bad_args[] = {"scheduler=127.0.0.1:1"};
  if (strcmp(gs_code_name(GS_OK), "ok") != 0) return __LINE__;
  if (gs_rank(NULL, &rank) != GS_INVALID_ARGUMENT) return __LINE__;
  if (strstr(gs_last_error(), "comm is NULL") == NULL) return __LINE__;
  if (gs_create(bad_args, 1, 1000, &comm) != GS_INVALID_ARGUMENT) return __LINE__;
  if (strstr(gs_last_error(), "args[0]") == NULL) return __LINE__;
  if (comm != NULL) return __LINE__;
  if (gs_destroy(NULL) != GS_OK) return __LINE__;
  if (gs_handle_free(NULL) != GS_OK) return __LINE__;
  if (strcmp(gs_last_error(), "") != 0) return __LINE__;
  return 0;
}

/* Sums data[0, count) over the job and checks the world size. Returns 0, or
 * the line of the first failed check. */
int gs_c_sum_floats(gs_comm* comm, float* data, size_t count, int expected_world) {
  int world = 0;
  if (gs_world_size(comm, &world) != GS_OK) return __LINE__;
  if (world != expected_world) return __LINE__;
  if (gs_allreduce(comm, data, count, GS_F32, GS_SUM, 30000) != GS_OK) return __LINE__;
  return 0;
}
