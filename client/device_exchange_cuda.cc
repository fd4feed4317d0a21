// CudaGradients (client/device_gradients_cuda.h): averaging a bucket, and
// the device compressors' exchange.
#include <cstring>

#include "client/device_gradients_cuda.h"
#include "compression/registry.h"
#include "compression/topk_compressor.h"
#include "compression/wire_codec.h"
#include "kernels/compress_cpu.h"
#include "kernels/compress_kernels.h"
#include "kernels/reduce_cuda.h"

namespace gradsync::client {
namespace {

StatusOr<Codec> CodecOf(const std::string& spec) {
  Codec c;
  if (spec == "none") return c;
  GS_ASSIGN_OR_RETURN(compression::CompressorSpec parsed, compression::ParseCompressorSpec(spec));
  const std::string& name = parsed.name;
  if (parsed.options.momentum != 0) {
    return UnimplementedError("\"" + spec +
                              "\": error feedback with momentum runs on host gradients only "
                              "(gradient_device=cpu)");
  }
  if (parsed.options.warmup != 0) {
    return UnimplementedError("\"" + spec +
                              "\": top-k's warm-up runs on host gradients only "
                              "(gradient_device=cpu)");
  }
  c.ef = parsed.options.error_feedback;
  c.ratio = parsed.options.ratio;
  c.chunk = parsed.options.chunk;
  c.levels = parsed.options.levels;
  // The family, from the one table of compressor names (the PS wire's);
  // one without a wire family (PowerSGD) has no device form either.
  const StatusOr<wire::Compression> known = compression::WireCompressionOf(name);
  if (!known.ok()) {
    c.kind = Codec::kHost;
    return c;
  }
  const wire::Compression family = *known;
  switch (family) {
    case wire::Compression::Fp16:
    case wire::Compression::Bf16:
      c.kind = Codec::kHalf;
      c.half = family == wire::Compression::Fp16 ? kernels::Float16Format::kFp16
                                                 : kernels::Float16Format::kBf16;
      break;
    case wire::Compression::TopK:
      // The sampled selection picks exactly the top-k set: same wire bytes.
      c.kind = Codec::kTopK;
      c.values = compression::TopKCompressor::ValuesOf(name) == compression::TopKValues::kFp16
                     ? kernels::SparseValueFormat::kF16
                     : kernels::SparseValueFormat::kF32;
      break;
    case wire::Compression::RandomK:
      c.kind = Codec::kRandomK;
      break;
    case wire::Compression::Sign:
      c.kind = Codec::kSign;
      break;
    case wire::Compression::Qsgd:
      c.kind = Codec::kQsgd;
      break;
    default:
      c.kind = Codec::kHost;
  }
  return c;
}

// Top-k wire bytes of one rank, as the CPU decompressor checks them: k
// indices strictly ascending and below n.
Status CheckSparse(const uint8_t* wire, size_t k, size_t n, int rank) {
  int64_t last = -1;
  for (size_t j = 0; j < k; ++j) {
    int32_t index;
    std::memcpy(&index, wire + 4 * j, 4);
    if (index <= last || static_cast<size_t>(index) >= n) {
      return InvalidArgumentError("top-k bytes of rank " + std::to_string(rank) + ": index " +
                                  std::to_string(index) + " at " + std::to_string(j) +
                                  " is out of range or not ascending (n = " + std::to_string(n) +
                                  ")");
    }
    last = index;
  }
  return Status();
}

}  // namespace

// What a device codec makes of data[0, n) (client/wire_reduce.h): the
// kernels of its kind on the gradients' stream. Filled by MakeCode.
class DeviceCodec final : public BucketCodec {
 public:
  Status Encode(uint8_t* w) override {
    switch (c_.kind) {
      case Codec::kHalf: {
        auto* wire = reinterpret_cast<uint16_t*>(w);
        if (c_.ef)
          return kernels::EfFloat16Cuda(c_.half, data_, residual_, has_, n_, wire, stream_);
        return c_.half == kernels::Float16Format::kFp16
                   ? kernels::FloatToHalfCuda(data_, wire, n_, stream_)
                   : kernels::FloatToBf16Cuda(data_, wire, n_, stream_);
      }
      case Codec::kRandomK: {
        auto* values = reinterpret_cast<float*>(w);
        if (c_.ef) {
          return kernels::EfRandomKCuda(data_, residual_, has_, n_, idx_, k_, scale_, values,
                                        stream_);
        }
        return kernels::GatherCuda(data_, idx_, k_, values, stream_);
      }
      case Codec::kTopK: {
        auto* idx = reinterpret_cast<int32_t*>(w);
        if (c_.ef) {
          return kernels::EfTopKCuda(data_, residual_, has_, n_, k_, c_.values, idx, w + 4 * k_,
                                     workspace_, ws_, stream_);
        }
        return kernels::TopKCuda(data_, n_, k_, c_.values, idx, w + 4 * k_, workspace_, ws_,
                                 stream_);
      }
      case Codec::kSign: {
        auto* scales = reinterpret_cast<float*>(w);
        uint8_t* bits = w + 4 * chunks_;
        if (c_.ef) {
          return kernels::EfSignCuda(data_, residual_, has_, n_, c_.chunk, scales, bits, stream_);
        }
        return kernels::SignEncodeCuda(data_, n_, c_.chunk, scales, bits, stream_);
      }
      case Codec::kQsgd: {
        auto* norms = reinterpret_cast<float*>(w);
        auto* q = reinterpret_cast<int8_t*>(w + 4 * chunks_);
        if (c_.ef) {
          return kernels::EfQsgdCuda(data_, residual_, has_, n_, c_.chunk, c_.levels, key_, norms,
                                     q, stream_);
        }
        return kernels::QsgdEncodeCuda(data_, n_, c_.chunk, c_.levels, key_, norms, q, stream_);
      }
      default:
        return InternalError("no device form for this compressor");
    }
  }

