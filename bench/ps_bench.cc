// ps_bench: parameter-server push+pull goodput against raw ZeroMQ PUSH/PULL
// moving the same bytes in the same pattern, in the same run, on loopback.
//
// For every configuration (S shards x W workers; by default S in {1, 2, 4}
// and W in {1, 2, 3, 4}) the bench starts two systems side by side:
//   - gradsync_ps: a real job. A gradsync_server --role=scheduler process and
//     S gradsync_server --role=server processes (ps_mode=sync, optimizer=none:
//     aggregate only, the default ps_threads), and W worker threads in this
//     process, each joining the job through client::Session (the scheduler,
//     heartbeats, reachability checks) and owning a client::PsClient on the
//     transport the Communicator gives it for path=ps
//     (client::MakePsClientTransport): TCP streams to the shards' stream
//     ports of its own, and with
//     --ps_shm (the default, as in a job) shared-memory links to the shards,
//     which are all on this host; --ps_shm=false keeps it all on loopback
//     TCP, like raw_zmq, as between hosts.
//   - raw_zmq: S child processes of this binary (--raw_shard), each with a
//     PULL socket that every worker's PUSH connects to and one bound PUSH
//     socket per worker; a shard sends every message it receives straight
//     back to the worker that sent it (no copy, no round barrier). Each of
//     the W worker threads has a PUSH socket per shard and a PULL socket
//     connected to its PUSH on every shard. One ZeroMQ context with one I/O
//     thread per node, as ZmqTransport has. Both sides' processes tune
//     malloc for large messages (wire::TuneMallocForLargeMessages).
// The shards are the deployed gradsync_server binary in processes of their
// own, so the measurement includes everything a job pays (the shard's
// receive thread, key threads, verification, aggregation, replies) and
// nothing of the bench, through public targets only (the shard library is
// private to ps/); the raw shards are processes too, so both sides have
// the same process and socket layout. A ps shard answers a partition only
// once every worker pushed it (sync rounds) while a raw shard echoes at once:
// that wait is part of what the ratio measures.
//
// One round: every worker sends a bucket of S x k partitions of 4 MiB (k =
// --parts), k partitions to each shard, and receives S x k partitions of
// 4 MiB back. For gradsync_ps that is one PsClient::AllReduce (pushes, pulls,
// the average copied back into the bucket); the bucket id is chosen so that
// the consistent hash puts exactly k whole partitions on every shard. For
// raw_zmq it is S x k sends of 4 MiB (zero-copy from the bucket) followed by
// S x k receives.
//
// Goodput = (bytes of gradient pushed + bytes of result pulled) per second,
// summed over workers: W x rounds x 2 x bucket_bytes / t, where t runs from
// the release of the workers' barrier to the end of the last worker's last
// round. Per shard it is that divided by S (every shard moves the same
// bytes). raw_zmq_gbps is the same quantity for raw_zmq. GB/s = 1e9 bytes/s,
// as every *_gbps field of the project's benchmarks. A repetition is
// --rounds rounds; ps and raw repetitions alternate (the order flips every
// repetition) so that noise on a shared machine hits both alike; the
// reported figures are medians over the repetitions after --warmup ones.
// ratio = median goodput / median raw goodput; the table also shows the
// median of the per-repetition ratios of each ps repetition to the raw one
// run right beside it ("paired"), which drifting background load disturbs
// less. Before timing, one round of each is run and the ps result is
// checked (every worker pushes rank + 1, so every element must come back as
// (W + 1) / 2).
//
// Output: a table per configuration as it finishes, the targets (ratio >=
// 0.8 with one shard; aggregate goodput growing with the number of shards at
// every worker count), then one JSON line per configuration:
//   {"impl","shards","workers","bytes","goodput_gbps","raw_zmq_gbps","ratio",
//    "per_shard_gbps"}
// where bytes is the bucket each worker pushes (and pulls back) per round.
//
// Defaults: k = 2, 3 rounds, 11 repetitions after 2 warm-up ones; --quick:
// k = 1, 2 rounds, 7 after 1. The shards run without a metrics endpoint
// (and without checkpoints, their default). The PsClients resend after
// --resend_ms (10 s, not the 1 s default, so that a slow repetition on a
// busy machine measures the data path rather than resends); resends, if
// any, are shown in the table.
//
// With --compression=SPEC (compression/registry.h) the PsClients compress
// every push partition with SPEC and the shards decompress it; with
// --reply=fp16|bf16 the shards answer in that encoding. Goodput still counts
// the uncompressed gradient bytes synchronised, so against raw ZeroMQ moving
// those bytes uncompressed the ratio is the effective speed-up (or cost) of
// compressing. The workers' values then vary along the bucket (rank + 1 plus
// a ripple, so top-k has real work), and the check before timing only
// requires finite results; the JSON lines carry "compression" and "reply"
// (and every line "curve" and "ps_shm").
//
//   bazel run --config=opt //bench:ps_bench -- --quick
//   flags: --quick --shards=1,2,4 --workers=1,2,3,4 --reps=N --warmup=N
//          --rounds=N --parts=k --resend_ms=N --server_bin=PATH --keep_tmp
//          --compression=SPEC --reply=none|fp16|bf16 --curve --ps_shm=true|false
//
// --curve runs every configuration a second time with CurveZMQ on every
// socket of the job (wire/curve.h), right after the plain one, and prints
// the goodput ratio curve/plain.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "client/ps_client.h"
#include "client/ps_transport.h"
#include "client/session.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/placement.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "common/time.h"
#include "wire/curve.h"
#include "wire/zmq_transport.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

