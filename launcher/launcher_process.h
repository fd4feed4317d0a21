// A process the Launcher started (launcher/launcher.h); internal to it.
#ifndef GRADSYNC_LAUNCHER_LAUNCHER_PROCESS_H_
#define GRADSYNC_LAUNCHER_LAUNCHER_PROCESS_H_

#include <unistd.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/subprocess.h"
#include "launcher/launcher.h"

namespace gradsync::launcher {

struct Launcher::Process {
  Process(std::string n, bool worker, Subprocess s, int f)
      : name(std::move(n)), is_worker(worker), sub(std::move(s)), fd(f) {}
  ~Process() {
    if (fd >= 0) close(fd);
  }

  std::string name;  // "worker 2", "worker 2 (restart 1)"
  bool is_worker;
  Subprocess sub;
  int fd;               // reads the log file
  std::string pending;  // output after the last newline
  std::optional<int> code;
  bool reported = false;                                 // its exit was looked at
  std::vector<std::pair<std::string, std::string>> env;  // what it was started with
};

// "exited with code 3", or "killed by signal 9 (Killed)" for codes above 128.
std::string Describe(int code);

}  // namespace gradsync::launcher

#endif  // GRADSYNC_LAUNCHER_LAUNCHER_PROCESS_H_
