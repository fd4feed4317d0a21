// NcclCollectives on one GPU (a world of one) with host buffers, and the
// comparison of the call records the ranks exchange before each operation.
// Tagged "gpu"; built with --config=cuda.
#include "client/nccl_collectives.h"

#include <cuda_runtime_api.h>

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

namespace gradsync::client {
namespace {

constexpr int kDevice = 0;

Deadline Soon() { return Deadline::AfterMs(30000); }

std::vector<uint8_t> RandomElements(DType dtype, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
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

class NcclCollectivesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kernels::HaveCudaDevice());
    StatusOr<std::vector<uint8_t>> id = kernels::NcclComm::MakeUniqueId();
    ASSERT_TRUE(id.ok()) << id.status();
    StatusOr<std::unique_ptr<NcclCollectives>> c =
        NcclCollectives::Connect(*id, 0, 1, kDevice, Soon());
    ASSERT_TRUE(c.ok()) << c.status();
    nccl_ = std::move(c).value();
  }

  OpTag NextTag() {
    OpTag tag;
    tag.step = 3;
    tag.bucket = 1;
    tag.seq = seq_++;
    tag.names_hash = 0xfeedULL;
    return tag;
  }

  std::unique_ptr<NcclCollectives> nccl_;
  uint64_t seq_ = 0;
};

TEST_F(NcclCollectivesTest, DescribesItself) {
  EXPECT_STREQ(nccl_->name(), "nccl");
  EXPECT_EQ(nccl_->rank(), 0);
  EXPECT_EQ(nccl_->world_size(), 1);
}

struct ReduceCase {
  DType dtype;
  ReduceOp op;
};

void PrintTo(const ReduceCase& c, std::ostream* os) {
  *os << DTypeName(c.dtype) << (c.op == ReduceOp::kAverage ? " average" : " sum");
}

class NcclCollectivesAllReduceTest : public NcclCollectivesTest,
                                     public ::testing::WithParamInterface<ReduceCase> {};

