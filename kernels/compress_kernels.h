// CUDA launch wrappers for the compression kernels: fp16/bf16 casts, top-k,
// random-k gather/scatter, sign and QSGD encode/decode, fused bucket
// pack/unpack and fused error-feedback updates. Only built with
// --config=cuda; plain C++ declarations, usable from .cc files.
//
// Results: every kernel computes bit for bit what its CPU reference in
// compress_cpu.h computes (and so what the compression/ compressors put on
// the wire), except the payload bits of computed NaNs (the GPU makes them
// 0x7FFFFFFF). The wire formats are described there; the wrappers take the
// parts of a wire buffer (scales, bits, norms, levels, indices, values) as
// separate device pointers.
//
// Memory: every pointer is device (or managed) memory and must stay valid
// until the work has finished; float and 32-bit pointers need 4-byte and
// 16-bit pointers 2-byte alignment. 16-byte aligned buffers take vector
// loads, others a scalar path with the same results. Outputs must not
// overlap inputs unless stated.
// Blocking: every call is asynchronous on `stream` (nothing is allocated,
// nothing waits for the device); results are ready once the stream is
// synchronised.
// Errors: the returned Status covers the arguments (InvalidArgument: a null
// or misaligned pointer with work to do, or a bad chunk, level count or k)
// and the launch (Internal, from cudaGetLastError); faults while a kernel
// runs show up at the next synchronisation of `stream`. With nothing to do
// (n == 0, k == 0) nothing is launched and OK is returned.
// Thread-safety: as for any launch on a stream; no state of its own.
#ifndef GRADSYNC_KERNELS_COMPRESS_KERNELS_H_
#define GRADSYNC_KERNELS_COMPRESS_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "kernels/compress_types.h"

