#include "client/session.h"

namespace gradsync::client {

StatusOr<std::unique_ptr<Session>> Session::Join(const Config& config, Deadline deadline,
                                                 size_t max_frame_bytes) {
  GS_ASSIGN_OR_RETURN(cluster::Node node,
                      cluster::StartNode(config, wire::Role::Worker, deadline,
                                         static_cast<int64_t>(max_frame_bytes)));
  return std::unique_ptr<Session>(new Session(std::move(node)));
}

Session::~Session() { node_.agent->Leave("session closed"); }

Status Session::Barrier(Deadline deadline) {
  return node_.agent->Barrier(wire::Group::Workers, deadline);
}

StatusOr<std::vector<uint8_t>> Session::ShareNcclId(std::optional<std::vector<uint8_t>> mine,
                                                    Deadline deadline) {
  return node_.agent->ShareNcclId(std::move(mine), deadline);
}

}  // namespace gradsync::client
