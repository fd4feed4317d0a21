// Threads that run the tasks handed to them, oldest first; with several
// threads, tasks run side by side. The threads start with the first task,
// so a pool that is never used costs none.
//
// Thread-safety: all methods are thread-safe.
#ifndef GRADSYNC_COMMON_TASK_POOL_H_
#define GRADSYNC_COMMON_TASK_POOL_H_

#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/blocking_queue.h"

namespace gradsync {

class TaskPool {
 public:
  // `threads` (at least 1) named `name` (top -H, perf; 15 characters kept).
  TaskPool(int threads, std::string name);
  // Runs every task handed before, then joins the threads.
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Queues `task`; false (and the task not run) once the pool is shutting
  // down.
  bool Run(std::function<void()> task);

  int threads() const { return threads_; }

 private:
  void Loop();

  const int threads_;
  const std::string name_;
  BlockingQueue<std::function<void()>> tasks_;
  std::mutex mu_;
  std::vector<std::thread> running_;  // guarded by mu_
  bool stopping_ = false;             // guarded by mu_
};

// The cores the calling thread may run on: its CPU affinity (what a Slurm
// task's or a container's cpuset allows), else the machine's count; at
// least 1. A CPU quota without a cpuset is not seen.
int UsableCores();

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_TASK_POOL_H_
