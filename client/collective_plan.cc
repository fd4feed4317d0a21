#include "client/collective_plan.h"

#include "client/halving_doubling.h"
#include "wire/message.h"

namespace gradsync::client {

const char* RingAlgorithmName(RingAlgorithm algorithm) {
  switch (algorithm) {
    case RingAlgorithm::kRing:
      return "ring";
    case RingAlgorithm::kHalvingDoubling:
      return "halving_doubling";
    case RingAlgorithm::kAuto:
      return "auto";
  }
  return "ring";
}

namespace {

// The index of setting `name`'s `value` among `choices`, or an
// InvalidArgument naming them.
StatusOr<int> Choice(const std::string& name, StatusOr<std::string> value,
                     std::initializer_list<const char*> choices) {
  GS_RETURN_IF_ERROR(value.status());
  int index = 0;
  std::string words;
  for (const char* c : choices) {
    if (*value == c) return index;
    words += (index == 0                                      ? ""
              : index + 1 == static_cast<int>(choices.size()) ? " or "
                                                              : ", ") +
             std::string(c);
    ++index;
  }
  return InvalidArgumentError(name + " must be " + words + ", got '" + *value + "'");
}

}  // namespace

StatusOr<CollectiveSettings> CollectiveSettings::FromConfig(const Config& config) {
  CollectiveSettings s;
  GS_ASSIGN_OR_RETURN(const int path,
                      Choice("path", config.GetString("path", "allreduce"), {"allreduce", "ps"}));
  GS_ASSIGN_OR_RETURN(const int backend,
                      Choice("backend", config.GetString("backend", "ring"), {"ring", "nccl"}));
  s.way = path == 1 ? SyncPath::kPs : backend == 1 ? SyncPath::kNccl : SyncPath::kRing;
  GS_ASSIGN_OR_RETURN(s.shm, config.GetBool("ring_shm", true));
  GS_ASSIGN_OR_RETURN(
      const int shm_allreduce,
      Choice("ring_shm_allreduce", config.GetString("ring_shm_allreduce", "segments"),
             {"segments", "ring"}));
  s.shm_segments = shm_allreduce == 0;
  GS_ASSIGN_OR_RETURN(
      const int order,
      Choice("ring_order", config.GetString("ring_order", "measured"), {"measured", "rank"}));
  s.measured_order = order == 0;
  GS_ASSIGN_OR_RETURN(const int algorithm,
                      Choice("ring_algorithm", config.GetString("ring_algorithm", "auto"),
                             {"ring", "halving_doubling", "auto"}));
  s.algorithm = static_cast<RingAlgorithm>(algorithm);
  GS_ASSIGN_OR_RETURN(std::string lanes, config.GetString("ring_lanes", "1"));
  if (lanes == "auto") {
    s.lanes = kAutoRingLanes;
    s.lanes_auto = true;
  } else {
    GS_ASSIGN_OR_RETURN(int64_t count, config.GetInt("ring_lanes", 1));
    if (count < 1 || count > wire::kMaxLanes) {
      return InvalidArgumentError("ring_lanes must be auto or in [1, " +
                                  std::to_string(wire::kMaxLanes) + "], got " +
                                  std::to_string(count));
    }
    s.lanes = static_cast<int>(count);
  }
  return s;
}

CollectivePlan PlanCollectives(const CollectiveSettings& s, const JobShape& shape) {
  CollectivePlan p;
  p.way = s.way;
  p.shape = shape;
  p.shm = s.shm;
  const bool nccl = s.way == SyncPath::kNccl;
  const bool one_host = shape.hosts <= 1;
  p.order_asked = s.measured_order;
  p.measured_order =
      s.measured_order && shape.hosts >= kLeastMeasuredHosts && shape.hosts <= kMostMeasuredHosts;
  // Beside NCCL the ring only checks the layout and gathers device records;
  // on one host with shared memory the links carry the data.
  const bool one_lane = nccl || (s.shm && one_host);
  p.lanes = one_lane ? 1 : s.lanes;
  p.lanes_auto = !one_lane && s.lanes_auto;
  p.asked = one_lane ? RingAlgorithm::kRing : s.algorithm;
  p.algorithm = HalvingDoublingFits(shape.workers) ? p.asked : RingAlgorithm::kRing;
  p.same_host = shape.workers > 1 && s.shm && one_host && !nccl;
  p.segments = p.same_host && s.shm_segments;
  return p;
}

std::string CollectivePlan::Describe() const {
  std::string line = std::string("collectives: ") +
                     (way == SyncPath::kPs     ? "buckets to the parameter servers"
                      : way == SyncPath::kNccl ? "buckets through NCCL"
                                               : "buckets round the ring") +
                     "; " + std::to_string(shape.workers) + " workers on " +
                     std::to_string(shape.hosts) + (shape.hosts == 1 ? " host" : " hosts") +
                     "; ring of " +
                     (lanes_auto ? "1 or " + std::to_string(lanes) + " lanes as measured"
                                 : std::to_string(lanes) + (lanes == 1 ? " lane" : " lanes")) +
                     (measured_order ? " in measured host order" : " in rank order") +
                     (order_asked && shape.hosts > kMostMeasuredHosts
                          ? " (ring_order=measured times the links of at most " +
                                std::to_string(kMostMeasuredHosts) + " hosts)"
                          : "") +
                     (shm ? ", shared memory between neighbours on a host" : "");
  if (way == SyncPath::kNccl) return line;
  if (same_host) {
    line += segments ? "; all-reduces through shared-memory segments"
                     : "; all-reduces round the ring (ring_shm_allreduce=ring)";
  } else if (algorithm == RingAlgorithm::kHalvingDoubling) {
    line += "; all-reduces by halving and doubling over " +
            std::to_string(HalvingDoublingLevels(shape.workers)) +
            " pairs, small ones by recursive doubling";
  } else if (algorithm == RingAlgorithm::kAuto) {
    line += "; small all-reduces by recursive doubling over " +
            std::to_string(HalvingDoublingLevels(shape.workers)) +
            " pairs, larger ones round the ring or by halving and doubling as each size measures "
            "faster";
  } else {
    line += "; all-reduces round the ring";
    if (asked == RingAlgorithm::kHalvingDoubling) {
      line +=
          " (ring_algorithm=halving_doubling needs a power of two of at least 4 workers over TCP "
          "streams)";
    }
  }
  return line;
}

std::map<std::string, std::string> CollectivePlan::Labels() const {
  return {{"path", SyncPathLabel(way)},
          {"algorithm", RingAlgorithmName(algorithm)},
          {"lanes", lanes_auto ? "auto" : std::to_string(lanes)},
          {"order", measured_order ? "measured" : "rank"},
          {"same_host", !same_host ? "no"
                        : segments ? "segments"
                                   : "ring"}};
}

}  // namespace gradsync::client
