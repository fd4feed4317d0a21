// CompressorRegistry: maps compressor names to factories, and builds
// compressors from spec strings that carry their options.
//
// There is no global registry and no static registration: the owner of a
// Communicator or server builds a registry, calls RegisterBuiltins (and
// registers its own compressors), and passes it in.
//
// Spec strings: "<name>" or "<name>:<key>=<value>[,<key>=<value>...]", e.g.
//   "fp16", "topk_sampled:ratio=0.001", "qsgd:chunk=256,levels=15,ef=1".
// Keys (see CompressorOptions for the defaults and ranges):
//   ratio   fraction of elements kept (topk, topk_fp16, topk_sampled,
//           topk_sampled_fp16, randomk)
//   chunk   elements per scale / norm (sign, qsgd)
//   levels  quantisation levels s (qsgd)
//   rank    rank R of the approximation (powersgd)
//   ef      0 or 1: wrap the compressor in ErrorFeedback (every name;
//           powersgd always has error feedback and refuses ef=0)
//   momentum M in [0, 1): momentum correction with momentum factor masking
//           (deep gradient compression) in the error feedback: the sparse
//           compressors (topk family, randomk) with ef=1 only; the trainer
//           then takes plain SGD steps (compression/error_feedback.h)
//   warmup  W >= 0 steps: the topk family's ratio starts at 1/4 and falls
//           geometrically to `ratio` over the first W steps (warm-up of deep
//           gradient compression; compression/topk_compressor.h)
// A key a compressor does not take is an error, not ignored.
//
// Builtin names and wire formats (details in each compressor's header):
//   none               4n bytes of fp32                         summable
//   fp16, bf16         2n bytes                                 summable
//   randomk            4k: fp32 values, shared-seed indices     summable
//   topk, topk_sampled           k int32 indices + k fp32 values
//   topk_fp16, topk_sampled_fp16 k int32 indices + k fp16 values
//   sign               4 ceil(n/chunk) scales + ceil(n/8) bytes of bits
//   qsgd               4 ceil(n/chunk) norms + n int8 levels
// with k = ceil(ratio * n).
//
// "powersgd" (keys rank and ef) is a valid spec name but not a Compressor:
// it needs collectives between its two factors, so the all-reduce path
// builds it from the spec (compression/powersgd.h, client/
// bucket_compression.h) and Create returns NotFound for it, saying so.
//
// Errors: Register returns AlreadyExists for a name taken before and
// InvalidArgument for an empty name or factory; Create returns NotFound,
// listing the known names, for an unknown name, and InvalidArgument for a
// malformed spec, an unknown or inapplicable key, or a value out of range.
//
// Thread-safety: all methods may be called concurrently (an internal mutex).
// Each Create call returns a fresh instance, owned by the caller, so every
// thread can have its own.
#ifndef GRADSYNC_COMPRESSION_REGISTRY_H_
#define GRADSYNC_COMPRESSION_REGISTRY_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "compression/compressor.h"

namespace gradsync::compression {

struct CompressorOptions {
  double ratio = 0.01;          // In (0, 1].
  size_t chunk = 512;           // A positive multiple of 8.
  int levels = 127;             // In [1, 127].
  int rank = 4;                 // In [1, 64] (powersgd).
  bool error_feedback = false;  // Wrap in ErrorFeedback.
  double momentum = 0;          // ErrorFeedback's momentum, in [0, 1).
  uint64_t warmup = 0;          // Top-k's warm-up steps (topk_compressor.h).
};

struct CompressorSpec {
  std::string name;
  CompressorOptions options;
  std::vector<std::string> keys;    // The keys the spec set, in order.
  std::vector<std::string> values;  // Their values, as the spec wrote them.
};

// Parses a spec string (syntax above). InvalidArgument, naming the spec,
// for an empty name, a key without '=', an unknown or repeated key, or a
// value that does not parse. Ranges are checked by the factories.
StatusOr<CompressorSpec> ParseCompressorSpec(const std::string& spec);

// The compression_overrides setting, "KEY=SPEC;KEY=SPEC" (KEY a bucket id or
// a tensor name): KEY -> SPEC; an entry without '=' maps to "" (the caller
// refuses it), empty entries are skipped. The specs are not parsed.
std::map<std::string, std::string> ParseCompressionOverrides(const std::string& list);

class CompressorRegistry {
 public:
  // Returns a new compressor; never null.
  using Factory = std::function<std::unique_ptr<Compressor>()>;
  // Returns a new compressor for the options, or InvalidArgument for
  // options out of range.
  using OptionsFactory =
      std::function<StatusOr<std::unique_ptr<Compressor>>(const CompressorOptions&)>;

  CompressorRegistry() = default;
  CompressorRegistry(const CompressorRegistry&) = delete;
  CompressorRegistry& operator=(const CompressorRegistry&) = delete;

  // A compressor that takes no options (but "ef").
  Status Register(std::string name, Factory factory);
  // A compressor that takes the option `keys` (besides "ef").
  Status RegisterWithOptions(std::string name, std::vector<std::string> keys,
                             OptionsFactory factory);

  // A new instance for `spec` ("name" or "name:key=value,..."). Internal
  // error if the factory returns null.
  StatusOr<std::unique_ptr<Compressor>> Create(const std::string& spec) const;

  // The registered names, sorted.
  std::vector<std::string> Names() const;

 private:
  struct Entry {
    std::vector<std::string> keys;
    OptionsFactory factory;
  };

  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;  // Guarded by mu_.
};

// Registers the compressors that ship with gradsync (the names above). Call
// it once per registry; a second call leaves the registry unchanged.
void RegisterBuiltins(CompressorRegistry* registry);

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_REGISTRY_H_
