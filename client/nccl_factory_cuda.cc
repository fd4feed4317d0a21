#include <cuda_runtime_api.h>
#include <unistd.h>

#include <utility>

#include "client/device_records.h"
#include "client/nccl_collectives.h"
#include "client/nccl_factory.h"
#include "wire/shm_link.h"

namespace gradsync::client {
namespace {

// The bucket id of the device-record exchange on the ring (no bucket has it).
constexpr uint32_t kDeviceRecordsBucket = 0xFFFFFFFEu;

StatusOr<DeviceRecord> ThisRank(int device) {
  char bus[32] = {};
  const cudaError_t err = cudaDeviceGetPCIBusId(bus, sizeof(bus), device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return InternalError("cudaDeviceGetPCIBusId(" + std::to_string(device) +
                         ") failed: " + cudaGetErrorString(err));
  }
  char host[65] = {};
  gethostname(host, sizeof(host) - 1);
  return DeviceRecord{wire::BootId(), bus, host, device};
}

}  // namespace

StatusOr<std::unique_ptr<Collectives>> MakeNcclCollectives(Session* session, int device,
                                                           Collectives* exchange,
                                                           Deadline deadline) {
  if (exchange != nullptr && exchange->world_size() > 1) {
    GS_ASSIGN_OR_RETURN(DeviceRecord mine, ThisRank(device));
    const std::vector<uint8_t> bytes = EncodeDeviceRecord(mine);
    const size_t world = static_cast<size_t>(exchange->world_size());
    std::vector<uint8_t> all(world * kDeviceRecordBytes);
    GS_RETURN_IF_ERROR(exchange->AllGather(bytes.data(), bytes.size(), all.data(),
                                           OpTag{0, kDeviceRecordsBucket, 0, 0}, deadline));
    std::vector<DeviceRecord> records;
    for (size_t r = 0; r < world; ++r) {
      records.push_back(DecodeDeviceRecord(all.data() + r * kDeviceRecordBytes));
    }
    GS_RETURN_IF_ERROR(CheckDistinctDevices(records));
  }
  GS_ASSIGN_OR_RETURN(std::unique_ptr<NcclCollectives> nccl,
                      NcclCollectives::Join(session, device, deadline));
  return std::unique_ptr<Collectives>(std::move(nccl));
}

}  // namespace gradsync::client
