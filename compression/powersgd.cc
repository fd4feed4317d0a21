#include "compression/powersgd.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "compression/registry.h"
#include "compression/seeded_rng.h"

namespace gradsync::compression {
namespace {

constexpr uint64_t kInitialQSalt = 0x706F7765725F7130ull;  // "power_q0"
constexpr uint64_t kFillSalt = 0x706F7765725F6669ull;      // "power_fi"
constexpr double kDegenerate = 1e-4;                       // orthogonal part / norm below this
constexpr int kDraws = 4;                                  // random replacements per column

size_t CeilSqrt(size_t n) {
  size_t s = static_cast<size_t>(std::sqrt(static_cast<double>(n)));
  while (s * s < n) ++s;
  while (s > 0 && (s - 1) * (s - 1) >= n) --s;
  return s;
}

// Uniform in [-1, 1) from 24 random bits, exact in float.
void FillUniform(Xoshiro256& rng, float* v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const int64_t bits = static_cast<int64_t>(rng.Next() >> 40) - (int64_t{1} << 23);
    v[i] = static_cast<float>(bits) * (1.0f / static_cast<float>(1 << 23));
  }
}

double Dot(const float* a, const float* b, size_t n) {
  double acc = 0;
  for (size_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * b[i];
  return acc;
}

// Removes from v its components along the first k (orthonormal) columns of
// m, twice, and normalises it. False, leaving v unnormalised, if what
// remains is below kDegenerate of v's norm (or v is zero).
bool OrthogonaliseColumn(const float* m, size_t rows, size_t k, float* v) {
  const double before = std::sqrt(Dot(v, v, rows));
  if (!(before > 0)) return false;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t j = 0; j < k; ++j) {
      const float* u = m + j * rows;
      const float d = static_cast<float>(Dot(v, u, rows));
      for (size_t i = 0; i < rows; ++i) v[i] -= d * u[i];
    }
  }
  const double after = std::sqrt(Dot(v, v, rows));
  if (!(after > kDegenerate * before)) return false;
  const float inv = static_cast<float>(1.0 / after);
  for (size_t i = 0; i < rows; ++i) v[i] *= inv;
  return true;
}

// A float dot product in 8 interleaved partial sums, added up in a fixed
// order: the same bits on every machine, and vectorisable.
float Dot8(const float* a, const float* b, size_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t l = 0; l < 8; ++l) part[l] += a[i + l] * b[i + l];
  }
  for (size_t l = 0; i < n; ++i, ++l) part[l] += a[i] * b[i];
  return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

// P = M Q: m is rows x cols row-major, q cols x r and p rows x r
// column-major.
void MultiplyMQ(const std::vector<float>& m, const std::vector<float>& q, PowerSgdShape s, size_t r,
                std::vector<float>* p) {
  p->resize(s.rows * r);
  for (size_t i = 0; i < s.rows; ++i) {
    for (size_t k = 0; k < r; ++k) {
      (*p)[k * s.rows + i] = Dot8(&m[i * s.cols], &q[k * s.cols], s.cols);
    }
  }
}

// Q = M^T P, in row order of M.
void MultiplyMtP(const std::vector<float>& m, const std::vector<float>& p, PowerSgdShape s,
                 size_t r, std::vector<float>* q) {
  q->assign(s.cols * r, 0.0f);
  for (size_t i = 0; i < s.rows; ++i) {
    const float* mi = &m[i * s.cols];
    for (size_t k = 0; k < r; ++k) {
      const float pik = p[k * s.rows + i];
      float* qk = &(*q)[k * s.cols];
      for (size_t j = 0; j < s.cols; ++j) qk[j] += mi[j] * pik;
    }
  }
}

// Row i of P Q^T into row[0, cols).
void LowRankRow(const std::vector<float>& p, const std::vector<float>& q, PowerSgdShape s, size_t r,
                size_t i, float* row) {
  std::fill(row, row + s.cols, 0.0f);
  for (size_t k = 0; k < r; ++k) {
    const float pik = p[k * s.rows + i];
    const float* qk = &q[k * s.cols];
    for (size_t j = 0; j < s.cols; ++j) row[j] += pik * qk[j];
  }
}

Status BadSpec(const std::string& spec, const std::string& why) {
  return InvalidArgumentError("compressor spec \"" + spec + "\": " + why);
}

}  // namespace

PowerSgdShape PowerSgdShapeOf(size_t n) {
  if (n == 0) return {};
  const size_t rows = CeilSqrt(n);
  return {rows, (n + rows - 1) / rows};
}

void OrthonormaliseColumns(float* m, size_t rows, size_t cols, uint64_t key) {
  Xoshiro256 rng(key);
  for (size_t k = 0; k < cols; ++k) {
    float* v = m + k * rows;
    bool ok = OrthogonaliseColumn(m, rows, k, v);
    for (int draw = 0; !ok && draw < kDraws; ++draw) {
      FillUniform(rng, v, rows);
      ok = OrthogonaliseColumn(m, rows, k, v);
    }
    if (!ok) std::fill(v, v + rows, 0.0f);
  }
}

StatusOr<std::unique_ptr<PowerSgd>> PowerSgd::Create(const std::string& spec) {
  GS_ASSIGN_OR_RETURN(CompressorSpec parsed, ParseCompressorSpec(spec));
  if (parsed.name != kName) return BadSpec(spec, "not a powersgd spec");
  for (const std::string& key : parsed.keys) {
    if (key != "rank" && key != "ef") {
      return BadSpec(
          spec, "compressor \"powersgd\" takes no option \"" + key + "\" (it takes: [rank, ef])");
    }
  }
  const bool ef_given = std::count(parsed.keys.begin(), parsed.keys.end(), "ef") > 0;
  if (ef_given && !parsed.options.error_feedback) {
    return BadSpec(spec,
                   "powersgd always uses error feedback (its residual is part of the "
                   "method), ef=0 is not supported");
  }
  const int rank = parsed.options.rank;
  if (rank < 1 || rank > kMaxRank) {
    return BadSpec(spec, "rank must be in [1, " + std::to_string(kMaxRank) + "]");
  }
  return std::make_unique<PowerSgd>(rank);
}

