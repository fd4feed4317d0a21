#include "client/sync_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/halving_doubling.h"
#include "client/link_probe.h"
#include "client/nccl_factory.h"
#include "client/ps_transport.h"
#include "cluster/node.h"
#include "cluster/ring_order.h"
#include "cluster/same_host_links.h"
#include "common/logging.h"
#include "wire/bulk_cipher.h"
#include "wire/same_host_transport.h"
#include "wire/tcp_stream_transport.h"

namespace gradsync::client {
namespace {

// The ring order's link probes: most bytes per probe, the longest a probe may
// take, how much faster another order must be to replace rank order, and
// the bucket id of the operation that shares the timings.
constexpr size_t kRingProbeBytes = size_t{1} << 20;
constexpr Millis kProbeTimeout(10000);
constexpr double kRingOrderMargin = 1.5;
constexpr int kProbePasses = 3;
// Probes faster than this count as this: below it (links of more than about
// 4 Gbit/s for a 512 KiB probe) a busy host's scheduling moves the times
// more than the links do.
constexpr std::chrono::microseconds kProbeFloor(1000);
constexpr double kLongestProbeMicros = 3.6e9;
// The bucket id of ring_lanes=auto's timed all-reduces.
constexpr uint32_t kRingLanesBucket = 0xfffffffeu;
// What each worker says of its ring in the gather of its streams' ports
// (the part's data; its ports are the lanes', lane k k-th, then the
// pairs', level k k-th, on the host the scheduler has for it).
struct LaneRecord {
  int32_t count = 0;
  int32_t automatic = 0;  // ring_lanes=auto
  int32_t algorithm = 0;  // RingAlgorithm as asked (CollectivePlan::asked)
};
static_assert(sizeof(LaneRecord) == 3 * sizeof(int32_t),
              "a LaneRecord goes over the wire as it is: no padding");

std::string LanesSetting(const LaneRecord& r) {
  const bool known = r.algorithm >= 0 &&
                     r.algorithm <= static_cast<int32_t>(RingAlgorithm::kAuto);  // else a peer's
  return std::string("ring_lanes=") + (r.automatic != 0 ? "auto" : std::to_string(r.count)) +
         ", ring_algorithm=" +
         (known ? RingAlgorithmName(static_cast<RingAlgorithm>(r.algorithm))
                : std::to_string(r.algorithm));
}

// ring_lanes=auto: the all-reduce each lane count is timed with, and how
// much faster every lane must be than lane 0 alone to be used.
constexpr size_t kAutoLanesBytes = size_t{4} << 20;
constexpr double kAutoLanesGain = 1.25;

// Fails when the job already knows that a collective cannot finish: the job
// ended, or a node of `role` died.
Status SessionHealth(const Session& session, wire::Role role) {
  GS_RETURN_IF_ERROR(session.job_status());
  GS_RETURN_IF_ERROR(session.MembershipStatus());
  return session.PeerDeathStatus(role);
}

// The ring to this worker's neighbours (its lanes), and the transports
// under it that are not the session's own.
struct Ring {
  // Every lane's and pair's TCP stream (with its shared-memory links).
  std::vector<std::unique_ptr<wire::Transport>> lane_transports;
  std::unique_ptr<RingLanes> lanes;  // destroyed before the transports
  // ring_algorithm=auto or halving_doubling over TCP streams, 2^L workers:
  // every all-reduce (with auto, those above small_bytes round `lanes` where
  // that measured faster) over pair rings (their transports in
  // lane_transports); all-gathers and broadcasts go to `lanes`.
  std::unique_ptr<HalvingDoubling> halving;
  // Every worker on one host with shared memory: the all-reduces over
  // segments (all-gathers and broadcasts stay on `lanes`); destroyed first.
  std::unique_ptr<HostCollectives> host;
  RingCollectives* ring() const { return &lanes->first(); }
  // Where the collectives go.
  Collectives& collectives() const {
    if (host) return *host;
    if (halving) return *halving;
    return *lanes;
  }
  uint64_t bytes_sent() const {
    return lanes->stats().bytes_sent + (host ? host->stats().bytes_published : 0) +
           (halving ? halving->stats().bytes_sent : 0);
  }
  void Shutdown() {
    if (host) host->Shutdown();
    for (auto& t : lane_transports) t->Shutdown();
  }
  // After Shutdown, once retired (SendsOut false): the segments, the links
  // and the lanes' transports go (a payload lent out of a link keeps that
  // link mapped until it is released); the rings stay, never used again.
  void Release() {
    host.reset();
    halving.reset();  // its sends point into callers' buffers only
    lane_transports.clear();
  }
  bool SendsOut() const { return (lanes && !lanes->Idle()) || (halving && !halving->Idle()); }
};

// This worker's ring peers, in `order` (empty: rank order).
RingPeers PeersInOrder(Session* session, const std::vector<int>& order) {
  const int n = session->num_workers();
  const int r = session->rank();
  RingPeers peers;
  peers.rank = r;
  peers.world_size = n;
  peers.order = order;
  peers.sender = wire::Sender{wire::Role::Worker, r, session->job_id()};
  peers.epoch = session->epoch();
  const cluster::RingNeighbours next = cluster::NeighboursOf(order, r, n);
  for (const wire::NodeInfo& p : session->peers()) {
    if (p.role != wire::Role::Worker || n < 2) continue;
    if (p.rank == next.right) peers.right_endpoint = p.DataEndpoint();
    if (p.rank == next.left) peers.left_identity = p.identity;
  }
  return peers;
}

// The options of a TCP stream of the ring under `identity` that takes the
// connections of `accept` alone.
wire::TcpStreamOptions RingStreamOptions(Session* session, const RingOptions& ring_options,
                                         const std::string& identity,
                                         std::vector<std::string> accept) {
  wire::TcpStreamOptions o;
  o.job_id = session->job_id();
  o.identity = identity;
  o.accept = std::move(accept);
  o.max_frame_bytes = RingFrameBytes(ring_options);
  o.max_message_bytes = o.max_frame_bytes + wire::Limits{}.max_header_bytes;
  o.refusals = session->refusals();
  o.node_keys = session->node_keys();  // CURVE: sealed under keys the node keys agree
  o.cipher = session->bulk_cipher();
  return o;
}

// The part of rank `rank` among a gather's (nullptr if none).
const wire::GatherPartFields* PartOf(const std::vector<wire::GatherPartFields>& parts, int rank) {
  for (const wire::GatherPartFields& p : parts) {
    if (p.rank == rank) return &p;
  }
  return nullptr;
}

// The ring order from measured links (cluster/ring_order.h); empty: rank
// order. Each host's lowest rank answers link-timing echoes at a stream
// port of its own (client/link_probe.h), announced through the scheduler,
// and times its links to the other hosts' (in turn, host h + 1, h + 2,
// ...); the rows go to every worker through the scheduler, whose gather
// also waits for every probe to end. Every worker derives the same order
// from the same rows. An elastic job measures again in each epoch (its
// gathers count per epoch, so a worker that joined takes part as the
// others do).
StatusOr<std::vector<int>> MeasuredOrder(Session* session, const SyncBackendOptions& options,
                                         const CollectivePlan& plan, Deadline deadline) {
  if (!plan.measured_order) return std::vector<int>{};
  const std::vector<wire::NodeInfo> peers = session->peers();
  const std::vector<std::vector<int>> hosts = cluster::WorkerHosts(peers);
  const size_t h_count = hosts.size();
  const int r = session->rank();
  std::vector<const wire::NodeInfo*> first(h_count, nullptr);
  size_t mine = 0;
  for (size_t h = 0; h < h_count; ++h) {
    if (std::find(hosts[h].begin(), hosts[h].end(), r) != hosts[h].end()) mine = h;
    for (const wire::NodeInfo& p : peers) {
      if (p.role == wire::Role::Worker && p.rank == hosts[h][0]) first[h] = &p;
    }
  }
  const bool prober = hosts[mine][0] == r && first[mine] != nullptr;
  const std::string own = session->self().identity;
  // Half the largest frame a ring stream takes.
  const size_t bytes = std::min(kRingProbeBytes, RingFrameBytes(options.ring) / 2);
  std::unique_ptr<LinkEcho> echo;
  wire::GatherPartFields part;
  if (prober) {
    std::vector<std::string> probers;
    for (size_t h = 0; h < h_count; ++h) {
      if (h != mine && first[h] != nullptr)
        probers.push_back(wire::ProbeIdentity(first[h]->identity));
    }
    GS_ASSIGN_OR_RETURN(std::string at, wire::ListenEndpoint(session->host(), 0));
    GS_ASSIGN_OR_RETURN(
        echo, LinkEcho::Listen(
                  RingStreamOptions(session, options.ring, wire::ProbeIdentity(own), probers), at));
    part.ports = {echo->port()};
  }
  GS_ASSIGN_OR_RETURN(const std::vector<wire::GatherPartFields> echoes,
                      session->Gather(part, deadline));
  std::vector<double> row(h_count, 0.0);
  // Each other host's echo endpoint ("" where it announced none), bound to
  // its first worker's key.
  std::vector<std::string> echo_at(h_count);
  for (size_t h = 0; prober && h < h_count; ++h) {
    const wire::GatherPartFields* theirs =
        first[h] == nullptr ? nullptr : PartOf(echoes, first[h]->rank);
    if (h == mine || theirs == nullptr || theirs->ports.size() != 1) continue;
    echo_at[h] = "tcp://" + first[h]->host + ":" + std::to_string(theirs->ports[0]);
    session->AddPeerEndpoint(first[h]->identity, echo_at[h]);
  }
  if (prober) {
    // kProbePasses passes over the links, each link's time the fastest of
    // all: a burst of load (peers still starting, another host's probe)
    // rarely lasts through every pass.
    std::vector<bool> failed(h_count, false);
    for (int pass = 0; pass < kProbePasses; ++pass) {
      for (size_t k = 1; k < h_count; ++k) {
        GS_RETURN_IF_ERROR(SessionHealth(*session, wire::Role::Worker));
        const size_t h = (mine + k) % h_count;
        if (first[h] == nullptr || failed[h]) continue;
        StatusOr<LinkTiming> timing = FailedPreconditionError("it announced no echo port");
        if (!echo_at[h].empty()) {
          timing = TimeLink(RingStreamOptions(session, options.ring, wire::ProbeIdentity(own), {}),
                            echo_at[h], bytes, deadline.Min(Deadline::After(kProbeTimeout)));
        }
        if (!timing.ok()) {
          GS_LOG(WARNING) << "cannot time the link to " << first[h]->Name() << " ("
                          << timing.status().message()
                          << "); the ring order avoids it where it can";
          failed[h] = true;
          row[h] = 0;
          continue;
        }
        const double t = static_cast<double>(std::max(kProbeFloor, timing->full).count());
        row[h] = pass == 0 ? t : std::min(row[h], t);
      }
    }
  }
  // The rows of each host's first worker (the others give none).
  wire::GatherPartFields times;
  if (prober) {
    times.data.resize(h_count * sizeof(double));
    std::memcpy(times.data.data(), row.data(), times.data.size());
  }
  GS_ASSIGN_OR_RETURN(const std::vector<wire::GatherPartFields> rows,
                      session->Gather(times, deadline));
  echo.reset();  // every prober gave its row: no probe is left
  std::vector<std::vector<double>> cost(h_count, std::vector<double>(h_count, 0.0));
  for (size_t h = 0; h < h_count; ++h) {
    const wire::GatherPartFields* theirs = PartOf(rows, hosts[h][0]);
    if (theirs == nullptr || theirs->data.size() != h_count * sizeof(double)) continue;
    std::memcpy(cost[h].data(), theirs->data.data(), theirs->data.size());
    // A peer's row is its word only: what no probe could give (not a
    // number, not positive, past an hour) counts as not measured.
    for (double& v : cost[h]) {
      if (!(v > 0 && v < kLongestProbeMicros)) v = 0;
    }
  }
  const std::vector<int> cycle = cluster::HostCycle(cost, kRingOrderMargin);
  std::vector<int> ranked(h_count);
  for (size_t h = 0; h < h_count; ++h) ranked[h] = static_cast<int>(h);
  auto slowest = [&](const std::vector<int>& c) { return cluster::SlowestLink(cost, c) / 1000; };
  if (cycle == ranked) {
    if (r == 0) {
      GS_LOG(INFO) << "ring in rank order over " << h_count << " hosts (measured links: slowest "
                   << slowest(ranked) << " ms a probe)";
    }
    return std::vector<int>{};
  }
  std::vector<int> order = cluster::RingOrderOf(hosts, cycle);
  if (r == 0) {
    GS_LOG(INFO) << "ring order " << cluster::OrderText(order) << " from measured links over "
                 << h_count << " hosts: slowest link " << slowest(cycle) << " ms a probe, against "
                 << slowest(ranked) << " ms in rank order";
  }
  return order;
}

// The identity lane `lane` of the node whose data transport is `identity`
// goes under ("" stays "").
std::string LaneName(const std::string& identity, int lane) {
  return lane == 0 || identity.empty() ? identity : wire::LaneIdentity(identity, lane);
}

// Lane k's shared-memory links: `links` (the ring neighbours on this host)
// under the lane's identities, the right neighbour's at `right_endpoint`.
wire::SameHostOptions LaneLinks(wire::SameHostOptions links, int lane,
                                const std::string& right_endpoint) {
  for (wire::SameHostPeer& p : links.peers) {
    p.identity = LaneName(p.identity, lane);
    if (!p.endpoint.empty()) p.endpoint = right_endpoint;
  }
  return links;
}

// The worker of job rank `rank` among the session's peers.
std::optional<wire::NodeInfo> WorkerOf(Session* session, int rank) {
  for (const wire::NodeInfo& p : session->peers()) {
    if (p.role == wire::Role::Worker && p.rank == rank) return p;
  }
  return std::nullopt;
}

// The `count` lanes of this worker's ring of `peers` in `order`, in
// *lanes: each a TcpStreamTransport of its own (in out->lane_transports)
// listening on a free port of this host and taking only its left
// neighbour's connection; where `links` names ring neighbours on this
// host, each lane reaches them through shared-memory links of its own over
// its stream. The ports go to the scheduler, which checks that no other
// node listens at them and hands every worker's to all (Session::Gather):
// no member forwards another's. Lane counts or algorithms that differ fail
// every worker, naming one that differs. Where the plan's algorithm is not
// the ring's (a world that fits HalvingDoublingFits), also a TCP
// stream of its own for each level of halving and doubling, its port
// gathered with the lanes', and the 2-rank ring with that level's partner
// over it in (*pairs)[level]; with `shm`, a partner on this host is
// reached through shared-memory links of the pair's own over that stream.
Status AddLanes(Session* session, const CollectivePlan& plan, const wire::SameHostOptions& links,
                const RingPeers& peers, const std::vector<int>& order,
                const RingOptions& ring_options, const HealthCheck& health, Ring* out,
                std::vector<std::unique_ptr<RingCollectives>>* lanes,
                std::vector<std::unique_ptr<RingCollectives>>* pairs, Deadline deadline) {
  const cluster::RingNeighbours next = cluster::NeighboursOf(order, peers.rank, peers.world_size);
  const std::optional<wire::NodeInfo> right = WorkerOf(session, next.right);
  if (!right) return InternalError("the ring's right neighbour is not a peer");
  LaneRecord mine;
  const int count = plan.lanes;
  const bool automatic = plan.lanes_auto;
  const bool shm = plan.shm;
  mine.count = count;
  mine.automatic = automatic ? 1 : 0;
  mine.algorithm = static_cast<int32_t>(plan.asked);
  const int levels =
      plan.algorithm != RingAlgorithm::kRing ? HalvingDoublingLevels(peers.world_size) : 0;
  GS_ASSIGN_OR_RETURN(std::string listen_at, wire::ListenEndpoint(session->host(), 0));
  auto port_of = [](const std::string& bound) {
    return static_cast<uint16_t>(std::stoi(bound.substr(bound.rfind(':') + 1)));
  };
  const std::string own = session->self().identity;
  wire::GatherPartFields part;
  part.data.resize(sizeof(mine));
  std::memcpy(part.data.data(), &mine, sizeof(mine));
  std::vector<std::unique_ptr<wire::Transport>> stream_transports;
  bool sealed = true;  // every stream sealed (what the transports say)
  for (int k = 0; k < count; ++k) {
    auto transport = std::make_unique<wire::TcpStreamTransport>(RingStreamOptions(
        session, ring_options, LaneName(own, k), {LaneName(peers.left_identity, k)}));
    sealed = sealed && transport->sealed();
    GS_ASSIGN_OR_RETURN(std::string bound, transport->Listen(listen_at));
    part.ports.push_back(port_of(bound));
    stream_transports.push_back(std::move(transport));
  }
  std::vector<std::unique_ptr<wire::TcpStreamTransport>> pair_transports;
  std::vector<wire::NodeInfo> partners;  // by level
  for (int k = 0; k < levels; ++k) {
    const std::optional<wire::NodeInfo> partner =
        WorkerOf(session, HalvingDoublingPartner(peers.rank, k));
    if (!partner) return InternalError("a halving-and-doubling partner is not a peer");
    partners.push_back(*partner);
    pair_transports.push_back(std::make_unique<wire::TcpStreamTransport>(
        RingStreamOptions(session, ring_options, wire::PairIdentity(own, k),
                          {wire::PairIdentity(partner->identity, k)})));
    GS_ASSIGN_OR_RETURN(std::string bound, pair_transports.back()->Listen(listen_at));
    part.ports.push_back(port_of(bound));
  }
  GS_ASSIGN_OR_RETURN(const std::vector<wire::GatherPartFields> all,
                      session->Gather(part, deadline));
  for (int q = 0; q < peers.world_size; ++q) {
    const wire::GatherPartFields* theirs = PartOf(all, q);
    LaneRecord record;
    if (theirs == nullptr || theirs->data.size() != sizeof(record)) {
      return FailedPreconditionError("worker " + std::to_string(q) +
                                     " announced no lanes of its ring");
    }
    std::memcpy(&record, theirs->data.data(), sizeof(record));
    if (record.count != count || (record.automatic != 0) != automatic ||
        record.algorithm != mine.algorithm) {
      return FailedPreconditionError("worker " + std::to_string(q) + " runs " +
                                     LanesSetting(record) + ", worker " +
                                     std::to_string(peers.rank) + " " + LanesSetting(mine) +
                                     ": every worker needs the same ring_lanes and "
                                     "ring_algorithm");
    }
    if (theirs->ports.size() != static_cast<size_t>(count + levels)) {
      return FailedPreconditionError("worker " + std::to_string(q) + " announced " +
                                     std::to_string(theirs->ports.size()) + " stream ports, not " +
                                     std::to_string(count + levels));
    }
  }
  for (int k = 0; k < levels; ++k) {
    const wire::NodeInfo& partner = partners[static_cast<size_t>(k)];
    const uint16_t port = PartOf(all, partner.rank)->ports[static_cast<size_t>(count + k)];
    const RingPeers pair =
        HalvingDoublingPairPeers(peers, k, "tcp://" + partner.host + ":" + std::to_string(port),
                                 wire::PairIdentity(partner.identity, k));
    session->AddPeerEndpoint(partner.identity, pair.right_endpoint);
    wire::SameHostOptions pair_links = links;
    pair_links.peers.clear();
    if (shm && cluster::SharesMachine(session->self(), partner)) {
      pair_links.peers.push_back({pair.left_identity, pair.right_endpoint, true, true});
    }
    out->lane_transports.push_back(cluster::OverSameHostLinks(
        std::move(pair_transports[static_cast<size_t>(k)]), std::move(pair_links),
        "pair of level " + std::to_string(k) + ": its partner on this host uses shared memory"));
    GS_ASSIGN_OR_RETURN(auto ring, RingCollectives::Create(out->lane_transports.back().get(), pair,
                                                           ring_options, health));
    pairs->push_back(std::move(ring));
  }
  const std::vector<uint16_t>& theirs = PartOf(all, right->rank)->ports;
  for (int k = 0; k < count; ++k) {
    RingPeers lane = peers;
    lane.right_endpoint =
        "tcp://" + right->host + ":" + std::to_string(theirs[static_cast<size_t>(k)]);
    lane.left_identity = LaneName(peers.left_identity, k);
    session->AddPeerEndpoint(right->identity, lane.right_endpoint);
    out->lane_transports.push_back(cluster::OverSameHostLinks(
        std::move(stream_transports[static_cast<size_t>(k)]),
        LaneLinks(links, k, lane.right_endpoint),
        "ring lane " + std::to_string(k) +
            ": neighbours on this host use shared memory, the others TCP streams"));
    GS_ASSIGN_OR_RETURN(auto ring, RingCollectives::Create(out->lane_transports.back().get(), lane,
                                                           ring_options, health));
    lanes->push_back(std::move(ring));
  }
  if (peers.rank == 0) {
    GS_LOG(INFO) << "ring over TCP streams"
                 << (sealed ? ", sealed under keys agreed with the node keys (AES-256-GCM by " +
                                  wire::BulkCipherEngineName(session->bulk_cipher()) + ")"
                            : std::string(", plain"));
  }
  return Status();
}

// ring_lanes=auto: times an all-reduce of kAutoLanesBytes over lane 0 alone
// and over every lane (the best of two each, after one over every lane
// that opens their connections) and keeps every lane when that is at least
// kAutoLanesGain faster, lane 0 alone otherwise. Rank 0's times decide and
// it tells the others, so that every rank cuts buffers alike.
Status ChooseLanes(RingLanes& lanes, int rank, Deadline deadline) {
  std::vector<float> data(kAutoLanesBytes / sizeof(float), 0.0f);
  uint64_t step = 1;
  auto timed = [&](size_t used) -> StatusOr<double> {
    lanes.SetActive(used);
    const SteadyTime start = std::chrono::steady_clock::now();
    GS_RETURN_IF_ERROR(lanes.AllReduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum,
                                       OpTag{step++, kRingLanesBucket, 0, 0}, deadline));
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  const size_t all = lanes.lanes();
  GS_RETURN_IF_ERROR(timed(all).status());
  double one_ms = std::numeric_limits<double>::infinity(), all_ms = one_ms;
  for (int rep = 0; rep < 2; ++rep) {
    GS_ASSIGN_OR_RETURN(double one, timed(1));
    GS_ASSIGN_OR_RETURN(double every, timed(all));
    one_ms = std::min(one_ms, one);
    all_ms = std::min(all_ms, every);
  }
  int32_t chosen = one_ms >= kAutoLanesGain * all_ms ? static_cast<int32_t>(all) : 1;
  GS_RETURN_IF_ERROR(
      lanes.Broadcast(&chosen, sizeof(chosen), 0, OpTag{step, kRingLanesBucket, 0, 0}, deadline));
  if (chosen != 1 && chosen != static_cast<int32_t>(all)) {  // worker 0's bytes
    return FailedPreconditionError("worker 0 chose " + std::to_string(chosen) +
                                   " ring lanes, not 1 or " + std::to_string(all));
  }
  lanes.SetActive(static_cast<size_t>(chosen));
  if (rank == 0) {
    GS_LOG(INFO) << "ring_lanes=auto: a " << (kAutoLanesBytes >> 20) << " MiB all-reduce took "
                 << one_ms << " ms over 1 lane, " << all_ms << " ms over " << all << ": using "
                 << chosen << (chosen == 1 ? " lane" : " lanes");
  }
  return Status();
}

StatusOr<Ring> MakeRing(Session* session, const SyncBackendOptions& options,
                        const CollectivePlan& plan, wire::RejectedMetrics* rejected,
                        Deadline deadline) {
  const int n = session->num_workers();
  const int r = session->rank();
  GS_ASSIGN_OR_RETURN(std::vector<int> order, MeasuredOrder(session, options, plan, deadline));
  RingPeers peers = PeersInOrder(session, order);
  wire::SameHostOptions links;
  links.job_id = session->job_id();
  links.link_bytes = options.shm_link_bytes;
  links.max_frame_bytes = RingFrameBytes(options.ring);
  links.max_message_bytes = links.max_frame_bytes + wire::Limits{}.max_header_bytes;
  links.refusals = session->refusals();
  // The scheduler passed on every node's host address and boot id.
  if (plan.shm) {
    links = cluster::RingSameHostOptions(links, session->self(), session->peers(), r, n, order);
  }
  // The ring's lanes are TCP streams of their own (sealed with CURVE),
  // neighbours on this host over shared memory beside them. Beside NCCL
  // one lane checks the layout and gathers the device records.
  Ring out;
  RingOptions ring_options = options.ring;
  ring_options.rejected = rejected;
  auto alarm = std::make_shared<LaneAlarm>();
  HealthCheck health = [session, alarm]() -> Status {
    GS_RETURN_IF_ERROR(SessionHealth(*session, wire::Role::Worker));
    return alarm->status();
  };
  std::vector<std::unique_ptr<RingCollectives>> lanes, pairs;
  if (n > 1) {
    Status s = AddLanes(session, plan, links, peers, order, ring_options, health, &out, &lanes,
                        &pairs, deadline);
    if (!s.ok()) {
      out.Shutdown();
      return s;
    }
  } else {
    // A ring of one sends nothing: a stream that never listens.
    out.lane_transports.push_back(std::make_unique<wire::TcpStreamTransport>(
        RingStreamOptions(session, ring_options, session->self().identity, {})));
    GS_ASSIGN_OR_RETURN(auto one, RingCollectives::Create(out.lane_transports.back().get(), peers,
                                                          ring_options, health));
    lanes.push_back(std::move(one));
  }
  out.lanes = std::make_unique<RingLanes>(std::move(lanes), std::move(alarm));
  if (plan.lanes_auto && out.lanes->lanes() > 1) {
    Status s = ChooseLanes(*out.lanes, r, deadline);
    if (!s.ok()) {
      out.Shutdown();
      return s;
    }
  }
  if (!pairs.empty()) {
    // auto: recursive doubling up to the ring's small_bytes, where it
    // moves log2(n) buffers to the ring's n - 1 and was 1.1-2.7x faster in
    // every run; larger all-reduces whichever way measured faster here:
    // round a link-bound ring, which kept pace with halving and doubling or
    // beat it, or by halving and doubling where the ring's steps cost CPU
    // time (docs/benchmarks.md, halving and doubling).
    const bool measure = plan.algorithm == RingAlgorithm::kAuto;
    auto made = HalvingDoubling::Create(r, n, std::move(pairs), out.lanes.get(), measure);
    if (!made.ok()) {
      out.Shutdown();
      return made.status();
    }
    out.halving = std::move(*made);
  }
  if (plan.same_host) {
    HostOptions host_options;
    host_options.enabled = plan.segments;
    host_options.poll_interval = ring_options.poll_interval;
    host_options.refusals = session->refusals();
    auto host = HostCollectives::Create(HostPeers{r, n, session->job_id(), session->epoch()},
                                        host_options, out.lanes.get(), health, deadline);
    if (!host.ok()) {
      out.Shutdown();
      return host.status();
    }
    out.host = std::move(*host);
  }
  return out;
}

// Buckets through `collectives` (the ring or NCCL), compressed as
// BucketCompression says; the ring checks the layout.
class AllReduceBackend : public SyncBackend {
 public:
  AllReduceBackend(Ring ring, std::unique_ptr<Collectives> nccl, BucketCompression* compression,
                   uint64_t seed)
      : ring_(std::move(ring)), nccl_(std::move(nccl)), compression_(compression), seed_(seed) {}

