// Exact top-k on the GPU: a radix select finds the k-th largest magnitude
// key T and how many keys are larger (G), then a stable compaction keeps
// every element with key > T and the first k - G (lowest indices) with
// key == T, in index order. This is the rule of TopKCpu and of
// compression/topk_select.h, so the selected set and its order are the same.
//
// Select: the 31-bit keys are cut into digits of 11, 10 and 10 bits (from
// the top). Each pass builds a histogram of the current digit over the keys
// that match the digits chosen so far, and a one-block kernel picks the bin
// holding the rank-th largest key, narrowing the prefix. The chosen prefix,
// the remaining rank and the count of larger keys stay on the device
// (TopKState), so the host never waits.
//
// Compaction: the input is cut into tiles of 4096 elements (256 threads x 16
// consecutive elements). One kernel counts per tile the keys > T and == T,
// one block scans the tile counts, and a third kernel gives every kept
// element its output position: (keys > T before it) + min(keys == T before
// it, k - G).
#include <cstdint>
#include <string>

#include "kernels/compress_kernels.h"
#include "kernels/compress_math.h"
#include "kernels/cuda_util.cuh"

namespace gradsync::kernels {
namespace {

using u64 = unsigned long long;

constexpr int kTileThreads = 256;
constexpr int kPerThread = 16;
constexpr size_t kTile = kTileThreads * kPerThread;
constexpr int kSelectThreads = 1024;
constexpr int kMaxBins = 2048;
constexpr size_t kMaxElements = 0x7FFFFFFF;  // Indices are int32.
constexpr unsigned int kHistogramBlocks = 1024;

struct TopKState {
  uint32_t prefix;   // Digits chosen so far; the key T after the last pass.
  uint32_t rank;     // Rank (1-based) of T among keys matching the prefix.
  uint32_t greater;  // Keys known to be larger than every match.
  uint32_t unused;
};

// Workspace: the state, one histogram per pass, then the per-tile counts
// and their exclusive prefix sums (greater in the low 32 bits, equal in the
// high 32).
constexpr size_t kHistOffset = sizeof(TopKState);
constexpr size_t kCountsOffset = kHistOffset + 3 * kMaxBins * sizeof(uint32_t);

size_t NumTiles(size_t n) { return (n + kTile - 1) / kTile; }

using device::GridStride;
using device::ThreadIndex;

// Exclusive prefix sum of `value` over the block in thread order; *total
// (if given) gets the block's sum. Every thread of the block must call it.
template <typename T>
__device__ T BlockExclusiveSum(T value, T* total = nullptr) {
  __shared__ T warp_sums[32];
  const unsigned int lane = threadIdx.x % 32;
  const unsigned int warp = threadIdx.x / 32;
  const unsigned int warps = blockDim.x / 32;
  T inclusive = value;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const T up = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
    if (lane >= static_cast<unsigned int>(d)) inclusive += up;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    T s = lane < warps ? warp_sums[lane] : T{0};
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const T up = __shfl_up_sync(0xFFFFFFFFu, s, d);
      if (lane >= static_cast<unsigned int>(d)) s += up;
    }
    if (lane < warps) warp_sums[lane] = s;
  }
  __syncthreads();
  const T before = warp == 0 ? T{0} : warp_sums[warp - 1];
  if (total != nullptr) *total = warp_sums[warps - 1];
  __syncthreads();  // warp_sums may be reused by the next call.
  return before + inclusive - value;
}

// Calls f(x) for every element, grid-stride, with 16-byte loads from the
// first 16-byte boundary on.
template <typename F>
__device__ __forceinline__ void ForEachInput(const float* in, size_t n, F f) {
  const size_t misaligned = (reinterpret_cast<uintptr_t>(in) % 16) / 4;
  const size_t head = misaligned == 0 ? 0 : (4 - misaligned < n ? 4 - misaligned : n);
  const size_t n4 = (n - head) / 4;
  const float4* v = reinterpret_cast<const float4*>(in + head);
  for (size_t g = ThreadIndex(); g < n4; g += GridStride()) {
    const float4 a = v[g];
    f(a.x);
    f(a.y);
    f(a.z);
    f(a.w);
  }
  if (ThreadIndex() < head) f(in[ThreadIndex()]);
  const size_t tail = head + 4 * n4;
  if (tail + ThreadIndex() < n) f(in[tail + ThreadIndex()]);
}