extern char** environ;

namespace gradsync::bench {
namespace {

using Steady = std::chrono::steady_clock;
constexpr size_t kPartitionBytes = size_t{4} << 20;
constexpr int kPs = 0, kRaw = 1;
constexpr auto kOpTimeout = std::chrono::seconds(60);

// ---------------------------------------------------------------------------
// Settings.

struct Settings {
  bool quick = false;
  std::vector<int> shards, workers;
  int reps = 0, warmup = 0, rounds = 0, parts = 0;
  int64_t resend_ms = 10000;
  std::string server_bin;
  bool keep_tmp = false;
  std::string compression = "none";
  std::string reply = "none";
  bool curve = false;  // also run every configuration with CURVE, beside the plain one
  bool ps_shm = true;  // the workers and shards of this host share memory
};

StatusOr<std::vector<int>> IntList(const Config& config, const std::string& name,
                                   const std::string& fallback, int lo, int hi) {
  GS_ASSIGN_OR_RETURN(std::string text, config.GetString(name, fallback));
  std::vector<int> out;
  for (const std::string& item : Split(text)) {
    const int v = std::atoi(item.c_str());
    if (v < lo || v > hi) {
      return InvalidArgumentError("--" + name + ": '" + item + "' not in [" + std::to_string(lo) +
                                  ", " + std::to_string(hi) + "]");
    }
    out.push_back(v);
  }
  if (out.empty()) return InvalidArgumentError("--" + name + " is empty");
  return out;
}

std::string FindServer() {
  std::vector<std::string> candidates = {SelfPath() + ".runfiles/gradsync/server/gradsync_server",
                                         "server/gradsync_server"};
  if (const char* dir = std::getenv("RUNFILES_DIR")) {
    candidates.insert(candidates.begin(), std::string(dir) + "/gradsync/server/gradsync_server");
  }
  for (const std::string& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

StatusOr<Settings> ParseSettings(const Config& config) {
  Settings s;
  GS_ASSIGN_OR_RETURN(s.quick, config.GetBool("quick", false));
  GS_ASSIGN_OR_RETURN(s.shards, IntList(config, "shards", "1,2,4", 1, 8));
  GS_ASSIGN_OR_RETURN(s.workers, IntList(config, "workers", "1,2,3,4", 1, 16));
  GS_ASSIGN_OR_RETURN(int64_t reps, config.GetInt("reps", s.quick ? 7 : 11));
  GS_ASSIGN_OR_RETURN(int64_t warmup, config.GetInt("warmup", s.quick ? 1 : 2));
  GS_ASSIGN_OR_RETURN(int64_t rounds, config.GetInt("rounds", s.quick ? 2 : 3));
  GS_ASSIGN_OR_RETURN(int64_t parts, config.GetInt("parts", s.quick ? 1 : 2));
  GS_ASSIGN_OR_RETURN(s.resend_ms, config.GetInt("resend_ms", 10000));
  GS_ASSIGN_OR_RETURN(s.server_bin, config.GetString("server_bin", FindServer()));
  GS_ASSIGN_OR_RETURN(s.keep_tmp, config.GetBool("keep_tmp", false));
  GS_ASSIGN_OR_RETURN(s.compression, config.GetString("compression", "none"));
  GS_ASSIGN_OR_RETURN(s.reply, config.GetString("reply", "none"));
  GS_ASSIGN_OR_RETURN(s.curve, config.GetBool("curve", false));
  GS_ASSIGN_OR_RETURN(s.ps_shm, config.GetBool("ps_shm", true));
  if (s.reply != "none" && s.reply != "fp16" && s.reply != "bf16") {
    return InvalidArgumentError("--reply must be none, fp16 or bf16");
  }
  if (reps < 1 || warmup < 0 || rounds < 1 || parts < 1 || parts > 8 || s.resend_ms < 1) {
    return InvalidArgumentError(
        "--reps, --rounds, --parts and --resend_ms must be positive, "
        "--warmup not negative, --parts at most 8");
  }
  if (s.server_bin.empty()) {
    return NotFoundError("no gradsync_server next to the bench; pass --server_bin=PATH");
  }
  s.reps = static_cast<int>(reps);
  s.warmup = static_cast<int>(warmup);
  s.rounds = static_cast<int>(rounds);
  s.parts = static_cast<int>(parts);
  return s;
}

// ---------------------------------------------------------------------------
// Raw shard (child process): echoes every message back to its worker.

int RawShardMain(int workers) {
  wire::TuneMallocForLargeMessages();  // as the gradsync shards' transports do
  try {
    zmq::context_t ctx(1);
    zmq::socket_t pull(ctx, zmq::socket_type::pull);
    pull.set(zmq::sockopt::linger, 0);
    pull.bind("tcp://127.0.0.1:*");
    std::vector<zmq::socket_t> back;
    std::string endpoints;
    for (int w = 0; w < workers; ++w) {
      back.emplace_back(ctx, zmq::socket_type::push);
      back.back().set(zmq::sockopt::linger, 0);
      back.back().bind("tcp://127.0.0.1:*");
      endpoints += (w ? "," : "") + back.back().get(zmq::sockopt::last_endpoint);
    }
    std::printf("raw shard ready pull=%s push=%s\n", pull.get(zmq::sockopt::last_endpoint).c_str(),
                endpoints.c_str());
    std::fflush(stdout);
    for (;;) {
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(pull, std::back_inserter(frames))) continue;
      uint32_t w = 0;
      if (frames.size() != 2 || frames[0].size() != sizeof(w)) return 3;
      std::memcpy(&w, frames[0].data(), sizeof(w));
      if (w >= back.size()) return 3;
      back[w].send(std::move(frames[1]), zmq::send_flags::none);
    }
  } catch (const zmq::error_t& e) {
    std::fprintf(stderr, "raw shard: %s\n", e.what());
    return 1;
  }
}

// ---------------------------------------------------------------------------
// One configuration.

struct Plan {
  int shards = 1, workers = 1, parts = 1, rounds = 1, reps = 1, warmup = 0;
  uint32_t bucket = 0;
  int64_t resend_ms = 0;
  std::string compression, reply;
  std::string key_file;  // the job runs CURVE with it; "": plain
  bool ps_shm = true;
  bool lossy() const { return compression != "none" || reply != "none"; }
  size_t bucket_bytes() const { return kPartitionBytes * parts * shards; }
  size_t count() const { return bucket_bytes() / sizeof(float); }
};

// The first bucket id whose partitions the consistent hash spreads evenly:
// exactly `parts` partitions on every shard.
StatusOr<uint32_t> BalancedBucket(int shards, int parts) {
  const size_t count = kPartitionBytes * parts * shards / sizeof(float);
  for (uint32_t b = 1; b < (1u << 22); ++b) {
    std::vector<int> per(shards, 0);
    for (const PartitionSpan& s :
         PlanPartitions(b, count, sizeof(float), kPartitionBytes, shards)) {
      per[static_cast<size_t>(s.shard)]++;
    }
    if (std::all_of(per.begin(), per.end(), [&](int n) { return n == parts; })) return b;
  }
  return NotFoundError("no bucket id puts exactly " + std::to_string(parts) +
                       " partitions on each of " + std::to_string(shards) + " shards");
}

struct RawEndpoints {
  std::string pull;               // where workers push
  std::vector<std::string> back;  // worker w's return socket at [w]
};

// A barrier for the worker threads; Abort releases everyone with false.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) return false;
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(lock, [&] { return gen_ != gen || aborted_; });
    return !aborted_;
  }
  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
  bool aborted_ = false;
};

// What the worker threads of one configuration share.
struct Shared {
  Shared(const Plan& p, std::string sched, std::vector<RawEndpoints> r)
      : plan(p),
        scheduler(std::move(sched)),
        raw(std::move(r)),
        barrier(p.workers),
        start(2 * p.reps * p.workers),
        end(2 * p.reps * p.workers),
        errors(p.workers) {}
  size_t Slot(int impl, int rep, int w) const {
    return (static_cast<size_t>(impl) * plan.reps + rep) * plan.workers + w;
  }