TEST_P(NcclCollectivesAllReduceTest, WorldOfOneKeepsTheDataAtEverySize) {
  const ReduceCase c = GetParam();
  // Sizes that make the staging buffer grow, then fit in it again.
  for (size_t count : {size_t{1}, size_t{1000}, size_t{3} << 20, size_t{4097}}) {
    const std::vector<uint8_t> input = RandomElements(c.dtype, count, 11);
    std::vector<uint8_t> data = input;
    Status s = nccl_->AllReduce(data.data(), count, c.dtype, c.op, NextTag(), Soon());
    ASSERT_TRUE(s.ok()) << "count " << count << ": " << s;
    EXPECT_EQ(data, input) << "count " << count;
    EXPECT_GE(nccl_->staging_bytes(), count * DTypeSize(c.dtype));
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, NcclCollectivesAllReduceTest,
                         ::testing::Values(ReduceCase{DType::kF32, ReduceOp::kSum},
                                           ReduceCase{DType::kF32, ReduceOp::kAverage},
                                           ReduceCase{DType::kF16, ReduceOp::kSum},
                                           ReduceCase{DType::kF16, ReduceOp::kAverage},
                                           ReduceCase{DType::kBF16, ReduceOp::kSum},
                                           ReduceCase{DType::kBF16, ReduceOp::kAverage}));

TEST_F(NcclCollectivesTest, WorldOfOneAllGatherCopiesInToOut) {
  const std::vector<uint8_t> in = RandomElements(DType::kF16, 5000, 2);
  std::vector<uint8_t> out(in.size(), 0);
  Status s = nccl_->AllGather(in.data(), in.size(), out.data(), NextTag(), Soon());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(out, in);
}

TEST_F(NcclCollectivesTest, WorldOfOneBroadcastKeepsTheRootsData) {
  const std::vector<uint8_t> input = RandomElements(DType::kBF16, 3000, 4);
  std::vector<uint8_t> data = input;
  Status s = nccl_->Broadcast(data.data(), data.size(), 0, NextTag(), Soon());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(data, input);
}

// Device memory goes to NCCL in place: no staging buffer is made for it.
TEST_F(NcclCollectivesTest, DeviceBuffersAreReducedInPlaceWithoutStaging) {
  const std::vector<uint8_t> input = RandomElements(DType::kF32, 4099, 6);
  void* dev = nullptr;
  void* gathered = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, input.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&gathered, input.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, input.data(), input.size(), cudaMemcpyHostToDevice), cudaSuccess);
  Status s = nccl_->AllReduce(dev, 4099, DType::kF32, ReduceOp::kSum, NextTag(), Soon());
  ASSERT_TRUE(s.ok()) << s;
  s = nccl_->Broadcast(dev, input.size(), 0, NextTag(), Soon());
  ASSERT_TRUE(s.ok()) << s;
  s = nccl_->AllGather(dev, input.size(), gathered, NextTag(), Soon());
  ASSERT_TRUE(s.ok()) << s;
  std::vector<uint8_t> out(input.size());
  ASSERT_EQ(cudaMemcpy(out.data(), gathered, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(out, input);
  EXPECT_EQ(nccl_->staging_bytes(), 0u);
  cudaFree(dev);
  cudaFree(gathered);
}

TEST_F(NcclCollectivesTest, EmptyOperationsSucceed) {
  EXPECT_TRUE(nccl_->AllReduce(nullptr, 0, DType::kF32, ReduceOp::kSum, NextTag(), Soon()).ok());
  EXPECT_TRUE(nccl_->AllGather(nullptr, 0, nullptr, NextTag(), Soon()).ok());
  EXPECT_TRUE(nccl_->Broadcast(nullptr, 0, 0, NextTag(), Soon()).ok());
}

TEST_F(NcclCollectivesTest, ManyOperationsInARow) {
  std::vector<float> data(256);
  for (int i = 0; i < 200; ++i) {
    for (size_t j = 0; j < data.size(); ++j) data[j] = static_cast<float>(i + j);
    Status s =
        nccl_->AllReduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum, NextTag(), Soon());
    ASSERT_TRUE(s.ok()) << "op " << i << ": " << s;
    ASSERT_EQ(data[7], static_cast<float>(i + 7));
  }
}

TEST_F(NcclCollectivesTest, BadCallsFailAndTheErrorSticks) {
  std::vector<int32_t> ints(16);
  Status s =
      nccl_->AllReduce(ints.data(), ints.size(), DType::kI32, ReduceOp::kSum, NextTag(), Soon());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("i32"), std::string::npos) << s;

  std::vector<float> data(16, 1.0f);
  Status later =
      nccl_->AllReduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum, NextTag(), Soon());
  EXPECT_EQ(later.code(), s.code());
  EXPECT_EQ(later.message(), s.message());
}

TEST_F(NcclCollectivesTest, BroadcastFromAMissingRootIsInvalidArgument) {
  std::vector<uint8_t> data(8);
  Status s = nccl_->Broadcast(data.data(), data.size(), 1, NextTag(), Soon());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
}

TEST_F(NcclCollectivesTest, ExpiredDeadlineIsDeadlineExceeded) {
  std::vector<float> data(64, 2.0f);
  Status s = nccl_->AllReduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum, NextTag(),
                              Deadline::Past());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("ncclAllGather"), std::string::npos)
      << "the call-record exchange comes first: " << s;
}

// The exchange itself cannot disagree in a world of one; these check what
// every rank concludes from the gathered records.
OpTag Tag(uint64_t step, uint64_t seq) {
  OpTag tag;
  tag.step = step;
  tag.bucket = 2;
  tag.seq = seq;
  tag.names_hash = 0xabcULL;
  return tag;
}

TEST(CompareCallRecordsTest, EqualRecordsAgree) {
  const NcclCallRecord r = MakeCallRecord(NcclOpKind::kAllReduce, Tag(5, 7), DType::kF32, 4096, 0);
  EXPECT_TRUE(CompareCallRecords({r, r, r}, 1).ok());
  EXPECT_TRUE(CompareCallRecords({r}, 0).ok());
}

