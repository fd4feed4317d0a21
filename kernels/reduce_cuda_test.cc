// Compares the CUDA reduction with the CPU reference, bit for bit. Needs a
// GPU: tagged "gpu" and built only with --config=cuda.
#include "kernels/reduce_cuda.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gpu_test_util.h"
#include "kernels/reduce.h"

namespace gradsync::kernels {
namespace {

#define ASSERT_CUDA_OK(expr)                                                   \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng));
  return v;
}

// Bit-for-bit equality (NaN payloads and -0 included); safe for empty vectors.
bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct Case {
  size_t n;
  size_t dst_offset;  // In floats from a cudaMalloc'd (256-byte) boundary.
  size_t src_offset;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "n=" << c.n << " dst+" << c.dst_offset << " src+" << c.src_offset;
}

class SumIntoCudaTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { ASSERT_TRUE(HaveCudaDevice()); }
};

TEST_P(SumIntoCudaTest, MatchesCpuReferenceBitForBit) {
  const Case c = GetParam();
  const std::vector<float> src = Values(c.n, 1);
  const std::vector<float> dst = Values(c.n, 2);
  std::vector<float> want = dst;
  SumIntoCpu(want.data(), src.data(), c.n);

  void* d_dst = nullptr;
  void* d_src = nullptr;
  const size_t bytes = c.n * sizeof(float);
  ASSERT_CUDA_OK(cudaMalloc(&d_dst, bytes + 4 * sizeof(float)));
  ASSERT_CUDA_OK(cudaMalloc(&d_src, bytes + 4 * sizeof(float)));
  float* dst_at = static_cast<float*>(d_dst) + c.dst_offset;
  float* src_at = static_cast<float*>(d_src) + c.src_offset;
  ASSERT_CUDA_OK(cudaMemcpy(dst_at, dst.data(), bytes, cudaMemcpyHostToDevice));
  ASSERT_CUDA_OK(cudaMemcpy(src_at, src.data(), bytes, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  ASSERT_CUDA_OK(cudaStreamCreate(&stream));

  Status s = SumIntoCuda(dst_at, src_at, c.n, stream);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<float> got(c.n);
  ASSERT_CUDA_OK(cudaMemcpy(got.data(), dst_at, bytes, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(BitEqual(got, want));

  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
  ASSERT_CUDA_OK(cudaFree(d_dst));
  ASSERT_CUDA_OK(cudaFree(d_src));
}

INSTANTIATE_TEST_SUITE_P(Sizes, SumIntoCudaTest,
                         ::testing::Values(Case{0, 0, 0}, Case{1, 0, 0}, Case{3, 0, 0},
                                           Case{1000003, 0, 0},
                                           // Same offset from 16 bytes: scalar head, then float4.
                                           Case{1000003, 1, 1},
                                           // Different offsets: scalar path throughout.
                                           Case{1000003, 1, 2}, Case{3, 3, 0}));

TEST(SumIntoCudaArgsTest, RejectsNullPointers) {
  EXPECT_EQ(SumIntoCuda(nullptr, nullptr, 4, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(SumIntoCuda(nullptr, nullptr, 0, nullptr).ok());
}

}  // namespace
}  // namespace gradsync::kernels
