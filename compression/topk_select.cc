#include "compression/topk_select.h"

#include <immintrin.h>

#include <algorithm>
#include <functional>

namespace gradsync {
namespace compression {
namespace {

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// The k-th largest of keys[0, m) (1 <= k <= m); reorders keys.
KthKey FindKth(uint32_t* keys, size_t m, size_t k) {
  std::nth_element(keys, keys + (k - 1), keys + m, std::greater<uint32_t>());
  const uint32_t kth = keys[k - 1];
  // nth_element puts every key larger than the k-th before it.
  const size_t greater = static_cast<size_t>(std::count_if(
      keys, keys + (k - 1), [kth](uint32_t v) { return v > kth; }));
  return {kth, greater};
}

// Keeps the first entries of idx whose keys are above `kth`, plus the first
// `ties` whose keys equal it; returns how many were kept.
size_t KeepAbove(uint32_t* idx, const uint32_t* keys, size_t m, uint32_t kth,
                 size_t ties) {
  size_t out = 0;
  for (size_t j = 0; j < m; ++j) {
    const bool tie = keys[j] == kth && ties > 0;
    if (keys[j] > kth || tie) {
      ties -= tie;
      idx[out++] = idx[j];
    }
  }
  return out;
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
__attribute__((target("avx2,popcnt"))) size_t CollectAtLeastAvx2(
    const float* in, size_t n, uint32_t threshold, uint32_t* idx,
    uint32_t* keys, size_t cap, size_t* done) {
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
    const __m256i key = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)), abs_mask);
    const __m256i hit = _mm256_or_si256(_mm256_cmpgt_epi32(key, below), all);
    const int mask = _mm256_movemask_ps(_mm256_castsi256_ps(hit));
    const __m256i perm = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(kLeftPack.lanes[mask]));
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

KthKey KthLargestKey(const uint32_t* keys, size_t m, size_t rank,
                     std::vector<uint32_t>* scratch) {
  constexpr size_t kPrefix = 4096;
  if (m >= 4 * kPrefix && rank * 16 <= m) {
    // A threshold expected to pass ~2 * rank keys, from the prefix.
    scratch->assign(keys, keys + kPrefix);
    const size_t prefix_rank = 2 * rank * kPrefix / m + 8;
    const uint32_t low = FindKth(scratch->data(), kPrefix, prefix_rank).key;
    scratch->resize(m);
    uint32_t* passed = scratch->data();
    size_t count = 0;
    for (size_t j = 0; j < m; ++j) {  // Branch-free compaction.
      passed[count] = keys[j];
      count += keys[j] >= low;
    }
    if (count >= rank) return FindKth(passed, count, rank);
  }
  scratch->assign(keys, keys + m);
  return FindKth(scratch->data(), m, rank);
}

void ExactTopK(const float* in, size_t n, size_t k,
               std::vector<uint32_t>* scratch, uint32_t* idx) {
  if (k == 0) return;
  if (k == n) {
    for (size_t i = 0; i < n; ++i) idx[i] = static_cast<uint32_t>(i);
    return;
  }
  scratch->resize(n);
  uint32_t* keys = scratch->data();
  for (size_t i = 0; i < n; ++i) keys[i] = MagnitudeKey(in[i]);
  const KthKey kth = FindKth(keys, n, k);
  size_t ties = k - kth.greater;  // The lowest-index ties are kept.
  size_t out = 0;
  for (size_t i = 0; i < n && out < k; ++i) {
    const uint32_t key = MagnitudeKey(in[i]);
    const bool tie = key == kth.key && ties > 0;
    if (key > kth.key || tie) {
      ties -= tie;
      idx[out++] = static_cast<uint32_t>(i);
    }
  }
}

size_t CollectAtLeastScalar(const float* in, size_t n, uint32_t threshold,
                            uint32_t* idx, uint32_t* keys, size_t cap) {
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

size_t CollectAtLeast(const float* in, size_t n, uint32_t threshold,
                      uint32_t* idx, uint32_t* keys, size_t cap) {
  if (!HasAvx2() || threshold > 0x80000000u) {
    return CollectAtLeastScalar(in, n, threshold, idx, keys, cap);
  }
  size_t done = 0;
  const size_t count =
      CollectAtLeastAvx2(in, n, threshold, idx, keys, cap, &done);
  if (count > cap) return cap + 1;
  const size_t rest = CollectAtLeastScalar(
      in + done, n - done, threshold, idx + count, keys + count, cap - count);
  for (size_t j = 0; j < std::min(rest, cap - count); ++j) {
    idx[count + j] += static_cast<uint32_t>(done);
  }
  return count + rest;
}

void TruncateToTopK(uint32_t* idx, uint32_t* keys, size_t m, size_t k,
                    std::vector<uint32_t>* scratch) {
  if (k == m || k == 0) return;
  scratch->assign(keys, keys + m);
  const KthKey kth = FindKth(scratch->data(), m, k);
  KeepAbove(idx, keys, m, kth.key, k - kth.greater);
}

}  // namespace compression
}  // namespace gradsync
