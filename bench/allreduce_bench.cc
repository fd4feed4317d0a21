// allreduce_bench: our CPU ring all-reduce (client::RingCollectives over
// wire::ZmqTransport) against Gloo's AllreduceRing and AllreduceRingChunked,
// fp32 sum, on loopback.
//
// The parent process re-executes itself once per rank (--child) for each
// world size N (2 and 4 by default). The ranks of one group share a
// gloo::rendezvous::FileStore in a temporary directory: Gloo connects its TCP
// full mesh through it, and each rank publishes there the endpoint its
// ZeroMQ transport bound (tcp://127.0.0.1, port 0), so that it can connect to
// its right neighbour. For every size, in the same processes on the same data:
//   1. check: each implementation all-reduces known integer-valued data once;
//      the result must equal the exact sum, or the rank exits loudly;
//   2. time: warm-up rounds, then timed rounds. In each round every
//      implementation runs once (interleaved, so that noise on this shared
//      machine hits all of them alike): restore the input, a barrier on the
//      implementation's own transport (our rings: an all-reduce of one
//      float; Gloo's: Gloo's barrier; OpenMPI: MPI_Barrier), time one
//      all-reduce. With --gloo_barrier our rings' rounds start with Gloo's
//      barrier too, as they all did before: its ranks sleep in epoll and are
//      woken by TCP, which can leave two ranks on one core (see
//      docs/benchmarks.md). Per round the time is the max over ranks; the
//      reported latency is the median over rounds.
// Rank 0 writes the medians to a file; the parent prints a table per N
// (algbw = bytes / time, busbw = algbw * 2(N-1)/N, GB/s = 1e9 bytes/s, and
// ours / best Gloo), whether the targets were met (against Gloo; against
// OpenMPI over TCP and on one host; the sealed ring >= 0.7x the plain one's
// busbw from 1 MiB), and one JSON line per
// (impl, ranks, bytes). --verbose adds min / p90 and the CPU time per
// all-reduce (process CPU of every thread, summed over ranks).
//
// Every wait has a deadline (Gloo's and our ring's per operation, the
// parent's per group): a child that fails or hangs is killed and reported by
// rank with the tail of its output; a wrong sum exits with its own code and
// the bench aborts naming the rank and the implementation.
//
// OpenMPI (openmpi_tcp, openmpi; bench/mpi_allreduce.cc) runs after the
// others for each N, under mpirun in processes of its own, with the same
// sizes, rounds and timing; its results join the same table and JSON lines.
//
//   bazel run --config=opt //bench:allreduce_bench -- --quick
//   flags: --quick --ranks=2,4 --sizes=4K,1M,... --iters=N --warmup=N
//          --impls=gradsync_ring,gloo_ring,gloo_ring_chunked,gradsync_ring_curve,
//                  gradsync_ring_shm,gradsync_ring_sealed,gradsync_ring_zmq,openmpi_tcp,
//                  openmpi,gradsync_shm_segments,gradsync_hd,gradsync_auto
//          --chunk_bytes=N --small_bytes=N --slot_bytes=N (gradsync_shm_segments)
//          --op_timeout_s=60 --group_timeout_s=N --gloo_barrier --keep_tmp --verbose

#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "client/halving_doubling.h"
#include "client/host_collectives.h"
#include "client/ring.h"
#include "common/config.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "common/time.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "wire/curve.h"
#include "wire/node_keys.h"
#include "wire/same_host_transport.h"
#include "wire/tcp_stream_transport.h"
#include "wire/zmq_transport.h"

extern char** environ;

