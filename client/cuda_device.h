// Which CUDA device a worker uses (the `cuda_device` setting and its
// default).
#ifndef GRADSYNC_CLIENT_CUDA_DEVICE_H_
#define GRADSYNC_CLIENT_CUDA_DEVICE_H_

#include <cstdint>

#include "common/status.h"

namespace gradsync::client {

// The device of a worker that sees `device_count` CUDA devices: `setting`
// when it is set (>= 0); otherwise (-1) the worker's local rank, so that the
// workers of one host (numbered by the launcher, torchrun or Slurm) each take
// their own GPU, or device 0 when the process sees a single device (each
// process was given its own GPU, e.g. through CUDA_VISIBLE_DEVICES) or has
// no local rank (-1). InvalidArgument, naming the setting or the local rank,
// for a device this process does not see. With device_count <= 0 nothing is
// checked (the caller reports the missing CUDA).
StatusOr<int> ResolveCudaDevice(int64_t setting, int64_t local_rank, int device_count);

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_CUDA_DEVICE_H_
