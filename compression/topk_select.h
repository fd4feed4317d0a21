// Selection kernels behind the top-k compressors.
//
// Elements are ranked by their magnitude key: the float's bits without the
// sign bit. For every non-NaN float the key orders like |x|; NaNs rank above
// infinity. Ties are broken by the lower index, which makes "the k largest"
// a unique, deterministic set. Every function returns indices in ascending
// order.
//
// Internal to compression/. Thread-safety: pure functions of their
// arguments; scratch vectors belong to the caller.
#ifndef GRADSYNC_COMPRESSION_TOPK_SELECT_H_
#define GRADSYNC_COMPRESSION_TOPK_SELECT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace gradsync::compression {

// The magnitude key of x.
inline uint32_t MagnitudeKey(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7FFFFFFFu;
}

struct KthKey {
  uint32_t key;    // The rank-th largest key.
  size_t greater;  // How many keys are strictly larger.
};

// The rank-th largest (1-based, 1 <= rank <= m) of keys[0, m), by radix
// selection (two passes over the keys, then passes over those that share
// the answer's top 11 bits). `scratch` is overwritten.
KthKey KthLargestKey(const uint32_t* keys, size_t m, size_t rank, std::vector<uint32_t>* scratch);

// Writes to idx[0, k) the indices of the k largest of in[0, n), ascending:
// the k-th largest key by radix selection, then one pass over in. k <= n.
// `scratch` is overwritten.
void ExactTopK(const float* in, size_t n, size_t k, std::vector<uint32_t>* scratch, uint32_t* idx);

// Writes to idx (and their keys to keys), in ascending index order, the
// i < n with MagnitudeKey(in[i]) >= threshold, and returns how many there
// are, or cap + 1 if there are more than cap. idx and keys hold at least
// cap + 8 entries (the vector path stores whole groups of 8); entries past
// the returned count are unspecified. n < 2^32.
size_t CollectAtLeast(const float* in, size_t n, uint32_t threshold, uint32_t* idx, uint32_t* keys,
                      size_t cap);
size_t CollectAtLeastScalar(const float* in, size_t n, uint32_t threshold, uint32_t* idx,
                            uint32_t* keys, size_t cap);

// idx[0, m) are ascending indices and keys[0, m) their keys, m >= k. Keeps
// in idx[0, k) the k of them with the largest keys (ties: lower index),
// ascending. keys is left unspecified; `scratch` is overwritten.
void TruncateToTopK(uint32_t* idx, uint32_t* keys, size_t m, size_t k,
                    std::vector<uint32_t>* scratch);

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_TOPK_SELECT_H_