  const char* name() const override { return collectives().name(); }
  SyncPath path() const override { return nccl_ ? SyncPath::kNccl : SyncPath::kRing; }
  Collectives& direct() override { return collectives(); }
  Status CheckLayout(const std::vector<wire::TensorSpecFields>& layout,
                     Deadline deadline) override {
    return ring_.ring()->CheckLayout(layout, deadline);
  }
  Status Reduce(BucketMemory& memory, int index, const Bucket& b, const OpTag& tag,
                Deadline deadline, WireTraffic* traffic) override {
    const std::string spec = compression_->SpecOf(b.id);
    if (memory.Reduces(index, b.dtype, spec, collectives())) {
      return memory.Reduce(index, b.count, b.dtype, spec, collectives(), tag, seed_, deadline,
                           traffic);
    }
    GS_ASSIGN_OR_RETURN(uint8_t * data, memory.HostView(index, b.bytes(), true, deadline));
    if (b.dtype == DType::kF32) {
      GS_RETURN_IF_ERROR(compression_->Reduce(collectives(), b.id, reinterpret_cast<float*>(data),
                                              b.count, tag, seed_, deadline, traffic));
    } else {
      *traffic = WireTraffic{b.bytes(), b.bytes(), false};
      GS_RETURN_IF_ERROR(
          collectives().AllReduce(data, b.count, b.dtype, ReduceOp::kAverage, tag, deadline));
    }
    return memory.EndHostView(index, b.bytes());
  }
  uint64_t SentBytes(uint64_t) const override {
    return nccl_ ? 0 : ring_.bytes_sent();  // NCCL counts none
  }
  bool CanReform() const override { return nccl_ == nullptr; }
  void CloseLinks() override { ring_.Shutdown(); }
  void ReleaseRetired() override { ring_.Release(); }
  bool SendsOut() const override { return ring_.SendsOut(); }

