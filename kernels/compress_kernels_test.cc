// Every compression kernel against its CPU reference (compress_cpu.h), bit
// for bit (computed NaNs only as NaN), on many sizes, alignments and value
// mixes. Needs a GPU: tagged "gpu" and built only with --config=cuda.
#include "kernels/compress_kernels.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "kernels/compress_cpu.h"
#include "kernels/compress_math.h"
#include "kernels/compress_test_util.h"
#include "kernels/gpu_test_util.h"

namespace gradsync::kernels {
namespace {

using testing_util::DescribeDifference;
using testing_util::FirstDifference;
using testing_util::TestValues;

#define ASSERT_CUDA_OK(expr)                                                   \
  do {                                                                         \
    const cudaError_t err_ = (expr);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

#define ASSERT_OK(expr)                          \
  do {                                           \
    const Status s_ = (expr);                    \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_; \
  } while (0)

// Sizes around warps, bytes, chunks and tiles, and one past 2^20.
const size_t kSizes[] = {0,   1,   7,    8,    9,    31,   32,   33,    511,
                         512, 513, 1023, 1024, 4095, 4097, 8193, 65537, (size_t{1} << 20) + 7};

// n elements of T in device memory, `offset` elements past a cudaMalloc'd
// (256-byte aligned) address, poisoned with 0xA5 bytes so that unwritten
// outputs show.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n, size_t offset = 0) : n_(n) {
    const size_t bytes = (n + offset) * sizeof(T) + 64;
    Expect(cudaMalloc(&base_, bytes));
    Expect(cudaMemset(base_, 0xA5, bytes));
    ptr_ = static_cast<T*>(base_) + offset;
  }
  explicit DeviceArray(const std::vector<T>& host, size_t offset = 0)
      : DeviceArray(host.size(), offset) {
    Upload(host);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(base_); }

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& host) {
    if (n_ > 0) {
      Expect(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    }
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      Expect(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return host;
  }

 private:
  static void Expect(cudaError_t err) {
    if (err != cudaSuccess) ADD_FAILURE() << cudaGetErrorString(err);
  }

  size_t n_;
  void* base_ = nullptr;
  T* ptr_ = nullptr;
};

template <typename T>
void ExpectSame(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      FAIL() << what << ": first difference at " << i << " of " << got.size() << ": got " << +got[i]
             << ", want " << +want[i];
    }
  }
}

// Bitwise, except that any two NaNs are equal.
void ExpectSameFloats(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_LT(FirstDifference(got.data(), want.data(), got.size()), 0)
      << what << ": " << DescribeDifference(got.data(), want.data(), got.size());
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Random, special, tie-heavy and constant inputs.
std::vector<std::vector<float>> Inputs(size_t n, uint64_t seed) {
  std::vector<float> ties(n);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const float levels[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -2.0f};
  for (float& x : ties) x = levels[rng() % 6];
  return {TestValues(n, seed), TestValues(n, seed + 1, true), ties, std::vector<float>(n, -0.5f)};
}

class CompressKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kernels::HaveCudaDevice());
    ASSERT_CUDA_OK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      EXPECT_EQ(cudaGetLastError(), cudaSuccess);
      cudaStreamDestroy(stream_);
    }
  }
  void Sync() {
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess)
        << cudaGetErrorString(cudaGetLastError());
  }

  cudaStream_t stream_ = nullptr;
};

// ---- fp16 / bf16 ----

// Every upper 16-bit pattern with low halves on and around the rounding
// points of both formats, plus +-0, subnormals, 65504, 65520, inf and NaNs.
std::vector<float> CastInputs() {
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF,
                           0x2000, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  std::vector<float> v;
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : lows) v.push_back(FromBits(hi << 16 | lo));
  }
  const float specials[] = {0.0f,
                            -0.0f,
                            1e-45f,
                            5.96e-8f,
                            2.98e-8f,
                            65504.0f,
                            65519.0f,
                            65520.0f,
                            -65520.0f,
                            std::numeric_limits<float>::infinity(),
                            FromBits(0x7F800001),
                            FromBits(0xFFC01234)};
  v.insert(v.end(), std::begin(specials), std::end(specials));
  const std::vector<float> random = TestValues(100003, 5, true);
  v.insert(v.end(), random.begin(), random.end());
  return v;
}

