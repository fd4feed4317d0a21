#include "launcher/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "common/config.h"
#include "common/metrics.h"
#include "common/net.h"
#include "common/private_files.h"
#include "common/subprocess.h"
#include "launcher/launcher_process.h"
#include "launcher/slurm.h"
#include "wire/curve.h"

namespace gradsync::launcher {
namespace {

constexpr Millis kPoll{20};
constexpr char kListening[] = "listening on tcp://";

bool IsExecutable(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         access(path.c_str(), X_OK) == 0;
}

std::string SelfPath() {
  char buffer[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
}

// `name` itself when it holds a '/', else the first match in $PATH.
StatusOr<std::string> FindCommand(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (IsExecutable(name)) return name;
    return NotFoundError("worker command " + name + " is not an executable file");
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (IsExecutable(candidate)) return candidate;
    start = end + 1;
  }
  return NotFoundError("worker command '" + name + "' not found in PATH");
}

Status Stopped(int sig) {
  return CancelledError("stopped by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")");
}

StatusOr<int> IntFlag(const Config& config, const char* name, int64_t def, int64_t lo, int64_t hi) {
  GS_ASSIGN_OR_RETURN(int64_t v, config.GetInt(name, def));
  if (v < lo || v > hi) {
    return InvalidArgumentError("--" + std::string(name) + "=" + std::to_string(v) +
                                " is out of range [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "]");
  }
  return static_cast<int>(v);
}

}  // namespace

std::string Describe(int code) {
  if (code <= 128) return "exited with code " + std::to_string(code);
  const int sig = code - 128;
  return "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
}

StatusOr<LaunchOptions> LaunchOptions::FromArgs(int argc, const char* const* argv) {
  int split = 1;
  while (split < argc && std::strcmp(argv[split], "--") != 0) ++split;
  GS_ASSIGN_OR_RETURN(Config config, Config::FromArgs(split, argv, nullptr));
  LaunchOptions o;
  GS_ASSIGN_OR_RETURN(o.workers, IntFlag(config, "workers", 1, 1, 4096));
  GS_ASSIGN_OR_RETURN(o.servers, IntFlag(config, "servers", 0, 0, 4096));
  // 0 (not given): not elastic. Under Slurm the step's size sets the workers.
  GS_ASSIGN_OR_RETURN(o.min_workers, IntFlag(config, "min_workers", 0, 0, 4096));
  GS_ASSIGN_OR_RETURN(o.slurm, config.GetBool("slurm", InSlurmStep()));
  // Under Slurm the step's size sets the workers: RunSlurmTask checks these.
  GS_ASSIGN_OR_RETURN(o.max_workers_given, IntFlag(config, "max_workers", 0, 0, 4096));
  GS_ASSIGN_OR_RETURN(o.max_workers,
                      IntFlag(config, "max_workers", o.workers, o.slurm ? 0 : o.workers, 4096));
  GS_ASSIGN_OR_RETURN(o.restarts, IntFlag(config, "restarts", 0, 0, 1000));
  if (o.restarts > 0 && !o.slurm && !o.Elastic()) {
    return InvalidArgumentError(
        "--restarts needs an elastic job (--min_workers below --workers, "
        "or --max_workers above it): a failed worker of any other job "
        "stops it");
  }
  GS_ASSIGN_OR_RETURN(o.port, IntFlag(config, "port", 0, 0, 65535));
  int metrics_default = kSchedulerMetricsPort;
  if (const char* env = std::getenv("GRADSYNC_METRICS_PORT")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*env == '\0' || *end != '\0' || v < 0 || v > 65535) {
      return InvalidArgumentError(std::string("GRADSYNC_METRICS_PORT='") + env + "' is not a port");
    }
    metrics_default = static_cast<int>(v);
  }
  GS_ASSIGN_OR_RETURN(o.metrics_port,
                      IntFlag(config, "metrics_port", metrics_default, 0, 65535 - 10 - o.workers));
  GS_ASSIGN_OR_RETURN(int grace, IntFlag(config, "grace_ms", 5000, 0, 3600000));
  o.grace = Millis(grace);
  GS_ASSIGN_OR_RETURN(o.host, config.GetString("host", o.host));
  GS_ASSIGN_OR_RETURN(o.server_binary, config.GetString("server_binary", ""));
  GS_ASSIGN_OR_RETURN(o.log_dir, config.GetString("log_dir", ""));
  GS_ASSIGN_OR_RETURN(o.security, config.GetString("security", o.security));
  if (!o.slurm && o.min_workers > o.workers) {
    return InvalidArgumentError("--min_workers=" + std::to_string(o.min_workers) +
                                " exceeds --workers=" + std::to_string(o.workers));
  }
  if (o.security != "auto" && o.security != "curve" && o.security != "none") {
    return InvalidArgumentError("security must be auto, curve or none, got '" + o.security + "'");
  }
  GS_RETURN_IF_ERROR(config.CheckKnownFlags());
  if (!config.positional().empty()) {
    return InvalidArgumentError("unexpected argument '" + config.positional()[0] + "' before '--'");
  }
  for (int i = split + 1; i < argc; ++i) o.worker_command.push_back(argv[i]);
  if (o.worker_command.empty()) {
    return InvalidArgumentError("no worker command: gradsync_launch [flags] -- command [args]");
  }
  return o;
}