  const Plan plan;
  const std::string scheduler;
  const std::vector<RawEndpoints> raw;
  const SteadyTime epoch = Steady::now();
  Barrier barrier;
  std::vector<double> start, end;  // seconds since epoch, by Slot
  std::vector<Status> errors;      // by worker thread
  std::atomic<uint64_t> resent{0};
};

// A worker's raw ZeroMQ side: a PUSH per shard, one PULL for what comes back.
class RawWorker {
 public:
  Status Connect(const std::vector<RawEndpoints>& shards, int w) {
    try {
      pull_.set(zmq::sockopt::linger, 0);
      pull_.set(zmq::sockopt::rcvtimeo, static_cast<int>(kOpTimeout.count() * 1000));
      for (const RawEndpoints& e : shards) {
        pull_.connect(e.back[static_cast<size_t>(w)]);
        push_.emplace_back(ctx_, zmq::socket_type::push);
        push_.back().set(zmq::sockopt::linger, 0);
        push_.back().connect(e.pull);
      }
    } catch (const zmq::error_t& e) {
      return UnavailableError(std::string("raw zmq connect: ") + e.what());
    }
    id_ = static_cast<uint32_t>(w);
    return OkStatus();
  }

  // Partition j of shard s is bytes [(j * S + s) * 4 MiB, ...) of `data`.
  Status Round(const uint8_t* data, int parts) {
    const size_t shards = push_.size();
    try {
      for (int j = 0; j < parts; ++j) {
        for (size_t s = 0; s < shards; ++s) {
          const uint8_t* p = data + (j * shards + s) * kPartitionBytes;
          push_[s].send(zmq::message_t(&id_, sizeof(id_)), zmq::send_flags::sndmore);
          push_[s].send(zmq::message_t(const_cast<uint8_t*>(p), kPartitionBytes, nullptr),
                        zmq::send_flags::none);
        }
      }
      for (size_t i = 0; i < shards * static_cast<size_t>(parts); ++i) {
        zmq::message_t msg;
        if (!pull_.recv(msg)) return DeadlineExceededError("raw zmq: no echo in time");
        if (msg.size() != kPartitionBytes) return DataLossError("raw zmq: short echo");
      }
    } catch (const zmq::error_t& e) {
      return UnavailableError(std::string("raw zmq: ") + e.what());
    }
    return OkStatus();
  }

