// Bucketer: the Communicator's registry of gradient tensors and the buckets
// they are packed into, with the per-step state of each.
//
// Build() assigns buckets as PyTorch DDP does: tensors in reverse
// registration order, the first bucket up to `first_cap_bytes`, later ones up
// to `cap_bytes`, a new bucket whenever the dtype changes; a tensor larger
// than the cap gets a bucket of its own. Each bucket owns one contiguous,
// 64-byte aligned buffer that its tensors occupy back to back.
//
// Thread-safety: none; the Communicator guards it with its mutex.
#ifndef GRADSYNC_CLIENT_BUCKETER_H_
#define GRADSYNC_CLIENT_BUCKETER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "gradsync/communicator.h"

namespace gradsync::client {

struct Tensor {
  std::string name;
  size_t count = 0;
  DType dtype = DType::kF32;
  int bucket = -1;
  size_t offset = 0;  // first element within its bucket
  // The matrix view of a tensor whose shape was registered: rows = the
  // first dimension, cols = the product of the others; 0 x 0 without one.
  size_t rows = 0;
  size_t cols = 0;
  // Per step:
  bool marked = false;     // marked ready in this (micro-)step
  bool holds_sum = false;  // its bucket region holds earlier micro-steps' sum
  void* data = nullptr;    // where the synchronised gradient goes
  std::shared_ptr<SyncHandle::State> handle;
};

struct Bucket {
  uint32_t id = 0;
  DType dtype = DType::kF32;
  std::vector<TensorId> tensors;  // in the order they sit in the buffer
  size_t count = 0;               // elements
  uint64_t names_hash = 0;        // names, sizes and dtypes of its tensors
  int pending = 0;                // tensors not yet marked ready this step
  bool in_flight = false;         // the engine has not finished with it

  size_t bytes() const { return count * DTypeSize(dtype); }
};

class Bucketer {
 public:
  Bucketer() = default;
  Bucketer(size_t first_cap_bytes, size_t cap_bytes)
      : first_cap_(first_cap_bytes), cap_(cap_bytes) {}

  // InvalidArgument for an empty, duplicate or too long name (more than
  // wire::Limits::max_string_bytes), zero elements, or a dtype that cannot
  // be reduced.
  StatusOr<TensorId> Add(const std::string& name, size_t count, DType dtype);
  // Assigns buckets (bucket ids are their indices; their memory is a
  // BucketMemory's, client/bucket_memory.h). Once.
  void Build();

  std::vector<Tensor>& tensors() { return tensors_; }
  Tensor& tensor(TensorId id) { return tensors_[static_cast<size_t>(id)]; }
  std::vector<Bucket>& buckets() { return buckets_; }

 private:
  size_t first_cap_ = size_t{1} << 20;
  size_t cap_ = size_t{25} << 20;
  std::vector<Tensor> tensors_;
  std::vector<Bucket> buckets_;
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_BUCKETER_H_
