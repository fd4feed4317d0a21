#include "client/bucket_memory.h"

#include <cstdint>
#include <vector>

#include "client/ring_test_util.h"
#include "gtest/gtest.h"

namespace gradsync::client {
namespace {

using Staging = BucketMemory::Staging;

TEST(HostBucketsTest, StagesAddsAndUnstagesInHostMemory) {
  auto m = MakeHostBuckets();
  EXPECT_FALSE(m->device());
  EXPECT_EQ(m->DeviceBytes(), 0u);
  ASSERT_TRUE(m->Allocate({12, 4 * sizeof(float), 0}).ok());
  const std::vector<float> a = {1, 2, 3, 4}, b = {10, 20, 30, 40};
  ASSERT_TRUE(m->Stage(1, 0, a.data(), 4, DType::kF32, false, nullptr, Staging::kGather).ok());
  ASSERT_TRUE(m->Stage(1, 0, b.data(), 4, DType::kF32, true, nullptr, Staging::kNow).ok());
  std::vector<float> first(2, 0), second(2, 0);
  ASSERT_TRUE(m->Unstage(1, {{0, first.data(), 8}, {8, second.data(), 8}}, DType::kF32).ok());
  ASSERT_TRUE(m->Wait(Soon()).ok());
  EXPECT_EQ(first, (std::vector<float>{11, 22}));
  EXPECT_EQ(second, (std::vector<float>{33, 44}));
}

TEST(HostBucketsTest, TheHostViewIsTheBucketItselfAndAligned) {
  auto m = MakeHostBuckets();
  ASSERT_TRUE(m->Allocate({100, 4096}).ok());
  for (int i = 0; i < 2; ++i) {
    auto view = m->HostView(i, 100, /*copy_in=*/false, Soon());
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*view) % 64, 0u);
  }
  const float v = 5;
  ASSERT_TRUE(m->Stage(0, 4, &v, 1, DType::kF32, false, nullptr, Staging::kNow).ok());
  auto view = m->HostView(0, 100, true, Soon());
  ASSERT_TRUE(view.ok());
  float seen = 0;
  std::memcpy(&seen, *view + 4, 4);
  EXPECT_EQ(seen, 5.0f);
  const float w = 7;
  std::memcpy(*view + 4, &w, 4);  // what a backend leaves in the view is the bucket's
  ASSERT_TRUE(m->EndHostView(0, 100).ok());
  float out = 0;
  ASSERT_TRUE(m->Unstage(0, {{4, &out, 4}}, DType::kF32).ok());
  EXPECT_EQ(out, 7.0f);
}

TEST(HostBucketsTest, LeavesReductionToTheBackendAndRefusesStreams) {
  auto m = MakeHostBuckets();
  ASSERT_TRUE(m->Allocate({64}).ok());
  Ring ring(1);
  EXPECT_FALSE(m->Reduces(0, DType::kF32, "topk:ratio=0.1", ring[0]));
  EXPECT_FALSE(m->Reduces(0, DType::kF32, "none", ring[0]));
  const float v = 1;
  int stream = 0;
  EXPECT_EQ(m->Stage(0, 0, &v, 1, DType::kF32, false, &stream, Staging::kNow).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(m->EncodePartition(0, 0, 0, 16, "topk:ratio=0.1", {}, Soon()).status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(m->Scratch(16).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace gradsync::client
