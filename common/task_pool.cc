#include "common/task_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <limits>

namespace gradsync {

TaskPool::TaskPool(int threads, std::string name)
    : threads_(std::max(threads, 1)),
      name_(name.substr(0, 15)),
      tasks_(std::numeric_limits<size_t>::max()) {}

TaskPool::~TaskPool() {
  std::vector<std::thread> running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    running.swap(running_);
  }
  tasks_.Close();  // the threads drain what is queued, then stop
  for (std::thread& t : running) t.join();
}

bool TaskPool::Run(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return false;
  if (running_.empty()) {
    for (int i = 0; i < threads_; ++i) running_.emplace_back([this] { Loop(); });
  }
  return tasks_.Push(std::move(task), Deadline::Infinite()).ok();
}

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

void TaskPool::Loop() {
  pthread_setname_np(pthread_self(), name_.c_str());
  for (;;) {
    StatusOr<std::function<void()>> task = tasks_.Pop(Deadline::Infinite());
    if (!task.ok()) return;  // closed and drained
    (*task)();
  }
}

}  // namespace gradsync
