// BufferPool: buffers for received payloads, kept for reuse up to a bound
// in bytes, so that a steady stream of messages reuses the same memory
// instead of mapping and faulting in fresh pages for each large payload.
// Thread-safe; a buffer may outlive its pool (it is then freed).
#ifndef GRADSYNC_WIRE_BUFFER_POOL_H_
#define GRADSYNC_WIRE_BUFFER_POOL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace gradsync::wire {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(size_t max_bytes) : max_bytes_(max_bytes) {}

  // A buffer of at least `n` bytes (not zeroed); it returns to the pool
  // when the last reference goes.
  std::shared_ptr<uint8_t> Get(size_t n) {
    uint8_t* buffer = nullptr;
    size_t capacity = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The smallest that fits and wastes at most half.
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->first >= n && it->first <= 2 * n + 4096 &&
            (best == free_.end() || it->first < best->first)) {
          best = it;
        }
      }
      if (best != free_.end()) {
        capacity = best->first;
        buffer = best->second.release();
        pooled_ -= capacity;
        free_.erase(best);
      }
    }
    if (buffer == nullptr) {
      capacity = std::max<size_t>(n, 1);
      buffer = new uint8_t[capacity];
    }
    std::weak_ptr<BufferPool> pool = weak_from_this();
    return std::shared_ptr<uint8_t>(buffer, [pool, capacity](uint8_t* b) {
      if (auto p = pool.lock()) {
        p->Put(b, capacity);
      } else {
        delete[] b;
      }
    });
  }

 private:
  void Put(uint8_t* b, size_t capacity) {
    std::unique_ptr<uint8_t[]> owned(b);
    std::lock_guard<std::mutex> lock(mu_);
    if (pooled_ + capacity > max_bytes_) return;  // freed
    pooled_ += capacity;
    free_.emplace_back(capacity, std::move(owned));
  }

  const size_t max_bytes_;
  std::mutex mu_;
  std::vector<std::pair<size_t, std::unique_ptr<uint8_t[]>>> free_;  // guarded by mu_
  size_t pooled_ = 0;                                                // guarded by mu_
};

}  // namespace gradsync::wire

#endif  // GRADSYNC_WIRE_BUFFER_POOL_H_
