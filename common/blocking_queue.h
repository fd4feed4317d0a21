// A bounded multi-producer multi-consumer queue with deadlines and Close().
//
// Push blocks while the queue is full; Pop blocks while it is empty. Both
// give up at their deadline (DeadlineExceeded) or when the queue is closed
// (Cancelled; Pop still drains what was queued before Close).
//
// Thread-safety: all methods are thread-safe.
#ifndef GRADSYNC_COMMON_BLOCKING_QUEUE_H_
#define GRADSYNC_COMMON_BLOCKING_QUEUE_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <utility>

#include "common/status.h"
#include "common/time.h"

namespace gradsync {

template <typename T>
class BlockingQueue {
 public:
  explicit BlockingQueue(size_t capacity) : capacity_(capacity) {}

  Status Push(T item, Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!not_full_.wait_until(lock, deadline.at(),
                              [&] { return closed_ || items_.size() < capacity_; })) {
      return DeadlineExceededError("queue full");
    }
    if (closed_) return CancelledError("queue closed");
    items_.push_back(std::move(item));
    not_empty_.notify_one();
    return OkStatus();
  }

  StatusOr<T> Pop(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    // A poll (a deadline already past) does not go near the condition
    // variable: a timed wait costs tens of microseconds of timer slack.
    if (items_.empty() && !closed_ && deadline.Expired()) {
      return DeadlineExceededError("nothing arrived before the deadline");
    }
    if (!not_empty_.wait_until(lock, deadline.at(), [&] { return closed_ || !items_.empty(); })) {
      return DeadlineExceededError("nothing arrived before the deadline");
    }
    if (items_.empty()) return CancelledError("queue closed");
    T item = std::move(items_.front());
    items_.pop_front();
    not_full_.notify_one();
    return item;
  }

  // Items queued now; may change at once.
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return items_.size();
  }
  bool full() const {
    std::lock_guard<std::mutex> lock(mu_);
    return items_.size() >= capacity_;
  }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_empty_.notify_all();
    not_full_.notify_all();
  }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable not_empty_;
  std::condition_variable not_full_;
  std::deque<T> items_;  // guarded by mu_
  bool closed_ = false;  // guarded by mu_
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_BLOCKING_QUEUE_H_
