// Compressed payloads of the parameter-server path, where every receiver
// decompresses what one sender compressed.
//
// A compressed Push (or Reply) carries its compressor family in
// DataBody.compression and the sender's full compressor spec in
// DataBody.codec ("topk:ratio=0.01,ef=1"). The receiver builds a compressor
// from the spec only to decompress: error-feedback residuals stay with the
// sender, but the spec keeps "ef" because it changes the format's meaning
// (random-k drops its n/k scaling under error feedback).
//
// Each partition of a bucket is compressed on its own, with its own
// compressor instance (so its own residual) and its own context
// (PartitionContext), so that a shard decompresses the partitions it owns
// without seeing the others.
//
// Thread-safety: PayloadDecoder is not thread-safe; give each thread its own.
#ifndef GRADSYNC_COMPRESSION_WIRE_CODEC_H_
#define GRADSYNC_COMPRESSION_WIRE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "compression/compressor.h"
#include "compression/registry.h"
#include "wire/message.h"

namespace gradsync {
namespace compression {

// The wire family of a registered compressor name: "fp16" -> Fp16, every
// top-k variant -> TopK, ... NotFound for a name without one ("none").
StatusOr<wire::Compression> WireCompressionOf(const std::string& name);

// The context partition `partition` of bucket `bucket` is compressed with:
// random-k draws different coordinates in every partition.
CompressContext PartitionContext(uint64_t seed, uint64_t step, uint32_t bucket,
                                 uint32_t partition);

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
  Status Check(const wire::DataBody& d,
               const std::vector<wire::Payload>& payloads,
               wire::ErrorCode* code);

  // Writes the `d.num_elements()` floats that `payloads` hold into `out`
  // (room for num_elements floats): copied when uncompressed (dtype f32),
  // decompressed with `ctx` otherwise. On failure nothing is promised about
  // `out`, `*code` says what was wrong (WrongType: a dtype other than f32,
  // an unknown codec or one of another family; SizeMismatch: the payload
  // size differs from what the codec writes; Malformed: the compressed
  // bytes do not decode) and the status names it.
  Status Decode(const wire::DataBody& d,
                const std::vector<wire::Payload>& payloads,
                const CompressContext& ctx, float* out, wire::ErrorCode* code);

 private:
  StatusOr<Compressor*> Find(const std::string& codec, wire::Compression family,
                             wire::ErrorCode* code);

  CompressorRegistry registry_;
  std::map<std::string, std::unique_ptr<Compressor>> codecs_;
  std::vector<uint8_t> joined_;
};

// A compressor for one sender's stream of partitions, and the fields it
// puts on the wire.
class PayloadEncoder {
 public:
  // InvalidArgument for a bad spec or "none" (send uncompressed instead).
  static StatusOr<std::unique_ptr<PayloadEncoder>> Create(
      const CompressorRegistry& registry, const std::string& spec);

  // Compresses `n` floats into one owned payload frame and fills the
  // compression and codec of `fields`.
  StatusOr<wire::Payload> Encode(const float* in, size_t n,
                                 const CompressContext& ctx,
                                 wire::DataFields* fields);
  size_t WireBytes(size_t n) const { return compressor_->WireBytes(n); }
  // What Encode puts in DataFields.compression and .codec.
  wire::Compression family() const { return family_; }
  const std::string& spec() const { return spec_; }

 private:
  PayloadEncoder(std::unique_ptr<Compressor> c, std::string spec,
                 wire::Compression family)
      : compressor_(std::move(c)), spec_(std::move(spec)), family_(family) {}

  std::unique_ptr<Compressor> compressor_;
  const std::string spec_;
  const wire::Compression family_;
};

}  // namespace compression
}  // namespace gradsync

#endif  // GRADSYNC_COMPRESSION_WIRE_CODEC_H_
