// PowerSGD (Vogels et al., 2019): rank-R gradient compression by one step
// of subspace iteration per training step, synchronised by two small
// all-reduces.
//
// PowerSGD is not a Compressor (compressor.h): its rank-R factors are only
// meaningful after the first factor has been summed over every rank, so it
// cannot compress a bucket into bytes on its own. It runs on the all-reduce
// path (client/bucket_compression.h) and reaches the other ranks through a
// sum callback. The registry (registry.h) does not create it; specs name it
// as "powersgd:rank=R" (R in [1, 64], default 4).
//
// Matrix view: a flat bucket of n floats is viewed as a row-major rows x
// cols matrix with rows = ceil(sqrt(n)) and cols = ceil(n / rows) (so cols
// <= rows), zero padded past n. The rank used is r = min(R, cols): more
// columns than that cannot carry more. A tensor whose shape the trainer
// registered is reduced as its own matrix instead (ReduceTensor), which is
// what the low-rank approximation is meant for: one bucket of many layers
// viewed as a square has no low-rank structure (momentum SGD diverged on
// it).
//
// One Reduce of bucket b, every rank with its own gradient g:
//   1. M = g + e, e this rank's residual of b (zero at first).
//   2. P = M Q (rows x r), summed over ranks; its columns are made
//      orthonormal by modified Gram-Schmidt, giving P^.
//   3. Q_local = M^T P^ (cols x r), summed over ranks and divided by the
//      world size, giving Q.
//   4. The bucket becomes P^ Q^T, the average of every rank's P^ Q_local^T,
//      and the residual becomes e = M - P^ Q_local^T, so what a rank
//      contributed plus its new residual equals M up to float rounding.
//   5. Q is kept as the next step's starting Q (warm start). The first Q is
//      uniform in [-1, 1), drawn from the job seed and the bucket id
//      (common/seeded_random.h), so it is the same on every rank.
// Error feedback (step 1) and warm start (step 5) are always on: "ef=1" is
// accepted and changes nothing, "ef=0" is an error. A bucket's residual and
// Q start afresh when its element count changes.
//
// Degenerate columns: a column of P that is zero, or whose part orthogonal
// to the columns before it is below 1e-4 of its norm, is replaced by a
// seeded random unit vector (from the job seed, step, bucket and column)
// orthogonalised against the columns before it, so P^ always has r
// orthonormal columns, never NaN, and a zero gradient does not leave Q stuck
// at zero. Such a vector is drawn again up to 4 times; should every draw
// still be degenerate the column is left zero.
//
// Determinism: every rank does the same float operations in the same order
// on the same summed values, so every rank ends with the same bits (given a
// backend whose sums are identical on every rank, as collectives.h
// promises).
//
// Traffic: each rank sends (rows + cols) * r floats, WireBytes(n) bytes.
//
// Errors: InvalidArgument from Create for a bad spec; from Reduce the sum
// callback's error, in which case the bucket's data, residual and Q are
// unchanged (a bucket whose element count changed has been reset).
//
// Thread-safety: none, one instance per thread. Ownership: keeps no pointer
// to the buffers or the callback it is given.
#ifndef GRADSYNC_COMPRESSION_POWERSGD_H_
#define GRADSYNC_COMPRESSION_POWERSGD_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "compression/compressor.h"

namespace gradsync::compression {

// The matrix a bucket of n floats is viewed as (n = 0 gives 0 x 0).
struct PowerSgdShape {
  size_t rows = 0;
  size_t cols = 0;
};
PowerSgdShape PowerSgdShapeOf(size_t n);

// Makes the `cols` columns of the column-major rows x cols matrix `m`
// (column k at m[k * rows]) orthonormal, in place, by modified Gram-Schmidt
// in column order; degenerate columns as above, drawn with `key`. Needs
// cols <= rows.
void OrthonormaliseColumns(float* m, size_t rows, size_t cols, uint64_t key);

class PowerSgd {
 public:
  static constexpr char kName[] = "powersgd";
  static constexpr int kDefaultRank = 4;
  static constexpr int kMaxRank = 64;

