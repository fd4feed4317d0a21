#include "compression/wire_codec.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/seeded_random.h"
#include "compression/topk_select.h"
#include "compression/wire_util.h"

namespace gradsync::compression {
namespace {

// Keys the partition streams apart from the job-wide seed.
constexpr uint64_t kPartitionSalt = 0x7061727469746E21ull;  // "partitn!"

}  // namespace

StatusOr<wire::Compression> WireCompressionOf(const std::string& name) {
  using wire::Compression;
  static const std::map<std::string, Compression> kFamilies = {
      {"fp16", Compression::Fp16},         {"bf16", Compression::Bf16},
      {"topk", Compression::TopK},         {"topk_fp16", Compression::TopK},
      {"topk_sampled", Compression::TopK}, {"topk_sampled_fp16", Compression::TopK},
      {"randomk", Compression::RandomK},   {"sign", Compression::Sign},
      {"qsgd", Compression::Qsgd},
  };
  auto it = kFamilies.find(name);
  if (it == kFamilies.end()) {
    return NotFoundError("compressor \"" + name +
                         "\" has no wire encoding on the "
                         "parameter-server path");
  }
  return it->second;
}

CompressContext PartitionContext(uint64_t seed, uint64_t step, uint32_t bucket,
                                 uint32_t partition) {
  return CompressContext{SplitMix64(seed ^ kPartitionSalt ^ SplitMix64(partition)), step, bucket};
}

PayloadDecoder::PayloadDecoder() { RegisterBuiltins(&registry_); }

StatusOr<Compressor*> PayloadDecoder::Find(const std::string& codec, wire::ErrorCode* code) {
  auto it = codecs_.find(codec);
  if (it != codecs_.end()) return it->second.get();
  *code = wire::ErrorCode::WrongType;
  StatusOr<CompressorSpec> spec = ParseCompressorSpec(codec);
  if (!spec.ok()) return spec.status();
  StatusOr<wire::Compression> family = WireCompressionOf(spec->name);
  if (!family.ok()) return InvalidArgumentError(family.status().message());
  StatusOr<std::unique_ptr<Compressor>> made = registry_.Create(codec);
  if (!made.ok()) return InvalidArgumentError(made.status().message());
  if (codecs_.size() >= kMaxCodecs) codecs_.clear();
  Compressor* c = made->get();
  codecs_[codec] = std::move(made).value();
  return c;
}

Status PayloadDecoder::Check(const wire::DataBody& d, const std::vector<wire::Payload>& payloads,
                             wire::ErrorCode* code) {
  const size_t n = d.num_elements();
  if (d.dtype() != wire::DType::F32) {
    *code = wire::ErrorCode::WrongType;
    return InvalidArgumentError(std::string("carries ") + wire::EnumNameDType(d.dtype()) +
                                " data; only f32 is taken");
  }
  size_t total = 0;
  for (const wire::Payload& p : payloads) total += p.size;
  const std::string codec = d.codec() != nullptr ? d.codec()->str() : "";
  if (codec.empty()) {
    if (n > total / sizeof(float) || total != n * sizeof(float)) {
      *code = wire::ErrorCode::SizeMismatch;
      return InvalidArgumentError("holds " + std::to_string(total) + " bytes for " +
                                  std::to_string(n) + " f32 elements");
    }
    return OkStatus();
  }
  GS_ASSIGN_OR_RETURN(Compressor * c, Find(codec, code));
  const size_t want = c->WireBytes(n);
  if (total != want) {
    *code = wire::ErrorCode::SizeMismatch;
    return InvalidArgumentError("holds " + std::to_string(total) + " bytes, \"" + codec +
                                "\" writes " + std::to_string(want) + " for " + std::to_string(n) +
                                " elements");
  }
  return OkStatus();
}

Status PayloadDecoder::Decode(const wire::DataBody& d, const std::vector<wire::Payload>& payloads,
                              const CompressContext& ctx, float* out, wire::ErrorCode* code) {
  GS_RETURN_IF_ERROR(Check(d, payloads, code));
  const size_t n = d.num_elements();
  size_t total = 0;
  for (const wire::Payload& p : payloads) total += p.size;
  const std::string codec = d.codec() != nullptr ? d.codec()->str() : "";
  if (codec.empty()) {
    uint8_t* dst = reinterpret_cast<uint8_t*>(out);
    for (const wire::Payload& p : payloads) {
      std::memcpy(dst, p.data, p.size);
      dst += p.size;
    }
    return OkStatus();
  }
  GS_ASSIGN_OR_RETURN(Compressor * c, Find(codec, code));
  const uint8_t* in = payloads.size() == 1 ? payloads[0].data : nullptr;
  if (payloads.size() != 1) {
    joined_.resize(total);
    size_t at = 0;
    for (const wire::Payload& p : payloads) {
      std::memcpy(joined_.data() + at, p.data, p.size);
      at += p.size;
    }
    in = joined_.data();
  }
  Status s = c->Decompress(in, total, n, ctx, out);
  if (!s.ok()) {
    *code = wire::ErrorCode::Malformed;
    return InvalidArgumentError("does not decode as \"" + codec + "\": " + s.message());
  }
  return OkStatus();
}

PayloadEncoder::PayloadEncoder(std::unique_ptr<Compressor> c, CompressorSpec parsed,
                               std::string spec)
    : compressor_(std::move(c)),
      parsed_(std::move(parsed)),
      spec_(std::move(spec)),
      keep_(compressor_->keep_ratio()) {}

std::string PayloadEncoder::CodecWithRatio(double ratio) const {
  // %.17g reads back as the same double.
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", ratio);
  std::string codec = parsed_.name + ":ratio=" + text;
  for (size_t i = 0; i < parsed_.keys.size(); ++i) {  // top-k: ratio, ef, momentum, warmup
    if (parsed_.keys[i] != "ratio" && parsed_.keys[i] != "warmup") {
      codec += "," + parsed_.keys[i] + "=" + parsed_.values[i];
    }
  }
  return codec;
}

StatusOr<std::unique_ptr<PayloadEncoder>> PayloadEncoder::Create(const CompressorRegistry& registry,
                                                                 const std::string& spec) {
  GS_ASSIGN_OR_RETURN(CompressorSpec parsed, ParseCompressorSpec(spec));
  StatusOr<wire::Compression> family = WireCompressionOf(parsed.name);
  if (!family.ok()) return InvalidArgumentError(family.status().message());
  GS_ASSIGN_OR_RETURN(std::unique_ptr<Compressor> c, registry.Create(spec));
  return std::unique_ptr<PayloadEncoder>(new PayloadEncoder(std::move(c), std::move(parsed), spec));
}

StatusOr<wire::Payload> PayloadEncoder::CompressInto(const float* in, size_t n,
                                                     const CompressContext& ctx,
                                                     wire::DataFields* fields, std::string codec) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(compressor_->WireBytes(n));
  GS_RETURN_IF_ERROR(compressor_->Compress(in, n, ctx, bytes->data(), bytes->size()));
  fields->codec = std::move(codec);
  return wire::Payload::Borrow(bytes->data(), bytes->size(), bytes);
}

