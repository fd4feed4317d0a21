// gradsync_launch: starts a gradsync job on this machine (see launcher.h).
//
//   gradsync_launch --workers=4 [--servers=0] [--port=0] [--host=127.0.0.1]
//       [--server_binary=PATH] [--log_dir=DIR] [--grace_ms=5000] -- command
//       [args...]
//   srun --ntasks-per-node=1 gradsync_launch [--servers=2] [--port=29400] -- command
//       (in a Slurm allocation: see launcher/slurm.h)
//
// Exit status: 0 when every worker exited 0; 1 when a process failed (the
// reason is printed on stderr); 2 for bad flags or a missing binary; 128 +
// the signal number when stopped by SIGINT or SIGTERM.
#include <atomic>
#include <cstdio>

#include "common/signals.h"
#include "launcher/launcher.h"
#include "launcher/slurm.h"

namespace gradsync::launcher {
namespace {

int Main(int argc, char** argv) {
  std::atomic<int> stop{0};
  SignalWatcher signals([&](int sig) { stop.store(sig); });
  auto options = LaunchOptions::FromArgs(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "gradsync_launch: %s\n", options.status().message().c_str());
    return 2;
  }
  if (options->slurm) {
    // One task of a Slurm step: become its scheduler, shard or worker.
    const std::string server =
        options->server_binary.empty() ? DefaultServerBinary() : options->server_binary;
    SlurmElastic elastic;
    elastic.min_workers = options->min_workers;
    elastic.max_workers = options->max_workers_given;
    elastic.restarts = options->restarts;
    StatusOr<int> code =
        RunSlurmTask(options->servers, options->port > 0 ? options->port : kSlurmDefaultPort,
                     server, options->worker_command, elastic, stop);
    if (code.ok()) return *code;
    std::fprintf(stderr, "gradsync_launch: %s\n", code.status().message().c_str());
    return 2;
  }
  Launcher launcher(*options, stdout);
  Status status = launcher.Run(stop);
  if (status.ok()) return 0;
  std::fprintf(stderr, "gradsync_launch: %s\n", status.message().c_str());
  if (status.code() == StatusCode::kCancelled) return 128 + stop.load();
  const bool setup =
      status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kNotFound;
  return setup ? 2 : 1;
}

}  // namespace
}  // namespace gradsync::launcher

int main(int argc, char** argv) { return gradsync::launcher::Main(argc, argv); }
