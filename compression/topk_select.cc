#include "compression/topk_select.h"

#include <immintrin.h>

#include <algorithm>

namespace gradsync::compression {
namespace {

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// Counts of one digit (up to 11 bits) of a set of keys.
class DigitHistogram {
 public:
  DigitHistogram(int shift, uint32_t mask) : shift_(shift), mask_(mask) {}

  // Counts the digit of key(j) for j < n (n < 2^32). Four tables, summed
  // after: neighbouring keys often share a digit, and one counter bumped
  // back to back stalls on its own store.
  template <typename KeyAt>
  void Count(KeyAt key, size_t n) {
    for (auto& c : tables_) std::fill(c, c + mask_ + 1, 0u);
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
      ++tables_[0][Digit(key(j))];
      ++tables_[1][Digit(key(j + 1))];
      ++tables_[2][Digit(key(j + 2))];
      ++tables_[3][Digit(key(j + 3))];
    }
    for (; j < n; ++j) ++tables_[0][Digit(key(j))];
    for (uint32_t d = 0; d <= mask_; ++d) {
      count_[d] = tables_[0][d] + tables_[1][d] + tables_[2][d] + tables_[3][d];
    }
  }
  uint32_t Digit(uint32_t key) const { return (key >> shift_) & mask_; }
  // The digit of the k-th largest key counted (1 <= k <= the count): the
  // keys of larger digits are taken off *k and added to *greater.
  uint32_t Find(size_t* k, size_t* greater) const {
    uint32_t d = mask_;
    for (; count_[d] < *k; --d) {
      *k -= count_[d];
      *greater += count_[d];
    }
    return d;
  }
  uint32_t operator[](uint32_t d) const { return count_[d]; }

 private:
  const int shift_;
  const uint32_t mask_;
  uint32_t tables_[4][0x800];
  uint32_t count_[0x800];
};

// The digits of a 32-bit key, most significant first.
constexpr int kDigitShift[] = {21, 10, 0};
constexpr uint32_t kDigitMask[] = {0x7FF, 0x7FF, 0x3FF};

// The k-th largest of keys[0, m) (1 <= k <= m, m < 2^32) by radix
// selection from the most significant digit: a histogram of the top 11
// bits of every key finds the digit the k-th key has there; only the keys
// with that digit (on gradients a small share) are gathered, into
// work(size), room for `size` keys asked for once, and the next 11 and the
// last 10 bits are found among them. Exact and linear in m whatever the
// order of the keys or their ties.
template <typename Work>
KthKey RadixKth(const uint32_t* keys, size_t m, size_t k, Work work) {
  uint32_t kth = 0;            // the digits of the k-th key found so far
  size_t greater = 0;          // keys known to be larger than it
  const uint32_t* set = keys;  // the keys still in the running
  size_t n = m;
  uint32_t* room = nullptr;
  for (int i = 0; i < 3; ++i) {
    DigitHistogram h(kDigitShift[i], kDigitMask[i]);
    h.Count([set](size_t j) { return set[j]; }, n);
    const uint32_t digit = h.Find(&k, &greater);
    kth |= digit << kDigitShift[i];
    if (i == 2 || h[digit] == n) continue;  // nothing to leave out
    // Branch-free compaction (it stores one past the last key kept); in
    // place once the set is in the work space.
    if (room == nullptr) room = work(size_t{h[digit]} + 1);
    size_t kept = 0;
    for (size_t j = 0; j < n; ++j) {
      const uint32_t v = set[j];
      room[kept] = v;
      kept += h.Digit(v) == digit;
    }
    set = room;
    n = kept;
  }
  return {kth, greater};
}

// RadixKth's work space in a caller's vector, grown when too small.
auto InVector(std::vector<uint32_t>* v) {
  return [v](size_t size) {
    if (v->size() < size) v->resize(size);
    return v->data();
  };
}

// Keeps in idx[0, k) the k of idx[0, m) with the largest keys[0, m) (ties:
// the first), in their order; `work` as RadixKth's.
template <typename Work>
void KeepLargest(uint32_t* idx, const uint32_t* keys, size_t m, size_t k, Work work) {
  if (k == m || k == 0) return;
  const KthKey kth = RadixKth(keys, m, k, work);
  size_t ties = k - kth.greater;  // the first ones are kept
  size_t out = 0;
  for (size_t j = 0; j < m; ++j) {
    const bool tie = keys[j] == kth.key && ties > 0;
    if (keys[j] > kth.key || tie) {
      ties -= tie;
      idx[out++] = idx[j];
    }
  }
}

// kLeftPack.lanes[mask] lists the set bit positions of an 8-bit mask
// first: a permutation for _mm256_permutevar8x32_epi32.
struct LeftPackTable {
  uint32_t lanes[256][8];
};

constexpr LeftPackTable MakeLeftPackTable() {
  LeftPackTable t{};
  for (int mask = 0; mask < 256; ++mask) {
    int out = 0;
    for (int bit = 0; bit < 8; ++bit) {
      if (mask & (1 << bit)) t.lanes[mask][out++] = static_cast<uint32_t>(bit);
    }
  }
  return t;
}

constexpr LeftPackTable kLeftPack = MakeLeftPackTable();

// Branch-free: each group of 8 stores 8 lanes at idx + count and keys +
// count, of which the first popcount(mask) are kept. Stops once count
// passes cap; returns count and sets *done to the elements scanned.
__attribute__((target("avx2,popcnt"))) size_t CollectAtLeastAvx2(const float* in, size_t n,
                                                                 uint32_t threshold, uint32_t* idx,
                                                                 uint32_t* keys, size_t cap,
                                                                 size_t* done) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  // Keys are < 2^31: compare signed against threshold - 1 (threshold in
  // [1, 2^31]); threshold 0 matches everything.
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(threshold - 1));
  const __m256i all = _mm256_set1_epi32(threshold == 0 ? -1 : 0);
  __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i eight = _mm256_set1_epi32(8);
  size_t count = 0;
  size_t i = 0;
  for (; i + 8 <= n && count <= cap; i += 8) {
    const __m256i key =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)), abs_mask);
    const __m256i hit = _mm256_or_si256(_mm256_cmpgt_epi32(key, below), all);
    const int mask = _mm256_movemask_ps(_mm256_castsi256_ps(hit));
    const __m256i perm =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLeftPack.lanes[mask]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + count),
                        _mm256_permutevar8x32_epi32(lane, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(keys + count),
                        _mm256_permutevar8x32_epi32(key, perm));
    count += static_cast<size_t>(__builtin_popcount(mask));
    lane = _mm256_add_epi32(lane, eight);
  }
  *done = i;
  return count;
}

}  // namespace

