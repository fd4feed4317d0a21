// Compressor: turns a bucket of fp32 gradients into bytes for the wire and
// back.
//
// A Compressor knows the exact compressed size of n elements before it
// compresses anything (WireBytes), so callers allocate wire buffers and
// header fields up front. Compressed bytes are raw, unaligned byte buffers
// (ZeroMQ frames, slices of a bucket): implementations read and write them
// with memcpy and never cast them in place to wider types.
//
// Errors: Compress and Decompress return InvalidArgument when a buffer size
// does not match what WireBytes promises; the message names both sizes. They
// never abort on anything that came from a peer.
//
// Thread-safety: the const methods may be called concurrently. Compress and
// Decompress may update internal state (an RNG, a residual), so one instance
// must not be used from several threads without external synchronisation;
// give each comm engine thread its own instance (see CompressorRegistry).
//
// Ownership: Compressors never keep pointers to the buffers they are given;
// every buffer only has to outlive the call. Input and output must not
// overlap.
#ifndef GRADSYNC_COMPRESSION_COMPRESSOR_H_
#define GRADSYNC_COMPRESSION_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace gradsync::compression {

// Per-call inputs shared by all ranks, so that seeded compressors (random-k)
// pick the same coordinates everywhere. Stateless compressors ignore it.
struct CompressContext {
  uint64_t seed = 0;       // Job-wide seed, agreed at rendezvous.
  uint64_t step = 0;       // Training step of the gradients.
  uint32_t bucket_id = 0;  // Bucket the elements belong to.
};

// How many elements a sparse compressor keeps (top-k), as a fraction a
// caller may change between calls: the parameter-server client shares one
// budget over a bucket's partitions this way.
class KeepRatio {
 public:
  virtual double ratio() const = 0;
  // The ratio of later calls. InvalidArgument unless 0 < ratio <= 1.
  virtual Status SetRatio(double ratio) = 0;
  // The next selection may take the elements whose magnitude key is at
  // least `key` in one pass, when exactly as many are as it keeps. 0: none.
  virtual void HintThreshold(uint32_t key) = 0;

 protected:
  ~KeepRatio() = default;
};

class Compressor {
 public:
  Compressor() = default;
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
  virtual ~Compressor() = default;

  // The name this compressor is registered under ("none", "fp16").
  virtual std::string name() const = 0;

  // True if the element-wise sum of compressed buffers decompresses to the
  // sum of the inputs, so the bytes can ride an all-reduce. False means the
  // buffers must be all-gathered and decompressed one by one.
  virtual bool summable() const = 0;

  // For summable compressors: the element type the all-reduce adds the
  // compressed bytes as (fp16 for "fp16", fp32 for "none" and "randomk").
  virtual DType summable_dtype() const { return DType::kF32; }

  // The training step of the calls that follow. A compressor whose format
  // follows a schedule (top-k's warm-up) sets it here; every rank calls it
  // with the same step before WireBytes, so all agree on the format. The
  // others ignore it.
  virtual void BeginStep(uint64_t step) { (void)step; }

  // Exact number of bytes Compress writes for `num_elements` floats.
  // Depends only on `num_elements` (and the step BeginStep set), never on
  // the values or the context.
  virtual size_t WireBytes(size_t num_elements) const = 0;

  // Compresses in[0, n) into out[0, WireBytes(n)). `out_size` is the size of
  // the caller's buffer; bytes past WireBytes(n) are left untouched.
  // InvalidArgument if out_size < WireBytes(n) (nothing is written then).
  virtual Status Compress(const float* in, size_t n, const CompressContext& ctx, uint8_t* out,
                          size_t out_size) = 0;

  // Decompresses in[0, in_size) into out[0, n). InvalidArgument, naming
  // both sizes, if in_size != WireBytes(n) (nothing is written then).
  // `ctx` must equal the one given to Compress.
  virtual Status Decompress(const uint8_t* in, size_t in_size, size_t n, const CompressContext& ctx,
                            float* out) = 0;

  // The kept fraction of a sparse compressor (top-k; an error-feedback
  // wrapper gives the one of the compressor it wraps); null for the others.
  virtual KeepRatio* keep_ratio() { return nullptr; }

  // The n values Compress(in, n, a context of `bucket_id`) would compress
  // now: `in` itself (no copy), or what error feedback forms from it, in
  // `scratch`. Changes nothing.
  virtual const float* CompressedValues(const float* in, size_t n, uint32_t bucket_id,
                                        std::vector<float>* scratch) const {
    (void)n;
    (void)bucket_id;
    (void)scratch;
    return in;
  }

  // out[i] -= Decompress(in)[i] for i < n, as float subtractions: what error
  // feedback keeps of what it compressed. The same errors as Decompress (out
  // unchanged then). This decompresses into `scratch` and subtracts; a
  // sparse compressor subtracts the elements it kept only (x - 0 is x, bit
  // for bit), without a pass over the rest.
  virtual Status SubtractDecompressed(const uint8_t* in, size_t in_size, size_t n,
                                      const CompressContext& ctx, float* out,
                                      std::vector<float>* scratch) {
    scratch->resize(n);
    GS_RETURN_IF_ERROR(Decompress(in, in_size, n, ctx, scratch->data()));
    const float* d = scratch->data();
    for (size_t i = 0; i < n; ++i) out[i] -= d[i];
    return OkStatus();
  }
};

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_COMPRESSOR_H_