 private:
  Collectives& collectives() const { return nccl_ ? *nccl_ : ring_.collectives(); }

  Ring ring_;
  std::unique_ptr<Collectives> nccl_;  // backend=nccl
  BucketCompression* compression_;
  uint64_t seed_;
};

// Buckets to the parameter-server shards; the ring for the rest.
class PsBackend : public SyncBackend {
 public:
  PsBackend(Ring ring, std::unique_ptr<PsClient> ps) : ring_(std::move(ring)), ps_(std::move(ps)) {}

  const char* name() const override { return ps_->name(); }
  SyncPath path() const override { return SyncPath::kPs; }
  Collectives& direct() override { return ring_.collectives(); }
  SyncPath direct_path() const override { return SyncPath::kRing; }
  Status CheckLayout(const std::vector<wire::TensorSpecFields>& layout,
                     Deadline deadline) override {
    return ring_.ring()->CheckLayout(layout, deadline);
  }
  Status PrepareBuckets(const std::vector<std::pair<uint32_t, std::string>>& specs) override {
    for (const auto& [id, spec] : specs) GS_RETURN_IF_ERROR(ps_->SetCompression(id, spec));
    return Status();
  }
  Status Reduce(BucketMemory& memory, int index, const Bucket& b, const OpTag& tag,
                Deadline deadline, WireTraffic* traffic) override {
    // The shards' results come back through host memory; the bucket goes
    // there only when the pushes carry it uncompressed (else its partitions
    // are compressed where the bucket is: EncodePartition).
    GS_ASSIGN_OR_RETURN(uint8_t * data,
                        memory.HostView(index, b.bytes(), ps_->PushesRaw(b.id, b.count), deadline));
    Status s = ps_->PushPull(data, b.count, b.dtype, tag, deadline);
    const PsClient::Traffic moved = ps_->last_traffic();
    *traffic = WireTraffic{moved.sent, moved.received, false};
    GS_RETURN_IF_ERROR(s);
    return memory.EndHostView(index, b.bytes());
  }
  SyncOp BucketOp(const WireTraffic&) const override { return SyncOp::kPushPull; }
  uint64_t SentBytes(uint64_t wire_bytes) const override { return wire_bytes; }  // pushes
  uint64_t Resent() const override { return ps_->stats().resent; }
  bool CanReform() const override { return true; }
  void CloseLinks() override {
    ring_.Shutdown();
    ps_->Close();
  }
  // The client's transport is its own, shut down by Close: nothing can
  // point into the client (its compressors' residuals among it).
  void ReleaseRetired() override {
    ring_.Release();
    ps_.reset();
  }
  bool SendsOut() const override { return ring_.SendsOut(); }
  void ResumeAt(uint64_t completed) override { ps_->ResumeAt(completed); }

