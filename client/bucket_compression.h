// BucketCompression: which compressor each bucket uses, and how a compressed
// bucket is synchronised on the all-reduce path.
//
// Settings (flags or GRADSYNC_*):
//   compression=SPEC            job-wide ("none", "fp16", "topk:ratio=0.01,ef=1";
//                               see compression/registry.h for the specs)
//   compression_min_bytes=N     buckets smaller than N bytes go uncompressed
//                               (default 65536)
//   compression_overrides=LIST  "KEY=SPEC;KEY=SPEC": KEY is a bucket id or a
//                               tensor name; a bucket takes its own override,
//                               else that of its first tensor that has one.
// Only f32 buckets are compressed; f16 and bf16 buckets travel as they are.
//
// Compressed buckets go through the one reducer (client/wire_reduce.h):
// summable compressors (fp16, bf16, randomk) compress, all-reduce the
// compressed values, decompress and divide by the number of workers; the
// others (top-k, sign, qsgd) compress, all-gather every rank's bytes,
// decompress each and sum them in rank order, so every rank ends with the
// same bits. PowerSGD ("powersgd:rank=R", compression/
// powersgd.h; always with error feedback and warm start) all-reduces its two
// rank-R factors in fp32, (rows + cols) * R floats for a bucket viewed as a
// rows x cols matrix, and every rank rebuilds the same average from them.
// When a bucket holds tensors whose shapes were registered, each such tensor
// of at least 2 x 2 is its own matrix (rows = first dimension) and the
// others (biases, norms) are all-reduced uncompressed, as one.
// Each bucket has its own compressor instance, so error-feedback residuals
// are per bucket.
//
// Thread-safety: none; the comm engine thread is the only user.
#ifndef GRADSYNC_CLIENT_BUCKET_COMPRESSION_H_
#define GRADSYNC_CLIENT_BUCKET_COMPRESSION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/collectives.h"
#include "client/wire_reduce.h"
#include "common/config.h"
#include "common/status.h"
#include "compression/compressor.h"
#include "compression/powersgd.h"
#include "compression/registry.h"

namespace gradsync::client {

// A tensor of a bucket: where it sits and, when the trainer registered its
// shape, its matrix view (rows x cols; 0 x 0 without a shape).
struct BucketTensor {
  size_t offset = 0;  // elements into the bucket
  size_t count = 0;
  size_t rows = 0;
  size_t cols = 0;
};

struct BucketInfo {
  uint32_t id = 0;
  DType dtype = DType::kF32;
  size_t bytes = 0;
  std::vector<std::string> tensor_names;
  std::vector<BucketTensor> tensors;  // in bucket order
};

class BucketCompression {
 public:
  // Reads the settings above; InvalidArgument naming a bad spec or override.
  static StatusOr<std::unique_ptr<BucketCompression>> FromConfig(const Config& config);

  // Chooses and creates each bucket's compressor. Once, before Reduce.
  Status Assign(const std::vector<BucketInfo>& buckets);
  // The spec bucket `id` uses ("none" when uncompressed).
  std::string SpecOf(uint32_t id) const;

  // What one Reduce moved, in compressed form.
  using Traffic = WireTraffic;

  // Averages the f32 bucket `data` over all ranks through `backend`, using
  // the bucket's compressor; uncompressed buckets are one AllReduce.
  Status Reduce(Collectives& backend, uint32_t bucket, float* data, size_t count, const OpTag& tag,
                uint64_t seed, Deadline deadline, Traffic* traffic);

 private:
  BucketCompression() = default;
  // OK if `spec` would create a compressor (or a PowerSgd).
  Status CheckSpec(const std::string& spec) const;
  Status ReducePowerSgd(Collectives& backend, compression::PowerSgd& p, float* data, size_t count,
                        const OpTag& tag, const compression::CompressContext& ctx,
                        Deadline deadline, Traffic* traffic);
  // PowerSGD tensor by tensor (see above); false in *done when the bucket
  // has no tensor with a matrix shape.
  Status ReducePowerSgdTensors(Collectives& backend, compression::PowerSgd& p, float* data,
                               const OpTag& tag, const compression::CompressContext& ctx,
                               Deadline deadline, Traffic* traffic, bool* done);
  compression::CompressorRegistry registry_;
  std::string default_spec_ = "none";
  size_t min_bytes_ = 65536;
  std::map<std::string, std::string> overrides_;  // key -> spec
  std::map<uint32_t, std::string> specs_;         // bucket -> spec
  std::map<uint32_t, std::unique_ptr<compression::Compressor>> compressors_;
  std::map<uint32_t, std::unique_ptr<compression::PowerSgd>> powersgd_;
  std::map<uint32_t, std::vector<BucketTensor>> layouts_;  // bucket -> its tensors
  HostReduceSpace space_;                                  // the reducer's buffers
  std::vector<float> scratch_;                             // PowerSGD's vectors
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_BUCKET_COMPRESSION_H_