 private:
  zmq::context_t ctx_{1};
  zmq::socket_t pull_{ctx_, zmq::socket_type::pull};
  std::vector<zmq::socket_t> push_;
  uint32_t id_ = 0;
};

StatusOr<std::unique_ptr<client::PsClient>> MakePsClient(client::Session& session,
                                                         const Plan& plan) {
  client::PsPeers peers;
  peers.rank = session.rank();
  peers.world_size = session.num_workers();
  peers.sender = wire::Sender{wire::Role::Worker, session.rank(), session.job_id()};
  client::PsClientOptions options;
  options.partition_bytes = kPartitionBytes;
  options.resend_after = Millis(plan.resend_ms);
  options.reply_codec = plan.reply == "none" ? "" : plan.reply;
  cluster::PsLinkOptions links;
  links.enabled = plan.ps_shm;
  peers.server_endpoints = client::PsShardEndpoints(session);
  GS_ASSIGN_OR_RETURN(auto transport, client::MakePsClientTransport(session, links));
  GS_ASSIGN_OR_RETURN(auto client,
                      client::PsClient::Create(std::move(transport), peers, options, nullptr));
  GS_RETURN_IF_ERROR(client->SetCompression(plan.bucket, plan.compression));
  return client;
}

class WorkerThread {
 public:
  WorkerThread(Shared* shared, int w) : sh_(shared), w_(w), data_(shared->plan.count()) {}