TEST(CompareCallRecordsTest, EveryFieldChangesTheFingerprint) {
  const NcclCallRecord base =
      MakeCallRecord(NcclOpKind::kAllReduce, Tag(5, 7), DType::kF32, 4096, 0);
  const std::vector<NcclCallRecord> variants = {
      MakeCallRecord(NcclOpKind::kAllGather, Tag(5, 7), DType::kF32, 4096, 0),
      MakeCallRecord(NcclOpKind::kAllReduce, Tag(6, 7), DType::kF32, 4096, 0),
      MakeCallRecord(NcclOpKind::kAllReduce, Tag(5, 8), DType::kF32, 4096, 0),
      MakeCallRecord(NcclOpKind::kAllReduce, Tag(5, 7), DType::kF16, 4096, 0),
      MakeCallRecord(NcclOpKind::kAllReduce, Tag(5, 7), DType::kF32, 4095, 0),
      MakeCallRecord(NcclOpKind::kAllReduce, Tag(5, 7), DType::kF32, 4096, 1),
  };
  for (const NcclCallRecord& v : variants) EXPECT_NE(v.fingerprint, base.fingerprint);
  OpTag other_bucket = Tag(5, 7);
  other_bucket.bucket = 3;
  EXPECT_NE(MakeCallRecord(NcclOpKind::kAllReduce, other_bucket, DType::kF32, 4096, 0).fingerprint,
            base.fingerprint);
  OpTag other_names = Tag(5, 7);
  other_names.names_hash = 0xabdULL;
  EXPECT_NE(MakeCallRecord(NcclOpKind::kAllReduce, other_names, DType::kF32, 4096, 0).fingerprint,
            base.fingerprint);
}

TEST(CompareCallRecordsTest, DisagreementNamesTheRanksTheFieldsAndThisCall) {
  const NcclCallRecord r0 = MakeCallRecord(NcclOpKind::kAllReduce, Tag(5, 7), DType::kF32, 4096, 0);
  const NcclCallRecord r2 = MakeCallRecord(NcclOpKind::kAllReduce, Tag(6, 7), DType::kF32, 100, 0);
  const Status s = CompareCallRecords({r0, r0, r2, r0}, 2);
  ASSERT_EQ(s.code(), StatusCode::kAborted) << s;
  const std::string& m = s.message();
  EXPECT_NE(m.find("rank 2 differs from rank 0"), std::string::npos) << m;
  EXPECT_NE(m.find("step 6 vs 5"), std::string::npos) << m;
  EXPECT_NE(m.find("count 100 vs 4096"), std::string::npos) << m;
  EXPECT_EQ(m.find("bucket"), m.find("bucket=")) << "bucket did not differ: " << m;
  EXPECT_NE(m.find("this rank (2) called AllReduce step=6 bucket=2 seq=7 "
                   "names_hash=0xabc "
                   "dtype=f32 count=100 op=sum"),
            std::string::npos)
      << m;
  // Rank 0's view names the same ranks.
  const Status s0 = CompareCallRecords({r0, r0, r2, r0}, 0);
  ASSERT_EQ(s0.code(), StatusCode::kAborted);
  EXPECT_NE(s0.message().find("rank 2 differs from rank 0"), std::string::npos) << s0;
}

TEST(CompareCallRecordsTest, ListsSeveralRanksAndCapsTheList) {
  const NcclCallRecord r0 = MakeCallRecord(NcclOpKind::kBroadcast, Tag(1, 1), DType::kU8, 64, 0);
  const NcclCallRecord bad = MakeCallRecord(NcclOpKind::kBroadcast, Tag(1, 1), DType::kU8, 64, 3);
  std::vector<NcclCallRecord> records(20, bad);
  records[0] = r0;
  const Status s = CompareCallRecords(records, 0);
  ASSERT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(s.message().find("ranks 1, 2, 3, 4, 5, 6, 7, 8 and 11 more differ"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("arg 3 vs 0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("called Broadcast step=1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("root=0"), std::string::npos) << s;
}

}  // namespace
}  // namespace gradsync::client
