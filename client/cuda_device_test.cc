#include "client/cuda_device.h"

#include <string>

#include "gtest/gtest.h"

namespace gradsync::client {
namespace {

TEST(CudaDeviceTest, EachLocalRankTakesItsOwnGpuByDefault) {
  for (int local = 0; local < 8; ++local) {
    auto device = ResolveCudaDevice(-1, local, 8);
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_EQ(*device, local);
  }
}

TEST(CudaDeviceTest, OneVisibleDeviceOrNoLocalRankIsDeviceZero) {
  EXPECT_EQ(ResolveCudaDevice(-1, 3, 1).value(), 0);  // CUDA_VISIBLE_DEVICES=3
  EXPECT_EQ(ResolveCudaDevice(-1, -1, 4).value(), 0);
}

TEST(CudaDeviceTest, AnExplicitSettingWins) {
  EXPECT_EQ(ResolveCudaDevice(2, 0, 4).value(), 2);
  EXPECT_EQ(ResolveCudaDevice(0, 3, 4).value(), 0);  // ranks may share a GPU
}

TEST(CudaDeviceTest, ADeviceThisProcessDoesNotSeeIsNamed) {
  auto setting = ResolveCudaDevice(4, 0, 4);
  ASSERT_EQ(setting.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(setting.status().message().find("cuda_device 4 does not exist: this process sees 4"),
            std::string::npos)
      << setting.status();
  auto rank = ResolveCudaDevice(-1, 5, 4);
  ASSERT_EQ(rank.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rank.status().message().find("local rank 5 has no GPU of its own"), std::string::npos)
      << rank.status();
}

TEST(CudaDeviceTest, WithoutCudaNothingIsChecked) {
  EXPECT_EQ(ResolveCudaDevice(-1, 2, 0).value(), 2);
  EXPECT_EQ(ResolveCudaDevice(7, 0, 0).value(), 7);
}

}  // namespace
}  // namespace gradsync::client