  bool EncodesDivided() const override { return c_.ResultInWire(); }
  Status EncodeDivided(uint8_t* w, float divisor) override {
    if (!c_.ResultInWire()) return BucketCodec::EncodeDivided(w, divisor);
    return kernels::DividedToHalfCuda(data_, divisor, reinterpret_cast<uint16_t*>(w), n_, stream_);
  }

  Status Check(const uint8_t* w, int rank) const override {
    if (c_.kind == Codec::kTopK) return CheckSparse(w, k_, n_, rank);
    if (c_.kind != Codec::kQsgd) return Status();  // every bit pattern decodes
    const auto* q = reinterpret_cast<const int8_t*>(w + 4 * chunks_);
    for (size_t i = 0; i < n_; ++i) {
      if (q[i] > c_.levels || q[i] < -c_.levels) {
        return InvalidArgumentError("qsgd bytes of rank " + std::to_string(rank) + ": level " +
                                    std::to_string(q[i]) + " at " + std::to_string(i) +
                                    " exceeds " + std::to_string(c_.levels));
      }
    }
    return Status();
  }

  Status Decode(const uint8_t* w, float* out) override {
    switch (c_.kind) {
      case Codec::kHalf: {
        auto* wire = reinterpret_cast<const uint16_t*>(w);
        return c_.half == kernels::Float16Format::kFp16
                   ? kernels::HalfToFloatCuda(wire, out, n_, stream_)
                   : kernels::Bf16ToFloatCuda(wire, out, n_, stream_);
      }
      case Codec::kRandomK:
        return kernels::ScatterCuda(reinterpret_cast<const float*>(w), idx_, k_, scale_, n_, out,
                                    stream_);
      case Codec::kTopK:
        return kernels::SparseDecompressCuda(reinterpret_cast<const int32_t*>(w), w + 4 * k_,
                                             c_.values, k_, n_, out, stream_);
      case Codec::kSign:
        return kernels::SignDecodeCuda(reinterpret_cast<const float*>(w), w + 4 * chunks_, n_,
                                       c_.chunk, out, stream_);
      case Codec::kQsgd:
        return kernels::QsgdDecodeCuda(reinterpret_cast<const float*>(w),
                                       reinterpret_cast<const int8_t*>(w + 4 * chunks_), n_,
                                       c_.chunk, c_.levels, out, stream_);
      default:
        return InternalError("no device form for this compressor");
    }
  }