TEST_F(CompressKernelsTest, NarrowingIsBitExactWithCommonHalf) {
  const std::vector<float> in = CastInputs();
  std::vector<uint16_t> want_half(in.size()), want_bf16(in.size());
  FloatToHalfCpu(in.data(), want_half.data(), in.size());
  FloatToBf16Cpu(in.data(), want_bf16.data(), in.size());
  // Aligned (vector path), head to align, and no common alignment (scalar).
  const size_t offsets[][2] = {{0, 0}, {1, 2}, {3, 3}, {1, 0}, {0, 1}};
  for (const auto& off : offsets) {
    SCOPED_TRACE("in+" + std::to_string(off[0]) + " out+" + std::to_string(off[1]));
    DeviceArray<float> d_in(in, off[0]);
    DeviceArray<uint16_t> d_half(in.size(), off[1]), d_bf16(in.size(), off[1]);
    ASSERT_OK(FloatToHalfCuda(d_in.get(), d_half.get(), in.size(), stream_));
    ASSERT_OK(FloatToBf16Cuda(d_in.get(), d_bf16.get(), in.size(), stream_));
    Sync();
    ExpectSame(d_half.Download(), want_half, "fp16");
    ExpectSame(d_bf16.Download(), want_bf16, "bf16");
  }
}

TEST_F(CompressKernelsTest, DividedToHalfIsDivideThenCastInOnePass) {
  std::vector<float> in = TestValues(100003, 7, true);
  in[0] = 65504.0f * 7;  // finite only once divided
  in[1] = -1e-8f;        // subnormal once divided
  for (float divisor : {1.0f, 3.0f, 7.0f, 64.0f}) {
    SCOPED_TRACE("divisor " + std::to_string(divisor));
    // The two passes it replaces, on the device: the same bits, NaNs too.
    DeviceArray<float> d_divided(in);
    DeviceArray<uint16_t> d_two_pass(in.size());
    ASSERT_OK(DivideFloatCuda(d_divided.get(), in.size(), divisor, stream_));
    ASSERT_OK(FloatToHalfCuda(d_divided.get(), d_two_pass.get(), in.size(), stream_));
    Sync();
    const std::vector<uint16_t> two_pass = d_two_pass.Download();
    // The CPU's divide and cast: the same bits but for NaN payloads (the
    // GPU's division makes every NaN the canonical one).
    std::vector<float> divided(in.size());
    for (size_t i = 0; i < in.size(); ++i) divided[i] = math::Div(in[i], divisor);
    std::vector<uint16_t> cpu(in.size());
    FloatToHalfCpu(divided.data(), cpu.data(), in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      if (std::isnan(in[i])) {
        ASSERT_EQ(two_pass[i] & 0x7C00, 0x7C00) << i;
        ASSERT_NE(two_pass[i] & 0x03FF, 0) << i;
      } else {
        ASSERT_EQ(two_pass[i], cpu[i]) << "element " << i << " of " << in[i];
      }
    }
    for (size_t off : {0, 1, 3}) {
      SCOPED_TRACE("out+" + std::to_string(off));
      DeviceArray<float> d_in(in);
      DeviceArray<uint16_t> d_out(in.size(), off);
      ASSERT_OK(DividedToHalfCuda(d_in.get(), divisor, d_out.get(), in.size(), stream_));
      Sync();
      ExpectSame(d_out.Download(), two_pass, "fp16 of the quotient");
      ExpectSame(d_in.Download(), in, "the input, unchanged");
    }
  }
}

TEST_F(CompressKernelsTest, WideningIsBitExactForEverySixteenBitPattern) {
  std::vector<uint16_t> all(65536 + 13);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> want_half(all.size()), want_bf16(all.size());
  HalfToFloatCpu(all.data(), want_half.data(), all.size());
  Bf16ToFloatCpu(all.data(), want_bf16.data(), all.size());
  const size_t offsets[][2] = {{0, 0}, {2, 1}, {1, 1}, {0, 3}};
  for (const auto& off : offsets) {
    SCOPED_TRACE("in+" + std::to_string(off[0]) + " out+" + std::to_string(off[1]));
    DeviceArray<uint16_t> d_in(all, off[0]);
    DeviceArray<float> d_half(all.size(), off[1]), d_bf16(all.size(), off[1]);
    ASSERT_OK(HalfToFloatCuda(d_in.get(), d_half.get(), all.size(), stream_));
    ASSERT_OK(Bf16ToFloatCuda(d_in.get(), d_bf16.get(), all.size(), stream_));
    Sync();
    ExpectSame(d_half.Download(), want_half, "fp16");  // NaNs included.
    ExpectSame(d_bf16.Download(), want_bf16, "bf16");
  }
}

