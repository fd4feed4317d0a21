// NcclComm on one GPU: world-size-1 collectives give the expected values,
// errors are sticky, and a communicator whose second rank never joins fails
// by its deadline instead of hanging. Tagged "gpu"; built with --config=cuda.
#include "client/nccl_comm.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "kernels/gpu_test_util.h"

namespace gradsync::kernels {
namespace {

#define ASSERT_CUDA_OK(expr)                                                   \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

constexpr int kDevice = 0;

// Device memory freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { (void)cudaFree(ptr_); }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// `n` elements of `dtype` holding finite random values, as raw bytes.
std::vector<uint8_t> RandomElements(DType dtype, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  if (dtype == DType::kF16) {
    FloatToHalf(values.data(), out.data(), n);
  } else if (dtype == DType::kBF16) {
    FloatToBf16(values.data(), out.data(), n);
  } else {
    std::memcpy(out.data(), values.data(), out.size());
  }
  return out;
}

std::vector<uint8_t> Download(const DeviceBuffer& buffer) {
  std::vector<uint8_t> out(buffer.bytes());
  EXPECT_EQ(cudaMemcpy(out.data(), buffer.get(), out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

void Upload(const std::vector<uint8_t>& bytes, const DeviceBuffer& buffer) {
  ASSERT_EQ(bytes.size(), buffer.bytes());
  ASSERT_CUDA_OK(cudaMemcpy(buffer.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
}

class NcclCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(HaveCudaDevice());
    ASSERT_CUDA_OK(cudaSetDevice(kDevice));
  }

  // A world of one: this process is rank 0 of 1.
  std::unique_ptr<NcclComm> MakeSolo() {
    StatusOr<std::vector<uint8_t>> id = NcclComm::MakeUniqueId();
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return nullptr;
    EXPECT_EQ(id->size(), NcclComm::kUniqueIdBytes);
    StatusOr<std::unique_ptr<NcclComm>> comm =
        NcclComm::Create(*id, 0, 1, kDevice, Deadline::AfterMs(30000));
    EXPECT_TRUE(comm.ok()) << comm.status();
    if (!comm.ok()) return nullptr;
    return std::move(comm).value();
  }
};

struct ReduceCase {
  DType dtype;
  NcclReduceOp op;
};

void PrintTo(const ReduceCase& c, std::ostream* os) {
  *os << DTypeName(c.dtype) << (c.op == NcclReduceOp::kAverage ? " average" : " sum");
}

class NcclAllReduceTest : public NcclCommTest, public ::testing::WithParamInterface<ReduceCase> {};

TEST_P(NcclAllReduceTest, WorldOfOneReturnsTheInputOutOfPlaceAndInPlace) {
  const ReduceCase c = GetParam();
  std::unique_ptr<NcclComm> comm = MakeSolo();
  ASSERT_NE(comm, nullptr);
  constexpr size_t kCount = 4099;
  const std::vector<uint8_t> input = RandomElements(c.dtype, kCount, 7);
  DeviceBuffer send(input.size());
  DeviceBuffer recv(input.size());
  ASSERT_NE(send.get(), nullptr);
  ASSERT_NE(recv.get(), nullptr);
  Upload(input, send);
  ASSERT_CUDA_OK(cudaMemset(recv.get(), 0xAB, recv.bytes()));

  Status s =
      comm->AllReduce(send.get(), recv.get(), kCount, c.dtype, c.op, Deadline::AfterMs(30000));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Download(recv), input);

  s = comm->AllReduce(send.get(), send.get(), kCount, c.dtype, c.op, Deadline::AfterMs(30000));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Download(send), input);
  EXPECT_TRUE(comm->status().ok());
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, NcclAllReduceTest,
                         ::testing::Values(ReduceCase{DType::kF32, NcclReduceOp::kSum},
                                           ReduceCase{DType::kF32, NcclReduceOp::kAverage},
                                           ReduceCase{DType::kF16, NcclReduceOp::kSum},
                                           ReduceCase{DType::kF16, NcclReduceOp::kAverage},
                                           ReduceCase{DType::kBF16, NcclReduceOp::kSum},
                                           ReduceCase{DType::kBF16, NcclReduceOp::kAverage}));

TEST_F(NcclCommTest, WorldOfOneAllGatherCopiesTheInput) {
  std::unique_ptr<NcclComm> comm = MakeSolo();
  ASSERT_NE(comm, nullptr);
  const std::vector<uint8_t> input = RandomElements(DType::kF32, 1000, 3);
  DeviceBuffer send(input.size());
  DeviceBuffer recv(input.size());
  Upload(input, send);
  ASSERT_CUDA_OK(cudaMemset(recv.get(), 0, recv.bytes()));
  Status s = comm->AllGather(send.get(), recv.get(), input.size(), Deadline::AfterMs(30000));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Download(recv), input);
}

TEST_F(NcclCommTest, WorldOfOneBroadcastCopiesTheRootsData) {
  std::unique_ptr<NcclComm> comm = MakeSolo();
  ASSERT_NE(comm, nullptr);
  const std::vector<uint8_t> input = RandomElements(DType::kBF16, 777, 5);
  DeviceBuffer send(input.size());
  DeviceBuffer recv(input.size());
  Upload(input, send);
  ASSERT_CUDA_OK(cudaMemset(recv.get(), 0, recv.bytes()));
  Status s = comm->Broadcast(send.get(), recv.get(), input.size(), 0, Deadline::AfterMs(30000));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Download(recv), input);
}

TEST_F(NcclCommTest, EmptyOperationsSucceed) {
  std::unique_ptr<NcclComm> comm = MakeSolo();
  ASSERT_NE(comm, nullptr);
  const Deadline deadline = Deadline::AfterMs(30000);
  EXPECT_TRUE(comm->AllReduce(nullptr, nullptr, 0, DType::kF32, NcclReduceOp::kSum, deadline).ok());
  EXPECT_TRUE(comm->AllGather(nullptr, nullptr, 0, deadline).ok());
  EXPECT_TRUE(comm->Broadcast(nullptr, nullptr, 0, 0, deadline).ok());
}

TEST_F(NcclCommTest, BadArgumentsFailAndTheErrorSticks) {
  std::unique_ptr<NcclComm> comm = MakeSolo();
  ASSERT_NE(comm, nullptr);
  DeviceBuffer buffer(64);
  Status s = comm->Broadcast(buffer.get(), buffer.get(), 64, 1, Deadline::AfterMs(30000));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("ncclBroadcast"), std::string::npos) << s;