 private:
  friend class CudaGradients;
  Codec c_;
  float* data_ = nullptr;
  size_t n_ = 0;
  float* residual_ = nullptr;
  bool has_ = false;
  cudaStream_t stream_ = nullptr;
  size_t chunks_ = 0;              // sign and qsgd: scales or norms
  size_t k_ = 0;                   // top-k and random-k: values kept
  const uint32_t* idx_ = nullptr;  // random-k: the indices, on the device
  float scale_ = 1.0f;             // random-k
  uint8_t* workspace_ = nullptr;   // top-k
  size_t ws_ = 0;
  uint64_t key_ = 0;  // qsgd
};

StatusOr<CudaGradients::State*> CudaGradients::StateOf(int bucket, const std::string& spec) {
  State& st = *state_.at(static_cast<size_t>(bucket));
  if (st.spec != spec) {
    GS_ASSIGN_OR_RETURN(st.codec, CodecOf(spec));
    st.spec = spec;
  }
  return &st;
}

namespace {

// Whether a bucket of `kind` stays on the device: its codec has a device
// form, or it goes uncompressed to a backend that takes device memory.
bool StaysOnDevice(Codec::Kind kind, const Collectives& backend) {
  return kind != Codec::kHost && (kind != Codec::kNone || backend.takes_device_memory());
}

// What a bucket of `dtype` is coded as: only f32 buckets are compressed.
Codec::Kind KindOf(const Codec& codec, DType dtype) {
  return dtype == DType::kF32 ? codec.kind : Codec::kNone;
}

}  // namespace

bool CudaGradients::Reduces(int bucket, DType dtype, const std::string& spec,
                            const Collectives& backend) {
  StatusOr<State*> st = StateOf(bucket, spec);
  if (!st.ok()) return true;  // Reduce says what is wrong with the spec
  return StaysOnDevice(KindOf((*st)->codec, dtype), backend);
}

Status CudaGradients::Reduce(int bucket, size_t count, DType dtype, const std::string& spec,
                             Collectives& backend, const OpTag& tag, uint64_t seed,
                             Deadline deadline, WireTraffic* traffic) {
  GS_RETURN_IF_ERROR(Select());
  GS_RETURN_IF_ERROR(AfterStaged(bucket));
  wire_result_ = -1;
  GS_ASSIGN_OR_RETURN(State * state, StateOf(bucket, spec));
  State& st = *state;
  const Codec::Kind kind = KindOf(st.codec, dtype);
  if (!StaysOnDevice(kind, backend)) {
    return InternalError("bucket " + std::to_string(bucket) +
                         " is averaged through its host view (Reduces)");
  }
  if (kind == Codec::kNone) {
    const size_t bytes = count * DTypeSize(dtype);
    *traffic = WireTraffic{bytes, bytes, false};
    GS_RETURN_IF_ERROR(Wait(deadline));
    return backend.AllReduce(Bucket(bucket), count, dtype, ReduceOp::kAverage, tag, deadline);
  }
  auto* data = reinterpret_cast<float*>(Bucket(bucket));
  if (st.codec.ef) GS_RETURN_IF_ERROR(st.residual.Reserve(count * sizeof(float), "a residual"));
  const kernels::SeedContext ctx{seed, tag.step, tag.bucket};
  bool in_wire = false;
  Status s = ReduceCompressed(st, data, count, ctx, backend, tag, deadline, traffic, &in_wire);
  if (st.codec.ef) st.has_residual = true;
  if (s.ok() && in_wire) wire_result_ = bucket;  // Unstage widens it
  return s;
}

StatusOr<uint8_t*> CudaGradients::HostView(int bucket, size_t bytes, bool copy_in,
                                           Deadline deadline) {
  GS_RETURN_IF_ERROR(Select());
  GS_RETURN_IF_ERROR(AfterStaged(bucket));
  wire_result_ = -1;
  GS_RETURN_IF_ERROR(mirror_.Reserve(bytes, "the host copy of a bucket"));
  if (copy_in) {
    GS_RETURN_IF_ERROR(ToHost(mirror_.get(), Bucket(bucket), bytes, deadline));
  } else {
    GS_RETURN_IF_ERROR(Wait(deadline));  // earlier results still being copied from mirror_
  }
  return mirror_.get();
}

Status CudaGradients::EndHostView(int bucket, size_t bytes) {
  return ToDevice(Bucket(bucket), mirror_.get(), bytes);
}

StatusOr<std::shared_ptr<std::vector<uint8_t>>> CudaGradients::EncodePartition(
    int bucket, uint32_t partition, size_t offset, size_t count, const std::string& spec,
    const compression::CompressContext& ctx, Deadline deadline) {
  GS_RETURN_IF_ERROR(Select());
  GS_RETURN_IF_ERROR(AfterStaged(bucket));
  std::unique_ptr<State>& slot = partitions_[{bucket, partition}];
  if (slot == nullptr) slot = std::make_unique<State>();
  State& st = *slot;
  if (st.spec != spec) {
    GS_ASSIGN_OR_RETURN(st.codec, CodecOf(spec));
    st.spec = spec;
  }
  if (st.codec.kind == Codec::kNone || st.codec.kind == Codec::kHost) {
    return InvalidArgumentError("compression \"" + spec + "\" has no device form");
  }
  if (st.codec.ef) GS_RETURN_IF_ERROR(st.residual.Reserve(count * sizeof(float), "a residual"));
  auto* data = reinterpret_cast<float*>(Bucket(bucket)) + offset;
  DeviceCodec code;
  GS_RETURN_IF_ERROR(MakeCode(st.codec, data, count, reinterpret_cast<float*>(st.residual.get()),
                              st.has_residual,
                              kernels::SeedContext{ctx.seed, ctx.step, ctx.bucket_id}, &code));
  const size_t wire_bytes = code.shape().wire_bytes;
  GS_RETURN_IF_ERROR(wire_.Reserve(wire_bytes + 4, "compressed bytes"));
  GS_RETURN_IF_ERROR(code.Encode(wire_.get()));
  if (st.codec.ef) st.has_residual = true;
  auto bytes = std::make_shared<std::vector<uint8_t>>(wire_bytes);
  GS_RETURN_IF_ERROR(wire_host_.Reserve(wire_bytes + 4, "compressed bytes"));
  GS_RETURN_IF_ERROR(ToHost(wire_host_.get(), wire_.get(), wire_bytes, deadline));
  if (!bytes->empty()) std::memcpy(bytes->data(), wire_host_.get(), bytes->size());
  return bytes;
}

Status CudaGradients::ToHost(uint8_t* host, const uint8_t* dev, size_t bytes, Deadline deadline) {
  GS_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_),
                          "copying to the host"));
  return Wait(deadline);
}

