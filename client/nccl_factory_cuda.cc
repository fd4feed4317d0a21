#include <utility>

#include "client/nccl_collectives.h"
#include "client/nccl_factory.h"

namespace gradsync::client {

StatusOr<std::unique_ptr<Collectives>> MakeNcclCollectives(Session* session, int device,
                                                           Deadline deadline) {
  GS_ASSIGN_OR_RETURN(std::unique_ptr<NcclCollectives> nccl,
                      NcclCollectives::Join(session, device, deadline));
  return std::unique_ptr<Collectives>(std::move(nccl));
}

}  // namespace gradsync::client
