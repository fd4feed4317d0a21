// How a communicator's collectives go, decided in one place.
//
// CollectiveSettings are the all-reduce settings as the job's Config gives
// them (path, backend, ring_shm, ring_shm_allreduce, ring_order, ring_lanes,
// ring_algorithm), read and checked once (FromConfig), into values that say
// what each means. PlanCollectives applies them to the job's shape in a
// membership epoch (its workers, the hosts they are on) and gives the
// CollectivePlan that MakeSyncBackend (client/sync_backend.h) builds, once
// per epoch: nothing downstream reads a setting again or decides otherwise.
// What the plan leaves to measurement is said in it: ring_lanes=auto (the
// lanes are opened, a timed all-reduce picks all or one) and
// ring_algorithm=auto (each all-reduce size goes the way its first runs
// measured faster).
//
// The plan is logged in one line by worker 0 (Describe) and exported as the
// labels of gradsync_client_collectives (Labels).
#ifndef GRADSYNC_CLIENT_COLLECTIVE_PLAN_H_
#define GRADSYNC_CLIENT_COLLECTIVE_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "client/client_metrics.h"
#include "common/config.h"
#include "common/status.h"

namespace gradsync::client {

// ring_algorithm. The values go over the wire (the workers compare theirs
// when the ring is made).
enum class RingAlgorithm : int32_t { kRing = 0, kHalvingDoubling = 1, kAuto = 2 };
// The lanes ring_lanes=auto opens and chooses among (all, or the first).
constexpr int kAutoRingLanes = 4;
// ring_order=measured times the links of at least this many and at most
// kMostMeasuredHosts hosts (every worker gets every row in one message).
constexpr size_t kLeastMeasuredHosts = 4;
constexpr size_t kMostMeasuredHosts = 64;

const char* RingAlgorithmName(RingAlgorithm algorithm);  // ring, halving_doubling, auto

struct CollectiveSettings {
  // Where buckets go (client/client_metrics.h): round the workers' ring
  // (path=allreduce, backend=ring), to NCCL (backend=nccl), or to the
  // parameter-server shards (path=ps).
  SyncPath way = SyncPath::kRing;
  // ring_shm: ring neighbours on one host exchange their messages through
  // shared memory (wire/same_host_transport.h).
  bool shm = true;
  // ring_shm_allreduce=segments (true) or ring: with every worker on one
  // host (and shm), all-reduces through shared-memory segments
  // (client/host_collectives.h) or round the ring's links.
  bool shm_segments = true;
  // ring_order=measured (true) or rank: the ring goes round the hosts in the
  // order its measured links favour (cluster/ring_order.h).
  bool measured_order = true;
  // ring_lanes: the ring's lanes (client/ring_lanes.h), each a TCP stream of
  // its own; `lanes_auto`: ring_lanes=auto (kAutoRingLanes opened).
  int lanes = 1;
  bool lanes_auto = false;
  RingAlgorithm algorithm = RingAlgorithm::kAuto;

  // InvalidArgument naming the setting and the values it takes.
  static StatusOr<CollectiveSettings> FromConfig(const Config& config);
};

// The job in a membership epoch: its workers and the hosts they are on.
struct JobShape {
  int workers = 1;
  size_t hosts = 1;
};

struct CollectivePlan {
  SyncPath way = SyncPath::kRing;
  JobShape shape;
  bool shm = true;  // ring neighbours on one host over shared memory
  // The ring goes round the hosts in the measured order (else rank order;
  // `order_asked`: ring_order=measured).
  bool measured_order = false;
  bool order_asked = false;
  // The ring's lanes; `lanes_auto`: opened, then all or the first used as a
  // timed all-reduce favours. One lane beside NCCL and where every worker
  // is on one host with shm (the links carry the data there).
  int lanes = 1;
  bool lanes_auto = false;
  // As applied: halving and doubling only over TCP streams and for a power
  // of two of at least 4 workers. `asked`: the setting where the ring has
  // streams to run it over (not beside NCCL nor on one host with shm),
  // which every worker must share whatever the world size.
  RingAlgorithm algorithm = RingAlgorithm::kRing;
  RingAlgorithm asked = RingAlgorithm::kRing;
  // Every worker on one host with shm (not beside NCCL): the workers agree
  // through HostCollectives whether all-reduces go through shared-memory
  // segments (`segments`, ring_shm_allreduce=segments) or round the ring.
  bool same_host = false;
  bool segments = false;

  // One line: the way, the shape, and how the all-reduces go.
  std::string Describe() const;
  // The labels of gradsync_client_collectives: path, algorithm, lanes,
  // order, same_host.
  std::map<std::string, std::string> Labels() const;
};

CollectivePlan PlanCollectives(const CollectiveSettings& settings, const JobShape& shape);

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_COLLECTIVE_PLAN_H_