Status CudaGradients::ToDevice(uint8_t* dev, const uint8_t* host, size_t bytes) {
  return Cuda(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_),
              "copying to the GPU");
}

Status CudaGradients::MakeCode(const Codec& c, float* data, size_t n, float* residual, bool has,
                               const kernels::SeedContext& ctx, DeviceCodec* code) {
  *code = DeviceCodec();
  code->c_ = c;
  code->data_ = data;
  code->n_ = n;
  code->residual_ = residual;
  code->has_ = has;
  code->stream_ = stream_;
  code->chunks_ = c.chunk > 0 ? kernels::NumChunks(n, c.chunk) : 0;
  BucketCodec::Shape& shape = code->shape_;
  switch (c.kind) {
    case Codec::kHalf:
      shape.summable = true;
      shape.dtype = c.half == kernels::Float16Format::kFp16 ? DType::kF16 : DType::kBF16;
      shape.elems = n;
      shape.wire_bytes = 2 * n;
      return Status();
    case Codec::kRandomK: {
      // Every rank draws the same indices from the context, on the host.
      // Unbiased (n / k) alone; with error feedback the dropped part is
      // carried instead (compression/registry.cc), so the scale is 1.
      const size_t k = kernels::SparseKeepCount(c.ratio, n);
      const std::vector<uint32_t> indices = kernels::RandomKIndicesCpu(ctx, n, k);
      GS_RETURN_IF_ERROR(indices_.Reserve(4 * k + 4, "random-k indices"));
      auto* idx = reinterpret_cast<uint32_t*>(indices_.get());
      // From pageable memory: staged before the call returns.
      GS_RETURN_IF_ERROR(
          Cuda(cudaMemcpyAsync(idx, indices.data(), 4 * k, cudaMemcpyHostToDevice, stream_),
               "copying random-k indices to the GPU"));
      code->k_ = k;
      code->idx_ = idx;
      code->scale_ = c.ef ? 1.0f : kernels::RandomKScale(n, k);
      shape.summable = true;
      shape.dtype = DType::kF32;
      shape.elems = k;
      shape.wire_bytes = 4 * k;
      return Status();
    }
    case Codec::kTopK: {
      const size_t k = kernels::SparseKeepCount(c.ratio, n);
      const size_t vb = c.values == kernels::SparseValueFormat::kF16 ? 2 : 4;
      code->ws_ = kernels::TopKWorkspaceBytes(n);
      GS_RETURN_IF_ERROR(workspace_.Reserve(code->ws_, "the top-k workspace"));
      code->workspace_ = workspace_.get();
      code->k_ = k;
      shape.wire_bytes = k * (4 + vb);
      return Status();
    }
    case Codec::kSign:
      shape.wire_bytes = 4 * code->chunks_ + (n + 7) / 8;
      return Status();
    case Codec::kQsgd:
      code->key_ = kernels::QsgdKey(ctx);
      shape.wire_bytes = 4 * code->chunks_ + n;
      return Status();
    default:
      return InternalError("no device form for this compressor");
  }
}

