#include "client/bucket_compression.h"

#include <algorithm>
#include <cstring>

#include "client/elementwise.h"

namespace gradsync::client {
namespace {

// A host compressor's code of one bucket, data[0, count).
class CompressorCodec final : public BucketCodec {
 public:
  CompressorCodec(compression::Compressor& c, float* data, size_t count,
                  const compression::CompressContext& ctx)
      : c_(c), data_(data), count_(count), ctx_(ctx) {
    shape_.wire_bytes = c.WireBytes(count);
    shape_.summable = c.summable();
    if (shape_.summable) {
      shape_.dtype = c.summable_dtype();
      shape_.elems = shape_.wire_bytes / DTypeSize(shape_.dtype);
    }
  }
  Status Encode(uint8_t* wire) override {
    return c_.Compress(data_, count_, ctx_, wire, shape_.wire_bytes);
  }
  Status Decode(const uint8_t* wire, float* out) override {
    return c_.Decompress(wire, shape_.wire_bytes, count_, ctx_, out);
  }

 private:
  compression::Compressor& c_;
  float* const data_;
  const size_t count_;
  const compression::CompressContext& ctx_;
};

}  // namespace

StatusOr<std::unique_ptr<BucketCompression>> BucketCompression::FromConfig(const Config& config) {
  std::unique_ptr<BucketCompression> bc(new BucketCompression());
  compression::RegisterBuiltins(&bc->registry_);
  GS_ASSIGN_OR_RETURN(bc->default_spec_, config.GetString("compression", "none"));
  GS_ASSIGN_OR_RETURN(int64_t min_bytes, config.GetInt("compression_min_bytes", 65536));
  GS_ASSIGN_OR_RETURN(std::string overrides, config.GetString("compression_overrides", ""));
  if (min_bytes < 0) return InvalidArgumentError("compression_min_bytes must not be negative");
  bc->min_bytes_ = static_cast<size_t>(min_bytes);
  bc->overrides_ = compression::ParseCompressionOverrides(overrides);
  // Refuse bad specs now, not at the first step.
  Status bad = bc->CheckSpec(bc->default_spec_);
  if (!bad.ok()) return InvalidArgumentError("compression: " + bad.message());
  for (const auto& [key, spec] : bc->overrides_) {
    if (spec.empty()) {
      return InvalidArgumentError("compression_overrides entry '" + key + "' has no '=SPEC'");
    }
    Status s = bc->CheckSpec(spec);
    if (!s.ok()) return InvalidArgumentError("compression_overrides " + key + ": " + s.message());
  }
  return bc;
}

Status BucketCompression::Assign(const std::vector<BucketInfo>& buckets) {
  for (const BucketInfo& b : buckets) {
    std::string spec = default_spec_;
    auto own = overrides_.find(std::to_string(b.id));
    if (own != overrides_.end()) {
      spec = own->second;
    } else {
      for (const std::string& name : b.tensor_names) {
        auto it = overrides_.find(name);
        if (it != overrides_.end()) {
          spec = it->second;
          break;
        }
      }
    }
    if (b.dtype != DType::kF32 || b.bytes < min_bytes_) spec = "none";
    specs_[b.id] = spec;
    if (spec == "none") continue;
    if (compression::PowerSgd::Names(spec)) {
      GS_ASSIGN_OR_RETURN(powersgd_[b.id], compression::PowerSgd::Create(spec));
      layouts_[b.id] = b.tensors;
      continue;
    }
    GS_ASSIGN_OR_RETURN(compressors_[b.id], registry_.Create(spec));
  }
  return Status();
}

Status BucketCompression::CheckSpec(const std::string& spec) const {
  if (compression::PowerSgd::Names(spec)) return compression::PowerSgd::Create(spec).status();
  return registry_.Create(spec).status();
}

std::string BucketCompression::SpecOf(uint32_t id) const {
  auto it = specs_.find(id);
  return it == specs_.end() ? "none" : it->second;
}

Status BucketCompression::Reduce(Collectives& backend, uint32_t bucket, float* data, size_t count,
                                 const OpTag& tag, uint64_t seed, Deadline deadline,
                                 Traffic* traffic) {
  const compression::CompressContext ctx{seed, tag.step, bucket};
  auto ps = powersgd_.find(bucket);
  if (ps != powersgd_.end()) {
    return ReducePowerSgd(backend, *ps->second, data, count, tag, ctx, deadline, traffic);
  }
  auto it = compressors_.find(bucket);
  if (it == compressors_.end()) {
    *traffic = Traffic{count * sizeof(float), count * sizeof(float), false};
    return backend.AllReduce(data, count, DType::kF32, ReduceOp::kAverage, tag, deadline);
  }
  compression::Compressor& c = *it->second;
  c.BeginStep(tag.step);  // every rank the same step: the same wire size
  CompressorCodec code(c, data, count, ctx);
  bool in_wire = false;  // only codes with EncodeDivided leave it there
  return ReduceWire(code, data, count, space_, backend, tag, deadline, traffic, &in_wire);
}

namespace {

// The rest of a PowerSGD reduction that `p` began (its first factor `f`):
// each factor summed through `backend` under `tag` in turn, then the
// average into `data`.
Status SumFactors(compression::PowerSgd& p, compression::PowerSgd::Factor f, float* data,
                  Collectives& backend, const OpTag& tag, Deadline deadline) {
  if (f.count == 0) return Status();
  GS_RETURN_IF_ERROR(
      backend.AllReduce(f.data, f.count, DType::kF32, ReduceOp::kSum, tag, deadline));
  const compression::PowerSgd::Factor q = p.Middle();
  GS_RETURN_IF_ERROR(
      backend.AllReduce(q.data, q.count, DType::kF32, ReduceOp::kSum, tag, deadline));
  p.Finish(data, backend.world_size());
  return Status();
}

}  // namespace

Status BucketCompression::ReducePowerSgd(Collectives& backend, compression::PowerSgd& p,
                                         float* data, size_t count, const OpTag& tag,
                                         const compression::CompressContext& ctx, Deadline deadline,
                                         Traffic* traffic) {
  bool done = false;
  GS_RETURN_IF_ERROR(ReducePowerSgdTensors(backend, p, data, tag, ctx, deadline, traffic, &done));
  if (done) return Status();
  const size_t bytes = p.WireBytes(count);
  *traffic = Traffic{bytes, bytes, false};
  // Both factors travel under the bucket's tag, one after the other.
  return SumFactors(p, p.Begin(data, count, ctx), data, backend, tag, deadline);
}

Status BucketCompression::ReducePowerSgdTensors(Collectives& backend, compression::PowerSgd& p,
                                                float* data, const OpTag& tag,
                                                const compression::CompressContext& ctx,
                                                Deadline deadline, Traffic* traffic, bool* done) {
  const std::vector<BucketTensor>& layout = layouts_[ctx.bucket_id];
  auto is_matrix = [](const BucketTensor& t) { return t.rows >= 2 && t.cols >= 2; };
  *done = std::any_of(layout.begin(), layout.end(), is_matrix);
  if (!*done) return Status();
  // Every factor, and then the vectors, travel under the bucket's tag, one
  // after the other, in bucket order on every rank.
  size_t bytes = 0;
  scratch_.clear();
  for (size_t i = 0; i < layout.size(); ++i) {
    const BucketTensor& t = layout[i];
    if (!is_matrix(t)) {
      scratch_.insert(scratch_.end(), data + t.offset, data + t.offset + t.count);
      continue;
    }
    const compression::PowerSgdShape shape{t.rows, t.cols};
    float* at = data + t.offset;
    GS_RETURN_IF_ERROR(SumFactors(p, p.BeginTensor(at, shape, ctx, static_cast<uint32_t>(i)), at,
                                  backend, tag, deadline));
    bytes += (t.rows + t.cols) * p.RankForMatrix(shape) * sizeof(float);
  }
  if (!scratch_.empty()) {
    GS_RETURN_IF_ERROR(backend.AllReduce(scratch_.data(), scratch_.size(), DType::kF32,
                                         ReduceOp::kAverage, tag, deadline));
    size_t at = 0;
    for (const BucketTensor& t : layout) {
      if (is_matrix(t)) continue;
      std::copy(scratch_.begin() + static_cast<std::ptrdiff_t>(at),
                scratch_.begin() + static_cast<std::ptrdiff_t>(at + t.count), data + t.offset);
      at += t.count;
    }
    bytes += scratch_.size() * sizeof(float);
  }
  *traffic = Traffic{bytes, bytes, false};
  return Status();
}

}  // namespace gradsync::client
