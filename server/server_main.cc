// gradsync_server: the scheduler and the parameter-server shards.
//
//   gradsync_server --role=scheduler --port=9000 --num_workers=4 --num_servers=2
//   gradsync_server --role=server --scheduler=host:9000 --num_workers=4 --num_servers=2
//       [--ps_mode=sync|async|ssp --staleness=s --optimizer=none|sgd|momentum|adam --lr=...]
//
// A server is one parameter-server shard (server/ps_shard.h lists its
// settings).
//
// Every flag can also be given as an environment variable: --num_workers as
// GRADSYNC_NUM_WORKERS, --role as GRADSYNC_ROLE, and so on. Exit status: 0
// when the job ended normally or on SIGTERM/SIGINT, 1 when it failed, 2 for
// bad flags.
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "cluster/node.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/signals.h"
#include "server/ps_shard.h"
#include "server/scheduler.h"
#include "wire/zmq_transport.h"

extern char** environ;

namespace gradsync::server {
namespace {

int Fail(const Status& s, int code) {
  GS_LOG(ERROR) << s.message();
  return code;
}

// Serves /metrics when --metrics_port is set; a busy port is only a warning.
void MaybeServeMetrics(const Config& config, ProcessMetrics& metrics, int64_t default_port) {
  auto port = config.GetInt("metrics_port", default_port);
  if (!port.ok() || *port == 0) return;
  auto bound = metrics.Serve("0.0.0.0:" + std::to_string(*port));
  if (!bound.ok()) {
    GS_LOG(WARNING) << bound.status().message() << "; continuing without /metrics";
  } else {
    GS_LOG(INFO) << "metrics on http://0.0.0.0:" << *bound << "/metrics";
  }
}

// Flags that nothing asked for are typos: refuse to start.
bool UnknownFlags(const Config& config) {
  auto unknown = config.UnknownFlags();
  for (const std::string& flag : unknown) GS_LOG(ERROR) << "unknown flag " << flag;
  return !unknown.empty();
}

int RunScheduler(const Config& config, const std::atomic<bool>& stop) {
  SetLogTag("scheduler");
  auto options = SchedulerOptions::FromConfig(config);
  if (!options.ok()) return Fail(options.status(), 2);
  (void)config.Lookup("metrics_port");
  if (UnknownFlags(config)) return 2;
  ProcessMetrics metrics("scheduler");
  SchedulerMetrics scheduler_metrics(metrics.registry());
  MaybeServeMetrics(config, metrics, 0);
  auto transport = wire::ZmqTransport::Create({"scheduler"});
  if (!transport.ok()) return Fail(transport.status(), 1);
  RealClock clock;
  Scheduler scheduler(*options, std::move(*transport), &scheduler_metrics, &clock);
  auto bound = scheduler.Start();
  if (!bound.ok()) return Fail(bound.status(), 1);
  GS_LOG(INFO) << "listening on " << *bound << " for " << options->num_workers
               << " workers and " << options->num_servers << " servers (pid " << getpid() << ")";
  Status result = scheduler.Run(stop);
  if (!result.ok()) return Fail(result, 1);
  GS_LOG(INFO) << "scheduler exiting";
  return 0;
}

// Starts the shard on the node's data transport; workers the scheduler
// declares dead stop holding rounds back.
StatusOr<std::shared_ptr<PsShard>> StartShard(cluster::Node& node, PsShardOptions options) {
  options.rules.num_workers = node.agent->assignment().num_workers;
  GS_ASSIGN_OR_RETURN(std::unique_ptr<PsShard> started,
                      PsShard::Start(node.data.get(), options, node.agent->sender()));
  std::shared_ptr<PsShard> shard = std::move(started);
  std::weak_ptr<PsShard> weak = shard;
  node.agent->OnPeerDead([weak](const wire::NodeInfo& dead, const std::string&) {
    auto s = weak.lock();
    if (s && dead.role == wire::Role::Worker) s->WorkerDied(dead.rank);
  });
  for (const wire::NodeInfo& dead : node.agent->dead_peers()) {
    if (dead.role == wire::Role::Worker) shard->WorkerDied(dead.rank);
  }
  GS_LOG(INFO) << "parameter-server shard: ps_mode=" << PsModeName(options.rules.mode)
               << " staleness=" << options.rules.staleness
               << " optimizer=" << OptimizerName(options.optimizer.kind)
               << " threads=" << options.threads;
  return shard;
}

void LogShardStats(const PsShardStats& s) {
  GS_LOG(INFO) << "shard stats: pushes applied " << s.pushes_applied << ", duplicates "
               << s.duplicates << ", rejected " << s.rejected << ", rounds closed "
               << s.rounds_closed << ", replies " << s.replies << ", max staleness "
               << s.max_staleness << ", total staleness " << s.staleness_sum;
}

int RunServer(const Config& config, const std::atomic<bool>& stop) {
  SetLogTag("server");
  auto options = cluster::NodeOptions::FromConfig(config);
  if (!options.ok()) return Fail(options.status(), 2);
  auto ps_options = PsShardOptions::FromConfig(config);
  if (!ps_options.ok()) return Fail(ps_options.status(), 2);
  for (const char* name : {"data_port", "metrics_port"}) (void)config.Lookup(name);
  if (UnknownFlags(config)) return 2;
  ProcessMetrics metrics("server");
  MaybeServeMetrics(config, metrics, 0);
  auto node = cluster::StartNode(config, wire::Role::Server, Deadline::AfterMs(180000));
  if (!node.ok()) return Fail(node.status(), 1);
  auto shard = StartShard(*node, *ps_options);
  if (!shard.ok()) return Fail(shard.status(), 1);
  GS_LOG(INFO) << "ready";
  Status end;
  while (!stop.load()) {
    end = node->agent->WaitForJobEnd(Deadline::AfterMs(100));
    if (!end.ok()) break;
  }
  (*shard)->Shutdown();
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
    std::fprintf(stderr, "gradsync_server: --role (GRADSYNC_ROLE) must be 'scheduler' or "
                         "'server', not '%s'\n", role->c_str());
    return 2;
  }
  return run(*config, stop);
}

}  // namespace
}  // namespace gradsync::server

int main(int argc, char** argv) { return gradsync::server::Main(argc, argv); }
