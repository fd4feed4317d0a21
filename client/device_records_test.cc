#include "client/device_records.h"

#include <cstring>

#include "gtest/gtest.h"

namespace gradsync::client {
namespace {

const char kBoot[] = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

TEST(DeviceRecordsTest, RoundTripsThroughItsBytes) {
  const DeviceRecord r{kBoot, "00000000:1A:00.0", "node7", 3};
  const std::vector<uint8_t> bytes = EncodeDeviceRecord(r);
  ASSERT_EQ(bytes.size(), kDeviceRecordBytes);
  const DeviceRecord back = DecodeDeviceRecord(bytes.data());
  EXPECT_EQ(back.boot_id, r.boot_id);
  EXPECT_EQ(back.bus_id, r.bus_id);
  EXPECT_EQ(back.host, r.host);
  EXPECT_EQ(back.device, 3);
}

TEST(DeviceRecordsTest, TwoRanksOnOneGpuOfOneMachineAreNamed) {
  std::vector<DeviceRecord> all = {{kBoot, "00000000:1A:00.0", "node7", 0},
                                   {kBoot, "00000000:1B:00.0", "node7", 1},
                                   {"other-boot", "00000000:1A:00.0", "node8", 0},
                                   {kBoot, "00000000:1A:00.0", "node7", 0}};
  const Status s = CheckDistinctDevices(all);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ranks 0 and 3 both use GPU 00000000:1A:00.0 of host node7"),
            std::string::npos)
      << s.message();
  all.pop_back();  // the same bus id on another machine is another GPU
  EXPECT_TRUE(CheckDistinctDevices(all).ok());
}

// A peer's record is bytes off the network: fields stop at their width and
// keep printable characters only.
TEST(DeviceRecordsTest, APeersBytesAreBoundedAndPrintable) {
  std::vector<uint8_t> bytes(kDeviceRecordBytes, 'A');
  bytes[3] = '\n';
  const DeviceRecord r = DecodeDeviceRecord(bytes.data());
  EXPECT_EQ(r.boot_id.size(), 48u);
  EXPECT_EQ(r.bus_id.size(), 32u);
  EXPECT_EQ(r.host.size(), 64u);
  EXPECT_EQ(r.boot_id[3], '?');
}

}  // namespace
}  // namespace gradsync::client
