#include "client/cuda_device.h"

#include <string>

namespace gradsync::client {

StatusOr<int> ResolveCudaDevice(int64_t setting, int64_t local_rank, int device_count) {
  const std::string seen = "this process sees " + std::to_string(device_count) + " CUDA device" +
                           (device_count == 1 ? "" : "s");
  if (setting >= 0) {
    if (device_count > 0 && setting >= device_count) {
      return InvalidArgumentError("cuda_device " + std::to_string(setting) +
                                  " does not exist: " + seen);
    }
    return static_cast<int>(setting);
  }
  if (local_rank < 0 || device_count == 1) return 0;
  if (device_count > 0 && local_rank >= device_count) {
    return InvalidArgumentError(
        "local rank " + std::to_string(local_rank) + " has no GPU of its own (cuda_device " +
        "defaults to the local rank): " + seen + "; set cuda_device to share one, or start at " +
        "most " + std::to_string(device_count) + " workers on this host");
  }
  return static_cast<int>(local_rank);
}

}  // namespace gradsync::client
