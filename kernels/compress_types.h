// Plain types shared by the CPU references of the compression kernels
// (compress_cpu.h) and their CUDA versions (compress_kernels.h). No CUDA
// headers, no dependencies: CPU-only code can use them.
#ifndef GRADSYNC_KERNELS_COMPRESS_TYPES_H_
#define GRADSYNC_KERNELS_COMPRESS_TYPES_H_

#include <cstdint>

namespace gradsync::kernels {

// The 16-bit float formats of the "fp16" and "bf16" compressors.
enum class Float16Format { kFp16, kBf16 };

// How top-k sends its values: fp32 ("topk") or fp16 ("topk_fp16").
enum class SparseValueFormat { kF32, kF16 };

// What the seeded compressors (random-k, QSGD) draw their random numbers
// from; the same three numbers as compression::CompressContext, so equal
// contexts give equal indices and levels on the CPU and on the GPU.
struct SeedContext {
  uint64_t seed = 0;
  uint64_t step = 0;
  uint32_t bucket_id = 0;
};

// One tensor's place in a fused bucket: bucket elements [offset, offset +
// count) hold the tensor's elements [0, count). Pack reads `tensor` and
// unpack writes it. The slices of one bucket are sorted by offset and do not
// overlap (gaps between them are allowed and left alone).
struct BucketSlice {
  float* tensor = nullptr;
  uint64_t offset = 0;
  uint64_t count = 0;
};

}  // namespace gradsync::kernels

#endif  // GRADSYNC_KERNELS_COMPRESS_TYPES_H_