  // From a spec "powersgd[:rank=R][,ef=1]". InvalidArgument, naming the
  // spec, for another name, another key, R out of range, or ef=0.
  static StatusOr<std::unique_ptr<PowerSgd>> Create(const std::string& spec);
  // True if `spec` names powersgd (whatever its options).
  static bool Names(const std::string& spec);

  explicit PowerSgd(int rank);

  int rank() const { return rank_; }
  // The rank used for a bucket of n floats: min(rank(), cols).
  size_t RankFor(size_t n) const;
  // Bytes one rank sends (and receives) for a bucket of n floats.
  size_t WireBytes(size_t n) const;

  // One reduction goes in three steps, and between them the caller sums
  // the factor the step gave over every rank, in place (every rank gets the
  // same bits):
  //   Factor p = Begin(data, n, ctx);    // or BeginTensor
  //   ... sum p.data[0, p.count) over the ranks ...
  //   Factor q = Middle();
  //   ... sum q over the ranks ...
  //   Finish(data, world_size);          // data[0, n): the rank-r average
  // Every rank makes the same calls with the same n, ctx and world_size.
  // One reduction at a time; one abandoned after Begin or Middle (a sum
  // that failed) changes nothing: the next Begin starts afresh. A factor of
  // count 0 (n = 0) needs no sum, and Finish then does nothing.
  struct Factor {
    float* data = nullptr;
    size_t count = 0;
  };
  // Of data[0, n) of bucket ctx.bucket_id, viewed as PowerSgdShapeOf(n).
  Factor Begin(const float* data, size_t n, const CompressContext& ctx);
  // Of one tensor of a bucket with a shape of its own: `data` holds
  // shape.rows x shape.cols floats, row-major (a tensor of shape
  // [d0, d1, ...] is d0 x (d1 * ...)), with rank r = min(rank(), rows,
  // cols), and its own residual and Q, keyed by (ctx.bucket_id, tensor). The
  // first Q is drawn from the seed, the bucket and the tensor index.
  Factor BeginTensor(const float* data, PowerSgdShape shape, const CompressContext& ctx,
                     uint32_t tensor);
  // After P was summed: orthonormalises it and gives this rank's Q.
  Factor Middle();
  // After Q was summed: writes the average into data[0, n) and keeps the
  // new residual and Q.
  void Finish(float* data, int world_size);
  // min(rank(), rows, cols).
  size_t RankForMatrix(PowerSgdShape s) const;

  // The residual of `bucket_id` (n floats), or null before its first
  // Reduce. Valid until the next Reduce.
  const std::vector<float>* Residual(uint32_t bucket_id) const;

 private:
  static constexpr uint32_t kWholeBucket = 0xFFFFFFFFu;

  struct BucketState {
    size_t n = 0;
    size_t rows = 0;
    size_t cols = 0;
    std::vector<float> residual;  // n floats
    std::vector<float> q;         // cols x r, column-major
  };

  BucketState& StateFor(size_t n, PowerSgdShape s, size_t r, const CompressContext& ctx,
                        uint32_t tensor);
  void LoadM(const float* g, size_t n, PowerSgdShape s, const BucketState& state);
  // Begin of n floats viewed as s (n <= rows x cols, zero padded).
  Factor BeginAs(const float* data, size_t n, PowerSgdShape s, size_t r, const CompressContext& ctx,
                 uint32_t tensor);

  // The reduction between Begin and Finish.
  struct Round {
    BucketState* state = nullptr;  // null: none (or n = 0)
    PowerSgdShape shape;
    size_t n = 0;
    size_t r = 0;
    uint64_t fill_key = 0;
  };

  const int rank_;
  std::unordered_map<uint64_t, BucketState> buckets_;
  std::vector<float> m_;         // rows x cols, row-major: g + e, zero padded
  std::vector<float> p_;         // rows x r, column-major
  std::vector<float> q_;         // cols x r, column-major
  std::vector<float> residual_;  // the new residual until Finish
  Round round_;
};

}  // namespace gradsync::compression

#endif  // GRADSYNC_COMPRESSION_POWERSGD_H_
