// SIGINT/SIGTERM delivered to a callback on a thread of its own, so that no
// signal handler touches program state.
//
// Construct it in main() before any other thread starts: it blocks the two
// signals in the calling thread, which every later thread inherits.
#ifndef GRADSYNC_COMMON_SIGNALS_H_
#define GRADSYNC_COMMON_SIGNALS_H_

#include <atomic>
#include <functional>
#include <thread>

namespace gradsync {

class SignalWatcher {
 public:
  // `on_signal` runs on the watcher's thread with the signal number.
  explicit SignalWatcher(std::function<void(int)> on_signal);
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_SIGNALS_H_