  Status Run() {
    const Plan& p = sh_->plan;
    Config config = Config::FromMap({{"scheduler", sh_->scheduler},
                                     {"num_workers", std::to_string(p.workers)},
                                     {"num_servers", std::to_string(p.shards)},
                                     {"key_file", p.key_file}});
    GS_ASSIGN_OR_RETURN(session_, client::Session::Join(config, Deadline::After(kOpTimeout)));
    GS_ASSIGN_OR_RETURN(ps_, MakePsClient(*session_, p));
    GS_RETURN_IF_ERROR(raw_.Connect(sh_->raw, w_));
    std::fill(data_.begin(), data_.end(), static_cast<float>(session_->rank() + 1));
    if (p.lossy()) {
      for (size_t i = 0; i < data_.size(); ++i) data_[i] += 0.5f * std::sin(0.001f * i);
    }
    if (!sh_->barrier.Wait()) return AbortedError("another worker failed");
    GS_RETURN_IF_ERROR(Check());
    for (int rep = 0; rep < p.warmup + p.reps; ++rep) {
      for (int i = 0; i < 2; ++i) GS_RETURN_IF_ERROR(Timed((rep + i) % 2, rep - p.warmup));
    }
    if (!sh_->barrier.Wait()) return AbortedError("another worker failed");
    sh_->resent += ps_->stats().resent;
    ps_.reset();
    session_.reset();
    return OkStatus();
  }

 private:
  Status PsRound() {
    client::OpTag tag;
    tag.bucket = sh_->plan.bucket;
    tag.seq = tag.step = ++seq_;
    return ps_->PushPull(data_.data(), data_.size(), DType::kF32, tag, Deadline::After(kOpTimeout));
  }

  // One round of each; the ps result must be the average of rank + 1.
  Status Check() {
    GS_RETURN_IF_ERROR(PsRound());
    const float want = (sh_->plan.workers + 1) / 2.0f;
    for (size_t i = 0; i < data_.size(); ++i) {
      if (sh_->plan.lossy() ? !std::isfinite(data_[i]) : data_[i] != want) {
        return DataLossError("worker " + std::to_string(w_) + ": element " + std::to_string(i) +
                             " is " + std::to_string(data_[i]) + ", want " + std::to_string(want));
      }
    }
    return raw_.Round(reinterpret_cast<const uint8_t*>(data_.data()), sh_->plan.parts);
  }

  // One repetition of `impl`; recorded when `rep` >= 0 (not a warm-up).
  Status Timed(int impl, int rep) {
    if (!sh_->barrier.Wait()) return AbortedError("another worker failed");
    const double t0 = Now();
    for (int r = 0; r < sh_->plan.rounds; ++r) {
      GS_RETURN_IF_ERROR(impl == kPs ? PsRound()
                                     : raw_.Round(reinterpret_cast<const uint8_t*>(data_.data()),
                                                  sh_->plan.parts));
    }
    const double t1 = Now();
    if (rep >= 0) {
      sh_->start[sh_->Slot(impl, rep, w_)] = t0;
      sh_->end[sh_->Slot(impl, rep, w_)] = t1;
    }
    return OkStatus();
  }

  double Now() const { return std::chrono::duration<double>(Steady::now() - sh_->epoch).count(); }

