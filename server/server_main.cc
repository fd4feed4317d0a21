// gradsync_server: the scheduler and the parameter-server shards.
//
//   gradsync_server --role=scheduler --port=9000 --num_workers=4 --num_servers=2
//   gradsync_server --role=server --scheduler=host:9000 --num_workers=4 --num_servers=2
//       [--ps_mode=sync|async|ssp --staleness=s --optimizer=none|sgd|momentum|adam --lr=...]
//
// A server is one parameter-server shard (ps/ps_shard.h lists its
// settings). With --checkpoint_dir=DIR it restores from DIR at start, writes
// a checkpoint every --checkpoint_interval_s (30) seconds and one more
// before it exits, SIGTERM/SIGINT included. Restarted with the same flags
// (the same --data_port) it rejoins the running job in its old place
// (scheduler/scheduler.h: the scheduler's --server_grace_ms).
//
// Every flag can also be given as an environment variable: --num_workers as
// GRADSYNC_NUM_WORKERS, --role as GRADSYNC_ROLE, and so on. Exit status: 0
// when the job ended normally or on SIGTERM/SIGINT, 1 when it failed, 2 for
// bad flags.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "cluster/node.h"
#include "cluster/ps_links.h"
#include "cluster/same_host_links.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/signals.h"
#include "ps/ps_shard.h"
#include "scheduler/scheduler.h"
#include "wire/message.h"
#include "wire/same_host_transport.h"
#include "wire/tcp_stream_transport.h"
#include "wire/validate.h"
#include "wire/zmq_transport.h"

extern char** environ;

