#include "client/bucket_memory.h"

#include <cstdlib>
#include <cstring>

#include "client/elementwise.h"

namespace gradsync::client {
namespace {

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

HostBuffer AlignedBuffer(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  return HostBuffer(static_cast<uint8_t*>(std::aligned_alloc(64, rounded == 0 ? 64 : rounded)));
}

class HostBuckets : public BucketMemory {
 public:
  bool device() const override { return false; }
  Status CheckPointer(const void*, const std::string&) const override { return Status(); }
  Status Allocate(const std::vector<size_t>& bucket_bytes) override {
    for (size_t bytes : bucket_bytes) {
      buckets_.push_back(AlignedBuffer(bytes));
      if (buckets_.back() == nullptr) {
        return FailedPreconditionError("allocating " + std::to_string(bytes) +
                                       " bytes of host memory for a bucket failed");
      }
    }
    return Status();
  }
  Status Stage(int bucket, size_t offset_bytes, const void* data, size_t count, DType dtype,
               bool add, void* stream, Staging) override {
    if (stream != nullptr) return InvalidArgumentError("host buckets take no CUDA stream");
    uint8_t* region = Bucket(bucket) + offset_bytes;
    if (add) {
      AddInto(region, static_cast<const uint8_t*>(data), count, dtype);
    } else {
      std::memcpy(region, data, count * DTypeSize(dtype));
    }
    return Status();
  }
  bool Reduces(int, DType, const std::string&, const Collectives&) override { return false; }
  Status Reduce(int, size_t, DType, const std::string&, Collectives&, const OpTag&, uint64_t,
                Deadline, WireTraffic*) override {
    return InternalError("host buckets are averaged through HostView");
  }
  StatusOr<uint8_t*> HostView(int bucket, size_t, bool, Deadline) override {
    return Bucket(bucket);
  }
  Status EndHostView(int, size_t) override { return Status(); }
  StatusOr<std::shared_ptr<std::vector<uint8_t>>> EncodePartition(
      int, uint32_t, size_t, size_t, const std::string&, const compression::CompressContext&,
      Deadline) override {
    return UnimplementedError("host buckets have no device encoder");
  }
  Status Unstage(int bucket, const std::vector<Slice>& slices, DType) override {
    for (const Slice& s : slices) std::memcpy(s.data, Bucket(bucket) + s.offset_bytes, s.bytes);
    return Status();
  }
  Status Wait(Deadline) override { return Status(); }
  Status WaitStaged(int, Deadline) override { return Status(); }
  Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return Status();
  }
  StatusOr<uint8_t*> Scratch(size_t) override {
    return FailedPreconditionError("host buckets have no device memory for a collective");
  }
  size_t DeviceBytes() const override { return 0; }

 private:
  uint8_t* Bucket(int bucket) const { return buckets_.at(static_cast<size_t>(bucket)).get(); }

  std::vector<HostBuffer> buckets_;
};

}  // namespace

std::unique_ptr<BucketMemory> MakeHostBuckets() { return std::make_unique<HostBuckets>(); }

}  // namespace gradsync::client
