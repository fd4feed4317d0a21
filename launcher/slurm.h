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
// --kill-on-bad-exit=0, Slurm's default).
#ifndef GRADSYNC_LAUNCHER_SLURM_H_
#define GRADSYNC_LAUNCHER_SLURM_H_

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

// Plans this task from the real environment and scontrol, then replaces
// this process with it. Returns only on failure.
// `min_workers` (0: not elastic) must not exceed the step's workers
// (InvalidArgument).
Status ExecSlurmTask(int servers, int port, const std::string& server_binary,
                     const std::vector<std::string>& worker_command, int min_workers = 0);

}  // namespace gradsync::launcher

#endif  // GRADSYNC_LAUNCHER_SLURM_H_
