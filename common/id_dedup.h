#ifndef GRADSYNC_COMMON_ID_DEDUP_H_
#define GRADSYNC_COMMON_ID_DEDUP_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/seeded_random.h"

namespace gradsync {

// IdDedup: the distinct 64-bit ids of a batch, each with the value it was
// first inserted with (its index among them, as the embedding tables and
// their client use it). Open addressing with linear probing over a
// power-of-two table; an entry is live when its stamp equals the current
// generation, so starting a new batch costs nothing and the table is only
// reallocated when a batch has more ids than it fits. Thread-safety: none.
class IdDedup {
 public:
  // Forgets every id and makes room for `n` of them.
  void Reset(size_t n) {
    if (n * 2 > keys_.size()) {
      size_t capacity = 16;
      while (capacity < n * 2) capacity *= 2;
      keys_.assign(capacity, 0);
      values_.assign(capacity, 0);
      stamps_.assign(capacity, 0);
      generation_ = 0;
    }
    if (++generation_ == 0) {
      std::fill(stamps_.begin(), stamps_.end(), 0);
      generation_ = 1;
    }
  }

  // The value of `id`, after inserting it with `value` if it was absent
  // (*inserted says which).
  uint32_t FindOrInsert(uint64_t id, uint32_t value, bool* inserted) {
    const size_t mask = keys_.size() - 1;
    for (size_t i = SplitMix64(id) & mask;; i = (i + 1) & mask) {
      if (stamps_[i] != generation_) {
        stamps_[i] = generation_;
        keys_[i] = id;
        values_[i] = value;
        *inserted = true;
        return value;
      }
      if (keys_[i] == id) {
        *inserted = false;
        return values_[i];
      }
    }
  }

 private:
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> values_;
  std::vector<uint32_t> stamps_;
  uint32_t generation_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_ID_DEDUP_H_
