#include "common/signals.h"

#include <pthread.h>
#include <signal.h>

#include <ctime>

namespace gradsync {
namespace {

sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

SignalWatcher::SignalWatcher(std::function<void(int)> on_signal) {
  sigset_t set = StopSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  thread_ = std::thread([this, set, on_signal = std::move(on_signal)] {
    const timespec poll{0, 100 * 1000 * 1000};
    while (!stop_.load()) {
      int sig = sigtimedwait(&set, nullptr, &poll);
      if (sig > 0) on_signal(sig);
    }
  });
}

SignalWatcher::~SignalWatcher() {
  stop_.store(true);
  thread_.join();
}

}  // namespace gradsync