namespace gradsync::kernels {

// ---- fp16 / bf16: out[i] = convert(in[i]) for i < n ----

Status FloatToHalfCuda(const float* in, uint16_t* out, size_t n, cudaStream_t stream);
Status HalfToFloatCuda(const uint16_t* in, float* out, size_t n, cudaStream_t stream);
Status FloatToBf16Cuda(const float* in, uint16_t* out, size_t n, cudaStream_t stream);
Status Bf16ToFloatCuda(const uint16_t* in, float* out, size_t n, cudaStream_t stream);
// out[i] = fp16(in[i] / divisor): the bits of DivideFloatCuda then
// FloatToHalfCuda in one pass, `in` left as it is.
Status DividedToHalfCuda(const float* in, float divisor, uint16_t* out, size_t n,
                         cudaStream_t stream);

// ---- Top-k ----
//
// The k largest elements of in[0, n) by magnitude (NaN above infinity, ties
// to the lower index), exactly the set of TopKCpu: indices[0, k) ascending
// and values[j] = in[indices[j]] as fp32 (float*) or fp16 (uint16_t*). A
// radix select on the 31-bit magnitude keys (3 histogram passes) finds the
// k-th largest key, then a stable compaction writes the outputs in index
// order. n <= 2^31 - 1, k <= n. `workspace` holds at least
// TopKWorkspaceBytes(n) bytes of device memory, 16-byte aligned, used by one
// call at a time.
size_t TopKWorkspaceBytes(size_t n);
Status TopKCuda(const float* in, size_t n, size_t k, SparseValueFormat format, int32_t* indices,
                void* values, void* workspace, size_t workspace_bytes, cudaStream_t stream);
// Top-k decompression: out[0, n) = 0, then out[indices[j]] = value j.
// Indices distinct and < n (indices outside [0, n) are skipped on the
// device; check peer data on the host where an error must be reported).
Status SparseDecompressCuda(const int32_t* indices, const void* values, SparseValueFormat format,
                            size_t k, size_t n, float* out, cudaStream_t stream);

// ---- Random-k ----
//
// The indices are drawn on the host (RandomKIndicesCpu: Floyd's algorithm
// is sequential) and copied to the device once per (context, n); every rank
// with the same context holds the same ones. Indices distinct and < n.

// out[j] = in[indices[j]] for j < k.
Status GatherCuda(const float* in, const uint32_t* indices, size_t k, float* out,
                  cudaStream_t stream);
// out[0, n) = 0, then out[indices[j]] = values[j] * scale.
Status ScatterCuda(const float* values, const uint32_t* indices, size_t k, float scale, size_t n,
                   float* out, cudaStream_t stream);
// out[indices[j]] += values[j] * scale (unfused product and sum).
Status ScatterAddCuda(const float* values, const uint32_t* indices, size_t k, float scale,
                      float* out, cudaStream_t stream);

// ---- Sign (chunk a positive multiple of 8) ----

// scales[0, ceil(n / chunk)) and bits[0, ceil(n / 8)).
Status SignEncodeCuda(const float* in, size_t n, size_t chunk, float* scales, uint8_t* bits,
                      cudaStream_t stream);
Status SignDecodeCuda(const float* scales, const uint8_t* bits, size_t n, size_t chunk, float* out,
                      cudaStream_t stream);

// ---- QSGD (chunk a positive multiple of 8, 1 <= levels <= 127) ----
//
// `key` is QsgdKey(context) from compress_cpu.h. Decode does not check that
// |q| <= levels: validate peer data before, as QsgdCompressor does.

// norms[0, ceil(n / chunk)) and q[0, n).
Status QsgdEncodeCuda(const float* in, size_t n, size_t chunk, int levels, uint64_t key,
                      float* norms, int8_t* q, cudaStream_t stream);
Status QsgdDecodeCuda(const float* norms, const int8_t* q, size_t n, size_t chunk, int levels,
                      float* out, cudaStream_t stream);

// ---- Fused buckets ----
//
// `slices` is a device array of num_slices BucketSlice, valid per
// ValidateSlices (compress_cpu.h; check the host copy before uploading it),
// whose tensors are device memory; bucket_elems is at least the end of the
// last slice. Upload once per bucket layout and reuse.

// bucket[offset + i] = tensor[i] (or rounded to fp16/bf16) for every slice.
Status PackBucketCuda(const BucketSlice* slices, size_t num_slices, size_t bucket_elems,
                      float* bucket, cudaStream_t stream);
Status PackBucket16Cuda(Float16Format format, const BucketSlice* slices, size_t num_slices,
                        size_t bucket_elems, uint16_t* bucket, cudaStream_t stream);
// tensor[i] = bucket[offset + i] (or widened from fp16/bf16).
Status UnpackBucketCuda(const BucketSlice* slices, size_t num_slices, size_t bucket_elems,
                        const float* bucket, cudaStream_t stream);
Status UnpackBucket16Cuda(Float16Format format, const BucketSlice* slices, size_t num_slices,
                          size_t bucket_elems, const uint16_t* bucket, cudaStream_t stream);

// ---- Error feedback ----
//
// `residual` (n floats) holds e_old on entry when has_residual (it is only
// written otherwise) and e_new = c - decompress(compress(c)) on return, with
// c = g + e_old (c = g without a residual); the other outputs are the
// compressor's for c. Exactly the Ef*Cpu references.

// fp16/bf16: one pass; wire[0, n).
Status EfFloat16Cuda(Float16Format format, const float* g, float* residual, bool has_residual,
                     size_t n, uint16_t* wire, cudaStream_t stream);
// Sign and QSGD: one kernel, chunk by chunk.
Status EfSignCuda(const float* g, float* residual, bool has_residual, size_t n, size_t chunk,
                  float* scales, uint8_t* bits, cudaStream_t stream);
Status EfQsgdCuda(const float* g, float* residual, bool has_residual, size_t n, size_t chunk,
                  int levels, uint64_t key, float* norms, int8_t* q, cudaStream_t stream);
// Top-k on c (c is formed in `residual`, then the kept elements' residuals
// are set); workspace as for TopKCuda.
Status EfTopKCuda(const float* g, float* residual, bool has_residual, size_t n, size_t k,
                  SparseValueFormat format, int32_t* indices, void* values, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream);
// Random-k with host-drawn indices (device copy) and scale RandomKScale(n, k):
// values[j] = c[indices[j]], e_new[indices[j]] = c - values[j] * scale.
Status EfRandomKCuda(const float* g, float* residual, bool has_residual, size_t n,
                     const uint32_t* indices, size_t k, float scale, float* values,
                     cudaStream_t stream);

// ---- Bucket arithmetic (client/elementwise.h on the device) ----
//
// Same bits as the CPU: each result is one rounding of the fp32 operation.

// acc[i] = round16(widen(acc[i]) + widen(in[i])).
Status Add16IntoCuda(Float16Format format, uint16_t* acc, const uint16_t* in, size_t n,
                     cudaStream_t stream);
// data[i] = data[i] / divisor.
Status DivideFloatCuda(float* data, size_t n, float divisor, cudaStream_t stream);
// data[i] = round16(widen(data[i]) * scale).
Status Scale16Cuda(Float16Format format, uint16_t* data, size_t n, float scale,
                   cudaStream_t stream);

}  // namespace gradsync::kernels

#endif  // GRADSYNC_KERNELS_COMPRESS_KERNELS_H_