Status CudaGradients::ReduceCompressed(State& st, float* data, size_t n,
                                       const kernels::SeedContext& ctx, Collectives& backend,
                                       const OpTag& tag, Deadline deadline, WireTraffic* traffic,
                                       bool* in_wire) {
  DeviceCodec code;
  GS_RETURN_IF_ERROR(MakeCode(st.codec, data, n, reinterpret_cast<float*>(st.residual.get()),
                              st.has_residual, ctx, &code));
  return ReduceWire(code, data, n, space_, backend, tag, deadline, traffic, in_wire);
}

StatusOr<uint8_t*> CudaGradients::Space::Buffer(Slot slot, size_t bytes) {
  CudaGradients& g = *owner_;
  // Device or pinned memory, grown to `bytes`.
  auto reserved = [bytes](auto& buffer, const char* what) -> StatusOr<uint8_t*> {
    GS_RETURN_IF_ERROR(buffer.Reserve(bytes, what));
    return buffer.get();
  };
  switch (slot) {
    case Slot::kWire:
      return reserved(g.wire_, "compressed bytes");
    case Slot::kGathered:
      return reserved(g.gathered_, "gathered compressed bytes");
    case Slot::kScratch:
      return reserved(g.scratch_, "decompression scratch");
    case Slot::kHostWire:
      return reserved(g.wire_host_, "compressed bytes");
    case Slot::kHostGathered:
      return reserved(g.gathered_host_, "gathered compressed bytes");
  }
  return InternalError("no such reduce buffer");
}

Status CudaGradients::Space::Divide(float* data, size_t n, int divisor) {
  return kernels::DivideFloatCuda(data, n, static_cast<float>(divisor), owner_->stream_);
}

Status CudaGradients::Space::SumInto(float* data, const float* add, size_t n) {
  return kernels::SumIntoCuda(data, add, n, owner_->stream_);
}

StatusOr<const uint8_t*> CudaGradients::Space::Aligned(const uint8_t* part, size_t bytes,
                                                       uint8_t* aligned) {
  if (reinterpret_cast<uintptr_t>(part) % 4 == 0) return part;
  GS_RETURN_IF_ERROR(
      Cuda(cudaMemcpyAsync(aligned, part, bytes, cudaMemcpyDeviceToDevice, owner_->stream_),
           "realigning compressed bytes"));
  return static_cast<const uint8_t*>(aligned);
}

}  // namespace gradsync::client
