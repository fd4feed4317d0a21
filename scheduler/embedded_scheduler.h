// EmbeddedScheduler: the job's scheduler (scheduler/scheduler.h, the same code
// as `gradsync_server --role=scheduler`) on a thread of the calling process,
// for trainers that host their own job (torchrun: rank 0 holds it).
//
//   auto s = EmbeddedScheduler::Start(config);   // port, num_workers, ...
//   ... workers join at host:(*s)->port() ...
//   Status job = (*s)->Stop(Deadline::AfterMs(5000));
//
// Settings are those of SchedulerOptions::FromConfig (port, num_workers,
// num_servers, heartbeat_ms, missed_heartbeats, rendezvous_timeout_ms,
// server_grace_ms). It serves no /metrics.
//
// Thread-safety: port() from any thread; Stop from one thread.
// Ownership: owns its thread and transport; destruction stops it at once.
#ifndef GRADSYNC_SCHEDULER_EMBEDDED_SCHEDULER_H_
#define GRADSYNC_SCHEDULER_EMBEDDED_SCHEDULER_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "common/config.h"
#include "common/status.h"
#include "common/time.h"
#include "scheduler/scheduler.h"

namespace gradsync::server {

class EmbeddedScheduler {
 public:
  // Binds the scheduler's port and starts serving on a new thread; returns
  // once it listens. InvalidArgument for bad settings, Unavailable when the
  // port cannot be bound.
  static StatusOr<std::unique_ptr<EmbeddedScheduler>> Start(const Config& config);
  ~EmbeddedScheduler();

  // The port the scheduler listens on (the real one when `port` was 0).
  int port() const { return port_; }

  // Gives the job until `deadline` to end by itself (every node left), then
  // stops the scheduler (the nodes still in are told the job is shut down)
  // and joins its thread. Returns the scheduler's result: OK, or why the
  // job failed. Idempotent.
  Status Stop(Deadline deadline);

 private:
  EmbeddedScheduler() = default;
  void Serve();

  RealClock clock_;
  std::unique_ptr<Scheduler> scheduler_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable ended_;
  bool done_ = false;  // guarded by mu_
  Status result_;      // guarded by mu_
};

}  // namespace gradsync::server

#endif  // GRADSYNC_SCHEDULER_EMBEDDED_SCHEDULER_H_