std::string DefaultServerBinary() {
  const std::string rel = "/gradsync/server/gradsync_server";
  std::vector<std::string> candidates;
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* dir = std::getenv(var)) candidates.push_back(dir + rel);
  }
  const std::string self = SelfPath();
  if (!self.empty()) {
    candidates.push_back(self + ".runfiles" + rel);
    const std::string dir = self.substr(0, self.rfind('/'));
    candidates.push_back(dir + "/../server/gradsync_server");
  }
  for (const std::string& c : candidates) {
    if (IsExecutable(c)) return c;
  }
  return "";
}

Launcher::Launcher(LaunchOptions options, std::FILE* out)
    : options_(std::move(options)), out_(out) {}

Launcher::~Launcher() = default;

void Launcher::Say(const std::string& line) {
  std::fprintf(out_, "[launcher] %s\n", line.c_str());
  std::fflush(out_);
}

Status Launcher::Prepare() {
  if (options_.server_binary.empty()) {
    options_.server_binary = DefaultServerBinary();
  }
  if (!IsExecutable(options_.server_binary)) {
    return NotFoundError("no gradsync_server binary at '" + options_.server_binary +
                         "': build //server:gradsync_server or pass --server_binary");
  }
  GS_ASSIGN_OR_RETURN(options_.worker_command[0], FindCommand(options_.worker_command[0]));
  if (options_.log_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/gradsync_launch.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      return UnavailableError("cannot create a log directory " + pattern + ": " +
                              std::strerror(errno));
    }
    options_.log_dir = pattern;
  } else {
    GS_RETURN_IF_ERROR(MakePrivateDirectory(options_.log_dir, "log directory"));
  }
  Say("logs in " + options_.log_dir);
  const bool curve = options_.security == "curve" ||
                     (options_.security == "auto" && !IsLoopbackHost(options_.host));
  security_ = {{"GRADSYNC_SECURITY", curve ? "curve" : "none"}};
  member_security_ = security_;
  if (curve) {
    // The scheduler's copy (with its own secret key) and the members'.
    const std::string path = options_.log_dir + "/job.key";
    const std::string members = options_.log_dir + "/job.members.key";
    GS_ASSIGN_OR_RETURN(wire::CurveKey key, wire::GenerateJobKey());
    GS_RETURN_IF_ERROR(wire::WriteKeyFile(path, key));
    GS_RETURN_IF_ERROR(wire::WriteKeyFile(members, wire::MembersCopy(key)));
    security_.emplace_back("GRADSYNC_KEY_FILE", path);
    member_security_.emplace_back("GRADSYNC_KEY_FILE", members);
    Say("CURVE with a new job key in " + path + " (the members' copy: " + members + ")");
  }
  return OkStatus();
}

Status Launcher::Start(const std::string& name, bool is_worker,
                       const std::vector<std::string>& argv,
                       const std::vector<std::pair<std::string, std::string>>& env) {
  std::string file = name;
  for (char& c : file) c = c == ' ' ? '_' : c;
  const std::string path = options_.log_dir + "/" + file + ".log";
  GS_ASSIGN_OR_RETURN(const int created, CreatePrivateFile(path, O_TRUNC));
  close(created);
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return UnavailableError("cannot read " + path + ": " + std::strerror(errno));
  }
  std::map<std::string, std::string> env_map(env.begin(), env.end());
  auto sub = Subprocess::Spawn(argv, env_map, path);
  if (!sub.ok()) {
    close(fd);
    return sub.status().WithPrefix("starting " + name);
  }
  processes_.push_back(std::make_unique<Process>(name, is_worker, std::move(*sub), fd));
  processes_.back()->env = env;
  return OkStatus();
}

