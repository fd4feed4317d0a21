// MakeNcclCollectives: the NCCL backend of the all-reduce path, in builds
// with and without CUDA. Code that must build either way (the Communicator)
// depends on this instead of nccl_collectives.h.
//
// Every worker of the session calls it with the same deadline budget: worker
// rank 0 makes the NCCL unique id, the scheduler hands it to the others
// (Session::ShareNcclId), and each joins the communicator as its session
// rank on CUDA device `device`. Returns once all workers have joined.
// Before that the workers tell each other their GPUs over `exchange` (the
// job's CPU ring; null: not checked) and two ranks on one GPU of one machine
// are refused, naming both (client/device_records.h).
//
// Errors: FailedPrecondition when gradsync was built without CUDA;
// DeadlineExceeded when the id or a worker did not arrive by `deadline`;
// InvalidArgument for a null session or a negative device, or two ranks on
// one GPU; Internal for CUDA or
// NCCL failures. Blocking: up to `deadline`. Ownership: `session` must
// outlive the returned Collectives.
#ifndef GRADSYNC_CLIENT_NCCL_FACTORY_H_
#define GRADSYNC_CLIENT_NCCL_FACTORY_H_

#include <memory>

#include "client/collectives.h"
#include "client/session.h"
#include "common/status.h"
#include "common/time.h"

namespace gradsync::client {

StatusOr<std::unique_ptr<Collectives>> MakeNcclCollectives(Session* session, int device,
                                                           Collectives* exchange,
                                                           Deadline deadline);

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_NCCL_FACTORY_H_
