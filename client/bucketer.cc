#include "client/bucketer.h"

#include "client/ring_plan.h"
#include "wire/validate.h"

namespace gradsync::client {
namespace {

uint64_t HashTensor(uint64_t h, const Tensor& t) {
  h = HashName(t.name.data(), t.name.size(), h);
  const uint64_t meta[2] = {t.count, static_cast<uint64_t>(t.dtype)};
  return HashName(reinterpret_cast<const char*>(meta), sizeof(meta), h);
}

}  // namespace

StatusOr<TensorId> Bucketer::Add(const std::string& name, size_t count, DType dtype) {
  if (name.empty()) return InvalidArgumentError("a tensor needs a name");
  if (name.size() > wire::Limits{}.max_string_bytes) {
    return InvalidArgumentError(
        "tensor name '" + name.substr(0, 64) + "...' has " + std::to_string(name.size()) +
        " bytes, at most " + std::to_string(wire::Limits{}.max_string_bytes) + " cross the wire");
  }
  if (count == 0) return InvalidArgumentError("tensor '" + name + "' has no elements");
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return InvalidArgumentError("tensor '" + name + "' has dtype " + DTypeName(dtype) +
                                "; gradients are f32, f16 or bf16");
  }
  for (const Tensor& t : tensors_) {
    if (t.name == name) return InvalidArgumentError("tensor '" + name + "' is already registered");
  }
  Tensor t;
  t.name = name;
  t.count = count;
  t.dtype = dtype;
  tensors_.push_back(std::move(t));
  return static_cast<TensorId>(tensors_.size() - 1);
}

void Bucketer::Build() {
  size_t cap = first_cap_;
  for (size_t i = tensors_.size(); i-- > 0;) {
    Tensor& t = tensors_[i];
    const size_t bytes = t.count * DTypeSize(t.dtype);
    bool fresh = buckets_.empty() || buckets_.back().dtype != t.dtype;
    if (!fresh && buckets_.back().bytes() + bytes > cap) {
      fresh = true;
    }
    if (fresh) {
      if (!buckets_.empty()) cap = cap_;
      Bucket b;
      b.id = static_cast<uint32_t>(buckets_.size());
      b.dtype = t.dtype;
      buckets_.push_back(std::move(b));
    }
    Bucket& b = buckets_.back();
    t.bucket = static_cast<int>(b.id);
    t.offset = b.count;
    b.count += t.count;
    b.tensors.push_back(static_cast<TensorId>(i));
  }
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int>(b.tensors.size());
    uint64_t h = 0;
    for (TensorId id : b.tensors) h = HashTensor(h, tensors_[static_cast<size_t>(id)]);
    b.names_hash = h;
  }
}

}  // namespace gradsync::client
