#include "client/session.h"

namespace gradsync::client {

StatusOr<std::unique_ptr<Session>> Session::Join(const Config& config, Deadline deadline) {
  GS_ASSIGN_OR_RETURN(cluster::Node node, cluster::StartNode(config, wire::Role::Worker, deadline));
  return std::unique_ptr<Session>(new Session(std::move(node)));
}

Session::~Session() { node_.agent->Leave("session closed"); }

Status Session::Barrier(Deadline deadline) {
  return node_.agent->Barrier(wire::Group::Workers, epoch(), deadline);
}

StatusOr<std::vector<uint8_t>> Session::ShareNcclId(std::optional<std::vector<uint8_t>> mine,
                                                    Deadline deadline) {
  return node_.agent->ShareNcclId(std::move(mine), deadline);
}

int Session::rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_.self.rank;
}

int Session::num_workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_.num_workers;
}

std::vector<wire::NodeInfo> Session::peers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_.peers;
}

uint32_t Session::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_.epoch;
}

Status Session::MembershipStatus() const {
  if (node_.agent->latest_epoch() <= epoch()) return Status();  // the common case, cheap
  const cluster::Assignment latest = node_.agent->latest();
  std::lock_guard<std::mutex> lock(mu_);
  if (latest.epoch <= current_.epoch) return Status();
  return MembershipChangedError(latest.change + " (epoch " + std::to_string(latest.epoch) + ": " +
                                std::to_string(latest.num_workers) + " workers)");
}

uint32_t Session::AdoptEpoch() {
  cluster::Assignment latest = node_.agent->latest();
  std::lock_guard<std::mutex> lock(mu_);
  if (latest.epoch > current_.epoch) current_ = std::move(latest);
  return current_.epoch;
}

Status Session::EpochBarrier(Deadline deadline) {
  return node_.agent->EpochBarrier(epoch(), deadline);
}

}  // namespace gradsync::client
