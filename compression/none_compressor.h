// The identity compressor: the wire carries the fp32 values unchanged
// (4 bytes per element, native byte order), so it is summable.
//
// Thread-safety: stateless; all methods may be called concurrently.
#ifndef GRADSYNC_COMPRESSION_NONE_COMPRESSOR_H_
#define GRADSYNC_COMPRESSION_NONE_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "compression/compressor.h"

namespace gradsync::compression {

class NoneCompressor : public Compressor {
 public:
  static constexpr char kName[] = "none";

  std::string name() const override { return kName; }
  bool summable() const override { return true; }
  // 4 * num_elements. Compress/Decompress reject n whose byte count would
  // overflow size_t.
  size_t WireBytes(size_t num_elements) const override;
  Status Compress(const float* in, size_t n, const CompressContext& ctx, uint8_t* out,
                  size_t out_size) override;
  Status Decompress(const uint8_t* in, size_t in_size, size_t n, const CompressContext& ctx,
                    float* out) override;
};

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_NONE_COMPRESSOR_H_
