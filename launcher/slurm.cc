#include "launcher/slurm.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gradsync::launcher {
namespace {

std::string Get(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? "" : it->second;
}

StatusOr<int> IntOf(const std::map<std::string, std::string>& env, const std::string& key) {
  const std::string v = Get(env, key);
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < 0) {
    return InvalidArgumentError(key + "='" + v + "' is not a count");
  }
  return static_cast<int>(n);
}

// The output of `command`, or Unavailable naming it.
StatusOr<std::string> Run(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return UnavailableError("cannot run " + command);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) return UnavailableError(command + " failed (status " + std::to_string(rc) + ")");
  return out;
}

bool Safe(const std::string& s) {
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && std::strchr("-_.,[]", c) == nullptr) {
      return false;
    }
  }
  return !s.empty();
}

// NodeAddr of `node` from scontrol (the name itself when it has none).
StatusOr<std::string> ScontrolAddress(const std::string& node) {
  if (!Safe(node)) return InvalidArgumentError("odd node name '" + node + "'");
  GS_ASSIGN_OR_RETURN(std::string out, Run("scontrol show node " + node));
  const size_t at = out.find("NodeAddr=");
  if (at == std::string::npos) return node;
  const size_t from = at + std::strlen("NodeAddr=");
  return out.substr(from, out.find_first_of(" \n", from) - from);
}

StatusOr<std::string> ScontrolFirstNode(const std::string& nodelist) {
  if (!Safe(nodelist)) return InvalidArgumentError("odd node list '" + nodelist + "'");
  GS_ASSIGN_OR_RETURN(std::string out, Run("scontrol show hostnames " + nodelist));
  const std::string first = out.substr(0, out.find('\n'));
  if (first.empty()) return InvalidArgumentError("empty node list '" + nodelist + "'");
  return first;
}

}  // namespace

bool InSlurmStep() {
  return std::getenv("SLURM_PROCID") != nullptr && std::getenv("SLURM_NTASKS") != nullptr;
}

StatusOr<SlurmTask> PlanSlurmTask(
    const std::map<std::string, std::string>& env, int servers, int port,
    const std::function<StatusOr<std::string>(const std::string&)>& node_address,
    const std::function<StatusOr<std::string>(const std::string&)>& first_node) {
  GS_ASSIGN_OR_RETURN(int procid, IntOf(env, "SLURM_PROCID"));
  GS_ASSIGN_OR_RETURN(int ntasks, IntOf(env, "SLURM_NTASKS"));
  if (ntasks < servers + 2) {
    return InvalidArgumentError("a Slurm step of " + std::to_string(ntasks) +
                                " tasks has no room for the scheduler, " + std::to_string(servers) +
                                " servers and a worker: run at least " +
                                std::to_string(servers + 2) + " tasks, one per node");
  }
  if (procid >= ntasks) return InvalidArgumentError("SLURM_PROCID is not below SLURM_NTASKS");
  SlurmTask t;
  t.num_servers = servers;
  t.num_workers = ntasks - 1 - servers;
  if (procid == 0) {
    t.role = SlurmTask::Role::kScheduler;
  } else if (procid <= servers) {
    t.role = SlurmTask::Role::kServer;
    t.rank = procid - 1;
  } else {
    t.role = SlurmTask::Role::kWorker;
    t.rank = procid - 1 - servers;
  }
  GS_ASSIGN_OR_RETURN(std::string first, first_node(Get(env, "SLURM_JOB_NODELIST")));
  GS_ASSIGN_OR_RETURN(std::string scheduler_host, node_address(first));
  t.scheduler = scheduler_host + ":" + std::to_string(port);
  const std::string mine = Get(env, "SLURMD_NODENAME");
  if (mine.empty()) return InvalidArgumentError("SLURMD_NODENAME is not set");
  GS_ASSIGN_OR_RETURN(t.host, node_address(mine));
  return t;
}