bool PowerSgd::Names(const std::string& spec) {
  return spec.compare(0, spec.find(':'), kName) == 0;
}

PowerSgd::PowerSgd(int rank) : rank_(rank) {}

size_t PowerSgd::RankFor(size_t n) const {
  return std::min(static_cast<size_t>(rank_), PowerSgdShapeOf(n).cols);
}

size_t PowerSgd::WireBytes(size_t n) const {
  const PowerSgdShape s = PowerSgdShapeOf(n);
  return (s.rows + s.cols) * RankFor(n) * sizeof(float);
}

const std::vector<float>* PowerSgd::Residual(uint32_t bucket_id) const {
  auto it = buckets_.find(bucket_id);
  return it == buckets_.end() ? nullptr : &it->second.residual;
}

PowerSgd::BucketState& PowerSgd::StateFor(size_t n, PowerSgdShape s, size_t r,
                                          const CompressContext& ctx, uint32_t tensor) {
  // Buckets are keyed by their id; a bucket's tensors by id and index + 1.
  const uint64_t key = tensor == kWholeBucket
                           ? ctx.bucket_id
                           : (uint64_t{1} << 63) | (uint64_t{ctx.bucket_id} << 24) | tensor;
  BucketState& state = buckets_[key];
  if (state.n == n && state.rows == s.rows && state.cols == s.cols) return state;
  state.n = n;
  state.rows = s.rows;
  state.cols = s.cols;
  state.residual.assign(n, 0.0f);
  state.q.resize(s.cols * r);
  // The first Q of a tensor is drawn from its index in the step's place.
  const uint64_t stream = tensor == kWholeBucket ? 0 : uint64_t{tensor} + 1;
  Xoshiro256 rng(::gradsync::StreamKey(ctx.seed, stream, ctx.bucket_id, kInitialQSalt));
  FillUniform(rng, state.q.data(), state.q.size());
  return state;
}

void PowerSgd::LoadM(const float* g, size_t n, PowerSgdShape s, const BucketState& state) {
  m_.resize(s.rows * s.cols);
  for (size_t i = 0; i < n; ++i) m_[i] = g[i] + state.residual[i];
  std::fill(m_.begin() + static_cast<std::ptrdiff_t>(n), m_.end(), 0.0f);
}

PowerSgd::Factor PowerSgd::Begin(const float* data, size_t n, const CompressContext& ctx) {
  round_ = Round{};
  if (n == 0) return Factor{};
  return BeginAs(data, n, PowerSgdShapeOf(n), RankFor(n), ctx, kWholeBucket);
}

size_t PowerSgd::RankForMatrix(PowerSgdShape s) const {
  return std::min({static_cast<size_t>(rank_), s.rows, s.cols});
}

PowerSgd::Factor PowerSgd::BeginTensor(const float* data, PowerSgdShape shape,
                                       const CompressContext& ctx, uint32_t tensor) {
  round_ = Round{};
  const size_t n = shape.rows * shape.cols;
  if (n == 0) return Factor{};
  return BeginAs(data, n, shape, RankForMatrix(shape), ctx, tensor);
}

PowerSgd::Factor PowerSgd::BeginAs(const float* data, size_t n, PowerSgdShape s, size_t r,
                                   const CompressContext& ctx, uint32_t tensor) {
  BucketState& state = StateFor(n, s, r, ctx, tensor);
  LoadM(data, n, s, state);
  MultiplyMQ(m_, state.q, s, r, &p_);
  round_ = Round{&state, s, n, r, StreamKey(ctx, kFillSalt)};
  return Factor{p_.data(), p_.size()};
}

PowerSgd::Factor PowerSgd::Middle() {
  if (round_.state == nullptr) return Factor{};
  const PowerSgdShape s = round_.shape;
  const size_t r = round_.r, n = round_.n;
  OrthonormaliseColumns(p_.data(), s.rows, r, round_.fill_key);
  MultiplyMtP(m_, p_, s, r, &q_);
  // The residual from this rank's own factor, before Q is summed.
  residual_.resize(s.rows * s.cols);
  for (size_t i = 0; i < s.rows; ++i) LowRankRow(p_, q_, s, r, i, &residual_[i * s.cols]);
  for (size_t i = 0; i < n; ++i) residual_[i] = m_[i] - residual_[i];
  residual_.resize(n);
  return Factor{q_.data(), q_.size()};
}

void PowerSgd::Finish(float* data, int world_size) {
  if (round_.state == nullptr) return;
  const PowerSgdShape s = round_.shape;
  const size_t r = round_.r, n = round_.n;
  const float world = static_cast<float>(world_size);
  for (float& v : q_) v /= world;
  // The average: full rows straight into data, the last through m_.
  const size_t last = s.rows - 1;
  for (size_t i = 0; i < last; ++i) LowRankRow(p_, q_, s, r, i, data + i * s.cols);
  LowRankRow(p_, q_, s, r, last, m_.data());
  std::copy(m_.begin(), m_.begin() + static_cast<std::ptrdiff_t>(n - last * s.cols),
            data + last * s.cols);
  round_.state->residual.swap(residual_);
  round_.state->q.swap(q_);
  round_ = Round{};
}

}  // namespace gradsync::compression
