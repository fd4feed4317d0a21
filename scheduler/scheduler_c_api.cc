#include "scheduler/scheduler_c_api.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/c_api_guard.h"
#include "common/config.h"
#include "common/status.h"
#include "common/time.h"
#include "scheduler/embedded_scheduler.h"

extern char** environ;

struct gs_scheduler {
  std::unique_ptr<gradsync::server::EmbeddedScheduler> scheduler;
};

namespace {

using gradsync::Config;
using gradsync::InvalidArgumentError;
using gradsync::Status;

}  // namespace

extern "C" {

int gs_scheduler_start(const char* const* args, int num_args, gs_scheduler** out, int* out_port) {
  return gradsync::CApiGuard("gs_scheduler_start", [&]() -> Status {
    if (out == nullptr || out_port == nullptr) {
      return InvalidArgumentError("out or out_port is NULL");
    }
    if (num_args < 0 || (num_args > 0 && args == nullptr)) {
      return InvalidArgumentError("args is NULL or num_args negative");
    }
    std::vector<const char*> argv = {"gradsync_scheduler"};
    argv.insert(argv.end(), args, args + num_args);
    GS_ASSIGN_OR_RETURN(Config config,
                        Config::FromArgs(static_cast<int>(argv.size()), argv.data(), environ));
    GS_ASSIGN_OR_RETURN(auto scheduler, gradsync::server::EmbeddedScheduler::Start(config));
    GS_RETURN_IF_ERROR(config.CheckKnownFlags("scheduler setting"));
    *out_port = scheduler->port();
    *out = new gs_scheduler{std::move(scheduler)};
    return gradsync::OkStatus();
  });
}

int gs_scheduler_stop(gs_scheduler* s, int64_t timeout_ms) {
  return gradsync::CApiGuard("gs_scheduler_stop", [&]() -> Status {
    if (s == nullptr) return gradsync::OkStatus();
    std::unique_ptr<gs_scheduler> owned(s);
    const gradsync::Deadline deadline =
        timeout_ms < 0 ? gradsync::Deadline::Infinite() : gradsync::Deadline::AfterMs(timeout_ms);
    return owned->scheduler->Stop(deadline);
  });
}

}  // extern "C"
