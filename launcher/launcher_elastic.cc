// The Launcher's side of elastic jobs: going on without a failed worker,
// or starting it again to rejoin the running job.
#include <signal.h>

#include <string>

#include "launcher/launcher.h"
#include "launcher/launcher_process.h"

namespace gradsync::launcher {

bool Launcher::Spare(const Process& p) {
  const int code = *p.code;
  if (!p.is_worker || code == 128 + SIGINT || code == 128 + SIGTERM || !options_.Elastic()) {
    return false;
  }
  if (Restart(p)) return true;
  if (options_.workers - lost_workers_ - 1 < options_.MinWorkers()) return false;
  ++lost_workers_;
  Say(p.name + " " + Describe(code) + ": the elastic job goes on with " +
      std::to_string(options_.workers - lost_workers_) + " workers");
  return true;
}

bool Launcher::Restart(const Process& p) {
  if (restarted_ >= options_.restarts) return false;
  ++restarted_;
  const std::string base = p.name.substr(0, p.name.find(" ("));
  const std::string name = base + " (restart " + std::to_string(restarted_) + ")";
  Say(p.name + " " + Describe(*p.code) + ": starting it again as " + name + " (restart " +
      std::to_string(restarted_) + " of " + std::to_string(options_.restarts) +
      "); it rejoins the running job");
  const std::vector<std::pair<std::string, std::string>> env = p.env;
  const Status s = Start(name, true, options_.worker_command, env);
  if (s.ok()) return true;
  Say("cannot restart " + base + ": " + s.message());
  return false;
}

std::string Launcher::WorkersSummary() const {
  int succeeded = 0;
  for (const auto& p : processes_) succeeded += p->is_worker && p->code && *p->code == 0;
  if (lost_workers_ == 0 && restarted_ == 0) {
    return "all " + std::to_string(succeeded) + " workers exited with code 0";
  }
  std::string s = std::to_string(succeeded) + " of " + std::to_string(options_.workers) +
                  " workers exited with code 0 (";
  if (restarted_ > 0) s += std::to_string(restarted_) + " restarted";
  if (restarted_ > 0 && lost_workers_ > 0) s += ", ";
  if (lost_workers_ > 0) s += std::to_string(lost_workers_) + " lost";
  return s + ")";
}

}  // namespace gradsync::launcher