// EncodeKeeping sets the step's ratio back whatever happens. A warm-up
// step states its own ratio.
StatusOr<wire::Payload> PayloadEncoder::Encode(const float* in, size_t n,
                                               const CompressContext& ctx,
                                               wire::DataFields* fields) {
  if (keep_ != nullptr && keep_->ratio() != parsed_.options.ratio) {
    return CompressInto(in, n, ctx, fields, CodecWithRatio(keep_->ratio()));
  }
  return CompressInto(in, n, ctx, fields, spec_);
}

void PayloadEncoder::MagnitudeKeys(const float* in, size_t n, const CompressContext& ctx,
                                   uint32_t* keys) const {
  const float* values = compressor_->CompressedValues(in, n, ctx.bucket_id, &values_);
  for (size_t i = 0; i < n; ++i) keys[i] = MagnitudeKey(values[i]);
}

StatusOr<wire::Payload> PayloadEncoder::EncodeKeeping(const float* in, size_t n, size_t keep,
                                                      const CompressContext& ctx,
                                                      wire::DataFields* fields, uint32_t at_least) {
  if (keep_ == nullptr || keep < 1 || keep > n) {
    return InvalidArgumentError("\"" + spec_ + "\" cannot keep " + std::to_string(keep) + " of " +
                                std::to_string(n) + " elements");
  }
  // ceil(ratio * n) == keep for ratio = (keep - 1/2) / n, whatever the
  // rounding of the division.
  const double ratio = (static_cast<double>(keep) - 0.5) / static_cast<double>(n);
  const double step_ratio = keep_->ratio();
  GS_RETURN_IF_ERROR(keep_->SetRatio(ratio));
  keep_->HintThreshold(at_least);
  StatusOr<wire::Payload> payload = CompressInto(in, n, ctx, fields, CodecWithRatio(ratio));
  keep_->HintThreshold(0);
  GS_RETURN_IF_ERROR(keep_->SetRatio(step_ratio));
  return payload;
}

std::vector<size_t> SharedKeepCounts(const std::vector<uint32_t>& keys,
                                     const std::vector<size_t>& sizes, double ratio,
                                     uint32_t* threshold_out) {
  std::vector<size_t> keep(sizes.size(), 0);
  const size_t k = KeepCount(ratio, keys.size());
  uint32_t threshold = 0;
  if (k > 0) {
    std::vector<uint32_t> scratch;
    threshold = KthLargestKey(keys.data(), keys.size(), k, &scratch).key;
  }
  size_t at = 0;
  for (size_t p = 0; p < sizes.size(); ++p) {
    const size_t n = sizes[p];
    if (threshold == 0) {
      keep[p] = KeepCount(ratio, n);
    } else {
      for (size_t i = at; i < at + n; ++i) keep[p] += keys[i] >= threshold;
    }
    keep[p] = std::min(n, std::max<size_t>(keep[p], 1));
    at += n;
  }
  if (threshold_out != nullptr) *threshold_out = threshold;
  return keep;
}

}  // namespace gradsync::compression
