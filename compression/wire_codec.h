// Compressed payloads of the parameter-server path, where every receiver
// decompresses what one sender compressed.
//
// A compressed Push (or Reply) carries the sender's full compressor spec in
// DataBody.codec ("topk:ratio=0.01,ef=1"); its family is the spec's name's
// (WireCompressionOf). The receiver builds a compressor
// from the spec only to decompress: error-feedback residuals stay with the
// sender, but the spec keeps "ef" because it changes the format's meaning
// (random-k drops its n/k scaling under error feedback).
//
// Each partition of a bucket is compressed on its own, with its own
// compressor instance (so its own residual) and its own context
// (PartitionContext), so that a shard decompresses the partitions it owns
// without seeing the others. Top-k shares one budget over the bucket: the
// sender finds the k = ceil(ratio * n) largest magnitudes of the whole
// bucket (after error feedback) and each partition keeps those it holds,
// stating its own ratio in the spec it sends (SharedKeepCounts,
// PayloadEncoder::EncodeKeeping), so the format stays the codec's own.
//
// Thread-safety: PayloadDecoder is not thread-safe; give each thread its own.
#ifndef GRADSYNC_COMPRESSION_WIRE_CODEC_H_
#define GRADSYNC_COMPRESSION_WIRE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "compression/compressor.h"
#include "compression/registry.h"
#include "compression/topk_compressor.h"
#include "wire/message.h"

namespace gradsync::compression {

// The wire family of a registered compressor name: "fp16" -> Fp16, every
// top-k variant -> TopK, ... NotFound for a name without one ("none").
StatusOr<wire::Compression> WireCompressionOf(const std::string& name);

// The context partition `partition` of bucket `bucket` is compressed with:
// random-k draws different coordinates in every partition.
CompressContext PartitionContext(uint64_t seed, uint64_t step, uint32_t bucket, uint32_t partition);

// Turns the payload frames of a verified data message into floats.
class PayloadDecoder {
 public:
  // At most this many distinct codecs are kept built; past it the cache
  // starts over, so a peer cycling through specs costs time, not memory.
  static constexpr size_t kMaxCodecs = 32;

  PayloadDecoder();

  // Verifies what Decode verifies before it writes anything (the dtype, the
  // codec, and that the payload holds exactly the bytes the codec writes for
  // d.num_elements()), so a receiver can refuse a message before it
  // allocates room for the decoded values. Errors as Decode's, but never
  // Malformed.
  Status Check(const wire::DataBody& d, const std::vector<wire::Payload>& payloads,
               wire::ErrorCode* code);

  // Writes the `d.num_elements()` floats that `payloads` hold into `out`
  // (room for num_elements floats): copied when uncompressed (dtype f32),
  // decompressed with `ctx` otherwise. On failure nothing is promised about
  // `out`, `*code` says what was wrong (WrongType: a dtype other than f32,
  // an unknown codec or one without a wire family; SizeMismatch: the payload
  // size differs from what the codec writes; Malformed: the compressed
  // bytes do not decode) and the status names it.
  Status Decode(const wire::DataBody& d, const std::vector<wire::Payload>& payloads,
                const CompressContext& ctx, float* out, wire::ErrorCode* code);

 private:
  StatusOr<Compressor*> Find(const std::string& codec, wire::ErrorCode* code);

  CompressorRegistry registry_;
  std::map<std::string, std::unique_ptr<Compressor>> codecs_;
  std::vector<uint8_t> joined_;
};

// A compressor for one sender's stream of partitions, and the fields it
// puts on the wire.
class PayloadEncoder {
 public:
  // InvalidArgument for a bad spec or "none" (send uncompressed instead).
  static StatusOr<std::unique_ptr<PayloadEncoder>> Create(const CompressorRegistry& registry,
                                                          const std::string& spec);

  // The training step of the calls that follow (Compressor::BeginStep):
  // top-k's warm-up ratio. Encode then states that step's ratio.
  void BeginStep(uint64_t step) { compressor_->BeginStep(step); }

  // Compresses `n` floats into one owned payload frame and fills the
  // codec of `fields`.
  StatusOr<wire::Payload> Encode(const float* in, size_t n, const CompressContext& ctx,
                                 wire::DataFields* fields);
  size_t WireBytes(size_t n) const { return compressor_->WireBytes(n); }
  // What Encode puts in DataFields.codec.
  const std::string& spec() const { return spec_; }

  // Top-k only (else none): how many elements a partition may keep can
  // vary from call to call (EncodeKeeping). The ratio of the step.
  std::optional<double> shared_budget_ratio() const {
    return keep_ ? std::optional<double>(keep_->ratio()) : std::nullopt;
  }
  // The magnitude keys (MagnitudeKey) of what Encode would select from
  // (Compressor::CompressedValues: `in`, or with error feedback m u + in +
  // the residual kept for `ctx`).
  void MagnitudeKeys(const float* in, size_t n, const CompressContext& ctx, uint32_t* keys) const;
  // As Encode, keeping exactly `keep` elements (1 <= keep <= n; top-k
  // only): the codec put in `fields` states the ratio that gives `keep`.
  // `at_least` (0: none) is a magnitude key that `keep` elements of what
  // Encode selects from are expected to reach: when exactly that many do,
  // they are the ones kept, found in one pass; else the selection runs as
  // usual. Either way the same elements are kept.
  StatusOr<wire::Payload> EncodeKeeping(const float* in, size_t n, size_t keep,
                                        const CompressContext& ctx, wire::DataFields* fields,
                                        uint32_t at_least = 0);

 private:
  PayloadEncoder(std::unique_ptr<Compressor> c, CompressorSpec parsed, std::string spec);
  // The spec with `ratio` for its ratio and without its warm-up (top-k).
  std::string CodecWithRatio(double ratio) const;
  // Compresses with the compressor as it is set into one owned frame and
  // fills `fields` with `codec`.
  StatusOr<wire::Payload> CompressInto(const float* in, size_t n, const CompressContext& ctx,
                                       wire::DataFields* fields, std::string codec);

  std::unique_ptr<Compressor> compressor_;
  const CompressorSpec parsed_;
  const std::string spec_;
  mutable std::vector<float> values_;  // MagnitudeKeys' error-feedback values
  KeepRatio* const keep_;              // compressor_'s kept fraction, if top-k
};

// How many elements each partition of one bucket keeps so that together
// they keep the k = ceil(ratio * total) largest magnitudes of the bucket:
// `keys` holds the MagnitudeKey of every element, partition after partition
// (sizes[p] each). Elements tied with the k-th are all kept; every
// partition keeps at least one; when the k-th magnitude is zero (fewer
// nonzeros than k), each partition keeps ceil(ratio * sizes[p]) instead.
// `threshold`, if not null, receives the k-th largest key (0 in that case):
// a partition whose count is its number of keys at or above it keeps just
// those (EncodeKeeping's `at_least`).
std::vector<size_t> SharedKeepCounts(const std::vector<uint32_t>& keys,
                                     const std::vector<size_t>& sizes, double ratio,
                                     uint32_t* threshold = nullptr);

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_WIRE_CODEC_H_
