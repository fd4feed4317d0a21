// The job launcher: starts a gradsync job on this machine, the way torchrun
// starts a PyTorch job.
//
//   gradsync_launch --workers=4 [--servers=0] [--port=0] -- trainer --epochs=3
//
// starts the scheduler (gradsync_server --role=scheduler), `servers`
// parameter-server shards (gradsync_server --role=server) and `workers`
// copies of the command after "--", each with GRADSYNC_SCHEDULER,
// GRADSYNC_NUM_WORKERS, GRADSYNC_NUM_SERVERS and (workers only)
// GRADSYNC_RANK and GRADSYNC_LOCAL_RANK in its environment, and /metrics
// ports that do not collide (see LaunchOptions::metrics_port). Every process writes to a log file
// of its own in the log directory; the launcher streams each file's lines to its output with the
// process's name in front ("[worker 2] ...").
//
// With `min_workers` below `workers` (or `max_workers` above it) the job is
// elastic (docs/design/failure_model.md#elastic-jobs): the scheduler gets
// --min_workers and --max_workers, and a worker that fails (exits non-zero,
// or is killed) is reported and the others go on, as long as at least
// min_workers remain. With `restarts`, a failed worker is started again
// ("worker 2 (restart 1)"), up to that many times in all, and rejoins the
// running job instead.
//
// The job succeeds when every worker exits 0 (in an elastic job: every
// worker that was not lost); the scheduler and servers then
// get a grace period to end by themselves before they are stopped. When any
// process exits non-zero (or the stop signal comes), every other process is
// sent SIGTERM, and SIGKILL after the grace period. Exit codes above 128 are
// read as death by signal (code - 128), as a shell reports them.
//
// Thread-safety: a Launcher is used from one thread; `stop_signal` may be set
// from any.
#ifndef GRADSYNC_LAUNCHER_LAUNCHER_H_
#define GRADSYNC_LAUNCHER_LAUNCHER_H_

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/time.h"

namespace gradsync::launcher {

struct LaunchOptions {
  int workers = 1;
  int servers = 0;
  // The fewest workers the job goes on with; 0 or `workers` (the default):
  // a failed worker stops the job.
  int min_workers = 0;
  int MinWorkers() const {
    return min_workers > 0 && min_workers < workers ? min_workers : workers;
  }
  // The most workers the job takes (the scheduler refuses joiners past it);
  // 0: `workers`.
  int max_workers = 0;
  int max_workers_given = 0;  // --max_workers as given (0: not); Slurm steps
  int MaxWorkers() const { return max_workers > workers ? max_workers : workers; }
  bool Elastic() const { return MinWorkers() < workers || MaxWorkers() > workers; }
  // Elastic jobs: how many times in all a failed worker is started again
  // (it rejoins the running job with the same environment); 0: never.
  int restarts = 0;
  // The scheduler's port; 0: any free port.
  int port = 0;
  // /metrics ports: the scheduler on `metrics_port`, shard i on
  // metrics_port + 1 + i, the worker of local rank r on metrics_port + 10 + r;
  // 0 turns them off. Default: $GRADSYNC_METRICS_PORT, else 9400.
  int metrics_port = 9400;
  // The scheduler's address as the nodes reach it.
  std::string host = "127.0.0.1";
  // Empty: DefaultServerBinary().
  std::string server_binary;
  // Empty: a new directory under $TMPDIR or /tmp. Either way mode 0700 when
  // created; an existing one must be this user's directory, not a symbolic
  // link. Log files (and the job key) in it are 0600, never opened through
  // a link.
  std::string log_dir;
  // The worker's argv; a bare argv[0] is looked up in PATH.
  std::vector<std::string> worker_command;
  // How long processes get to end by themselves before SIGTERM, and to end
  // after SIGTERM before SIGKILL.
  Millis grace{5000};
  // How long the scheduler may take to listen.
  Millis startup_timeout{15000};
  // auto: CURVE when `host` is not loopback, none when it is; curve: always
  // (a new key per job, in the log directory, mode 0600, handed to every
  // process as GRADSYNC_KEY_FILE); none: never.
  std::string security = "auto";
  // Run as one task of a Slurm job step (launcher/slurm.h): `--slurm`, or
  // by default when SLURM_PROCID and SLURM_NTASKS are set.
  bool slurm = false;

  // Parses `[--flag=value...] -- command [args...]` (argv[0] is the
  // launcher). Flags: workers, servers, min_workers, max_workers, restarts
  // (elastic jobs only), port, metrics_port, host,
  // server_binary, log_dir, grace_ms, security. InvalidArgument for a missing command, an unknown
  // flag, an argument before "--" or a value out of range.
  static StatusOr<LaunchOptions> FromArgs(int argc, const char* const* argv);
};

// The gradsync_server beside the running executable: in its Bazel runfiles
// ($RUNFILES_DIR, $TEST_SRCDIR or <exe>.runfiles), or in the sibling server/
// directory of bazel-bin. Empty when none is found.
std::string DefaultServerBinary();

class Launcher {
 public:
  // Writes the processes' lines and its own ("[launcher] ...") to `out`,
  // which must outlive the Launcher.
  Launcher(LaunchOptions options, std::FILE* out);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Runs the job and returns when every process has ended. OK when every
  // worker exited 0. Aborted naming the first process that failed and how
  // ("worker 2 exited with code 3", "server 0 killed by signal 9 (Killed)",
  // "scheduler exited with code 1 before listening"). Cancelled when
  // `stop_signal` became non-zero ("stopped by signal 2 (Interrupt)").
  // NotFound when the server binary or the worker command is missing;
  // Unavailable when the log directory or a process cannot be created;
  // DeadlineExceeded when the scheduler does not listen in time. Blocks;
  // polls `stop_signal` every few milliseconds.
  Status Run(const std::atomic<int>& stop_signal);

  // The directory holding the logs (known once Run started).
  const std::string& log_dir() const { return options_.log_dir; }

 private:
  struct Process;

  Status Prepare();
  Status StartScheduler(const std::atomic<int>& stop_signal);
  Status StartNodes();
  Status Start(const std::string& name, bool is_worker, const std::vector<std::string>& argv,
               const std::vector<std::pair<std::string, std::string>>& env);
  Status Supervise(const std::atomic<int>& stop_signal);
  Status FinishInfrastructure(const std::atomic<int>& stop_signal);
  // The first process that ended with a non-zero code since the last call.
  Process* Reap();
  Status Failure(const Process& p, const std::atomic<int>& stop_signal);
  // Whether the job goes on without failed worker `p` (an elastic job with
  // workers to spare); says so when it does.
  bool Spare(const Process& p);
  // Starts failed worker `p` again, if a restart is left.
  bool Restart(const Process& p);
  std::string WorkersSummary() const;
  void StopAll();
  void PumpAll(bool final);
  void Say(const std::string& line);

  LaunchOptions options_;
  std::FILE* out_;
  std::string scheduler_address_;
  // GRADSYNC_SECURITY and, with CURVE, GRADSYNC_KEY_FILE for every process.
  std::vector<std::pair<std::string, std::string>> security_;         // the scheduler's
  std::vector<std::pair<std::string, std::string>> member_security_;  // every other process's
  std::vector<std::unique_ptr<Process>> processes_;
  int lost_workers_ = 0;
  int restarted_ = 0;
};

}  // namespace gradsync::launcher

#endif  // GRADSYNC_LAUNCHER_LAUNCHER_H_