namespace gradsync::server {
namespace {

int Fail(const Status& s, int code) {
  GS_LOG(ERROR) << s.message();
  return code;
}

// Serves /metrics on --metrics_port (`default_port` when unset, 0 turns it
// off). A busy port is only a warning; a port that is not a number is an error.
Status ServeMetrics(const Config& config, ProcessMetrics& metrics, int64_t default_port) {
  GS_ASSIGN_OR_RETURN(int64_t port, config.GetInt("metrics_port", default_port));
  GS_ASSIGN_OR_RETURN(std::string host, config.GetString("host", "127.0.0.1"));
  metrics.ServeOrWarn(host, port);
  return Status();
}

// Flags that nothing asked for are typos: refuse to start.
bool UnknownFlags(const Config& config) {
  Status known = config.CheckKnownFlags();
  if (!known.ok()) GS_LOG(ERROR) << known.message();
  return !known.ok();
}

int RunScheduler(const Config& config, const std::atomic<bool>& stop) {
  SetLogTag("scheduler");
  auto options = SchedulerOptions::FromConfig(config);
  if (!options.ok()) return Fail(options.status(), 2);
  ProcessMetrics metrics("scheduler");
  SchedulerMetrics scheduler_metrics(metrics.registry());
  Status served = ServeMetrics(config, metrics, kSchedulerMetricsPort);
  if (!served.ok()) return Fail(served, 2);
  if (UnknownFlags(config)) return 2;
  auto refusals = std::make_shared<wire::TransportRefusals>();
  metrics.AddTransportRefusals(refusals);
  wire::ZmqOptions zmq = cluster::TransportOptions(options->curve, refusals);
  zmq.identity = "scheduler";
  zmq.max_frame_bytes = cluster::kControlFrameBytes;
  auto transport = wire::ZmqTransport::Create(zmq);
  if (!transport.ok()) return Fail(transport.status(), 1);
  RealClock clock;
  Scheduler scheduler(*options, std::move(*transport), &scheduler_metrics, &clock);
  auto bound = scheduler.Start();
  if (!bound.ok()) return Fail(bound.status(), 1);
  GS_LOG(INFO) << "listening on " << *bound << " for " << options->num_workers << " workers and "
               << options->num_servers << " servers (pid " << getpid() << ")";
  Status result = scheduler.Run(stop);
  if (!result.ok()) return Fail(result, 1);
  GS_LOG(INFO) << "scheduler exiting";
  return 0;
}

// The shard's transport: the node's TCP stream listener, with the workers
// of this host heard and answered through shared memory (null: none are, or
// ps_shm=false). Parameter-server traffic never goes over ZeroMQ.
std::unique_ptr<wire::SameHostTransport> ShardLinks(const cluster::PsLinkOptions& options,
                                                    cluster::Node& node) {
  const cluster::Assignment& a = node.agent->assignment();
  wire::SameHostOptions same_host = cluster::PsSameHostOptions(options, a.job_id, a.self, a.peers);
  same_host.identity = a.self.identity;  // the scheduler's name for this shard
  same_host.refusals = node.refusals;
  return cluster::OverSameHostLinks(node.streams.get(), std::move(same_host),
                                    "workers on this host reach the shard through shared memory");
}

// The shard's ZeroMQ data port takes no parameter-server traffic: each
// message a peer sends there is refused, answered where its header allows
// and counted, until `done`.
void RefuseDataPort(wire::Transport& data, wire::Sender self, ShardMetrics& metrics,
                    const std::atomic<bool>& done) {
  wire::Policy nothing = wire::Policy::Accepting({});
  nothing.job_id = self.job_id;
  while (!done.load()) {
    auto in = data.Receive(Deadline::AfterMs(100));
    if (!in.ok()) {
      if (in.status().code() == StatusCode::kDeadlineExceeded) continue;
      return;
    }
    wire::Verdict v = wire::Validate(in->message, nothing);
    metrics.rejected.Count(v.code);
    if (!v.ShouldAnswer()) continue;
    if (v.code == wire::ErrorCode::WrongType) {
      v.detail =
          "this shard takes pushes and pulls at its TCP stream port (the plan's stream_port), "
          "not at its data port";
    }
    data.Post(in->from,
              wire::MakeError(wire::AnswerAs(self, false), v.code, v.detail,
                              v.type_known ? v.type : wire::MsgType::Error),
              Deadline::AfterMs(1000), nullptr);
  }
}

// By rank, the identity each worker of `a`'s epoch reaches the shards
// under (PsRules::worker_identities, and what the stream listener takes).
std::vector<std::string> PsWorkerIdentities(const cluster::Assignment& a) {
  return cluster::PsClientIdentities(a.peers, a.num_workers, a.epoch);
}

// Starts the shard on `transport` (the node's stream listener, or one over
// it); workers the scheduler declares dead stop holding rounds back.
StatusOr<std::shared_ptr<PsShard>> StartShard(cluster::Node& node, wire::Transport* transport,
                                              PsShardOptions options) {
  options.rules.num_workers = node.agent->assignment().num_workers;
  options.rules.shard = node.agent->sender().rank;
  options.rules.num_shards = node.agent->assignment().num_servers;
  options.rules.worker_identities = PsWorkerIdentities(node.agent->assignment());
  GS_ASSIGN_OR_RETURN(std::unique_ptr<PsShard> started,
                      PsShard::Start(transport, options, node.agent->sender()));
  std::shared_ptr<PsShard> shard = std::move(started);
  std::weak_ptr<PsShard> weak = shard;
  node.agent->OnPeerDead([weak](const wire::NodeInfo& dead, const std::string&) {
    auto s = weak.lock();
    if (s && dead.role == wire::Role::Worker) s->WorkerDied(dead.rank);
  });
  for (const wire::NodeInfo& dead : node.agent->dead_peers()) {
    if (dead.role == wire::Role::Worker) shard->WorkerDied(dead.rank);
  }
  // Elastic jobs: each membership epoch's workers, re-ranked.
  wire::TcpStreamTransport* streams = node.streams.get();  // outlives the shard
  auto start_epoch = [weak, streams](const cluster::Assignment& next) {
    auto s = weak.lock();
    if (!s || next.epoch == 0) return;
    if (streams != nullptr) {
      streams->SetAccept(next.job_id, PsWorkerIdentities(next));
    }
    s->StartEpoch(next.epoch, next.num_workers, PsWorkerIdentities(next));
  };
  node.agent->OnNewEpoch(start_epoch);
  start_epoch(node.agent->latest());  // one that came before the callback
  GS_LOG(INFO) << "parameter-server shard: ps_mode=" << PsModeName(options.rules.mode)
               << " staleness=" << options.rules.staleness
               << " optimizer=" << OptimizerName(options.optimizer.kind)
               << " threads=" << options.threads;
  return shard;
}

// Writes a checkpoint now and logs the outcome.
void CheckpointNow(PsShard& shard, const std::string& when) {
  Status s = shard.Checkpoint();
  if (!s.ok()) {
    GS_LOG(ERROR) << "checkpoint " << when << " failed: " << s.message();
    return;
  }
  const CheckpointStats c = shard.checkpoint_stats();
  GS_LOG(INFO) << "checkpoint written " << when << ": " << c.last_keys << " keys, " << c.last_bytes
               << " bytes in " << c.last_duration_seconds << " s";
}

void LogShardStats(const PsShardStats& s) {
  GS_LOG(INFO) << "shard stats: pushes applied " << s.pushes_applied << ", duplicates "
               << s.duplicates << ", early pulls " << s.early_pulls << ", unplanned pushes "
               << s.unplanned << ", rejected " << s.rejected << ", rounds closed "
               << s.rounds_closed << ", replies " << s.replies << ", max staleness "
               << s.max_staleness << ", total staleness " << s.staleness_sum
               << ", straggler wait mean "
               << (s.rounds_closed > 0
                       ? s.straggler_wait_s * 1e3 / static_cast<double>(s.rounds_closed)
                       : 0.0)
               << " ms";
}

// The embedding tables' counters into their metrics (a snapshot waits for
// each key thread's current message).
void ExportEmbeddingStats(PsShard& shard, EmbeddingMetrics& metrics) {
  StatusOr<EmbeddingServiceStats> s = shard.EmbeddingStats();
  if (!s.ok()) return;
  metrics.Set(s->rows, s->tables, s->refused, s->rounds, shard.embedding_bytes());
}

void LogEmbeddingStats(PsShard& shard) {
  StatusOr<EmbeddingServiceStats> s = shard.EmbeddingStats();
  if (!s.ok() || s->tables == 0) return;
  GS_LOG(INFO) << "embedding stats: tables " << s->tables << ", rows " << s->rows.rows << " ("
               << shard.embedding_bytes() << " bytes), pulled " << s->rows.pulled << ", pushed "
               << s->rows.pushed << ", admitted " << s->rows.admitted << ", not admitted "
               << s->rows.not_admitted << ", evicted idle " << s->rows.evicted_idle
               << ", evicted for memory " << s->rows.evicted_memory << ", refused for memory "
               << s->rows.refused_memory << ", non-finite " << s->rows.refused_nonfinite
               << ", refused messages " << s->refused << ", rounds " << s->rounds;
}

int RunServer(const Config& config, const std::atomic<bool>& stop) {
  SetLogTag("server");
  auto options = cluster::NodeOptions::FromConfig(config);
  if (!options.ok()) return Fail(options.status(), 2);
  auto ps_options = PsShardOptions::FromConfig(config);
  if (!ps_options.ok()) return Fail(ps_options.status(), 2);
  auto interval_s = config.GetDouble("checkpoint_interval_s", 30);
  if (!interval_s.ok()) return Fail(interval_s.status(), 2);
  if (!(*interval_s > 0)) {
    return Fail(InvalidArgumentError("checkpoint_interval_s must be positive"), 2);
  }
  // Read by the node when it starts (cluster/node.h).
  for (const char* later : {"data_port", "security", "key_file"}) (void)config.Lookup(later);
  auto link_options = cluster::PsLinkOptions::FromConfig(config);
  if (!link_options.ok()) return Fail(link_options.status(), 2);
  ProcessMetrics metrics("server");
  Status served = ServeMetrics(config, metrics, kServerMetricsPort);
  if (!served.ok()) return Fail(served, 2);
  if (UnknownFlags(config)) return 2;
  ShardMetrics shard_metrics(metrics.registry());
  ps_options->metrics = &shard_metrics;
  EmbeddingMetrics embedding_metrics(metrics.registry(), ps_options->embedding_max_bytes);
  auto node = cluster::StartNode(config, wire::Role::Server, Deadline::AfterMs(180000));
  if (!node.ok()) return Fail(node.status(), 1);
  metrics.AddTransportRefusals(node->refusals);
  // Outlives the shard.
  std::unique_ptr<wire::SameHostTransport> links = ShardLinks(*link_options, *node);
  wire::Transport* transport = node->streams.get();
  if (links) transport = links.get();
  auto shard = StartShard(*node, transport, *ps_options);
  if (!shard.ok()) return Fail(shard.status(), 1);
  std::atomic<bool> refusing_done{false};
  std::thread refuser(
      [&] { RefuseDataPort(*node->data, node->agent->sender(), shard_metrics, refusing_done); });
  const bool checkpoints = !ps_options->checkpoint_dir.empty();
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(*interval_s));
  if (checkpoints) {
    GS_LOG(INFO) << "checkpoints in " << ps_options->checkpoint_dir << " every " << *interval_s
                 << " s";
  }
  GS_LOG(INFO) << "ready";
  Status end;
  SteadyTime next_checkpoint = std::chrono::steady_clock::now() + interval;
  SteadyTime next_export = std::chrono::steady_clock::now();
  while (!stop.load()) {
    end = node->agent->WaitForJobEnd(Deadline::AfterMs(100));
    if (end.ok()) end = (*shard)->health();
    if (!end.ok()) break;
    if (std::chrono::steady_clock::now() >= next_export) {
      ExportEmbeddingStats(**shard, embedding_metrics);
      next_export = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    }
    if (checkpoints && std::chrono::steady_clock::now() >= next_checkpoint) {
      CheckpointNow(**shard, "periodically");
      next_checkpoint = std::chrono::steady_clock::now() + interval;
    }
  }
  if (checkpoints) CheckpointNow(**shard, stop.load() ? "on exit (signal)" : "on exit");
  LogEmbeddingStats(**shard);
  (*shard)->Shutdown();
  refusing_done.store(true);
  refuser.join();
  LogShardStats((*shard)->stats());
  node->agent->Leave(stop.load() ? "stopped by signal" : "job ended");
  if (!end.ok() && end.code() != StatusCode::kAborted) return Fail(end, 1);
  GS_LOG(INFO) << "server exiting: " << (end.ok() ? "stopped by signal" : end.message());
  return 0;
}

int Main(int argc, char** argv) {
  // Before any thread starts, so that every thread has the signals blocked.
  std::atomic<bool> stop{false};
  SignalWatcher signals([&](int sig) {
    GS_LOG(INFO) << "received signal " << sig << ", stopping";
    stop.store(true);
  });
  auto config = Config::FromArgs(argc, argv, environ);
  if (!config.ok()) return Fail(config.status(), 2);
  auto role = config->GetString("role", "");
  int (*run)(const Config&, const std::atomic<bool>&) = nullptr;
  if (*role == "scheduler") run = RunScheduler;
  if (*role == "server") run = RunServer;
  if (run == nullptr) {
    std::fprintf(stderr,
                 "gradsync_server: --role (GRADSYNC_ROLE) must be 'scheduler' or "
                 "'server', not '%s'\n",
                 role->c_str());
    return 2;
  }
  return run(*config, stop);
}

}  // namespace
}  // namespace gradsync::server

int main(int argc, char** argv) { return gradsync::server::Main(argc, argv); }