TEST_F(CompressKernelsTest, CastsAtEverySize) {
  for (size_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> in = TestValues(n, n, true);
    std::vector<uint16_t> half(n);
    std::vector<float> back(n);
    FloatToHalfCpu(in.data(), half.data(), n);
    HalfToFloatCpu(half.data(), back.data(), n);
    DeviceArray<float> d_in(in), d_back(n);
    DeviceArray<uint16_t> d_half(n);
    ASSERT_OK(FloatToHalfCuda(d_in.get(), d_half.get(), n, stream_));
    ASSERT_OK(HalfToFloatCuda(d_half.get(), d_back.get(), n, stream_));
    Sync();
    ExpectSame(d_half.Download(), half, "fp16");
    ExpectSame(d_back.Download(), back, "widened");
  }
}

// ---- Top-k ----

void RunTopK(cudaStream_t stream, const std::vector<float>& in, size_t k, SparseValueFormat format,
             size_t offset) {
  const size_t n = in.size();
  const bool f16 = format == SparseValueFormat::kF16;
  std::vector<int32_t> want_idx(k);
  std::vector<float> want32(k);
  std::vector<uint16_t> want16(k);
  TopKCpu(in.data(), n, k, format, want_idx.data(),
          f16 ? static_cast<void*>(want16.data()) : want32.data());
  DeviceArray<float> d_in(in, offset);
  DeviceArray<int32_t> d_idx(k);
  DeviceArray<float> d32(k);
  DeviceArray<uint16_t> d16(k);
  const size_t ws_bytes = TopKWorkspaceBytes(n);
  DeviceArray<uint8_t> ws(ws_bytes);
  ASSERT_OK(TopKCuda(d_in.get(), n, k, format, d_idx.get(),
                     f16 ? static_cast<void*>(d16.get()) : d32.get(), ws.get(), ws_bytes, stream));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ExpectSame(d_idx.Download(), want_idx, "indices");
  if (f16) {
    ExpectSame(d16.Download(), want16, "fp16 values");
  } else {
    ExpectSame(d32.Download(), want32, "values");  // Copies: NaNs too.
  }
}

