#include "client/device_records.h"

#include <algorithm>
#include <cstring>

namespace gradsync::client {
namespace {

constexpr size_t kBoot = 48, kBus = 32, kHost = 64;

void Put(const std::string& s, size_t width, uint8_t* out) {
  std::memcpy(out, s.data(), std::min(s.size(), width));
}

std::string Get(const uint8_t* in, size_t width) {
  std::string s;
  for (size_t i = 0; i < width && in[i] != 0; ++i) {
    const char c = static_cast<char>(in[i]);
    s += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return s;
}

}  // namespace

std::vector<uint8_t> EncodeDeviceRecord(const DeviceRecord& r) {
  std::vector<uint8_t> out(kDeviceRecordBytes, 0);
  Put(r.boot_id, kBoot, out.data());
  Put(r.bus_id, kBus, out.data() + kBoot);
  Put(r.host, kHost, out.data() + kBoot + kBus);
  std::memcpy(out.data() + kBoot + kBus + kHost, &r.device, sizeof(r.device));
  return out;
}

DeviceRecord DecodeDeviceRecord(const uint8_t* bytes) {
  DeviceRecord r;
  r.boot_id = Get(bytes, kBoot);
  r.bus_id = Get(bytes + kBoot, kBus);
  r.host = Get(bytes + kBoot + kBus, kHost);
  std::memcpy(&r.device, bytes + kBoot + kBus + kHost, sizeof(r.device));
  return r;
}

Status CheckDistinctDevices(const std::vector<DeviceRecord>& all) {
  for (size_t a = 0; a < all.size(); ++a) {
    for (size_t b = a + 1; b < all.size(); ++b) {
      if (all[a].boot_id.empty() || all[a].boot_id != all[b].boot_id ||
          all[a].bus_id != all[b].bus_id) {
        continue;
      }
      return InvalidArgumentError(
          "ranks " + std::to_string(a) + " and " + std::to_string(b) + " both use GPU " +
          all[a].bus_id + " of host " + all[a].host + " (cuda_device " +
          std::to_string(all[a].device) + " and " + std::to_string(all[b].device) +
          "): each rank of an NCCL job needs a GPU of its own (cuda_device defaults to the "
          "worker's local rank on its host)");
    }
  }
  return OkStatus();
}

}  // namespace gradsync::client
