#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace gradsync {

StatusOr<Subprocess> Subprocess::Spawn(const std::vector<std::string>& argv,
                                       const std::map<std::string, std::string>& env,
                                       const std::string& output_path) {
  if (argv.empty()) return InvalidArgumentError("empty command");
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& kv : env) merged[kv.first] = kv.second;
  std::vector<std::string> env_strings;
  for (const auto& kv : merged) env_strings.push_back(kv.first + "=" + kv.second);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, output_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);  // children see SIGTERM again
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return UnavailableError("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  return Subprocess(pid, output_path);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), exit_code_(other.exit_code_), output_path_(std::move(other.output_path_)) {
  other.pid_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  std::swap(pid_, other.pid_);
  std::swap(exit_code_, other.exit_code_);
  std::swap(output_path_, other.output_path_);
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_code_) {
    kill(pid_, SIGKILL);
    Wait(Deadline::Infinite());
  }
}

void Subprocess::Signal(int sig) const {
  if (pid_ > 0 && !exit_code_) kill(pid_, sig);
}

std::optional<int> Subprocess::Wait(Deadline deadline) {
  while (!exit_code_) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, deadline.infinite() ? 0 : WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (r < 0 && errno != EINTR) break;
    if (deadline.Expired()) return std::nullopt;
    std::this_thread::sleep_for(Millis(5));
  }
  return exit_code_;
}

bool Subprocess::running() { return !Wait(Deadline::Past()).has_value(); }

std::string Subprocess::Output() const {
  std::ifstream in(output_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Subprocess::WaitForOutput(const std::string& text, Deadline deadline) const {
  for (;;) {
    if (Output().find(text) != std::string::npos) return true;
    if (deadline.Expired()) return false;
    std::this_thread::sleep_for(Millis(10));
  }
}

}  // namespace gradsync
