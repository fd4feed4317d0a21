#include "client/device_gradients.h"

namespace gradsync::client {

StatusOr<std::unique_ptr<BucketMemory>> MakeDeviceGradients(int /*device*/) {
  return FailedPreconditionError(
      "gradsync was built without CUDA, so it cannot take CUDA tensors "
      "(gradient_device=cuda); rebuild with --config=cuda");
}

int VisibleCudaDevices() { return 0; }

}  // namespace gradsync::client
