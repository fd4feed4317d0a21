#include "client/nccl_factory.h"

namespace gradsync::client {

StatusOr<std::unique_ptr<Collectives>> MakeNcclCollectives(Session* /*session*/, int /*device*/,
                                                           Collectives* /*exchange*/,
                                                           Deadline /*deadline*/) {
  return FailedPreconditionError(
      "gradsync was built without CUDA; rebuild with --config=cuda to use the "
      "nccl path");
}

}  // namespace gradsync::client
