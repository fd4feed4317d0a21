#include "client/bucketer.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace gradsync::client {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kHalfMiBOfF32 = kMiB / 8;

std::vector<TensorId> Ids(std::initializer_list<int> ids) {
  return std::vector<TensorId>(ids.begin(), ids.end());
}

TEST(BucketerTest, ReverseRegistrationOrderSmallFirstBucketThenLargeOnes) {
  Bucketer b(1 * kMiB, 4 * kMiB);
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(b.Add("t" + std::to_string(i), kHalfMiBOfF32, DType::kF32).ok());
  }
  b.Build();
  auto& buckets = b.buckets();
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].tensors, Ids({11, 10}));                  // first: 1 MiB
  EXPECT_EQ(buckets[1].tensors, Ids({9, 8, 7, 6, 5, 4, 3, 2}));  // then 4 MiB
  EXPECT_EQ(buckets[2].tensors, Ids({1, 0}));
  // Tensors sit back to back in their bucket's buffer.
  for (const Bucket& bucket : buckets) {
    size_t offset = 0;
    for (TensorId id : bucket.tensors) {
      EXPECT_EQ(b.tensor(id).offset, offset);
      EXPECT_EQ(b.tensor(id).bucket, static_cast<int>(bucket.id));
      offset += b.tensor(id).count;
    }
    EXPECT_EQ(bucket.count, offset);
    EXPECT_EQ(bucket.pending, static_cast<int>(bucket.tensors.size()));
  }
  EXPECT_NE(buckets[0].names_hash, buckets[2].names_hash);
}

TEST(BucketerTest, ADtypeChangeStartsANewBucket) {
  Bucketer b(kMiB, kMiB);
  ASSERT_TRUE(b.Add("a", 10, DType::kF32).ok());
  ASSERT_TRUE(b.Add("b", 10, DType::kF16).ok());
  ASSERT_TRUE(b.Add("c", 10, DType::kF16).ok());
  ASSERT_TRUE(b.Add("d", 10, DType::kF32).ok());
  b.Build();
  ASSERT_EQ(b.buckets().size(), 3u);
  EXPECT_EQ(b.buckets()[0].tensors, Ids({3}));
  EXPECT_EQ(b.buckets()[1].tensors, Ids({2, 1}));
  EXPECT_EQ(b.buckets()[1].dtype, DType::kF16);
  EXPECT_EQ(b.buckets()[2].tensors, Ids({0}));
}

TEST(BucketerTest, ATensorLargerThanTheCapGetsABucketOfItsOwn) {
  Bucketer b(kMiB, 2 * kMiB);
  ASSERT_TRUE(b.Add("small0", kMiB / 16, DType::kF32).ok());
  ASSERT_TRUE(b.Add("huge", 3 * kMiB / 4, DType::kF32).ok());  // 3 MiB
  ASSERT_TRUE(b.Add("small2", kMiB / 16, DType::kF32).ok());
  b.Build();
  ASSERT_EQ(b.buckets().size(), 3u);
  EXPECT_EQ(b.buckets()[0].tensors, Ids({2}));
  EXPECT_EQ(b.buckets()[1].tensors, Ids({1}));
  EXPECT_EQ(b.buckets()[2].tensors, Ids({0}));
}

TEST(BucketerTest, SameRegistrationsGiveTheSameHashesAndDifferentOnesDiffer) {
  auto hash = [](size_t count) {
    Bucketer b(kMiB, kMiB);
    EXPECT_TRUE(b.Add("w", count, DType::kF32).ok());
    b.Build();
    return b.buckets()[0].names_hash;
  };
  EXPECT_EQ(hash(100), hash(100));
  EXPECT_NE(hash(100), hash(101));
}

TEST(BucketerTest, BadRegistrationsAreRefusedByName) {
  Bucketer b(kMiB, kMiB);
  ASSERT_TRUE(b.Add("w", 4, DType::kF32).ok());
  auto dup = b.Add("w", 4, DType::kF32);
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("'w' is already registered"), std::string::npos);
  EXPECT_EQ(b.Add("", 4, DType::kF32).status().code(), StatusCode::kInvalidArgument);
  auto long_name = b.Add(std::string(4097, 'n'), 4, DType::kF32);
  EXPECT_EQ(long_name.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(long_name.status().message().find("4097 bytes, at most 4096"), std::string::npos);
  EXPECT_TRUE(b.Add(std::string(4096, 'n'), 4, DType::kF32).ok());
  EXPECT_EQ(b.Add("z", 0, DType::kF32).status().code(), StatusCode::kInvalidArgument);
  auto i32 = b.Add("ints", 4, DType::kI32);
  EXPECT_EQ(i32.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(i32.status().message().find("i32"), std::string::npos);
}

}  // namespace
}  // namespace gradsync::client