// Histogram of digit (key >> kShift) & (2^kBits - 1) over the keys whose
// bits above the digit equal the state's prefix.
template <int kShift, int kBits>
__global__ void HistogramKernel(const float* __restrict__ in, size_t n,
                                const TopKState* __restrict__ state, uint32_t* __restrict__ hist) {
  constexpr int kBins = 1 << kBits;
  constexpr int kMatch = kShift + kBits;
  __shared__ uint32_t counts[kBins];
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) counts[b] = 0;
  __syncthreads();
  const uint32_t want = kMatch >= 31 ? 0u : state->prefix >> kMatch;
  ForEachInput(in, n, [&](float x) {
    const uint32_t key = math::MagnitudeKey(x);
    if ((key >> kMatch) == want) {
      atomicAdd(&counts[(key >> kShift) & (kBins - 1)], 1u);
    }
  });
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
    if (counts[b] != 0) atomicAdd(&hist[b], counts[b]);
  }
}

// One block of kSelectThreads: finds the bin of `hist` that holds the
// rank-th largest matching key (bins scanned from the top) and narrows the
// state to it. The first pass starts from rank k and an empty prefix.
template <int kBins>
__global__ void SelectKernel(TopKState* state, const uint32_t* __restrict__ hist, int shift,
                             bool first, uint32_t k) {
  constexpr int kPer = kBins / kSelectThreads;
  const uint32_t rank = first ? k : state->rank;
  const uint32_t prefix = first ? 0u : state->prefix;
  const uint32_t greater = first ? 0u : state->greater;
  const int top = kBins - 1 - static_cast<int>(threadIdx.x) * kPer;
  uint32_t h[kPer];
  uint32_t local = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    h[j] = hist[top - j];
    local += h[j];
  }
  uint32_t above = BlockExclusiveSum(local);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (above < rank && rank <= above + h[j]) {
      state->prefix = prefix | (static_cast<uint32_t>(top - j) << shift);
      state->greater = greater + above;
      state->rank = rank - above;
    }
    above += h[j];
  }
}

// The 16 consecutive elements of this thread in its tile; false where past n.
__device__ __forceinline__ void LoadRun(const float* in, size_t n, size_t base, float* x,
                                        bool* valid) {
  if (base + kPerThread <= n && reinterpret_cast<uintptr_t>(in) % 16 == 0) {
    const float4* v = reinterpret_cast<const float4*>(in + base);
#pragma unroll
    for (int q = 0; q < kPerThread / 4; ++q) {
      const float4 a = v[q];
      x[4 * q] = a.x;
      x[4 * q + 1] = a.y;
      x[4 * q + 2] = a.z;
      x[4 * q + 3] = a.w;
    }
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) valid[j] = true;
    return;
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    valid[j] = base + j < n;
    x[j] = valid[j] ? in[base + j] : 0.0f;
  }
}

// Keys > T in the low 16 bits, keys == T in the high 16 (at most 16 each).
__device__ __forceinline__ uint32_t CountRun(const float* x, const bool* valid, uint32_t t) {
  uint32_t packed = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const uint32_t key = math::MagnitudeKey(x[j]);
    packed += valid[j] ? (key > t ? 1u : 0u) + (key == t ? 0x10000u : 0u) : 0u;
  }
  return packed;
}

__global__ void CountKernel(const float* __restrict__ in, size_t n,
                            const TopKState* __restrict__ state, u64* __restrict__ tile_counts) {
  float x[kPerThread];
  bool valid[kPerThread];
  LoadRun(in, n, blockIdx.x * kTile + threadIdx.x * kPerThread, x, valid);
  uint32_t total = 0;
  BlockExclusiveSum(CountRun(x, valid, state->prefix), &total);
  if (threadIdx.x == 0) {
    tile_counts[blockIdx.x] = (total & 0xFFFFu) | (u64{total >> 16} << 32);
  }
}

// One block: exclusive prefix sums of the packed tile counts.
__global__ void ScanTilesKernel(const u64* __restrict__ counts, size_t tiles,
                                u64* __restrict__ offsets) {
  u64 carry = 0;
  for (size_t base = 0; base < tiles; base += blockDim.x) {
    const size_t t = base + threadIdx.x;
    u64 total = 0;
    const u64 before = BlockExclusiveSum(t < tiles ? counts[t] : u64{0}, &total);
    if (t < tiles) offsets[t] = carry + before;
    carry += total;
  }
}