Status Launcher::StartScheduler(const std::atomic<int>& stop_signal) {
  GS_RETURN_IF_ERROR(
      Start("scheduler", false,
            {options_.server_binary, "--role=scheduler", "--port=" + std::to_string(options_.port),
             "--metrics_port=" + std::to_string(options_.metrics_port),
             "--num_workers=" + std::to_string(options_.workers),
             "--num_servers=" + std::to_string(options_.servers),
             "--min_workers=" + std::to_string(options_.MinWorkers()),
             "--max_workers=" + std::to_string(options_.MaxWorkers()), "--host=" + options_.host},
            security_));
  Process& scheduler = *processes_.back();
  const Deadline deadline = Deadline::After(options_.startup_timeout);
  for (;;) {
    const std::string out = scheduler.sub.Output();
    const size_t at = out.find(kListening);
    const size_t colon = at == std::string::npos ? at : out.find(':', at + sizeof(kListening) - 1);
    if (colon != std::string::npos && out.find('\n', colon) != std::string::npos) {
      scheduler_address_ = options_.host + ":" + std::to_string(std::atoi(out.c_str() + colon + 1));
      return OkStatus();
    }
    PumpAll(false);
    if (stop_signal.load() != 0) return OkStatus();  // Supervise reports it
    if (auto code = scheduler.sub.Wait(Deadline::Past())) {
      scheduler.code = code;
      scheduler.reported = true;
      return AbortedError("scheduler " + Describe(*code) + " before listening");
    }
    if (deadline.Expired()) {
      return DeadlineExceededError("the scheduler did not listen within " +
                                   FormatSeconds(options_.startup_timeout));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

namespace {

// A TCP port free on `host` now (the system's pick), for torch.distributed's
// store under dist.init_process_group(); 0 when none can be had.
int FreeTcpPort(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "0", &hints, &found) != 0) return 0;
  int port = 0;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
    port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return port;
}

}  // namespace

Status Launcher::StartNodes() {
  std::vector<std::pair<std::string, std::string>> job = {
      {"GRADSYNC_SCHEDULER", scheduler_address_},
      {"GRADSYNC_NUM_WORKERS", std::to_string(options_.workers)},
      {"GRADSYNC_NUM_SERVERS", std::to_string(options_.servers)}};
  job.insert(job.end(), member_security_.begin(), member_security_.end());
  Say("scheduler at " + scheduler_address_ + ", starting " + std::to_string(options_.servers) +
      " servers and " + std::to_string(options_.workers) + " workers");
  for (int s = 0; s < options_.servers; ++s) {
    const int metrics = options_.metrics_port > 0 ? options_.metrics_port + 1 + s : 0;
    // The rank is the label's: "[server 1]" is server 1 in every log line.
    auto env = job;
    env.emplace_back("GRADSYNC_RANK", std::to_string(s));
    GS_RETURN_IF_ERROR(Start(
        "server " + std::to_string(s), false,
        {options_.server_binary, "--role=server", "--metrics_port=" + std::to_string(metrics)},
        env));
  }
  // torch.distributed's env:// variables, so that a PyTorch worker's
  // dist.init_process_group("gradsync") finds this job as under torchrun.
  const std::string workers = std::to_string(options_.workers);
  const std::string torch_port = std::to_string(FreeTcpPort(options_.host));
  for (int r = 0; r < options_.workers; ++r) {
    auto env = job;
    env.emplace_back("GRADSYNC_RANK", std::to_string(r));
    env.emplace_back("GRADSYNC_LOCAL_RANK", std::to_string(r));
    for (const auto& [name, value] :
         std::vector<std::pair<std::string, std::string>>{{"RANK", std::to_string(r)},
                                                          {"LOCAL_RANK", std::to_string(r)},
                                                          {"WORLD_SIZE", workers},
                                                          {"LOCAL_WORLD_SIZE", workers},
                                                          {"MASTER_ADDR", options_.host},
                                                          {"MASTER_PORT", torch_port}}) {
      env.emplace_back(name, value);
    }
    env.emplace_back("GRADSYNC_METRICS_BASE_PORT",
                     std::to_string(options_.metrics_port > 0 ? options_.metrics_port + 10 : 0));
    GS_RETURN_IF_ERROR(Start("worker " + std::to_string(r), true, options_.worker_command, env));
  }
  return OkStatus();
}

Launcher::Process* Launcher::Reap() {
  for (auto& p : processes_) {
    if (!p->code) p->code = p->sub.Wait(Deadline::Past());
    if (!p->code || p->reported) continue;
    p->reported = true;
    if (*p->code != 0) return p.get();
  }
  return nullptr;
}

Status Launcher::Failure(const Process& p, const std::atomic<int>& stop_signal) {
  // A Ctrl-C reaches the children as well; let the launcher's own signal win.
  const int code = *p.code;
  if (code == 128 + SIGINT || code == 128 + SIGTERM) {
    const Deadline settle = Deadline::AfterMs(300);
    while (stop_signal.load() == 0 && !settle.Expired()) {
      std::this_thread::sleep_for(kPoll);
    }
  }
  if (int sig = stop_signal.load(); sig != 0) return Stopped(sig);
  return AbortedError(p.name + " " + Describe(code));
}

Status Launcher::Supervise(const std::atomic<int>& stop_signal) {
  for (;;) {
    PumpAll(false);
    if (int sig = stop_signal.load(); sig != 0) return Stopped(sig);
    if (Process* failed = Reap()) {
      if (!Spare(*failed)) return Failure(*failed, stop_signal);
      continue;
    }
    bool workers_running = false;
    for (const auto& p : processes_) {
      workers_running |= p->is_worker && !p->code;
    }
    if (!workers_running) return FinishInfrastructure(stop_signal);
    std::this_thread::sleep_for(kPoll);
  }
}

// Every worker exited 0: the scheduler and servers get the grace period to
// notice the end of the job and exit by themselves.
Status Launcher::FinishInfrastructure(const std::atomic<int>& stop_signal) {
  Say(WorkersSummary());
  const Deadline deadline = Deadline::After(options_.grace);
  for (;;) {
    PumpAll(false);
    if (Process* failed = Reap()) return Failure(*failed, stop_signal);
    bool running = false;
    for (const auto& p : processes_) running |= !p->code;
    if (!running || deadline.Expired() || stop_signal.load() != 0) {
      return OkStatus();
    }
    std::this_thread::sleep_for(kPoll);
  }
}

void Launcher::StopAll() {
  std::vector<std::string> stopped;
  for (auto& p : processes_) {
    if (!p->code) p->code = p->sub.Wait(Deadline::Past());
    if (p->code) continue;
    p->sub.Signal(SIGTERM);
    stopped.push_back(p->name);
  }
  if (stopped.empty()) return;
  std::string names;
  for (const std::string& n : stopped) names += (names.empty() ? "" : ", ") + n;
  Say("stopping " + names);
  const Deadline deadline = Deadline::After(options_.grace);
  for (auto& p : processes_) {
    if (!p->code) p->code = p->sub.Wait(deadline);
    if (!p->code) {
      Say(p->name + " did not stop within " + FormatSeconds(options_.grace) + ", killing it");
      p->sub.Signal(SIGKILL);
      p->code = p->sub.Wait(Deadline::Infinite());
    }
    p->reported = true;
  }
}

void Launcher::PumpAll(bool final) {
  char buffer[1 << 16];
  for (auto& p : processes_) {
    ssize_t n;
    while ((n = read(p->fd, buffer, sizeof(buffer))) > 0) {
      p->pending.append(buffer, static_cast<size_t>(n));
    }
    size_t start = 0, end;
    while ((end = p->pending.find('\n', start)) != std::string::npos) {
      std::fprintf(out_, "[%s] %.*s\n", p->name.c_str(), static_cast<int>(end - start),
                   p->pending.data() + start);
      start = end + 1;
    }
    p->pending.erase(0, start);
    if (final && !p->pending.empty()) {
      std::fprintf(out_, "[%s] %s\n", p->name.c_str(), p->pending.c_str());
      p->pending.clear();
    }
  }
  std::fflush(out_);
}

Status Launcher::Run(const std::atomic<int>& stop_signal) {
  GS_RETURN_IF_ERROR(Prepare());
  Status status = StartScheduler(stop_signal);
  if (status.ok() && stop_signal.load() == 0) status = StartNodes();
  if (status.ok()) status = Supervise(stop_signal);
  if (!status.ok()) Say(status.message());
  StopAll();
  PumpAll(true);
  return status;
}

}  // namespace gradsync::launcher