  Shared* const sh_;
  const int w_;
  std::vector<float> data_;
  uint64_t seq_ = 0;
  std::unique_ptr<client::Session> session_;
  std::unique_ptr<client::PsClient> ps_;
  RawWorker raw_;  // declared last: closes before data_ goes away
};

// ---------------------------------------------------------------------------
// Processes of one configuration.

// "... listening on tcp://0.0.0.0:PORT ..." -> "127.0.0.1:PORT".
StatusOr<std::string> SchedulerAddress(const std::string& out) {
  const std::string key = "listening on tcp://";
  const size_t at = out.find(key);
  const size_t colon = at == std::string::npos ? at : out.find(':', at + key.size());
  if (colon == std::string::npos) return UnavailableError("scheduler did not say its port");
  return "127.0.0.1:" + std::to_string(std::atoi(out.c_str() + colon + 1));
}

struct Procs {
  std::unique_ptr<Subprocess> scheduler;
  std::vector<Subprocess> shards, raw;
  std::string address;
  std::vector<RawEndpoints> raw_endpoints;
};

Status StartPs(const Settings& s, const Plan& p, const std::string& dir, Procs* procs) {
  const std::string n = std::to_string(p.workers), m = std::to_string(p.shards);
  GS_ASSIGN_OR_RETURN(
      Subprocess sched,
      Subprocess::Spawn(
          {s.server_bin, "--role=scheduler", "--port=0", "--num_workers=" + n, "--num_servers=" + m,
           "--missed_heartbeats=40", "--metrics_port=0", "--key_file=" + p.key_file},
          {}, dir + "/scheduler.log"));
  procs->scheduler = std::make_unique<Subprocess>(std::move(sched));
  if (!procs->scheduler->WaitForOutput("listening on", Deadline::AfterMs(15000))) {
    return UnavailableError("the scheduler did not start; see " + dir + "/scheduler.log");
  }
  GS_ASSIGN_OR_RETURN(procs->address, SchedulerAddress(procs->scheduler->Output()));
  const std::map<std::string, std::string> env = {{"GRADSYNC_SCHEDULER", procs->address},
                                                  {"GRADSYNC_NUM_WORKERS", n},
                                                  {"GRADSYNC_NUM_SERVERS", m}};
  for (int i = 0; i < p.shards; ++i) {
    GS_ASSIGN_OR_RETURN(
        Subprocess shard,
        Subprocess::Spawn({s.server_bin, "--role=server", "--ps_mode=sync", "--optimizer=none",
                           "--metrics_port=0", "--key_file=" + p.key_file,
                           p.ps_shm ? "--ps_shm=true" : "--ps_shm=false"},
                          env, dir + "/server" + std::to_string(i) + ".log"));
    procs->shards.push_back(std::move(shard));
  }
  return OkStatus();
}

StatusOr<RawEndpoints> ParseRaw(const std::string& out) {
  const size_t pull = out.find(" pull="), push = out.find(" push=");
  if (pull == std::string::npos || push == std::string::npos) {
    return UnavailableError("raw shard did not say its endpoints");
  }
  RawEndpoints e;
  e.pull = out.substr(pull + 6, push - pull - 6);
  const size_t eol = out.find('\n', push);
  e.back = Split(out.substr(push + 6, eol - push - 6));
  return e;
}

Status StartRaw(const Plan& p, const std::string& dir, Procs* procs) {
  for (int i = 0; i < p.shards; ++i) {
    const std::string log = dir + "/raw" + std::to_string(i) + ".log";
    GS_ASSIGN_OR_RETURN(
        Subprocess shard,
        Subprocess::Spawn({SelfPath(), "--raw_shard", "--workers=" + std::to_string(p.workers)}, {},
                          log));
    procs->raw.push_back(std::move(shard));
  }
  for (Subprocess& shard : procs->raw) {
    if (!shard.WaitForOutput("raw shard ready", Deadline::AfterMs(15000))) {
      return UnavailableError("a raw shard did not start; see " + shard.output_path());
    }
    GS_ASSIGN_OR_RETURN(RawEndpoints e, ParseRaw(shard.Output()));
    if (e.back.size() != static_cast<size_t>(p.workers)) {
      return UnavailableError("raw shard endpoints: " + shard.Output());
    }
    procs->raw_endpoints.push_back(std::move(e));
  }
  return OkStatus();
}

// After the workers left, the scheduler releases the shards and every
// process of the job exits by itself; the raw shards are ended by SIGTERM.
Status StopAll(Procs* procs) {
  for (Subprocess& r : procs->raw) r.Signal(SIGTERM);
  for (Subprocess& r : procs->raw) r.Wait(Deadline::AfterMs(5000));
  Status s;
  for (Subprocess& shard : procs->shards) {
    auto code = shard.Wait(Deadline::AfterMs(15000));
    if (code != 0) s = AbortedError("a shard did not end cleanly; see " + shard.output_path());
  }
  if (procs->scheduler) {
    procs->scheduler->Signal(SIGTERM);
    procs->scheduler->Wait(Deadline::AfterMs(5000));
  }
  return s;
}

// ---------------------------------------------------------------------------
// Results.

struct Row {
  int shards = 0, workers = 0;
  size_t bytes = 0;          // bucket per worker per round
  double ps[3] = {0, 0, 0};  // goodput p10, p50, p90 (GB/s)
  double raw[3] = {0, 0, 0};
  double paired = 0;  // median over repetitions of ps / the raw one beside it
  uint64_t resent = 0;
  bool curve = false;  // the job ran CURVE
  double ratio() const { return ps[1] / raw[1]; }
  double per_shard() const { return ps[1] / shards; }
};

// Goodput of every timed repetition of `impl`, GB/s.
std::vector<double> Goodputs(const Shared& sh, int impl) {
  const Plan& p = sh.plan;
  const double bytes = 2.0 * p.workers * p.rounds * static_cast<double>(p.bucket_bytes());
  std::vector<double> out;
  for (int rep = 0; rep < p.reps; ++rep) {
    double t0 = 1e300, t1 = 0;
    for (int w = 0; w < p.workers; ++w) {
      t0 = std::min(t0, sh.start[sh.Slot(impl, rep, w)]);
      t1 = std::max(t1, sh.end[sh.Slot(impl, rep, w)]);
    }
    out.push_back(bytes / (t1 - t0) / 1e9);
  }
  return out;
}

StatusOr<Row> RunConfig(const Settings& s, int shards, int workers, const std::string& tmp,
                        const std::string& key_file) {
  Plan p;
  p.key_file = key_file;
  p.shards = shards;
  p.workers = workers;
  p.parts = s.parts;
  p.rounds = s.rounds;
  p.reps = s.reps;
  p.warmup = s.warmup;
  p.resend_ms = s.resend_ms;
  p.compression = s.compression;
  p.reply = s.reply;
  p.ps_shm = s.ps_shm;
  GS_ASSIGN_OR_RETURN(p.bucket, BalancedBucket(shards, s.parts));
  const std::string dir = tmp + "/s" + std::to_string(shards) + "w" + std::to_string(workers) +
                          (key_file.empty() ? "" : "-curve");
  std::filesystem::create_directories(dir);
  Procs procs;
  Status started = StartPs(s, p, dir, &procs);
  if (started.ok()) started = StartRaw(p, dir, &procs);
  if (!started.ok()) {
    StopAll(&procs).IgnoreError();
    return started;
  }
  Shared sh(p, procs.address, procs.raw_endpoints);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&sh, w] {
      auto worker = std::make_unique<WorkerThread>(&sh, w);
      sh.errors[static_cast<size_t>(w)] = worker->Run();
      if (!sh.errors[static_cast<size_t>(w)].ok()) sh.barrier.Abort();
    });
  }
  for (std::thread& t : threads) t.join();
  Status stopped = StopAll(&procs);
  for (int w = 0; w < workers; ++w) {
    const Status& e = sh.errors[static_cast<size_t>(w)];
    if (!e.ok() && e.code() != StatusCode::kAborted) {
      return e.WithPrefix("worker thread " + std::to_string(w) + " (logs in " + dir + ")");
    }
  }
  for (const Status& e : sh.errors) {
    if (!e.ok()) return e.WithPrefix("logs in " + dir);
  }
  GS_RETURN_IF_ERROR(stopped);
  Row row;
  row.curve = !key_file.empty();
  row.shards = shards;
  row.workers = workers;
  row.bytes = p.bucket_bytes();
  row.resent = sh.resent.load();
  const std::vector<double> ps = Goodputs(sh, kPs), raw = Goodputs(sh, kRaw);
  const double qs[3] = {0.1, 0.5, 0.9};
  for (int i = 0; i < 3; ++i) {
    row.ps[i] = Quantile(ps, qs[i]);
    row.raw[i] = Quantile(raw, qs[i]);
  }
  std::vector<double> paired(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) paired[i] = ps[i] / raw[i];
  row.paired = Quantile(paired, 0.5);
  return row;
}