KthKey KthLargestKey(const uint32_t* keys, size_t m, size_t rank, std::vector<uint32_t>* scratch) {
  return RadixKth(keys, m, rank, InVector(scratch));
}

void ExactTopK(const float* in, size_t n, size_t k, std::vector<uint32_t>* scratch, uint32_t* idx) {
  if (k == 0) return;
  if (k == n) {
    for (size_t i = 0; i < n; ++i) idx[i] = static_cast<uint32_t>(i);
    return;
  }
  // The top digit of the k-th largest key: every key from that digit up
  // is a candidate (k of them or a few more on gradients), gathered in
  // one vectorised pass and then cut to the k largest.
  DigitHistogram top(kDigitShift[0], kDigitMask[0]);
  top.Count([in](size_t j) { return MagnitudeKey(in[j]); }, n);
  size_t rank = k, greater = 0;
  const uint32_t digit = top.Find(&rank, &greater);
  const size_t m = greater + top[digit];
  scratch->resize(3 * (m + 8));
  uint32_t* candidates = scratch->data();
  uint32_t* keys = candidates + m + 8;  // CollectAtLeast stores groups of 8
  CollectAtLeast(in, n, digit << kDigitShift[0], candidates, keys, m);
  uint32_t* work = keys + m + 8;  // room for m + 8
  KeepLargest(candidates, keys, m, k, [work](size_t) { return work; });
  std::copy(candidates, candidates + k, idx);
}

size_t CollectAtLeastScalar(const float* in, size_t n, uint32_t threshold, uint32_t* idx,
                            uint32_t* keys, size_t cap) {
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t key = MagnitudeKey(in[i]);
    if (key >= threshold) {
      if (count == cap) return cap + 1;
      idx[count] = static_cast<uint32_t>(i);
      keys[count++] = key;
    }
  }
  return count;
}

size_t CollectAtLeast(const float* in, size_t n, uint32_t threshold, uint32_t* idx, uint32_t* keys,
                      size_t cap) {
  if (!HasAvx2() || threshold > 0x80000000u) {
    return CollectAtLeastScalar(in, n, threshold, idx, keys, cap);
  }
  size_t done = 0;
  const size_t count = CollectAtLeastAvx2(in, n, threshold, idx, keys, cap, &done);
  if (count > cap) return cap + 1;
  const size_t rest =
      CollectAtLeastScalar(in + done, n - done, threshold, idx + count, keys + count, cap - count);
  for (size_t j = 0; j < std::min(rest, cap - count); ++j) {
    idx[count + j] += static_cast<uint32_t>(done);
  }
  return count + rest;
}

void TruncateToTopK(uint32_t* idx, uint32_t* keys, size_t m, size_t k,
                    std::vector<uint32_t>* scratch) {
  KeepLargest(idx, keys, m, k, InVector(scratch));
}

}  // namespace gradsync::compression