namespace gradsync::bench {
namespace {

using Steady = std::chrono::steady_clock;
// gradsync_ring: our ring as a job without CURVE runs it between hosts, over
// TCP connections its threads read and write (wire/tcp_stream_transport.h).
// gradsync_ring_zmq: the same ring over ZeroMQ (wire/zmq_transport.h), the
// transport under the shared-memory links of a job on one host.
// gradsync_ring_curve: that ring with CurveZMQ (wire/curve.h) on every socket.
// gradsync_ring_sealed: our ring as a CURVE job runs it between hosts: TCP
// streams sealed with AES-256-GCM under keys agreed with every rank's own
// node key (wire/tcp_stream_transport.h).
// gradsync_ring_shm: our ring with the neighbours' messages in shared memory
// (wire/same_host_transport.h).
// gradsync_shm_segments: our all-reduce over shared-memory segments
// (client/host_collectives.h), as a job on one host runs it.
// gradsync_hd: our all-reduce by halving and doubling over TCP streams, a
// 2-rank ring with each partner (client/halving_doubling.h), as a job with
// ring_algorithm=halving_doubling runs it between hosts (up to the ring's
// small_bytes by recursive doubling); 4, 8, 16 ... ranks.
// gradsync_auto: as a job runs by default (ring_algorithm=auto) between
// hosts with 4, 8, 16 ... workers: recursive doubling up to small_bytes,
// larger sizes the way that measured faster (client/halving_doubling.h);
// the trials of each size run before its rounds, and the way each size
// took is printed under the table.
// openmpi_tcp / openmpi: MPI_Allreduce under mpirun (bench/mpi_allreduce.cc),
// TCP only (--mca btl self,tcp) and OpenMPI's default (shared memory).
constexpr const char* kImplNames[] = {"gradsync_ring",     "gloo_ring",
                                      "gloo_ring_chunked", "gradsync_ring_curve",
                                      "openmpi_tcp",       "openmpi",
                                      "gradsync_ring_shm", "gradsync_ring_sealed",
                                      "gradsync_ring_zmq", "gradsync_shm_segments",
                                      "gradsync_hd",       "gradsync_auto"};
constexpr int kNumImpls = 12;
constexpr int kOurs = 0;
constexpr int kOursCurve = 3;
constexpr int kMpiTcp = 4;
constexpr int kMpi = 5;
constexpr int kOursShm = 6;
constexpr int kOursSealed = 7;
constexpr int kOursZmq = 8;
constexpr int kOursSegments = 9;
constexpr int kOursHd = 10;
constexpr int kOursAuto = 11;
constexpr int kExitFailed = 3;    // a child's exit code when something failed
constexpr int kExitWrongSum = 4;  // ... when an implementation computed a wrong sum

// ---------------------------------------------------------------------------
// Settings shared by parent and children.

struct Settings {
  bool quick = false;
  std::vector<int> ranks;
  std::vector<size_t> sizes;
  std::vector<bool> impl_on;  // by index into kImplNames
  int64_t iters = 0;          // 0: by size
  int64_t warmup = -1;        // -1: by size
  int64_t chunk_bytes = 0;    // 0: RingOptions default
  int64_t small_bytes = -1;   // -1: RingOptions default
  int64_t slot_bytes = 0;     // 0: HostOptions default
  int64_t op_timeout_s = 60;
  int64_t group_timeout_s = 0;  // 0: by plan
  bool keep_tmp = false;
  bool verbose = false;       // also print min / p50 / p90 per row
  bool gloo_barrier = false;  // our rings' rounds also start with Gloo's barrier
};

// "4K", "16M", "4096" -> bytes.
StatusOr<size_t> ParseSize(const std::string& s) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  std::string unit = end;
  size_t scale = unit.empty() ? 1 : unit == "K" ? 1 << 10 : unit == "M" ? 1 << 20 : 0;
  if (end == s.c_str() || scale == 0) return InvalidArgumentError("bad size '" + s + "'");
  size_t bytes = v * scale;
  if (bytes == 0 || bytes % 4 != 0 || bytes > (size_t{1} << 30)) {
    return InvalidArgumentError("size '" + s + "' must be a multiple of 4, at most 1 GiB");
  }
  return bytes;
}

// "4 KiB", "256 MiB".
std::string SizeName(size_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

std::string DefaultSizes(bool quick) {
  return quick ? "4K,16K,64K,256K,1M,4M,16M" : "4K,16K,64K,256K,1M,4M,16M,64M,256M";
}

Status ParseLists(const Config& config, Settings* s) {
  GS_ASSIGN_OR_RETURN(std::string ranks, config.GetString("ranks", "2,4"));
  GS_ASSIGN_OR_RETURN(std::string sizes, config.GetString("sizes", DefaultSizes(s->quick)));
  GS_ASSIGN_OR_RETURN(std::string impls,
                      config.GetString("impls",
                                       "gradsync_ring,gloo_ring,gloo_ring_chunked,"
                                       "gradsync_ring_curve,gradsync_ring_shm,"
                                       "gradsync_ring_sealed,gradsync_ring_zmq,"
                                       "openmpi_tcp,openmpi,"
                                       "gradsync_shm_segments"));
  for (const auto& r : Split(ranks)) {
    int n = std::atoi(r.c_str());
    if (n < 2 || n > 16) return InvalidArgumentError("--ranks: '" + r + "' not in [2, 16]");
    s->ranks.push_back(n);
  }
  for (const auto& z : Split(sizes)) {
    GS_ASSIGN_OR_RETURN(size_t bytes, ParseSize(z));
    s->sizes.push_back(bytes);
  }
  s->impl_on.assign(kNumImpls, false);
  for (const auto& name : Split(impls)) {
    auto it = std::find_if(std::begin(kImplNames), std::end(kImplNames),
                           [&](const char* n) { return name == n; });
    if (it == std::end(kImplNames)) return InvalidArgumentError("--impls: unknown '" + name + "'");
    s->impl_on[it - std::begin(kImplNames)] = true;
  }
  return OkStatus();
}

StatusOr<Settings> ParseSettings(const Config& config) {
  Settings s;
  GS_ASSIGN_OR_RETURN(s.quick, config.GetBool("quick", false));
  GS_RETURN_IF_ERROR(ParseLists(config, &s));
  GS_ASSIGN_OR_RETURN(s.iters, config.GetInt("iters", 0));
  GS_ASSIGN_OR_RETURN(s.warmup, config.GetInt("warmup", -1));
  GS_ASSIGN_OR_RETURN(s.chunk_bytes, config.GetInt("chunk_bytes", 0));
  GS_ASSIGN_OR_RETURN(s.small_bytes, config.GetInt("small_bytes", -1));
  GS_ASSIGN_OR_RETURN(s.slot_bytes, config.GetInt("slot_bytes", 0));
  GS_ASSIGN_OR_RETURN(s.op_timeout_s, config.GetInt("op_timeout_s", 60));
  GS_ASSIGN_OR_RETURN(s.group_timeout_s, config.GetInt("group_timeout_s", 0));
  GS_ASSIGN_OR_RETURN(s.keep_tmp, config.GetBool("keep_tmp", false));
  GS_ASSIGN_OR_RETURN(s.verbose, config.GetBool("verbose", false));
  GS_ASSIGN_OR_RETURN(s.gloo_barrier, config.GetBool("gloo_barrier", false));
  return s;
}

int TimedIters(const Settings& s, size_t bytes) {
  if (s.iters > 0) return static_cast<int>(s.iters);
  if (bytes <= (256 << 10)) return s.quick ? 20 : 50;
  if (bytes <= (4 << 20)) return s.quick ? 10 : 20;
  if (bytes <= (64 << 20)) return s.quick ? 5 : 10;
  return 5;
}

int WarmupIters(const Settings& s, size_t bytes) {
  if (s.warmup >= 0) return static_cast<int>(s.warmup);
  if (bytes <= (256 << 10)) return s.quick ? 3 : 5;
  return bytes <= (4 << 20) ? 2 : 1;
}

// ---------------------------------------------------------------------------
// Child: one rank.

// Gloo throws; the bench turns that into a Status at each call site.
Status GlooCall(const char* what, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return InternalError(std::string("gloo ") + what + ": " + e.what());
  }
  return OkStatus();
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

Buffer AllocBuffer(size_t bytes) {
  size_t rounded = (bytes + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded);
  if (p == nullptr) Die("out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, rounded);
  return Buffer(static_cast<float*>(p));
}

// The input of `rank` at element i is pattern[i % kPeriod] of a small integer
// pattern, so that every sum over ranks is exact in fp32.
constexpr size_t kPeriod = 509;

// One period of the inputs of ranks [first, end) summed: the input of one
// rank, or the all-reduce's expected result.
std::vector<float> Period(int first, int end) {
  std::vector<float> out(kPeriod, 0.0f);
  for (size_t j = 0; j < kPeriod; ++j) {
    for (int k = first; k < end; ++k) out[j] += static_cast<float>((j * 7 + k * 131) % kPeriod);
  }
  return out;
}

void FillInput(float* x, size_t count, int rank) {
  const std::vector<float> period = Period(rank, rank + 1);
  for (size_t i = 0, j = 0; i < count; ++i, j = j + 1 == kPeriod ? 0 : j + 1) x[i] = period[j];
}

class Impl {
 public:
  virtual ~Impl() = default;
  virtual Status Run() = 0;  // one in-place all-reduce of the bound buffer
  // Brings the ranks together on the implementation's own transport, as
  // MPI_Barrier does for OpenMPI: the timed all-reduce starts from the exits
  // of this barrier, whose skew is the transport's own. Without one
  // (HasAlign false), Gloo's barrier is the implementation's own (Gloo's).
  virtual bool HasAlign() const { return false; }
  virtual Status Align() { return Status(); }
};

class OursImpl : public Impl {
 public:
  OursImpl(client::Collectives* collectives, float* data, size_t count, uint64_t* seq,
           int timeout_s)
      : collectives_(collectives), data_(data), count_(count), seq_(seq), timeout_s_(timeout_s) {}
  Status Run() override {
    client::OpTag tag;
    tag.seq = (*seq_)++;
    tag.step = tag.seq;
    return collectives_->AllReduce(data_, count_, DType::kF32, client::ReduceOp::kSum, tag,
                                   Deadline::After(std::chrono::seconds(timeout_s_)));
  }
  // An all-reduce of one float: no rank leaves before every rank came.
  bool HasAlign() const override { return true; }
  Status Align() override {
    client::OpTag tag;
    tag.seq = (*seq_)++;
    tag.step = tag.seq;
    float one = 1;
    return collectives_->AllReduce(&one, 1, DType::kF32, client::ReduceOp::kSum, tag,
                                   Deadline::After(std::chrono::seconds(timeout_s_)));
  }

 private:
  client::Collectives* collectives_;
  float* data_;
  size_t count_;
  uint64_t* seq_;
  int timeout_s_;
};

template <typename Algo>
class GlooImpl : public Impl {
 public:
  GlooImpl(const std::shared_ptr<gloo::Context>& ctx, float* data, size_t count)
      : algo_(std::make_unique<Algo>(ctx, std::vector<float*>{data}, static_cast<int>(count))) {}
  Status Run() override {
    return GlooCall("all-reduce", [&] { algo_->run(); });
  }

 private:
  std::unique_ptr<Algo> algo_;  // held by pointer: Gloo's destructors are noexcept(false)
};

struct ChildArgs {
  int rank = 0;
  int world = 0;
  uint64_t job_id = 0;
  std::string dir;
  std::string results;
};

// What one rank holds for its whole life.
struct Rank {
  ChildArgs args;
  Settings settings;
  std::unique_ptr<gloo::rendezvous::FileStore> store;
  std::shared_ptr<gloo::Context> ctx;
  std::unique_ptr<gloo::BarrierAllToAll> barrier;
  // Our ring: plain, with CURVE, over shared memory (by impl index).
  struct OurRing {
    std::unique_ptr<wire::TcpStreamTransport> stream;    // kOurs
    std::unique_ptr<wire::ZmqTransport> transport;       // the others
    std::unique_ptr<wire::SameHostTransport> same_host;  // over transport (shm only)
    std::unique_ptr<client::RingCollectives> ring;
    std::unique_ptr<client::HostCollectives> host;  // over ring (segments only)
    // kOursHd, kOursAuto: a transport for each level's pair, and the
    // all-reduce over them (beside `ring`).
    std::vector<std::unique_ptr<wire::TcpStreamTransport>> pair_streams;
    std::unique_ptr<client::HalvingDoubling> hd;
    client::Collectives* collectives() const {
      if (hd) return hd.get();
      return host ? static_cast<client::Collectives*>(host.get()) : ring.get();
    }
    uint64_t seq = 0;
  };
  std::map<int, OurRing> ours;
};

Status ConnectGloo(Rank* r) {
  return GlooCall("connect", [&] {
    r->store = std::make_unique<gloo::rendezvous::FileStore>(r->args.dir);
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    attr.ai_family = AF_INET;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(r->args.rank, r->args.world);
    ctx->setTimeout(std::chrono::seconds(r->settings.op_timeout_s));
    ctx->connectFullMesh(*r->store, device);
    r->ctx = ctx;
    r->barrier = std::make_unique<gloo::BarrierAllToAll>(r->ctx);
  });
}

// Publishes `mine` under this rank's `prefix` key and returns rank `peer`'s
// (-1: the right neighbour's).
StatusOr<std::string> SwapEndpoints(Rank* r, const std::string& mine, const std::string& prefix,
                                    int peer = -1) {
  if (peer < 0) peer = (r->args.rank + 1) % r->args.world;
  std::string right_key = prefix + std::to_string(peer);
  std::vector<char> got;
  Status s = GlooCall("store", [&] {
    r->store->set(prefix + std::to_string(r->args.rank), {mine.begin(), mine.end()});
    r->store->wait({right_key}, std::chrono::seconds(r->settings.op_timeout_s));
    got = r->store->get(right_key);
  });
  if (!s.ok()) return s;
  return std::string(got.begin(), got.end());
}

// The job's CURVE key: made by rank 0, shared through the store under
// `name`.
StatusOr<wire::CurveKey> SharedKey(Rank* r, const std::string& name) {
  wire::CurveKey key;
  if (r->args.rank == 0) {
    GS_ASSIGN_OR_RETURN(key, wire::GenerateCurveKey());
  }
  const std::string mine =
      key.public_z85 + std::string(key.secret_z85.data(), key.secret_z85.size());
  std::vector<char> got;
  GS_RETURN_IF_ERROR(GlooCall("store", [&] {
    if (r->args.rank == 0) r->store->set(name, {mine.begin(), mine.end()});
    r->store->wait({name}, std::chrono::seconds(r->settings.op_timeout_s));
    got = r->store->get(name);
  }));
  if (got.size() != 80) return DataLossError("the shared CURVE key is not 80 characters");
  return wire::CurveKey{std::string(got.begin(), got.begin() + 40),
                        wire::SecretString(got.begin() + 40, got.end()), "", ""};
}

// The ZeroMQ identities of this rank's left and right neighbours, through
// the store.
StatusOr<std::pair<std::string, std::string>> NeighbourIdentities(Rank* r, int impl,
                                                                  const std::string& mine) {
  const int n = r->args.world;
  auto key = [impl](int rank) {
    return std::string(kImplNames[impl]) + "_identity_" + std::to_string(rank);
  };
  const std::string left = key((r->args.rank + n - 1) % n), right = key((r->args.rank + 1) % n);
  std::vector<char> got_left, got_right;
  GS_RETURN_IF_ERROR(GlooCall("store", [&] {
    r->store->set(key(r->args.rank), {mine.begin(), mine.end()});
    r->store->wait({left, right}, std::chrono::seconds(r->settings.op_timeout_s));
    got_left = r->store->get(left);
    got_right = r->store->get(right);
  }));
  return std::make_pair(std::string(got_left.begin(), got_left.end()),
                        std::string(got_right.begin(), got_right.end()));
}

// With node keys (kOursSealed): every rank's identity, public key and
// endpoint, through the store, become the plan of `keys`; returns the left
// neighbour's identity.
StatusOr<std::string> SharePlan(Rank* r, int impl, const std::string& endpoint,
                                wire::NodeKeys* keys, const std::string& identity) {
  const int n = r->args.world;
  auto key = [impl](int rank) {
    return std::string(kImplNames[impl]) + "_plan_" + std::to_string(rank);
  };
  const std::string mine = identity + "\n" + keys->own().public_z85 + "\n" + endpoint;
  std::vector<std::string> all(static_cast<size_t>(n));
  GS_RETURN_IF_ERROR(GlooCall("store", [&] {
    r->store->set(key(r->args.rank), {mine.begin(), mine.end()});
    for (int k = 0; k < n; ++k) {
      r->store->wait({key(k)}, std::chrono::seconds(r->settings.op_timeout_s));
      std::vector<char> got = r->store->get(key(k));
      all[static_cast<size_t>(k)].assign(got.begin(), got.end());
    }
  }));
  std::vector<wire::NodeInfo> plan;
  for (int k = 0; k < n; ++k) {
    const std::vector<std::string> f = Split(all[static_cast<size_t>(k)], '\n');
    if (f.size() != 3) return DataLossError("a rank's plan entry is malformed");
    wire::NodeInfo node;
    node.rank = k;
    node.identity = f[0];
    node.public_key = f[1];
    node.host = "127.0.0.1";
    node.data_port = static_cast<uint16_t>(std::atoi(f[2].c_str() + f[2].rfind(':') + 1));
    plan.push_back(node);
  }
  keys->SetPlan(plan);
  return plan[static_cast<size_t>((r->args.rank + n - 1) % n)].identity;
}

client::RingOptions OurRingOptions(const Rank& r) {
  client::RingOptions options;
  if (r.settings.chunk_bytes > 0) options.chunk_bytes = r.settings.chunk_bytes;
  if (r.settings.small_bytes >= 0) options.small_bytes = r.settings.small_bytes;
  return options;
}

// Our ring over TCP connections of its own (kOurs; kOursSealed: sealed,
// with node keys): identities rank-R, each rank taking its left
// neighbour's connection.
Status ConnectStreams(Rank* r, int impl, Rank::OurRing* ours) {
  const int n = r->args.world;
  auto name = [](int rank) { return "rank-" + std::to_string(rank); };
  wire::TcpStreamOptions options;
  options.job_id = r->args.job_id;
  options.identity = name(r->args.rank);
  options.accept = {name((r->args.rank + n - 1) % n)};
  std::shared_ptr<wire::NodeKeys> keys;
  if (impl == kOursSealed) {
    GS_ASSIGN_OR_RETURN(wire::CurveKey job, SharedKey(r, std::string(kImplNames[impl]) + "_key"));
    GS_ASSIGN_OR_RETURN(wire::CurveKey own, wire::GenerateCurveKey());
    keys = std::make_shared<wire::NodeKeys>(job, own);
    options.node_keys = keys;
  }
  ours->stream = std::make_unique<wire::TcpStreamTransport>(options);
  GS_ASSIGN_OR_RETURN(std::string endpoint, ours->stream->Listen("tcp://127.0.0.1:0"));
  if (keys) GS_RETURN_IF_ERROR(SharePlan(r, impl, endpoint, keys.get(), options.identity).status());
  GS_ASSIGN_OR_RETURN(std::string right,
                      SwapEndpoints(r, endpoint, std::string(kImplNames[impl]) + "_endpoint_"));
  client::RingPeers peers;
  peers.left_identity = options.accept[0];
  peers.rank = r->args.rank;
  peers.world_size = n;
  peers.right_endpoint = right;
  peers.sender = wire::Sender{wire::Role::Worker, r->args.rank, r->args.job_id};
  GS_ASSIGN_OR_RETURN(ours->ring, client::RingCollectives::Create(ours->stream.get(), peers,
                                                                  OurRingOptions(*r), nullptr));
  return OkStatus();
}

// kOursHd, kOursAuto (`impl`): the plain ring over TCP streams
// (ConnectStreams) and, beside it, a 2-rank ring over TCP streams with each
// level's partner.
Status ConnectHd(Rank* r, int impl, Rank::OurRing* ours) {
  const int n = r->args.world;
  const int rank = r->args.rank;
  GS_RETURN_IF_ERROR(ConnectStreams(r, impl, ours));
  auto name = [](int rank, int level) {
    return "rank-" + std::to_string(rank) + "/pair" + std::to_string(level);
  };
  std::vector<std::unique_ptr<client::RingCollectives>> pairs;
  for (int k = 0; k < client::HalvingDoublingLevels(n); ++k) {
    const int partner = client::HalvingDoublingPartner(rank, k);
    wire::TcpStreamOptions options;
    options.job_id = r->args.job_id;
    options.identity = name(rank, k);
    options.accept = {name(partner, k)};
    ours->pair_streams.push_back(std::make_unique<wire::TcpStreamTransport>(options));
    GS_ASSIGN_OR_RETURN(std::string endpoint,
                        ours->pair_streams.back()->Listen("tcp://127.0.0.1:0"));
    GS_ASSIGN_OR_RETURN(
        std::string theirs,
        SwapEndpoints(r, endpoint, std::string(kImplNames[impl]) + "_" + std::to_string(k) + "_",
                      partner));
    client::RingPeers job;
    job.rank = rank;
    job.world_size = n;
    job.sender = wire::Sender{wire::Role::Worker, rank, r->args.job_id};
    const client::RingPeers peers =
        client::HalvingDoublingPairPeers(job, k, theirs, options.accept[0]);
    GS_ASSIGN_OR_RETURN(auto pair,
                        client::RingCollectives::Create(ours->pair_streams.back().get(), peers,
                                                        OurRingOptions(*r), nullptr));
    pairs.push_back(std::move(pair));
  }
  GS_ASSIGN_OR_RETURN(ours->hd,
                      client::HalvingDoubling::Create(rank, n, std::move(pairs), ours->ring.get(),
                                                      /*measure=*/impl == kOursAuto));
  return OkStatus();
}

// Our ring for implementation `impl` (kOurs, kOursSealed, kOursZmq,
// kOursCurve or kOursShm).
Status ConnectOurs(Rank* r, int impl) {
  Rank::OurRing& ours = r->ours[impl];
  if (impl == kOurs || impl == kOursSealed) return ConnectStreams(r, impl, &ours);
  if (impl == kOursHd || impl == kOursAuto) {
    if (client::HalvingDoublingFits(r->args.world)) return ConnectHd(r, impl, &ours);
    r->ours.erase(impl);  // not for this many ranks
    return OkStatus();
  }
  wire::ZmqOptions zmq;
  if (impl == kOursCurve) {
    GS_ASSIGN_OR_RETURN(zmq.curve, SharedKey(r, std::string(kImplNames[impl]) + "_key"));
  }
  GS_ASSIGN_OR_RETURN(ours.transport, wire::ZmqTransport::Create(zmq));
  GS_ASSIGN_OR_RETURN(std::string endpoint, ours.transport->Listen("tcp://127.0.0.1:0"));
  GS_ASSIGN_OR_RETURN(std::string right,
                      SwapEndpoints(r, endpoint, std::string(kImplNames[impl]) + "_endpoint_"));
  client::RingPeers peers;
  peers.rank = r->args.rank;
  peers.world_size = r->args.world;
  peers.right_endpoint = right;
  peers.sender = wire::Sender{wire::Role::Worker, r->args.rank, r->args.job_id};
  const client::RingOptions options = OurRingOptions(*r);
  wire::Transport* ring_transport = ours.transport.get();
  if (impl == kOursShm || impl == kOursSegments) {
    wire::SameHostOptions links;
    links.job_id = r->args.job_id;
    GS_ASSIGN_OR_RETURN(auto ids, NeighbourIdentities(r, impl, ours.transport->identity()));
    if (r->args.world == 2) {
      links.peers.push_back({ids.second, right, true, true});
    } else {
      links.peers.push_back({ids.second, right, true, false});
      links.peers.push_back({ids.first, "", false, true});
    }
    peers.left_identity = ids.first;
    ours.same_host = std::make_unique<wire::SameHostTransport>(ring_transport, links);
    ring_transport = ours.same_host.get();
  }
  GS_ASSIGN_OR_RETURN(ours.ring,
                      client::RingCollectives::Create(ring_transport, peers, options, nullptr));
  if (impl == kOursSegments) {
    client::HostPeers host{r->args.rank, r->args.world, r->args.job_id, 0};
    client::HostOptions host_options;
    if (r->settings.slot_bytes > 0) host_options.slot_bytes = r->settings.slot_bytes;
    GS_ASSIGN_OR_RETURN(
        ours.host, client::HostCollectives::Create(host, host_options, ours.ring.get(), nullptr,
                                                   Deadline::After(std::chrono::seconds(60))));
    if (!ours.host) return UnavailableError("the all-reduce over segments could not be set up");
  }
  return OkStatus();
}

Status Barrier(Rank* r) {
  return GlooCall("barrier", [&] { r->barrier->run(); });
}

std::vector<std::unique_ptr<Impl>> MakeImpls(Rank* r, float* data, size_t count) {
  std::vector<std::unique_ptr<Impl>> impls(kNumImpls);
  const auto& on = r->settings.impl_on;
  for (auto& [impl, ours] : r->ours) {
    impls[impl] = std::make_unique<OursImpl>(ours.collectives(), data, count, &ours.seq,
                                             static_cast<int>(r->settings.op_timeout_s));
  }
  if (on[1]) impls[1] = std::make_unique<GlooImpl<gloo::AllreduceRing<float>>>(r->ctx, data, count);
  if (on[2]) {
    impls[2] = std::make_unique<GlooImpl<gloo::AllreduceRingChunked<float>>>(r->ctx, data, count);
  }
  return impls;
}

Status Verify(const Rank& r, const char* impl, const float* data, size_t count) {
  const std::vector<float> sum = Period(0, r.args.world);
  for (size_t i = 0, j = 0; i < count; ++i, j = j + 1 == kPeriod ? 0 : j + 1) {
    const float want = sum[j];
    if (data[i] != want) {
      return DataLossError(std::string(impl) + " gave a wrong sum on rank " +
                           std::to_string(r.args.rank) + " at element " + std::to_string(i) +
                           " of " + std::to_string(count) + ": got " + std::to_string(data[i]) +
                           ", want " + std::to_string(want));
    }
  }
  return OkStatus();
}

// CPU time of the whole process (every thread: ours, ZeroMQ's, Gloo's).
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

struct Sample {
  double wall = 0;  // seconds, from the end of the barrier to the end of the all-reduce
  double cpu = 0;   // process CPU seconds over the same span
};

// Runs `impl` once on fresh input, timed from the end of its barrier.
StatusOr<Sample> TimedRun(Rank* r, Impl* impl, float* data, const float* input, size_t bytes) {
  std::memcpy(data, input, bytes);
  if (r->settings.gloo_barrier || !impl->HasAlign()) GS_RETURN_IF_ERROR(Barrier(r));
  GS_RETURN_IF_ERROR(impl->Align());
  const double cpu0 = ProcessCpuSeconds();
  const auto t0 = Steady::now();
  GS_RETURN_IF_ERROR(impl->Run());
  Sample sample;
  sample.wall = std::chrono::duration<double>(Steady::now() - t0).count();
  sample.cpu = ProcessCpuSeconds() - cpu0;
  return sample;
}

// Reduces `v` over ranks in place with Gloo (max or sum).
Status ReduceOverRanks(Rank* r, std::vector<double>* v, const gloo::ReductionFunction<double>* fn) {
  return GlooCall("reduce over ranks", [&] {
    gloo::AllreduceRing<double> reduce(r->ctx, {v->data()}, static_cast<int>(v->size()), fn);
    reduce.run();
  });
}

// wall[impl * iters + i]: round i's time, max over ranks; cpu: sum over ranks.
struct Samples {
  std::vector<double> wall, cpu;
};

StatusOr<Samples> TimeAll(Rank* r, std::vector<std::unique_ptr<Impl>>& impls, float* data,
                          const float* input, size_t bytes) {
  const int iters = TimedIters(r->settings, bytes);
  const int warmup = WarmupIters(r->settings, bytes);
  Samples out{std::vector<double>(kNumImpls * iters), std::vector<double>(kNumImpls * iters)};
  for (int round = 0; round < warmup + iters; ++round) {
    for (int k = 0; k < kNumImpls; ++k) {
      if (!impls[k]) continue;
      GS_ASSIGN_OR_RETURN(Sample t, TimedRun(r, impls[k].get(), data, input, bytes));
      if (round < warmup) continue;
      out.wall[k * iters + round - warmup] = t.wall;
      out.cpu[k * iters + round - warmup] = t.cpu;
    }
  }
  GS_RETURN_IF_ERROR(ReduceOverRanks(r, &out.wall, gloo::ReductionFunction<double>::max));
  GS_RETURN_IF_ERROR(ReduceOverRanks(r, &out.cpu, gloo::ReductionFunction<double>::sum));
  return out;
}

Status RunSize(Rank* r, size_t bytes, std::ofstream* results) {
  const size_t count = bytes / sizeof(float);
  Buffer input = AllocBuffer(bytes), data = AllocBuffer(bytes);
  FillInput(input.get(), count, r->args.rank);
  auto impls = MakeImpls(r, data.get(), count);
  for (int k = 0; k < kNumImpls; ++k) {
    if (!impls[k]) continue;
    // gradsync_auto: its trials of this size (and the choice) first.
    const int untimed = k == kOursAuto ? 2 * client::HalvingDoubling::kTrials + 1 : 1;
    for (int i = 0; i < untimed; ++i) {
      GS_RETURN_IF_ERROR(TimedRun(r, impls[k].get(), data.get(), input.get(), bytes).status());
      GS_RETURN_IF_ERROR(Verify(*r, kImplNames[k], data.get(), count));
    }
  }
  if (results != nullptr && r->ours.count(kOursAuto) != 0) {
    std::ofstream(r->args.results + ".auto", std::ios::app)
        << bytes << " " << r->ours[kOursAuto].hd->ChosenFor(bytes) << "\n";
  }
  GS_ASSIGN_OR_RETURN(Samples samples, TimeAll(r, impls, data.get(), input.get(), bytes));
  if (results == nullptr) return OkStatus();
  const int iters = TimedIters(r->settings, bytes);
  for (int k = 0; k < kNumImpls; ++k) {
    if (!impls[k]) continue;
    auto slice = [&](const std::vector<double>& v) {
      return std::vector<double>(v.begin() + k * iters, v.begin() + (k + 1) * iters);
    };
    const std::vector<double> wall = slice(samples.wall);
    *results << kImplNames[k] << " " << bytes << " " << Quantile(wall, 0.5) * 1e6 << " "
             << Quantile(wall, 0) * 1e6 << " " << Quantile(wall, 0.9) * 1e6 << " "
             << Quantile(slice(samples.cpu), 0.5) * 1e6 << "\n";
  }
  results->flush();
  return OkStatus();
}

Status RunChild(Rank* r) {
  GS_RETURN_IF_ERROR(ConnectGloo(r));
  for (int impl :
       {kOurs, kOursCurve, kOursShm, kOursSealed, kOursZmq, kOursSegments, kOursHd, kOursAuto}) {
    if (r->settings.impl_on[impl]) GS_RETURN_IF_ERROR(ConnectOurs(r, impl));
  }
  std::ofstream results;
  if (r->args.rank == 0) {
    results.open(r->args.results);
    if (!results) return UnavailableError("cannot write " + r->args.results);
  }
  for (size_t bytes : r->settings.sizes) {
    Status s = RunSize(r, bytes, r->args.rank == 0 ? &results : nullptr);
    if (!s.ok()) return s.WithPrefix("all-reduce of " + SizeName(bytes));
  }
  return Barrier(r);  // nobody tears down while a peer still needs it
}

int ChildMain(const Config& config, Settings settings) {
  Rank r;
  r.settings = std::move(settings);
  r.args.rank = static_cast<int>(OrDie(config.GetInt("rank", -1), "--rank"));
  r.args.world = static_cast<int>(OrDie(config.GetInt("world", 0), "--world"));
  r.args.job_id = static_cast<uint64_t>(OrDie(config.GetInt("job_id", 1), "--job_id"));
  r.args.dir = OrDie(config.GetString("dir", ""), "--dir");
  r.args.results = OrDie(config.GetString("results", ""), "--results");
  Status s = RunChild(&r);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", r.args.rank, s.ToString().c_str());
    std::fflush(stderr);
    // Skip destructors: peers may be gone mid-operation.
    std::_Exit(s.code() == StatusCode::kDataLoss ? kExitWrongSum : kExitFailed);
  }
  r.ours.clear();  // each ring before the transports under it
  return 0;
}

// ---------------------------------------------------------------------------
// Parent.

struct Row {
  int impl = 0;
  int ranks = 0;
  size_t bytes = 0;
  double p50_us = 0;
  double min_us = 0;  // spread over the timed rounds, for --verbose
  double p90_us = 0;
  double cpu_us = 0;  // process CPU time summed over ranks, median over rounds
  double algbw() const { return bytes / (p50_us * 1e-6) / 1e9; }
  double busbw() const { return algbw() * 2.0 * (ranks - 1) / ranks; }
};

std::vector<std::string> ChildArgv(const Config& config, int rank, int world, uint64_t job_id,
                                   const std::string& dir) {
  std::vector<std::string> argv = {SelfPath(),
                                   "--child",
                                   "--rank=" + std::to_string(rank),
                                   "--world=" + std::to_string(world),
                                   "--job_id=" + std::to_string(job_id),
                                   "--dir=" + dir,
                                   "--results=" + dir + "/results.txt"};
  for (const char* name : {"quick", "sizes", "iters", "warmup", "impls", "chunk_bytes",
                           "small_bytes", "slot_bytes", "op_timeout_s", "gloo_barrier"}) {
    auto v = config.Lookup(name);
    if (v) argv.push_back(std::string("--") + name + "=" + *v);
  }
  return argv;
}

std::string Tail(const std::string& s, size_t n) {
  return s.size() <= n ? s : "[...]\n" + s.substr(s.size() - n);
}

// Waits for every child; on the first failure or at the deadline kills the
// rest and returns an error that names each rank and shows its output.
Status WaitAll(std::vector<Subprocess>& kids, Deadline deadline) {
  std::vector<std::optional<int>> codes(kids.size());
  int first_failed = -1;
  for (bool all_done = false; !all_done && first_failed < 0 && !deadline.Expired();) {
    std::this_thread::sleep_for(Millis(20));
    all_done = true;
    for (size_t i = 0; i < kids.size(); ++i) {
      if (!codes[i]) codes[i] = kids[i].Wait(Deadline::Past());
      all_done = all_done && codes[i].has_value();
      if (first_failed < 0 && codes[i] && *codes[i] != 0) first_failed = static_cast<int>(i);
    }
  }
  if (first_failed >= 0) std::this_thread::sleep_for(Millis(500));  // peers print their side
  std::string report;
  for (size_t i = 0; i < kids.size(); ++i) {
    if (!codes[i]) codes[i] = kids[i].Wait(Deadline::Past());
    if (codes[i] && *codes[i] == 0) continue;
    const char* killed =
        first_failed >= 0 ? "was killed after a peer failed" : "did not finish in time (killed)";
    std::string what = codes[i] ? "exited with code " + std::to_string(*codes[i]) : killed;
    if (!codes[i]) kids[i].Signal(SIGKILL);
    report += "\n--- rank " + std::to_string(i) + " " + what + "; its output (" +
              kids[i].output_path() + "):\n" + Tail(kids[i].Output(), 4000);
  }
  if (report.empty()) return OkStatus();
  if (first_failed < 0) return DeadlineExceededError("ranks did not finish in time:" + report);
  for (size_t i = 0; i < kids.size(); ++i) {
    if (codes[i] == kExitWrongSum) {
      return DataLossError("WRONG RESULT on rank " + std::to_string(i) + ":" + report);
    }
  }
  return AbortedError("rank " + std::to_string(first_failed) + " failed first:" + report);
}

int64_t GroupTimeoutS(const Settings& s, int world) {
  if (s.group_timeout_s > 0) return s.group_timeout_s;
  double total_mib = 0;
  for (size_t b : s.sizes) total_mib += b / 1048576.0 * (TimedIters(s, b) + WarmupIters(s, b) + 1);
  // Generous: ~20 MiB/s per implementation and rank at worst, plus start-up.
  return 60 + static_cast<int64_t>(total_mib * kNumImpls * world / 20.0);
}

StatusOr<std::vector<Row>> ReadResults(const std::string& path, int world) {
  std::ifstream in(path);
  if (!in) return NotFoundError("no results file " + path);
  std::vector<Row> rows;
  std::string impl;
  Row row;
  row.ranks = world;
  while (in >> impl >> row.bytes >> row.p50_us >> row.min_us >> row.p90_us >> row.cpu_us) {
    row.impl = static_cast<int>(std::find(std::begin(kImplNames), std::end(kImplNames), impl) -
                                std::begin(kImplNames));
    rows.push_back(row);
  }
  return rows;
}

std::string FindMpirun() {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin";
  for (const std::string& d : Split(dirs, ':')) {
    const std::string candidate = d + "/mpirun";
    if (!d.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// MPI_Allreduce over `world` ranks under mpirun, the same sizes and rounds
// as the others: TCP only (kMpiTcp) or OpenMPI's default (kMpi).
StatusOr<std::vector<Row>> RunMpi(const Settings& s, const std::string& dir, int world, int impl) {
  const std::string mpirun = FindMpirun();
  if (mpirun.empty()) {
    std::printf("(%s skipped: no mpirun on PATH; tools/install_deps.sh installs openmpi-bin)\n",
                kImplNames[impl]);
    return std::vector<Row>{};
  }
  std::string plan;
  for (size_t bytes : s.sizes) {
    plan += (plan.empty() ? "" : ",") + std::to_string(bytes) + ":" +
            std::to_string(WarmupIters(s, bytes)) + ":" + std::to_string(TimedIters(s, bytes));
  }
  const std::string self = SelfPath();
  const std::string binary = self.substr(0, self.rfind('/') + 1) + "mpi_allreduce";
  const std::string results = dir + "/" + kImplNames[impl] + ".txt";
  std::vector<std::string> argv = {
      mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
      "-np",  std::to_string(world)};
  if (impl == kMpiTcp) {
    for (const char* a : {"--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"}) {
      argv.push_back(a);
    }
  }
  for (const std::string& a : {binary, "--impl=" + std::string(kImplNames[impl]),
                               "--results=" + results, "--plan=" + plan}) {
    argv.push_back(a);
  }
  const std::map<std::string, std::string> env = {{"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                                                  {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                                                  {"OMPI_MCA_rmaps_base_oversubscribe", "1"}};
  GS_ASSIGN_OR_RETURN(Subprocess run,
                      Subprocess::Spawn(argv, env, dir + "/" + kImplNames[impl] + ".log"));
  std::vector<Subprocess> one;
  one.push_back(std::move(run));
  GS_RETURN_IF_ERROR(
      WaitAll(one, Deadline::After(std::chrono::seconds(GroupTimeoutS(s, world))))
          .WithPrefix(std::string(kImplNames[impl]) + " with " + std::to_string(world) + " ranks"));
  return ReadResults(results, world);
}

StatusOr<std::vector<Row>> RunGroup(const Config& config, const Settings& s, const std::string& tmp,
                                    int world, uint64_t job_id) {
  std::string dir = tmp + "/n" + std::to_string(world);
  std::filesystem::create_directories(dir);
  std::vector<Subprocess> kids;
  for (int r = 0; r < world; ++r) {
    auto argv = ChildArgv(config, r, world, job_id, dir);
    GS_ASSIGN_OR_RETURN(Subprocess kid,
                        Subprocess::Spawn(argv, {}, dir + "/rank" + std::to_string(r) + ".log"));
    kids.push_back(std::move(kid));
  }
  int64_t timeout_s = GroupTimeoutS(s, world);
  GS_RETURN_IF_ERROR(WaitAll(kids, Deadline::After(std::chrono::seconds(timeout_s)))
                         .WithPrefix(std::to_string(world) + " ranks"));
  GS_ASSIGN_OR_RETURN(std::vector<Row> rows, ReadResults(dir + "/results.txt", world));
  for (int impl : {kMpiTcp, kMpi}) {
    if (!s.impl_on[impl]) continue;
    GS_ASSIGN_OR_RETURN(std::vector<Row> mpi, RunMpi(s, dir, world, impl));
    rows.insert(rows.end(), mpi.begin(), mpi.end());
  }
  return rows;
}

const Row* Find(const std::vector<Row>& rows, int impl, int ranks, size_t bytes) {
  for (const Row& r : rows) {
    if (r.impl == impl && r.ranks == ranks && r.bytes == bytes) return &r;
  }
  return nullptr;
}

// The faster Gloo row at `bytes` (lower latency is higher busbw).
const Row* BestGloo(const std::vector<Row>& rows, int ranks, size_t bytes) {
  const Row* a = Find(rows, 1, ranks, bytes);
  const Row* b = Find(rows, 2, ranks, bytes);
  if (a == nullptr || b == nullptr) return a != nullptr ? a : b;
  return a->p50_us <= b->p50_us ? a : b;
}

void PrintTable(const Settings& s, int world, const std::vector<Row>& rows) {
  std::printf(
      "\nall-reduce, fp32 sum, %d ranks on loopback: median over rounds of the max over "
      "ranks; GB/s = 1e9 B/s\n",
      world);
  std::printf("%9s", "size");
  for (const char* n : kImplNames) std::printf(" | %-26s", n);
  std::printf(" | ours/best gloo\n%9s", "");
  for (int k = 0; k < kNumImpls; ++k) std::printf(" | %8s %8s %8s", "algbw", "busbw", "p50 us");
  std::printf(" | %6s %7s\n", "busbw", "latency");
  for (size_t bytes : s.sizes) {
    std::printf("%9s", SizeName(bytes).c_str());
    for (int k = 0; k < kNumImpls; ++k) {
      const Row* r = Find(rows, k, world, bytes);
      if (r == nullptr)
        std::printf(" | %26s", "-");
      else
        std::printf(" | %8.3f %8.3f %8.1f", r->algbw(), r->busbw(), r->p50_us);
    }
    const Row* ours = Find(rows, kOurs, world, bytes);
    const Row* gloo = BestGloo(rows, world, bytes);
    if (ours && gloo) {
      std::printf(" | %5.2fx %6.2fx (%s)", ours->busbw() / gloo->busbw(),
                  ours->p50_us / gloo->p50_us, gloo->impl == 1 ? "ring" : "chunked");
    } else {
      std::printf(" | -");
    }
    const Row* curve = Find(rows, kOursCurve, world, bytes);
    if (ours && curve) std::printf(" | curve/plain busbw %5.2fx", curve->busbw() / ours->busbw());
    const Row* sealed = Find(rows, kOursSealed, world, bytes);
    if (ours && sealed) {
      std::printf(" | sealed/plain busbw %5.2fx", sealed->busbw() / ours->busbw());
    }
    // Over TCP our plain ring against OpenMPI's TCP; on one host our
    // shared-memory all-reduces against OpenMPI's default (shared memory).
    for (auto [mine, impl] : {std::pair<int, int>{kOurs, kMpiTcp},
                              {kOursHd, kMpiTcp},
                              {kOursAuto, kMpiTcp},
                              {kOursShm, kMpi},
                              {kOursSegments, kMpi}}) {
      const Row* a = Find(rows, mine, world, bytes);
      const Row* mpi = Find(rows, impl, world, bytes);
      if (a && mpi) {
        std::printf(" | %s/%s busbw %5.2fx latency %6.2fx", kImplNames[mine], kImplNames[impl],
                    a->busbw() / mpi->busbw(), a->p50_us / mpi->p50_us);
      }
    }
    std::printf("\n");
  }
}

std::string Verdict(int checked, const std::string& missed) {
  if (checked == 0) return "not measured";
  return missed.empty() ? "met" : "MISSED at" + missed;
}

// The targets: busbw >= 1.0x best Gloo from 1 MiB up; 4 KiB latency <= 1.5x.
void PrintTargets(const std::vector<Row>& rows) {
  std::string bw_missed, lat_missed;
  int bw_checked = 0, lat_checked = 0;
  for (const Row& r : rows) {
    const Row* gloo = r.impl == kOurs ? BestGloo(rows, r.ranks, r.bytes) : nullptr;
    if (gloo == nullptr) continue;
    const std::string at = " " + SizeName(r.bytes) + "/N=" + std::to_string(r.ranks);
    if (r.bytes >= (1 << 20) && ++bw_checked && r.busbw() < gloo->busbw()) bw_missed += at;
    if (r.bytes == 4096 && ++lat_checked && r.p50_us > 1.5 * gloo->p50_us) lat_missed += at;
  }
  std::printf("\ntarget busbw >= 1.0x best Gloo from 1 MiB up: %s\n",
              Verdict(bw_checked, bw_missed).c_str());
  std::printf("target 4 KiB latency <= 1.5x best Gloo: %s\n",
              Verdict(lat_checked, lat_missed).c_str());
  // Against OpenMPI: over TCP, and on one host against its shared memory;
  // and a CURVE job's ring (sealed streams) against the plain one.
  struct PairTarget {
    int ours;
    int theirs;
    double min_busbw;    // ours / theirs from 1 MiB
    double max_latency;  // ours / theirs at 4 KiB; 0: no target
  };
  for (const PairTarget t :
       {PairTarget{kOurs, kMpiTcp, 1.0, 3.0}, PairTarget{kOursHd, kMpiTcp, 1.0, 3.0},
        PairTarget{kOursAuto, kMpiTcp, 1.0, 3.0}, PairTarget{kOursShm, kMpi, 1.0, 3.0},
        PairTarget{kOursSegments, kMpi, 1.0, 3.0}, PairTarget{kOursSealed, kOurs, 0.7, 0}}) {
    std::string bw, lat;
    int bw_n = 0, lat_n = 0;
    for (const Row& r : rows) {
      const Row* other = r.impl == t.ours ? Find(rows, t.theirs, r.ranks, r.bytes) : nullptr;
      if (other == nullptr) continue;
      const std::string at = " " + SizeName(r.bytes) + "/N=" + std::to_string(r.ranks);
      if (r.bytes >= (1 << 20) && ++bw_n && r.busbw() < t.min_busbw * other->busbw()) bw += at;
      if (t.max_latency > 0 && r.bytes == 4096 && ++lat_n &&
          r.p50_us > t.max_latency * other->p50_us) {
        lat += at;
      }
    }
    std::printf("target %s busbw >= %.1fx %s from 1 MiB up: %s\n", kImplNames[t.ours], t.min_busbw,
                kImplNames[t.theirs], Verdict(bw_n, bw).c_str());
    if (t.max_latency > 0) {
      std::printf("target %s 4 KiB latency <= %.0fx %s: %s\n", kImplNames[t.ours], t.max_latency,
                  kImplNames[t.theirs], Verdict(lat_n, lat).c_str());
    }
  }
}

void PrintSpread(const std::vector<Row>& rows) {
  std::printf(
      "\nspread over timed rounds (us), and CPU time per all-reduce (all threads, "
      "summed over ranks, median):\n");
  for (const Row& r : rows) {
    std::printf("  %-18s N=%d %8s  min %10.1f  p50 %10.1f  p90 %10.1f  cpu %10.1f\n",
                kImplNames[r.impl], r.ranks, SizeName(r.bytes).c_str(), r.min_us, r.p50_us,
                r.p90_us, r.cpu_us);
  }
}

void PrintJson(const std::vector<Row>& rows) {
  std::printf("\n");
  for (const Row& r : rows) {
    std::printf(
        "{\"impl\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"algbw_gbps\":%.4f,"
        "\"busbw_gbps\":%.4f,\"p50_us\":%.2f}\n",
        kImplNames[r.impl], r.ranks, r.bytes, r.algbw(), r.busbw(), r.p50_us);
  }
}

// The way gradsync_auto took for each size (its rank 0's file, if any).
void PrintChoices(const std::string& path) {
  std::ifstream in(path);
  size_t bytes = 0;
  std::string way, line;
  while (in >> bytes >> way) line += " " + SizeName(bytes) + " " + way + ";";
  if (!line.empty()) std::printf("(gradsync_auto took:%s)\n", line.c_str());
}

int ParentMain(const Config& config, const Settings& s) {
  std::string tmp = (std::filesystem::temp_directory_path() / "allreduce_bench.XXXXXX").string();
  if (mkdtemp(tmp.data()) == nullptr) Die("mkdtemp " + tmp + ": " + std::strerror(errno));
  uint64_t job_id = std::random_device{}() & 0x7fffffff;
  std::vector<Row> all;
  for (int world : s.ranks) {
    auto t0 = Steady::now();
    auto rows = RunGroup(config, s, tmp, world, job_id);
    if (!rows.ok()) Die(rows.status().ToString() + "\n(logs kept in " + tmp + ")");
    PrintTable(s, world, *rows);
    PrintChoices(tmp + "/n" + std::to_string(world) + "/results.txt.auto");
    std::printf("(%d ranks took %.1f s)\n", world,
                std::chrono::duration<double>(Steady::now() - t0).count());
    std::fflush(stdout);
    all.insert(all.end(), rows->begin(), rows->end());
  }
  if (s.verbose) PrintSpread(all);
  PrintTargets(all);
  PrintJson(all);
  if (!s.keep_tmp) std::filesystem::remove_all(tmp);
  return 0;
}

}  // namespace
}  // namespace gradsync::bench

int main(int argc, char** argv) {
  using namespace gradsync;
  Config config = bench::OrDie(Config::FromArgs(argc, argv, environ), "flags");
  bench::Settings settings = bench::OrDie(bench::ParseSettings(config), "flags");
  if (bench::OrDie(config.GetBool("child", false), "--child")) {
    return bench::ChildMain(config, std::move(settings));
  }
  if (Status known = config.CheckKnownFlags(); !known.ok()) {
    std::fprintf(stderr, "allreduce_bench: %s\n", known.message().c_str());
    return 2;
  }
  return bench::ParentMain(config, settings);
}
