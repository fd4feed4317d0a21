// Child processes with their output in a file: used by the launcher and the
// multi-process tests.
//
// Thread-safety: a Subprocess is used from one thread at a time.
#ifndef GRADSYNC_COMMON_SUBPROCESS_H_
#define GRADSYNC_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"

namespace gradsync {

class Subprocess {
 public:
  // Starts argv[0] (a path) with `argv`, the parent's environment plus
  // `env`, stdout and stderr appended to `output_path` (created 0600 if
  // missing; a symbolic link there is refused: the child fails to start).
  static StatusOr<Subprocess> Spawn(const std::vector<std::string>& argv,
                                    const std::map<std::string, std::string>& env,
                                    const std::string& output_path);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();  // SIGKILLs and reaps a child still running

  pid_t pid() const { return pid_; }
  const std::string& output_path() const { return output_path_; }
  void Signal(int sig) const;
  // The exit code (128 + signal if killed) once it ended; nullopt at the
  // deadline.
  std::optional<int> Wait(Deadline deadline);
  bool running();
  // Everything the child wrote so far.
  std::string Output() const;
  // Waits until the output contains `text`; false at the deadline.
  bool WaitForOutput(const std::string& text, Deadline deadline) const;

 private:
  Subprocess(pid_t pid, std::string output_path)
      : pid_(pid), output_path_(std::move(output_path)) {}
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::string output_path_;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_SUBPROCESS_H_
