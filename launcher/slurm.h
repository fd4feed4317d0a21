// gradsync_launch inside a Slurm allocation (`--slurm`, or SLURM_PROCID and
// SLURM_NTASKS set): srun starts one launcher per node
// (`srun --ntasks-per-node=1 gradsync_launch --servers=2 -- trainer ...`)
// and each becomes one process of the job:
//   task 0 (the allocation's first node)      the scheduler
//   tasks 1 .. servers                        shard 0 .. servers - 1
//   the other tasks                           workers, rank = task - 1 - servers
// Every process gets the scheduler's address (the first node's NodeAddr, as
// `scontrol show node` reports it, and `--port`, default 29400), its rank,
// the job size and its own node's address as GRADSYNC_HOST. Off loopback the
// job needs a shared key file (GRADSYNC_KEY_FILE, see README) or
// --security=none. With --min_workers below the allocation's workers the
// scheduler runs an elastic job: a worker task that dies ends a membership
// epoch, not the job (srun must then not kill the step on a task's failure:
// --kill-on-bad-exit=0, Slurm's default). --max_workers above them lets
// workers join the running job. With --restarts=N a worker task does not
// become its trainer but runs it, and starts it again (up to N times in
// all) when it fails: the new process joins the running job with the same
// environment.
#ifndef GRADSYNC_LAUNCHER_SLURM_H_
#define GRADSYNC_LAUNCHER_SLURM_H_

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace gradsync::launcher {

constexpr int kSlurmDefaultPort = 29400;

// Whether this process is a task of a Slurm job step.
bool InSlurmStep();

struct SlurmTask {
  enum class Role { kScheduler, kServer, kWorker };
  Role role = Role::kWorker;
  int rank = 0;  // shard or worker rank
  int num_workers = 0;
  int num_servers = 0;
  int min_workers = 0;    // in (0, num_workers): an elastic job
  int max_workers = 0;    // above num_workers: joiners are admitted up to it
  std::string scheduler;  // host:port
  std::string host;       // this node's address
};

// This task's part. `env` holds SLURM_PROCID, SLURM_NTASKS,
// SLURM_JOB_NODELIST and SLURMD_NODENAME; `node_address` maps a node name to
// its address, `first_node` a node list to its first name. InvalidArgument
// when the step has too few tasks for a scheduler, the servers and a worker.
StatusOr<SlurmTask> PlanSlurmTask(
    const std::map<std::string, std::string>& env, int servers, int port,
    const std::function<StatusOr<std::string>(const std::string&)>& node_address,
    const std::function<StatusOr<std::string>(const std::string&)>& first_node);

// The argv and extra environment that run `task`: the server binary for the
// scheduler and shards, `worker_command` for a worker.
struct SlurmExec {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
};
SlurmExec SlurmExecFor(const SlurmTask& task, const std::string& server_binary,
                       const std::vector<std::string>& worker_command,
                       const std::string& local_rank);

// The elastic settings of a step (LaunchOptions): 0 where not given.
struct SlurmElastic {
  int min_workers = 0;  // must not exceed the step's workers
  int max_workers = 0;
  int restarts = 0;  // worker tasks: start a failed trainer again, this many times
};

// Plans this task from the real environment and scontrol, then replaces
// this process with it, or (a worker task with restarts) runs it as a
// child until it succeeds or the restarts are spent, and returns its exit
// status. `stop` (a signal number, 0: none) is forwarded to the child.
// InvalidArgument for settings the step cannot take; otherwise returns
// only on failure to start.
StatusOr<int> RunSlurmTask(int servers, int port, const std::string& server_binary,
                           const std::vector<std::string>& worker_command,
                           const SlurmElastic& elastic, const std::atomic<int>& stop);

// Runs `e` as a child, inheriting stdout and stderr, and starts it again
// after each failure (an exit status other than 0), `restarts` times in all;
// `name` names it in the launcher's lines. Returns the last exit status (128
// + signal for a child killed by a signal).
StatusOr<int> SuperviseWorker(const SlurmExec& e, const std::string& name, int restarts,
                              const std::atomic<int>& stop);

}  // namespace gradsync::launcher

#endif  // GRADSYNC_LAUNCHER_SLURM_H_