void PrintHeader(const Settings& s) {
  std::printf(
      "ps push+pull goodput vs raw ZeroMQ PUSH/PULL on loopback: %d x 4 MiB partitions "
      "per shard per worker, %d rounds per repetition, median of %d (p10..p90); "
      "GB/s = 1e9 B/s\n",
      s.parts, s.rounds, s.reps);
  std::printf("ps pushes compressed with %s, replies %s\n", s.compression.c_str(), s.reply.c_str());
  std::printf("%6s %7s %5s %9s | %8s %17s %9s | %8s %17s | %6s %6s\n", "shards", "workers", "curve",
              "bucket", "ps GB/s", "(p10..p90)", "per shard", "raw GB/s", "(p10..p90)", "ratio",
              "paired");
}

void PrintRow(const Row& r) {
  std::printf(
      "%6d %7d %5s %5zu MiB | %8.3f (%6.3f..%6.3f) %9.3f | %8.3f (%6.3f..%6.3f) | "
      "%5.2fx %5.2fx",
      r.shards, r.workers, r.curve ? "yes" : "no", r.bytes >> 20, r.ps[1], r.ps[0], r.ps[2],
      r.per_shard(), r.raw[1], r.raw[0], r.raw[2], r.ratio(), r.paired);
  if (r.resent > 0) std::printf("  (%llu resent)", static_cast<unsigned long long>(r.resent));
  std::printf("\n");
  std::fflush(stdout);
}

const Row* Find(const std::vector<Row>& rows, int shards, int workers) {
  for (const Row& r : rows) {
    if (r.shards == shards && r.workers == workers && !r.curve) return &r;
  }
  return nullptr;
}

