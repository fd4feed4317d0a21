#include "client/ring_lanes.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <utility>

namespace gradsync::client {

void LaneAlarm::Raise(const Status& failure) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!first_.ok()) return;
  first_ = failure;
  raised_.store(true, std::memory_order_release);
}

Status LaneAlarm::status() const {
  if (!raised_.load(std::memory_order_acquire)) return Status();  // each poll of every lane
  std::lock_guard<std::mutex> lock(mu_);
  return first_;
}

RingLanes::RingLanes(std::vector<std::unique_ptr<RingCollectives>> lanes,
                     std::shared_ptr<LaneAlarm> alarm)
    : lanes_(std::move(lanes)), active_(lanes_.size()), alarm_(std::move(alarm)) {
  if (lanes_.size() > 1) {
    pool_ = std::make_unique<TaskPool>(static_cast<int>(lanes_.size() - 1), "gs-lanes");
  }
}

RingLanes::~RingLanes() = default;

bool RingLanes::Idle() const {
  return std::all_of(lanes_.begin(), lanes_.end(), [](const auto& lane) { return lane->Idle(); });
}

size_t RingLanes::LanesFor(size_t bytes) const {
  return std::max<size_t>(1, std::min(active_, bytes / kMinLaneBytes));
}

Status RingLanes::Raised(Status s) {
  if (!s.ok()) alarm_->Raise(s);
  return s;
}

Status RingLanes::OnLanes(
    size_t used, size_t units,
    const std::function<Status(size_t lane, size_t first, size_t count)>& run) {
  // After a failure every lane is broken (and sends may still point into
  // the lanes' buffers): nothing runs again.
  GS_RETURN_IF_ERROR(alarm_->status());
  auto lane_run = [&](size_t lane) {
    const size_t first = units * lane / used;
    return Raised(run(lane, first, units * (lane + 1) / used - first));
  };
  std::vector<std::promise<Status>> done(used);
  for (size_t lane = 1; lane < used; ++lane) {
    if (!pool_->Run([&, lane] { done[lane].set_value(lane_run(lane)); })) {
      done[lane].set_value(CancelledError("the ring's lanes are shutting down"));
    }
  }
  Status result = lane_run(0);
  for (size_t lane = 1; lane < used; ++lane) {
    Status s = done[lane].get_future().get();
    if (result.ok()) result = std::move(s);
  }
  // The first lane to fail names the cause; the others failed on it.
  if (!result.ok()) return alarm_->status();
  return result;
}

Status RingLanes::AllReduce(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
                            Deadline deadline) {
  const size_t element = DTypeSize(dtype);
  const size_t used = LanesFor(count * element);
  if (used == 1) return Raised(lanes_[0]->AllReduce(data, count, dtype, op, tag, deadline));
  auto* bytes = static_cast<uint8_t*>(data);
  return OnLanes(used, count, [&](size_t lane, size_t first, size_t n) {
    return lanes_[lane]->AllReduce(bytes + first * element, n, dtype, op, tag, deadline);
  });
}

Status RingLanes::AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                            Deadline deadline) {
  const size_t used = LanesFor(bytes);
  if (used == 1) return Raised(lanes_[0]->AllGather(in, bytes, out, tag, deadline));
  // Lane k gathers slice k of every rank's block into a buffer of its own
  // (rank after rank), then puts each where the rank's block has it.
  const size_t n = static_cast<size_t>(world_size());
  if (gathered_.size() < used) gathered_.resize(used);
  const auto* from = static_cast<const uint8_t*>(in);
  auto* to = static_cast<uint8_t*>(out);
  return OnLanes(used, bytes, [&](size_t lane, size_t first, size_t count) -> Status {
    std::vector<uint8_t>& mine = gathered_[lane];
    if (mine.size() < count * n) mine.resize(count * n);
    GS_RETURN_IF_ERROR(lanes_[lane]->AllGather(from + first, count, mine.data(), tag, deadline));
    for (size_t r = 0; r < n; ++r) {
      std::memcpy(to + r * bytes + first, mine.data() + r * count, count);
    }
    return Status();
  });
}

Status RingLanes::Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                            Deadline deadline) {
  const size_t used = LanesFor(bytes);
  if (used == 1) return Raised(lanes_[0]->Broadcast(data, bytes, root, tag, deadline));
  auto* base = static_cast<uint8_t*>(data);
  return OnLanes(used, bytes, [&](size_t lane, size_t first, size_t n) {
    return lanes_[lane]->Broadcast(base + first, n, root, tag, deadline);
  });
}

RingStats RingLanes::stats() const {
  RingStats sum;
  for (const auto& lane : lanes_) {
    sum += lane->stats();
  }
  return sum;
}

}  // namespace gradsync::client
