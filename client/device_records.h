// DeviceRecord: which GPU a rank of an NCCL job uses, as the ranks tell
// each other before NCCL starts, so that two ranks on one GPU are refused
// with both named (NCCL would fail on its own, or the job would run two
// ranks on one GPU).
//
// A record is kDeviceRecordBytes of fixed fields: the machine's boot id
// (two processes with the same boot id share the machine's GPUs), the GPU's
// PCI bus id, the host name and the cuda_device index, each NUL-padded.
// Records come from peers: DecodeDeviceRecord bounds every field and keeps
// printable characters only.
#ifndef GRADSYNC_CLIENT_DEVICE_RECORDS_H_
#define GRADSYNC_CLIENT_DEVICE_RECORDS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace gradsync::client {

struct DeviceRecord {
  std::string boot_id;
  std::string bus_id;  // cudaDeviceGetPCIBusId
  std::string host;
  int32_t device = 0;  // cuda_device
};

inline constexpr size_t kDeviceRecordBytes = 48 + 32 + 64 + 4;

// The record's bytes (fields cut to their width).
std::vector<uint8_t> EncodeDeviceRecord(const DeviceRecord& r);
// A record from kDeviceRecordBytes bytes.
DeviceRecord DecodeDeviceRecord(const uint8_t* bytes);
// OK when no two ranks' records name the same GPU of the same machine;
// InvalidArgument naming the first two ranks that do otherwise. `all`:
// every rank's record, by rank.
Status CheckDistinctDevices(const std::vector<DeviceRecord>& all);

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_DEVICE_RECORDS_H_