 private:
  Ring ring_;
  std::unique_ptr<PsClient> ps_;
};

StatusOr<std::unique_ptr<SyncBackend>> MakePsBackend(const SyncBackendOptions& options,
                                                     Session* session,
                                                     BucketCompression* compression,
                                                     BucketMemory* memory, Ring ring,
                                                     wire::RejectedMetrics* rejected,
                                                     std::function<bool()> stopped) {
  const int n = session->num_workers();
  const int r = session->rank();
  PsPeers peers{r, n, session->epoch(), PsShardEndpoints(*session),
                wire::Sender{wire::Role::Worker, r, session->job_id()}};
  auto health = [session, stopped = std::move(stopped)]() -> Status {
    if (stopped()) return CancelledError("the communicator was shut down");
    // The shards close rounds without dead workers; a dead shard ends it.
    return SessionHealth(*session, wire::Role::Server);
  };
  // The shards answer on a transport of the PS client's own, known to them
  // by this identity (wire::PsClientIdentity); the ring keeps the session's.
  GS_ASSIGN_OR_RETURN(std::unique_ptr<wire::Transport> transport,
                      MakePsClientTransport(*session, options.ps_links));
  PsClientOptions ps_options = options.ps;
  ps_options.rejected = rejected;
  GS_ASSIGN_OR_RETURN(auto ps, PsClient::Create(std::move(transport), peers, ps_options, health));
  if (memory->device()) {
    // Compressed pushes are made on the GPU: only their bytes reach the host.
    const Millis timeout = options.op_timeout;
    ps->SetPartitionEncoder(
        [memory, compression, timeout](
            uint32_t bucket, uint32_t partition, size_t offset, size_t count,
            const compression::CompressContext& ctx) -> StatusOr<wire::Payload> {
          GS_ASSIGN_OR_RETURN(
              auto bytes,
              memory->EncodePartition(static_cast<int>(bucket), partition, offset, count,
                                      compression->SpecOf(bucket), ctx, Deadline::After(timeout)));
          const uint8_t* data = bytes->data();
          const size_t size = bytes->size();
          return wire::Payload::Borrow(data, size, std::move(bytes));
        });
  }
  return std::unique_ptr<SyncBackend>(new PsBackend(std::move(ring), std::move(ps)));
}

}  // namespace

StatusOr<std::unique_ptr<SyncBackend>> MakeSyncBackend(
    const SyncBackendOptions& options, Session* session, BucketCompression* compression,
    BucketMemory* memory, wire::RejectedMetrics* ring_rejected, wire::RejectedMetrics* ps_rejected,
    std::function<bool()> stopped, Deadline deadline) {
  const JobShape shape{session->num_workers(), cluster::WorkerHosts(session->peers()).size()};
  CollectivePlan plan = PlanCollectives(options.collectives, shape);
  if (session->rank() == 0) GS_LOG(INFO) << plan.Describe();
  GS_ASSIGN_OR_RETURN(Ring ring, MakeRing(session, options, plan, ring_rejected, deadline));
  std::unique_ptr<SyncBackend> backend;
  if (plan.way == SyncPath::kPs) {
    GS_ASSIGN_OR_RETURN(backend, MakePsBackend(options, session, compression, memory,
                                               std::move(ring), ps_rejected, std::move(stopped)));
  } else {
    std::unique_ptr<Collectives> nccl;
    if (plan.way == SyncPath::kNccl) {
      GS_ASSIGN_OR_RETURN(nccl,
                          MakeNcclCollectives(session, options.cuda_device, ring.ring(), deadline));
    }
    backend.reset(new AllReduceBackend(std::move(ring), std::move(nccl), compression,
                                       options.compression_seed));
  }
  backend->set_plan(std::move(plan));
  return backend;
}

}  // namespace gradsync::client