SlurmExec SlurmExecFor(const SlurmTask& task, const std::string& server_binary,
                       const std::vector<std::string>& worker_command,
                       const std::string& local_rank) {
  SlurmExec e;
  const std::string port = task.scheduler.substr(task.scheduler.rfind(':') + 1);
  e.env = {{"GRADSYNC_SCHEDULER", task.scheduler},
           {"GRADSYNC_NUM_WORKERS", std::to_string(task.num_workers)},
           {"GRADSYNC_NUM_SERVERS", std::to_string(task.num_servers)},
           {"GRADSYNC_HOST", task.host}};
  switch (task.role) {
    case SlurmTask::Role::kScheduler:
      e.argv = {server_binary,
                "--role=scheduler",
                "--host=" + task.host,
                "--port=" + port,
                "--num_workers=" + std::to_string(task.num_workers),
                "--num_servers=" + std::to_string(task.num_servers)};
      if (task.min_workers > 0 && task.min_workers < task.num_workers) {
        e.argv.push_back("--min_workers=" + std::to_string(task.min_workers));
      }
      if (task.max_workers > task.num_workers) {
        e.argv.push_back("--max_workers=" + std::to_string(task.max_workers));
      }
      break;
    case SlurmTask::Role::kServer:
      e.argv = {server_binary, "--role=server", "--rank=" + std::to_string(task.rank)};
      break;
    case SlurmTask::Role::kWorker:
      e.argv = worker_command;
      e.env["GRADSYNC_RANK"] = std::to_string(task.rank);
      e.env["GRADSYNC_LOCAL_RANK"] = local_rank.empty() ? "0" : local_rank;
      break;
  }
  return e;
}

StatusOr<int> SuperviseWorker(const SlurmExec& e, const std::string& name, int restarts,
                              const std::atomic<int>& stop) {
  for (int attempt = 0;; ++attempt) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t child = fork();
    if (child < 0) return UnavailableError(std::string("cannot fork: ") + std::strerror(errno));
    if (child == 0) {
      for (const auto& [k, v] : e.env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (const std::string& a : e.argv) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      std::fprintf(stderr, "gradsync_launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
      _exit(127);
    }
    int status = 0;
    bool forwarded = false;
    for (;;) {
      const pid_t done = waitpid(child, &status, WNOHANG);
      if (done == child) break;
      if (done < 0 && errno != EINTR) {
        return UnavailableError(std::string("waitpid: ") + std::strerror(errno));
      }
      if (stop.load() != 0 && !forwarded) {
        kill(child, stop.load());
        forwarded = true;
      }
      usleep(20000);
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 0 || stop.load() != 0 || attempt >= restarts) return code;
    std::fprintf(
        stderr, "gradsync_launch: %s %s; starting it again (restart %d of %d)\n", name.c_str(),
        WIFEXITED(status) ? ("exited with code " + std::to_string(code)).c_str()
                          : ("was killed by signal " + std::to_string(WTERMSIG(status))).c_str(),
        attempt + 1, restarts);
  }
}

StatusOr<int> RunSlurmTask(int servers, int port, const std::string& server_binary,
                           const std::vector<std::string>& worker_command,
                           const SlurmElastic& elastic, const std::atomic<int>& stop) {
  std::map<std::string, std::string> env;
  for (const char* key :
       {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "SLURMD_NODENAME", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(key)) env[key] = v;
  }
  GS_ASSIGN_OR_RETURN(SlurmTask task,
                      PlanSlurmTask(env, servers, port, ScontrolAddress, ScontrolFirstNode));
  if (elastic.min_workers > task.num_workers) {
    return InvalidArgumentError("--min_workers=" + std::to_string(elastic.min_workers) +
                                " exceeds the " + std::to_string(task.num_workers) +
                                " workers of this Slurm step");
  }
  task.min_workers = elastic.min_workers;
  task.max_workers = elastic.max_workers;
  const bool is_elastic = (task.min_workers > 0 && task.min_workers < task.num_workers) ||
                          task.max_workers > task.num_workers;
  if (elastic.restarts > 0 && !is_elastic) {
    return InvalidArgumentError(
        "--restarts needs an elastic step (--min_workers below its " +
        std::to_string(task.num_workers) +
        " workers, or --max_workers above): a failed worker of any other job stops it");
  }
  SlurmExec e = SlurmExecFor(task, server_binary, worker_command, env["SLURM_LOCALID"]);
  if (task.role == SlurmTask::Role::kWorker && elastic.restarts > 0) {
    return SuperviseWorker(e, "worker " + std::to_string(task.rank), elastic.restarts, stop);
  }
  for (const auto& [k, v] : e.env) setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> argv;
  for (std::string& a : e.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  execvp(argv[0], argv.data());
  return UnavailableError("cannot run " + e.argv[0] + ": " + std::strerror(errno));
}

}  // namespace gradsync::launcher