  Status later = comm->AllGather(buffer.get(), buffer.get(), 64, Deadline::AfterMs(30000));
  EXPECT_EQ(later.code(), s.code());
  EXPECT_EQ(later.message(), s.message());
  EXPECT_EQ(comm->status().message(), s.message());
}

TEST_F(NcclCommTest, UnsupportedDTypeIsInvalidArgument) {
  std::unique_ptr<NcclComm> comm = MakeSolo();
  ASSERT_NE(comm, nullptr);
  DeviceBuffer buffer(64);
  Status s = comm->AllReduce(buffer.get(), buffer.get(), 16, DType::kI32, NcclReduceOp::kSum,
                             Deadline::AfterMs(30000));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("i32"), std::string::npos) << s;
}

TEST_F(NcclCommTest, ExpiredDeadlineFailsAndTheErrorSticks) {
  std::unique_ptr<NcclComm> comm = MakeSolo();
  ASSERT_NE(comm, nullptr);
  DeviceBuffer buffer(4096 * sizeof(float));
  Status s = comm->AllReduce(buffer.get(), buffer.get(), 4096, DType::kF32, NcclReduceOp::kSum,
                             Deadline::Past());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("ncclAllReduce of 4096 f32 elements"), std::string::npos) << s;
  EXPECT_NE(s.message().find("communicator aborted"), std::string::npos) << s;

  Status later = comm->AllReduce(buffer.get(), buffer.get(), 4096, DType::kF32, NcclReduceOp::kSum,
                                 Deadline::AfterMs(30000));
  EXPECT_EQ(later.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(later.message(), s.message());
}

TEST_F(NcclCommTest, FailingHealthCheckEndsAWaitEarly) {
  StatusOr<std::vector<uint8_t>> id = NcclComm::MakeUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclCommOptions options;
  options.health = [] { return UnavailableError("worker 1 died"); };
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 of 2 never joins; the health check gives up long before the
  // deadline.
  StatusOr<std::unique_ptr<NcclComm>> comm =
      NcclComm::Create(*id, 0, 2, kDevice, Deadline::AfterMs(60000), options);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kUnavailable) << comm.status();
  EXPECT_NE(comm.status().message().find("ncclCommInitRank"), std::string::npos) << comm.status();
  EXPECT_NE(comm.status().message().find("worker 1 died"), std::string::npos) << comm.status();
  EXPECT_LT(elapsed, std::chrono::seconds(15));
}

TEST_F(NcclCommTest, MissingRankFailsInitByTheDeadline) {
  StatusOr<std::vector<uint8_t>> id = NcclComm::MakeUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 of 2 never joins.
  StatusOr<std::unique_ptr<NcclComm>> comm =
      NcclComm::Create(*id, 0, 2, kDevice, Deadline::AfterMs(2000));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_NE(comm.status().message().find("ncclCommInitRank"), std::string::npos) << comm.status();
  EXPECT_NE(comm.status().message().find("communicator aborted"), std::string::npos)
      << comm.status();
  EXPECT_GE(elapsed, std::chrono::milliseconds(1900));
  EXPECT_LT(elapsed, std::chrono::seconds(15));
}

TEST_F(NcclCommTest, BadCreateArgumentsAreInvalidArgument) {
  const std::vector<uint8_t> short_id(16);
  EXPECT_EQ(NcclComm::Create(short_id, 0, 1, kDevice, Deadline::AfterMs(1000)).status().code(),
            StatusCode::kInvalidArgument);
  const std::vector<uint8_t> id(NcclComm::kUniqueIdBytes);
  EXPECT_EQ(NcclComm::Create(id, 2, 2, kDevice, Deadline::AfterMs(1000)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclComm::Create(id, 0, 1, -1, Deadline::AfterMs(1000)).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradsync::kernels