void PrintTargets(const Settings& s, const std::vector<Row>& rows) {
  std::string low, flat;
  int ratio_checked = 0, growth_checked = 0;
  for (const Row& r : rows) {
    if (r.shards == 1 && !r.curve && ++ratio_checked && r.ratio() < 0.8) {
      low += " W=" + std::to_string(r.workers);
    }
  }
  std::vector<int> shards = s.shards;
  std::sort(shards.begin(), shards.end());
  for (int w : s.workers) {
    for (size_t i = 1; i < shards.size(); ++i) {
      const Row* a = Find(rows, shards[i - 1], w);
      const Row* b = Find(rows, shards[i], w);
      if (a == nullptr || b == nullptr) continue;
      ++growth_checked;
      if (b->ps[1] <= a->ps[1]) {
        flat += " W=" + std::to_string(w) + ":S" + std::to_string(shards[i - 1]) + "->S" +
                std::to_string(shards[i]);
      }
    }
  }
  auto verdict = [](int checked, const std::string& missed) {
    if (checked == 0) return std::string("not measured");
    return missed.empty() ? std::string("met") : "MISSED at" + missed;
  };
  std::printf("\ntarget ratio >= 0.8 with 1 shard: %s\n", verdict(ratio_checked, low).c_str());
  std::printf("target aggregate goodput grows with the number of shards: %s\n",
              verdict(growth_checked, flat).c_str());
}

void PrintJson(const Settings& s, const std::vector<Row>& rows) {
  std::printf("\n");
  for (const Row& r : rows) {
    std::printf(
        "{\"impl\":\"gradsync_ps\",\"shards\":%d,\"workers\":%d,\"bytes\":%zu,"
        "\"goodput_gbps\":%.4f,\"raw_zmq_gbps\":%.4f,\"ratio\":%.4f,"
        "\"per_shard_gbps\":%.4f,\"compression\":\"%s\",\"reply\":\"%s\","
        "\"curve\":%s,\"ps_shm\":%s}\n",
        r.shards, r.workers, r.bytes, r.ps[1], r.raw[1], r.ratio(), r.per_shard(),
        s.compression.c_str(), s.reply.c_str(), r.curve ? "true" : "false",
        s.ps_shm ? "true" : "false");
  }
}

int BenchMain(const Settings& s) {
  std::string tmp = (std::filesystem::temp_directory_path() / "ps_bench.XXXXXX").string();
  if (mkdtemp(tmp.data()) == nullptr) Die("mkdtemp " + tmp + ": " + std::strerror(errno));
  const auto t0 = Steady::now();
  const std::string key_file = tmp + "/job.key";
  if (s.curve) {
    auto key = wire::GenerateCurveKey();
    if (!key.ok() || !wire::WriteKeyFile(key_file, *key).ok()) Die("cannot write " + key_file);
  }
  PrintHeader(s);
  std::vector<Row> rows;
  for (int shards : s.shards) {
    for (int workers : s.workers) {
      for (const std::string& key : {std::string(), key_file}) {
        if (!s.curve && !key.empty()) continue;
        auto row = RunConfig(s, shards, workers, tmp, key);
        if (!row.ok()) {
          Die(std::to_string(shards) + " shards, " + std::to_string(workers) +
              " workers: " + row.status().ToString() + "\n(logs kept in " + tmp + ")");
        }
        PrintRow(*row);
        rows.push_back(*row);
      }
      const Row* plain = Find(rows, shards, workers);
      if (s.curve && plain != nullptr) {
        std::printf("%14s curve/plain goodput %.2fx\n", "", rows.back().ps[1] / plain->ps[1]);
      }
    }
  }
  std::printf("(took %.1f s)\n", std::chrono::duration<double>(Steady::now() - t0).count());
  PrintTargets(s, rows);
  PrintJson(s, rows);
  if (!s.keep_tmp) std::filesystem::remove_all(tmp);
  return 0;
}

}  // namespace
}  // namespace gradsync::bench

int main(int argc, char** argv) {
  using namespace gradsync;
  Config config = bench::OrDie(Config::FromArgs(argc, argv, environ), "flags");
  if (bench::OrDie(config.GetBool("raw_shard", false), "--raw_shard")) {
    const int64_t workers = bench::OrDie(config.GetInt("workers", 0), "--workers");
    if (workers < 1 || workers > 64) bench::Die("--raw_shard needs --workers in [1, 64]");
    return bench::RawShardMain(static_cast<int>(workers));
  }
  bench::Settings settings = bench::OrDie(bench::ParseSettings(config), "flags");
  if (Status known = config.CheckKnownFlags(); !known.ok()) {
    std::fprintf(stderr, "ps_bench: %s\n", known.message().c_str());
    return 2;
  }
  SetMinLogSeverity(LogSeverity::kWarning);  // the workers' join lines would break the table
  return bench::BenchMain(settings);
}