TEST_F(CompressKernelsTest, TopKSelectsTheReferenceSet) {
  for (size_t n : kSizes) {
    if (n == 0) continue;
    const std::vector<std::vector<float>> inputs = Inputs(n, 7 * n);
    for (size_t v = 0; v < inputs.size(); ++v) {
      std::vector<size_t> ks = {1, SparseKeepCount(0.01, n), SparseKeepCount(0.1, n), n / 2 + 1, n};
      std::sort(ks.begin(), ks.end());
      ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
      for (size_t k : ks) {
        for (auto format : {SparseValueFormat::kF32, SparseValueFormat::kF16}) {
          SCOPED_TRACE("n=" + std::to_string(n) + " input " + std::to_string(v) + " k=" +
                       std::to_string(k) + (format == SparseValueFormat::kF16 ? " fp16" : ""));
          RunTopK(stream_, inputs[v], k, format, v == 1 ? 1 : 0);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_F(CompressKernelsTest, TopKDecompressMatchesReference) {
  const size_t n = 65537;
  const std::vector<float> in = TestValues(n, 3, true);
  const size_t k = SparseKeepCount(0.01, n);
  for (auto format : {SparseValueFormat::kF32, SparseValueFormat::kF16}) {
    const bool f16 = format == SparseValueFormat::kF16;
    std::vector<int32_t> idx(k);
    std::vector<float> v32(k), want(n);
    std::vector<uint16_t> v16(k);
    void* values = f16 ? static_cast<void*>(v16.data()) : v32.data();
    TopKCpu(in.data(), n, k, format, idx.data(), values);
    SparseDecompressCpu(idx.data(), values, format, k, n, want.data());
    DeviceArray<int32_t> d_idx(idx);
    DeviceArray<float> d32(v32), d_out(n);
    DeviceArray<uint16_t> d16(v16);
    ASSERT_OK(SparseDecompressCuda(d_idx.get(), f16 ? static_cast<void*>(d16.get()) : d32.get(),
                                   format, k, n, d_out.get(), stream_));
    Sync();
    ExpectSame(d_out.Download(), want, f16 ? "fp16" : "fp32");
  }
}

// ---- Random-k ----

TEST_F(CompressKernelsTest, RandomKGatherAndScatterMatchReference) {
  for (size_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const size_t k = SparseKeepCount(0.05, n);
    const std::vector<float> in = TestValues(n, n + 1, true);
    const std::vector<uint32_t> idx = RandomKIndicesCpu({42, n, 3}, n, k);
    const float scale = k > 0 ? RandomKScale(n, k) : 1.0f;
    std::vector<float> values(k), scattered(n), acc = TestValues(n, n + 2);
    GatherCpu(in.data(), idx.data(), k, values.data());
    ScatterCpu(values.data(), idx.data(), k, scale, n, scattered.data());
    DeviceArray<float> d_acc(acc);
    ScatterAddCpu(values.data(), idx.data(), k, scale, acc.data());
    DeviceArray<float> d_in(in), d_values(k), d_scattered(n);
    DeviceArray<uint32_t> d_idx(idx);
    ASSERT_OK(GatherCuda(d_in.get(), d_idx.get(), k, d_values.get(), stream_));
    ASSERT_OK(ScatterCuda(d_values.get(), d_idx.get(), k, scale, n, d_scattered.get(), stream_));
    ASSERT_OK(ScatterAddCuda(d_values.get(), d_idx.get(), k, scale, d_acc.get(), stream_));
    Sync();
    ExpectSame(d_values.Download(), values, "gathered");
    ExpectSameFloats(d_scattered.Download(), scattered, "scattered");
    ExpectSameFloats(d_acc.Download(), acc, "scatter-added");
  }
}

// ---- Sign ----

TEST_F(CompressKernelsTest, SignEncodeDecodeMatchReference) {
  // 4096: the two-pass kernel (the chunks of a block exceed shared memory).
  for (size_t chunk : {size_t{8}, size_t{64}, size_t{512}, size_t{4096}}) {
    for (size_t n : kSizes) {
      for (bool specials : {false, true}) {
        SCOPED_TRACE("chunk=" + std::to_string(chunk) + " n=" + std::to_string(n) +
                     (specials ? " specials" : ""));
        const std::vector<float> in = TestValues(n, chunk + n, specials);
        const size_t chunks = NumChunks(n, chunk);
        std::vector<float> scales(chunks), out(n);
        std::vector<uint8_t> bits((n + 7) / 8);
        SignEncodeCpu(in.data(), n, chunk, scales.data(), bits.data());
        SignDecodeCpu(scales.data(), bits.data(), n, chunk, out.data());
        // Misaligned inputs take the encoder's scalar loads.
        DeviceArray<float> d_in(in, n % 2), d_scales(chunks);
        DeviceArray<float> d_out(n, specials ? 1 : 0);
        DeviceArray<uint8_t> d_bits(bits.size());
        ASSERT_OK(SignEncodeCuda(d_in.get(), n, chunk, d_scales.get(), d_bits.get(), stream_));
        ASSERT_OK(SignDecodeCuda(d_scales.get(), d_bits.get(), n, chunk, d_out.get(), stream_));
        Sync();
        ExpectSameFloats(d_scales.Download(), scales, "scales");
        ExpectSame(d_bits.Download(), bits, "bits");
        ExpectSameFloats(d_out.Download(), out, "decoded");
      }
    }
  }
}

// ---- QSGD ----

TEST_F(CompressKernelsTest, QsgdEncodeDecodeMatchReference) {
  std::vector<float> tiny(4096);
  for (size_t i = 0; i < tiny.size(); ++i) {
    tiny[i] = FromBits(static_cast<uint32_t>(i % 37)) * (i % 2 ? -1.0f : 1.0f);
  }
  // 2048: fewer chunks per block in shared memory; 16384: the two-pass kernel.
  for (size_t chunk : {size_t{8}, size_t{64}, size_t{512}, size_t{2048}, size_t{16384}}) {
    for (int levels : {1, 7, 127}) {
      std::vector<std::vector<float>> inputs;
      for (size_t n : kSizes) inputs.push_back(TestValues(n, n + levels, n % 2));
      inputs.push_back(tiny);
      for (const std::vector<float>& in : inputs) {
        const size_t n = in.size();
        SCOPED_TRACE("chunk=" + std::to_string(chunk) + " levels=" + std::to_string(levels) +
                     " n=" + std::to_string(n));
        const uint64_t key = QsgdKey({42, n, 3});
        const size_t chunks = NumChunks(n, chunk);
        std::vector<float> norms(chunks), out(n);
        std::vector<int8_t> q(n);
        QsgdEncodeCpu(in.data(), n, chunk, levels, key, norms.data(), q.data());
        QsgdDecodeCpu(norms.data(), q.data(), n, chunk, levels, out.data());
        const size_t misalign = n % 3;  // Scalar decode paths too.
        DeviceArray<float> d_in(in, n % 2), d_norms(chunks), d_out(n, misalign);
        DeviceArray<int8_t> d_q(n, misalign);
        ASSERT_OK(
            QsgdEncodeCuda(d_in.get(), n, chunk, levels, key, d_norms.get(), d_q.get(), stream_));
        ASSERT_OK(QsgdDecodeCuda(d_norms.get(), d_q.get(), n, chunk, levels, d_out.get(), stream_));
        Sync();
        ExpectSame(d_norms.Download(), norms, "norms");  // Max keys: bitwise.
        ExpectSame(d_q.Download(), q, "levels");
        ExpectSameFloats(d_out.Download(), out, "decoded");
      }
    }
  }
}

// ---- Fused buckets ----

struct Layout {
  std::vector<std::vector<float>> tensors;
  std::vector<BucketSlice> host_slices;  // Host tensor pointers.
  size_t bucket_elems = 0;
};

// Tensors of mixed sizes (empty, odd, one large) with gaps between them.
Layout MakeLayout(uint32_t seed) {
  std::mt19937 rng(seed);
  Layout l;
  uint64_t offset = rng() % 3;
  for (int t = 0; t < 40; ++t) {
    size_t size = rng() % 2000;
    if (t % 9 == 0) size = 0;
    if (t == 17) size = 300001;
    l.tensors.push_back(TestValues(size, seed * 100 + t, t % 5 == 0));
    l.host_slices.push_back({l.tensors.back().data(), offset, size});
    offset += size + rng() % 3;
  }
  l.bucket_elems = offset + 5;
  return l;
}

TEST_F(CompressKernelsTest, BucketPackAndUnpackMatchReference) {
  Layout l = MakeLayout(3);
  ASSERT_TRUE(ValidateSlices(l.host_slices.data(), l.host_slices.size(), l.bucket_elems).ok());
  std::vector<std::unique_ptr<DeviceArray<float>>> d_tensors;
  std::vector<BucketSlice> device_slices = l.host_slices;
  for (size_t t = 0; t < l.tensors.size(); ++t) {
    d_tensors.push_back(std::make_unique<DeviceArray<float>>(l.tensors[t]));
    device_slices[t].tensor = d_tensors.back()->get();
  }
  const size_t s = device_slices.size();
  std::vector<uint8_t> slice_bytes(s * sizeof(BucketSlice));
  std::memcpy(slice_bytes.data(), device_slices.data(), slice_bytes.size());
  DeviceArray<uint8_t> d_slices(slice_bytes);
  const auto* slices = reinterpret_cast<const BucketSlice*>(d_slices.get());

  // Pack: gaps keep the poison the device buffers start with.
  std::vector<float> bucket(l.bucket_elems, FromBits(0xA5A5A5A5));
  std::vector<uint16_t> half(l.bucket_elems, 0xA5A5), bf16 = half;
  PackBucketCpu(l.host_slices.data(), s, bucket.data());
  PackBucket16Cpu(Float16Format::kFp16, l.host_slices.data(), s, half.data());
  PackBucket16Cpu(Float16Format::kBf16, l.host_slices.data(), s, bf16.data());
  DeviceArray<float> d_bucket(l.bucket_elems);
  DeviceArray<uint16_t> d_half(l.bucket_elems), d_bf16(l.bucket_elems);
  ASSERT_OK(PackBucketCuda(slices, s, l.bucket_elems, d_bucket.get(), stream_));
  ASSERT_OK(
      PackBucket16Cuda(Float16Format::kFp16, slices, s, l.bucket_elems, d_half.get(), stream_));
  ASSERT_OK(
      PackBucket16Cuda(Float16Format::kBf16, slices, s, l.bucket_elems, d_bf16.get(), stream_));
  Sync();
  ExpectSame(d_bucket.Download(), bucket, "packed");
  ExpectSame(d_half.Download(), half, "packed fp16");
  ExpectSame(d_bf16.Download(), bf16, "packed bf16");

  // Round trip: unpacking the packed bucket gives the tensors back.
  for (auto& t : d_tensors) {
    ASSERT_CUDA_OK(cudaMemsetAsync(t->get(), 0, t->size() * sizeof(float), stream_));
  }
  ASSERT_OK(UnpackBucketCuda(slices, s, l.bucket_elems, d_bucket.get(), stream_));
  Sync();
  for (size_t t = 0; t < l.tensors.size(); ++t) {
    ExpectSame(d_tensors[t]->Download(), l.tensors[t], "round trip, tensor " + std::to_string(t));
  }

  // Unpack a different bucket (fp32, then fp16 over it) into the tensors.
  const std::vector<float> other = TestValues(l.bucket_elems, 99, true);
  std::vector<uint16_t> other_half(l.bucket_elems);
  FloatToHalfCpu(other.data(), other_half.data(), other.size());
  for (auto format : {0, 1}) {
    DeviceArray<float> d_other(other);
    DeviceArray<uint16_t> d_other_half(other_half);
    if (format == 0) {
      UnpackBucketCpu(l.host_slices.data(), s, other.data());
      ASSERT_OK(UnpackBucketCuda(slices, s, l.bucket_elems, d_other.get(), stream_));
    } else {
      UnpackBucket16Cpu(Float16Format::kFp16, l.host_slices.data(), s, other_half.data());
      ASSERT_OK(UnpackBucket16Cuda(Float16Format::kFp16, slices, s, l.bucket_elems,
                                   d_other_half.get(), stream_));
    }
    Sync();
    for (size_t t = 0; t < l.tensors.size(); ++t) {
      ExpectSame(d_tensors[t]->Download(), l.tensors[t], "tensor " + std::to_string(t));
    }
  }
}

// ---- Error feedback ----

// Checks decompress(C(c)) + e_new == c: exact where c - d was exact.
void ExpectIdentity(const std::vector<float>& c, const std::vector<float>& d,
                    const std::vector<float>& e, bool exact) {
  for (size_t i = 0; i < c.size(); ++i) {
    if (!std::isfinite(c[i]) || !std::isfinite(d[i])) continue;
    if (exact) {
      ASSERT_EQ(d[i] + e[i], c[i]) << i;
    } else {
      ASSERT_NEAR(d[i] + e[i], c[i], 1.2e-7f * (std::fabs(c[i]) + std::fabs(d[i]))) << i;
    }
  }
}

class ErrorFeedbackTest : public CompressKernelsTest, public ::testing::WithParamInterface<size_t> {
 protected:
  void Prepare(bool has_residual) {
    n_ = GetParam();
    g_ = TestValues(n_, n_ + 11, n_ % 2);
    e_old_ = has_residual ? TestValues(n_, n_ + 12) : std::vector<float>(n_);
    c_.resize(n_);
    for (size_t i = 0; i < n_; ++i) {
      c_[i] = has_residual ? g_[i] + e_old_[i] : g_[i];
    }
    d_g_ = std::make_unique<DeviceArray<float>>(g_);
    d_e_ = std::make_unique<DeviceArray<float>>(e_old_);
  }

  size_t n_ = 0;
  std::vector<float> g_, e_old_, c_;
  std::unique_ptr<DeviceArray<float>> d_g_, d_e_;
};

TEST_P(ErrorFeedbackTest, Float16SignQsgdMatchReference) {
  for (bool has : {false, true}) {
    SCOPED_TRACE(has ? "with residual" : "first step");
    Prepare(has);
    const size_t n = n_;
    std::vector<float> e = e_old_, d(n);
    std::vector<uint16_t> wire(n);
    EfFloat16Cpu(Float16Format::kFp16, g_.data(), e.data(), has, n, wire.data());
    DeviceArray<uint16_t> d_wire(n, 1);
    ASSERT_OK(EfFloat16Cuda(Float16Format::kFp16, d_g_->get(), d_e_->get(), has, n, d_wire.get(),
                            stream_));
    Sync();
    ExpectSame(d_wire.Download(), wire, "fp16 wire");
    ExpectSameFloats(d_e_->Download(), e, "fp16 residual");
    HalfToFloatCpu(wire.data(), d.data(), n);
    ExpectIdentity(c_, d, d_e_->Download(), true);

    Prepare(has);
    e = e_old_;
    const size_t chunks = NumChunks(n, 512);
    std::vector<float> scales(chunks);
    std::vector<uint8_t> bits((n + 7) / 8);
    EfSignCpu(g_.data(), e.data(), has, n, 512, scales.data(), bits.data());
    DeviceArray<float> d_scales(chunks);
    DeviceArray<uint8_t> d_bits(bits.size());
    ASSERT_OK(
        EfSignCuda(d_g_->get(), d_e_->get(), has, n, 512, d_scales.get(), d_bits.get(), stream_));
    Sync();
    ExpectSameFloats(d_scales.Download(), scales, "sign scales");
    ExpectSame(d_bits.Download(), bits, "sign bits");
    ExpectSameFloats(d_e_->Download(), e, "sign residual");
    SignDecodeCpu(scales.data(), bits.data(), n, 512, d.data());
    ExpectIdentity(c_, d, d_e_->Download(), false);

    Prepare(has);
    e = e_old_;
    const uint64_t key = QsgdKey({1, 2, 3});
    std::vector<float> norms(chunks);
    std::vector<int8_t> q(n);
    EfQsgdCpu(g_.data(), e.data(), has, n, 512, 127, key, norms.data(), q.data());
    DeviceArray<float> d_norms(chunks);
    DeviceArray<int8_t> d_q(n);
    ASSERT_OK(EfQsgdCuda(d_g_->get(), d_e_->get(), has, n, 512, 127, key, d_norms.get(), d_q.get(),
                         stream_));
    Sync();
    ExpectSame(d_norms.Download(), norms, "qsgd norms");
    ExpectSame(d_q.Download(), q, "qsgd levels");
    ExpectSameFloats(d_e_->Download(), e, "qsgd residual");
    QsgdDecodeCpu(norms.data(), q.data(), n, 512, 127, d.data());
    ExpectIdentity(c_, d, d_e_->Download(), false);
  }
}

TEST_P(ErrorFeedbackTest, SparseMatchReference) {
  for (bool has : {false, true}) {
    SCOPED_TRACE(has ? "with residual" : "first step");
    const size_t n = GetParam();
    const size_t k = SparseKeepCount(0.01, n);
    for (auto format : {SparseValueFormat::kF32, SparseValueFormat::kF16}) {
      Prepare(has);
      const bool f16 = format == SparseValueFormat::kF16;
      std::vector<float> e = e_old_, v32(k), d(n);
      std::vector<uint16_t> v16(k);
      std::vector<int32_t> idx(k);
      void* values = f16 ? static_cast<void*>(v16.data()) : v32.data();
      EfTopKCpu(g_.data(), e.data(), has, n, k, format, idx.data(), values);
      DeviceArray<int32_t> d_idx(k);
      DeviceArray<float> d32(k);
      DeviceArray<uint16_t> d16(k);
      const size_t ws_bytes = TopKWorkspaceBytes(n);
      DeviceArray<uint8_t> ws(ws_bytes);
      ASSERT_OK(EfTopKCuda(d_g_->get(), d_e_->get(), has, n, k, format, d_idx.get(),
                           f16 ? static_cast<void*>(d16.get()) : d32.get(), ws.get(), ws_bytes,
                           stream_));
      Sync();
      ExpectSame(d_idx.Download(), idx, "top-k indices");
      if (f16) {
        ExpectSame(d16.Download(), v16, "top-k fp16 values");
      } else {
        ExpectSameFloats(d32.Download(), v32, "top-k values");
      }
      ExpectSameFloats(d_e_->Download(), e, "top-k residual");
      SparseDecompressCpu(idx.data(), values, format, k, n, d.data());
      ExpectIdentity(c_, d, d_e_->Download(), !f16);
    }

    Prepare(has);
    const std::vector<uint32_t> ridx = RandomKIndicesCpu({7, 8, 9}, n, k);
    const float scale = k > 0 ? RandomKScale(n, k) : 1.0f;
    std::vector<float> e = e_old_, values(k), d(n);
    EfRandomKCpu(g_.data(), e.data(), has, n, ridx.data(), k, scale, values.data());
    DeviceArray<uint32_t> d_ridx(ridx);
    DeviceArray<float> d_values(k);
    ASSERT_OK(EfRandomKCuda(d_g_->get(), d_e_->get(), has, n, d_ridx.get(), k, scale,
                            d_values.get(), stream_));
    Sync();
    ExpectSameFloats(d_values.Download(), values, "random-k values");
    ExpectSameFloats(d_e_->Download(), e, "random-k residual");
    ScatterCpu(values.data(), ridx.data(), k, scale, n, d.data());
    ExpectIdentity(c_, d, d_e_->Download(), false);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ErrorFeedbackTest,
                         ::testing::Values(0, 1, 31, 33, 513, 4097, 65537, (size_t{1} << 20) + 7));

// ---- Arguments ----

TEST_F(CompressKernelsTest, RejectsBadArguments) {
  const auto invalid = StatusCode::kInvalidArgument;
  // Floats [0, 64) in, [64, 128) sparse indices, [128, 192) values,
  // [192, 256) workspace, halves from float 256 on.
  void* raw = nullptr;
  ASSERT_CUDA_OK(cudaMalloc(&raw, 2048));
  ASSERT_CUDA_OK(cudaMemset(raw, 0, 2048));
  float* f = static_cast<float*>(raw);
  uint16_t* h = reinterpret_cast<uint16_t*>(f + 256);
  EXPECT_TRUE(FloatToHalfCuda(nullptr, nullptr, 0, stream_).ok());
  EXPECT_EQ(FloatToHalfCuda(nullptr, h, 4, stream_).code(), invalid);
  EXPECT_TRUE(FloatToHalfCuda(f, h + 1, 4, stream_).ok());
  EXPECT_TRUE(HalfToFloatCuda(h + 1, f + 1, 4, stream_).ok());
  EXPECT_EQ(HalfToFloatCuda(h, reinterpret_cast<float*>(h + 1), 4, stream_).code(),
            invalid);  // A float pointer that is only 2-byte aligned.
  EXPECT_EQ(SignEncodeCuda(f, 8, 12, f, reinterpret_cast<uint8_t*>(f + 8), stream_).code(),
            invalid);
  EXPECT_EQ(QsgdEncodeCuda(f, 8, 8, 128, 0, f, reinterpret_cast<int8_t*>(f), stream_).code(),
            invalid);
  int32_t* idx = reinterpret_cast<int32_t*>(f + 64);
  EXPECT_EQ(TopKCuda(f, 8, 9, SparseValueFormat::kF32, idx, f + 128, f + 192, TopKWorkspaceBytes(8),
                     stream_)
                .code(),
            invalid);
  EXPECT_EQ(TopKCuda(f, 8, 2, SparseValueFormat::kF32, idx, f + 128, f + 192,
                     TopKWorkspaceBytes(8) - 1, stream_)
                .code(),
            invalid);
  EXPECT_EQ(TopKCuda(f, size_t{1} << 31, 2, SparseValueFormat::kF32, idx, f + 128, f + 192, 1 << 30,
                     stream_)
                .code(),
            invalid);
  EXPECT_TRUE(
      TopKCuda(f, 8, 0, SparseValueFormat::kF32, nullptr, nullptr, nullptr, 0, stream_).ok());
  EXPECT_EQ(ScatterCuda(f, reinterpret_cast<uint32_t*>(idx), 9, 1.0f, 8, f, stream_).code(),
            invalid);
  Sync();
  ASSERT_CUDA_OK(cudaFree(raw));
}

}  // namespace
}  // namespace gradsync::kernels