template <bool kF16>
__global__ void WriteKernel(const float* __restrict__ in, size_t n, uint32_t k,
                            const TopKState* __restrict__ state, const u64* __restrict__ offsets,
                            int32_t* __restrict__ indices, void* __restrict__ values) {
  const uint32_t t = state->prefix;
  const uint32_t ties = k - state->greater;
  const size_t base = blockIdx.x * kTile + threadIdx.x * kPerThread;
  float x[kPerThread];
  bool valid[kPerThread];
  LoadRun(in, n, base, x, valid);
  const uint32_t before = BlockExclusiveSum(CountRun(x, valid, t));
  const u64 tile = offsets[blockIdx.x];
  uint32_t gt = static_cast<uint32_t>(tile) + (before & 0xFFFFu);
  uint32_t eq = static_cast<uint32_t>(tile >> 32) + (before >> 16);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const uint32_t key = math::MagnitudeKey(x[j]);
    uint32_t pos = ~0u;
    if (valid[j] && key > t) {
      pos = gt + (eq < ties ? eq : ties);
      ++gt;
    } else if (valid[j] && key == t) {
      if (eq < ties) pos = gt + eq;
      ++eq;
    }
    if (pos != ~0u) {
      indices[pos] = static_cast<int32_t>(base + j);
      if (kF16) {
        static_cast<uint16_t*>(values)[pos] = math::FloatToHalfBits(x[j]);
      } else {
        static_cast<float*>(values)[pos] = x[j];
      }
    }
  }
}

template <int kShift, int kBits>
void SelectPass(const float* in, size_t n, size_t k, int pass, void* workspace,
                cudaStream_t stream) {
  auto* state = static_cast<TopKState*>(workspace);
  uint32_t* hist =
      reinterpret_cast<uint32_t*>(static_cast<char*>(workspace) + kHistOffset) + pass * kMaxBins;
  HistogramKernel<kShift, kBits>
      <<<launch::Blocks(n, kTile, kHistogramBlocks), kTileThreads, 0, stream>>>(in, n, state, hist);
  SelectKernel<(1 << kBits)>
      <<<1, kSelectThreads, 0, stream>>>(state, hist, kShift, pass == 0, static_cast<uint32_t>(k));
}

}  // namespace

namespace launch {

Status CheckTopKArgs(const char* fn, size_t n, size_t k, SparseValueFormat format,
                     const int32_t* indices, const void* values, const void* workspace,
                     size_t workspace_bytes) {
  if (n > kMaxElements) {
    return InvalidArgumentError(std::string(fn) + ": " + std::to_string(n) +
                                " elements exceed the int32 index limit");
  }
  if (k > n) {
    return InvalidArgumentError(std::string(fn) + ": k " + std::to_string(k) + " exceeds n " +
                                std::to_string(n));
  }
  if (k == 0) return OkStatus();
  const size_t value_bytes = format == SparseValueFormat::kF16 ? 2 : 4;
  GS_RETURN_IF_ERROR(CheckPointers(
      fn,
      {{"indices", indices, 4}, {"values", values, value_bytes}, {"workspace", workspace, 16}}));
  if (workspace_bytes < TopKWorkspaceBytes(n)) {
    return InvalidArgumentError(std::string(fn) + ": workspace of " +
                                std::to_string(workspace_bytes) + " bytes, " +
                                std::to_string(TopKWorkspaceBytes(n)) + " needed");
  }
  return OkStatus();
}

}  // namespace launch

size_t TopKWorkspaceBytes(size_t n) { return kCountsOffset + 2 * NumTiles(n) * sizeof(u64); }

Status TopKCuda(const float* in, size_t n, size_t k, SparseValueFormat format, int32_t* indices,
                void* values, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  constexpr char kFn[] = "TopKCuda";
  GS_RETURN_IF_ERROR(
      launch::CheckTopKArgs(kFn, n, k, format, indices, values, workspace, workspace_bytes));
  if (k == 0) return OkStatus();
  GS_RETURN_IF_ERROR(launch::CheckPointers(kFn, {{"in", in, 4}}));
  GS_RETURN_IF_ERROR(
      launch::LaunchStatus(kFn, cudaMemsetAsync(workspace, 0, kCountsOffset, stream)));
  SelectPass<20, 11>(in, n, k, 0, workspace, stream);
  SelectPass<10, 10>(in, n, k, 1, workspace, stream);
  SelectPass<0, 10>(in, n, k, 2, workspace, stream);
  const size_t tiles = NumTiles(n);
  const auto* state = static_cast<const TopKState*>(workspace);
  u64* counts = reinterpret_cast<u64*>(static_cast<char*>(workspace) + kCountsOffset);
  u64* offsets = counts + tiles;
  const unsigned int grid = static_cast<unsigned int>(tiles);
  CountKernel<<<grid, kTileThreads, 0, stream>>>(in, n, state, counts);
  ScanTilesKernel<<<1, kSelectThreads, 0, stream>>>(counts, tiles, offsets);
  if (format == SparseValueFormat::kF16) {
    WriteKernel<true><<<grid, kTileThreads, 0, stream>>>(in, n, static_cast<uint32_t>(k), state,
                                                         offsets, indices, values);
  } else {
    WriteKernel<false><<<grid, kTileThreads, 0, stream>>>(in, n, static_cast<uint32_t>(k), state,
                                                          offsets, indices, values);
  }
  return launch::LaunchStatus(kFn);
}

}  // namespace gradsync::kernels
