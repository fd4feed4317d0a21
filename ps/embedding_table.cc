#include "ps/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "common/id_dedup.h"
#include "common/seeded_random.h"

namespace gradsync::server {
namespace {

constexpr uint32_t kNoSlot = std::numeric_limits<uint32_t>::max();

// What RowBytes charges per row beyond its floats: the id, the last-touch
// step and the LRU links of its slot, its entry in the id index (a hash node
// and its share of the bucket array) and its place on the free list.
constexpr size_t kRowAllowance = 64;

// A block of the row arena holds a power of two of rows, at most
// kMaxRowsPerBlock and no more than about kTargetBlockBytes of floats, so that
// a table never holds much more memory than its rows need and wide rows do
// not come in blocks of tens of megabytes.
constexpr size_t kMaxRowsPerBlock = 1024;
constexpr size_t kTargetBlockBytes = size_t{1} << 20;

// The admission sketch: kSketchDepth rows of kSketchWidth saturating 8-bit
// counters; each row takes its own 16 bits of one 64-bit hash of the id.
constexpr int kSketchDepth = 4;
constexpr size_t kSketchWidth = 65536;
constexpr uint32_t kMaxAdmitAfter = 255;

// Salts of the initializer's and the sketch's hashes.
constexpr uint64_t kInitSalt = 0x656D62496E697421ull;    // "embInit!"
constexpr uint64_t kSketchSalt = 0x656D62536B657421ull;  // "embSket!"

StatusOr<RowOptimizerKind> ParseRowOptimizer(const std::string& name) {
  if (name == "sgd") return RowOptimizerKind::kSgd;
  if (name == "adagrad") return RowOptimizerKind::kAdagrad;
  if (name == "adam") return RowOptimizerKind::kAdam;
  return InvalidArgumentError("embedding_optimizer must be sgd, adagrad or adam, got '" + name +
                              "'");
}

std::string Number(double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", value);
  return buf;
}

// A float setting that must be finite and stay so (and nonzero when
// `positive`) once narrowed to float.
Status CheckFloat(const char* name, double value, bool positive, float* out) {
  const float narrowed = static_cast<float>(value);
  const bool ok = std::isfinite(value) && std::isfinite(narrowed) &&
                  (positive ? narrowed > 0.0f : narrowed >= 0.0f);
  if (!ok) {
    return InvalidArgumentError(std::string(name) + " must be " +
                                (positive ? "positive" : "non-negative") + " and finite, got " +
                                Number(value));
  }
  *out = narrowed;
  return OkStatus();
}

// A beta must be in [0, 1) as a float as well: 0.99999999 rounds to 1.
Status CheckBeta(const char* name, double value, float* out) {
  const float narrowed = static_cast<float>(value);
  if (!(value >= 0.0 && narrowed < 1.0f)) {
    return InvalidArgumentError(std::string(name) + " must be in [0, 1), got " + Number(value));
  }
  *out = narrowed;
  return OkStatus();
}

// True when no element of g[0, n) is a NaN or an infinity (exponent bits all
// set); a branch-free integer pass that vectorizes.
bool AllFinite(const float* g, size_t n) {
  uint32_t bad = 0;
  for (size_t j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, g + j, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
  }
  return bad == 0;
}

// The row updates, element by element as PyTorch computes them in float32
// (scalars narrowed to float once per step).
void SgdUpdate(float* __restrict p, const float* __restrict g, size_t n, float lr) {
  for (size_t j = 0; j < n; ++j) p[j] = p[j] - lr * g[j];
}

void AdagradUpdate(float* __restrict p, float* __restrict s, const float* __restrict g, size_t n,
                   float lr, float eps) {
  for (size_t j = 0; j < n; ++j) {
    const float gj = g[j];
    s[j] = s[j] + gj * gj;
    p[j] = p[j] - lr * (gj / (std::sqrt(s[j]) + eps));
  }
}

// The constants of one SparseAdam step.
struct AdamStep {
  float one_minus_b1;
  float one_minus_b2;
  float neg_step_size;  // -lr * sqrt(1 - b2^t) / (1 - b1^t), from doubles
  float eps;
};

// SparseAdam: m_upd = (g - m) (1 - b1); m += m_upd; v_upd = (g^2 - v)(1 - b2);
// v += v_upd; p += -step_size * ((m_upd + m_old) / (sqrt(v_upd + v_old) + eps)).
// m_upd + m_old is the new m and v_upd + v_old the new v, bit for bit (float
// addition commutes), so those sums are not formed twice.
void AdamUpdate(float* __restrict p, float* __restrict m, float* __restrict v,
                const float* __restrict g, size_t n, const AdamStep& k) {
  for (size_t j = 0; j < n; ++j) {
    const float gj = g[j];
    const float m_old = m[j];
    const float m_new = m_old + (gj - m_old) * k.one_minus_b1;
    const float v_old = v[j];
    const float v_new = v_old + (gj * gj - v_old) * k.one_minus_b2;
    m[j] = m_new;
    v[j] = v_new;
    p[j] = p[j] + k.neg_step_size * (m_new / (std::sqrt(v_new) + k.eps));
  }
}

}  // namespace

size_t FloatsPerRow(RowOptimizerKind optimizer, uint32_t dim) {
  return size_t{dim} * (optimizer == RowOptimizerKind::kSgd       ? 1
                        : optimizer == RowOptimizerKind::kAdagrad ? 2
                                                                  : 3);
}

const char* RowOptimizerName(RowOptimizerKind kind) {
  switch (kind) {
    case RowOptimizerKind::kSgd:
      return "sgd";
    case RowOptimizerKind::kAdagrad:
      return "adagrad";
    case RowOptimizerKind::kAdam:
      return "adam";
  }
  return "invalid";
}

StatusOr<EmbeddingOptions> EmbeddingOptions::FromConfig(const Config& config) {
  EmbeddingOptions o;
  GS_ASSIGN_OR_RETURN(std::string name, config.GetString("embedding_optimizer", "adagrad"));
  GS_ASSIGN_OR_RETURN(o.optimizer, ParseRowOptimizer(name));
  const double default_eps = o.optimizer == RowOptimizerKind::kAdagrad ? 1e-10 : 1e-8;
  GS_ASSIGN_OR_RETURN(double lr, config.GetDouble("embedding_lr", 0.01));
  GS_ASSIGN_OR_RETURN(double eps, config.GetDouble("embedding_eps", default_eps));
  GS_ASSIGN_OR_RETURN(double beta1, config.GetDouble("beta1", 0.9));
  GS_ASSIGN_OR_RETURN(double beta2, config.GetDouble("beta2", 0.999));
  GS_ASSIGN_OR_RETURN(int64_t seed, config.GetInt("embedding_seed", 0));
  GS_ASSIGN_OR_RETURN(double init_scale, config.GetDouble("embedding_init_scale", 0.0));
  GS_ASSIGN_OR_RETURN(int64_t admit_after, config.GetInt("embedding_admit_after", 1));
  GS_ASSIGN_OR_RETURN(int64_t idle_steps, config.GetInt("embedding_idle_steps", 0));
  GS_RETURN_IF_ERROR(CheckFloat("embedding_lr", lr, /*positive=*/true, &o.lr));
  GS_RETURN_IF_ERROR(CheckFloat("embedding_eps", eps, /*positive=*/true, &o.eps));
  GS_RETURN_IF_ERROR(CheckBeta("beta1", beta1, &o.beta1));
  GS_RETURN_IF_ERROR(CheckBeta("beta2", beta2, &o.beta2));
  GS_RETURN_IF_ERROR(
      CheckFloat("embedding_init_scale", init_scale, /*positive=*/false, &o.init_scale));
  if (admit_after < 1 || admit_after > kMaxAdmitAfter) {
    return InvalidArgumentError("embedding_admit_after must be in [1, " +
                                std::to_string(kMaxAdmitAfter) + "] (an 8-bit count), got " +
                                std::to_string(admit_after));
  }
  if (idle_steps < 0) {
    return InvalidArgumentError("embedding_idle_steps must be >= 0 (0: never), got " +
                                std::to_string(idle_steps));
  }
  // A seed is 64 bits; a negative one is taken as its two's complement.
  o.seed = static_cast<uint64_t>(seed);
  o.admit_after = static_cast<uint32_t>(admit_after);
  o.idle_steps = static_cast<uint64_t>(idle_steps);
  return o;
}

void InitRow(uint64_t seed, uint32_t table, uint64_t id, float scale, float* out, size_t dim) {
  const uint64_t key = SplitMix64(SplitMix64(SplitMix64(seed ^ kInitSalt) ^ table) ^ id);
  for (size_t j = 0; j < dim; ++j) {
    // The top 24 bits, exactly representable: u in [0, 1), 2u - 1 in [-1, 1).
    const float u = static_cast<float>(SplitMix64(key + j) >> 40) * 0x1p-24f;
    out[j] = scale * (2.0f * u - 1.0f);
  }
}

MemoryBudget::MemoryBudget(size_t limit)
    : limit_(limit),
      share_used_(new std::atomic<size_t>[kMaxShares]),
      joined_(new std::atomic<bool>[kMaxShares]) {
  for (int i = 0; i < kMaxShares; ++i) {
    share_used_[i].store(0);
    joined_[i].store(false);
  }
}

int MemoryBudget::Join() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < kMaxShares; ++i) {
    if (joined_[i].load()) continue;
    share_used_[i].store(0);
    joined_[i].store(true);
    joined_count_.fetch_add(1);
    if (i >= high_.load()) high_.store(i + 1);
    return i;
  }
  return -1;
}

void MemoryBudget::Leave(int share) {
  if (share < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  joined_[share].store(false);
  joined_count_.fetch_sub(1);
}

size_t MemoryBudget::used(int share) const {
  return share < 0 ? 0 : share_used_[share].load(std::memory_order_relaxed);
}

size_t MemoryBudget::FairShare() const {
  const int n = joined_count_.load(std::memory_order_relaxed);
  return n <= 1 ? limit_ : limit_ / static_cast<size_t>(n);
}

bool MemoryBudget::TryTake(size_t bytes, int share) {
  // What the other shares still lack of their guarantee stays free.
  size_t reserve = 0;
  if (share >= 0) {
    const size_t fair = FairShare();
    const int high = high_.load(std::memory_order_relaxed);
    for (int i = 0; i < high; ++i) {
      if (i == share || !joined_[i].load(std::memory_order_relaxed)) continue;
      const size_t u = share_used_[i].load(std::memory_order_relaxed);
      if (u < fair) reserve += fair - u;
    }
  }
  reserve = std::min(reserve, limit_);
  size_t now = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ - reserve || now > limit_ - reserve - bytes) {
      if (share >= 0 && used(share) + bytes <= FairShare()) {
        pressed_.store(true, std::memory_order_relaxed);
      }
      return false;
    }
  } while (!used_.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  if (share >= 0) share_used_[share].fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

void MemoryBudget::Give(size_t bytes, int share) {
  if (share >= 0) share_used_[share].fetch_sub(bytes, std::memory_order_relaxed);
  used_.fetch_sub(bytes, std::memory_order_relaxed);
}

// Rows live in slots of a chunked arena: block b holds slots
// [b * rows_per_block, (b + 1) * rows_per_block), each `stride` floats (the
// values, then the optimizer state: adagrad's sum of squares, adam's m and
// v). Blocks are allocated as slots are first needed and are never moved or
// freed before the table is, so growth never copies rows; an evicted row's
// slot goes on the free list for the next admitted row. Beside its floats a
// slot has its id, last-touch step and links in an intrusive doubly-linked
// list over slot indices, least recently touched first (the LRU list).
struct EmbeddingTable::Impl {
  struct SlotInfo {
    uint64_t id;
    uint64_t last_touch;
    uint32_t prev;
    uint32_t next;
  };
  struct Block {
    std::unique_ptr<float[]> rows;
    std::unique_ptr<SlotInfo[]> info;
  };

  Impl(uint32_t table, uint32_t dim, const EmbeddingOptions& o, MemoryBudget* budget)
      : options(o),
        table(table),
        dim(dim),
        stride(FloatsPerRow(o.optimizer, dim)),
        row_bytes(stride * sizeof(float) + kRowAllowance),
        // A table of rows of no elements (dim 0) keeps its bookkeeping; its
        // scale is never used.
        scale(o.init_scale > 0.0f
                  ? o.init_scale
                  : 1.0f / std::sqrt(static_cast<float>(std::max<uint32_t>(dim, 1)))),
        budget(budget),
        share(budget->Join()) {
    // admit_after 0 (only possible without FromConfig) admits at once, as 1
    // does; counts saturate at 255, so a larger value is taken as 255.
    admit_after = std::min(std::max<uint32_t>(o.admit_after, 1), kMaxAdmitAfter);
    size_t rows = kMaxRowsPerBlock;
    const size_t row_floats_bytes = std::max<size_t>(stride * sizeof(float), 1);
    while (rows > 1 && rows * row_floats_bytes > kTargetBlockBytes) rows /= 2;
    block_shift = 0;
    while ((size_t{1} << block_shift) < rows) ++block_shift;
    block_mask = rows - 1;
    // The sketch's fixed 256 KiB belongs to the table, like its other fixed
    // structures, and is not charged to the budget, which counts rows only.
    if (admit_after > 1) {
      sketch.assign(kSketchDepth * kSketchWidth, 0);
      sketch_key = SplitMix64(SplitMix64(o.seed ^ kSketchSalt) ^ table);
    }
  }

  float* Row(uint32_t slot) {
    return blocks[slot >> block_shift].rows.get() + (slot & block_mask) * stride;
  }
  SlotInfo& Info(uint32_t slot) { return blocks[slot >> block_shift].info[slot & block_mask]; }
  const float* Row(uint32_t slot) const {
    return blocks[slot >> block_shift].rows.get() + (slot & block_mask) * stride;
  }
  const SlotInfo& Info(uint32_t slot) const {
    return blocks[slot >> block_shift].info[slot & block_mask];
  }

  void Unlink(uint32_t slot) {
    SlotInfo& s = Info(slot);
    if (s.prev != kNoSlot)
      Info(s.prev).next = s.next;
    else
      head = s.next;
    if (s.next != kNoSlot)
      Info(s.next).prev = s.prev;
    else
      tail = s.prev;
  }

  void LinkBack(uint32_t slot) {
    SlotInfo& s = Info(slot);
    s.prev = tail;
    s.next = kNoSlot;
    if (tail != kNoSlot)
      Info(tail).next = slot;
    else
      head = slot;
    tail = slot;
  }

  // Marks the row used now. It records the table's clock rather than the
  // step the caller named, so the LRU list stays in last-touch order even
  // when a late pull names an older step.
  void Touch(uint32_t slot) {
    if (slot != tail) {
      Unlink(slot);
      LinkBack(slot);
    }
    Info(slot).last_touch = clock;
  }

  void Evict(uint32_t slot) {
    Unlink(slot);
    index.erase(Info(slot).id);
    free_slots.push_back(slot);
    budget->Give(row_bytes, share);
  }

  // Gives back down to the table's share when a table within its own was
  // refused memory (MemoryBudget::pressed).
  void GiveBackBorrowed() {
    if (!budget->pressed() || budget->used(share) <= budget->FairShare()) return;
    while (head != kNoSlot && budget->used(share) > budget->FairShare()) {
      Evict(head);
      stats.evicted_memory++;
    }
    budget->Relieve();
  }

  void EvictIdle() {
    if (options.idle_steps == 0) return;
    while (head != kNoSlot && clock - Info(head).last_touch > options.idle_steps) {
      Evict(head);
      stats.evicted_idle++;
    }
  }

  // Counts one push of `id` in the sketch; true once the id's estimate
  // (the smallest of its counters) reaches admit_after.
  bool CountAndAdmit(uint64_t id) {
    const uint64_t h = SplitMix64(id ^ sketch_key);
    uint32_t estimate = kMaxAdmitAfter;
    for (int r = 0; r < kSketchDepth; ++r) {
      uint8_t& c = sketch[r * kSketchWidth + ((h >> (16 * r)) & (kSketchWidth - 1))];
      if (c < kMaxAdmitAfter) ++c;
      estimate = std::min<uint32_t>(estimate, c);
    }
    return estimate >= admit_after;
  }

  // A slot for a new row of `id` with its budget taken, evicting the least
  // recently touched rows of this table while the budget is short; kNoSlot
  // when the table has no row left to give up. The new row is initialised,
  // its optimizer state zeroed, and it goes to the back of the LRU list.
  uint32_t Admit(uint64_t id) {
    while (!budget->TryTake(row_bytes, share)) {
      // Within its share, a table keeps its rows: the memory is borrowed by
      // others, who give it back at their next step.
      if (head == kNoSlot || budget->used(share) + row_bytes <= budget->FairShare()) {
        return kNoSlot;
      }
      Evict(head);
      stats.evicted_memory++;
    }
    uint32_t slot;
    if (!free_slots.empty()) {
      slot = free_slots.back();
      free_slots.pop_back();
    } else if (slots_made == kNoSlot) {
      budget->Give(row_bytes, share);  // 2^32 - 1 slots: no index left to give.
      return kNoSlot;
    } else {
      slot = slots_made++;
      if ((slot >> block_shift) == blocks.size()) {
        const size_t rows = block_mask + 1;
        blocks.push_back(Block{std::unique_ptr<float[]>(new float[rows * stride]),
                               std::unique_ptr<SlotInfo[]>(new SlotInfo[rows])});
      }
    }
    float* row = Row(slot);
    InitRow(options.seed, table, id, scale, row, dim);
    std::fill(row + dim, row + stride, 0.0f);
    Info(slot).id = id;
    index.emplace(id, slot);
    LinkBack(slot);
    Info(slot).last_touch = clock;
    stats.admitted++;
    return slot;
  }

  // Sums the gradient rows of duplicate ids, in the order they come, into
  // summed[u * dim, (u + 1) * dim) for unique_ids[u].
  void SumDuplicates(const uint64_t* ids, size_t n, const float* grads) {
    dedup.Reset(n);
    unique_ids.clear();
    if (summed.size() < n * dim) summed.resize(n * dim);
    for (size_t i = 0; i < n; ++i) {
      bool inserted;
      const uint32_t u =
          dedup.FindOrInsert(ids[i], static_cast<uint32_t>(unique_ids.size()), &inserted);
      float* dst = summed.data() + static_cast<size_t>(u) * dim;
      const float* src = grads + i * dim;
      if (inserted) {
        unique_ids.push_back(ids[i]);
        std::copy_n(src, dim, dst);
      } else {
        for (size_t j = 0; j < dim; ++j) dst[j] = dst[j] + src[j];
      }
    }
  }

  void Update(uint32_t slot, const float* g, const AdamStep& adam) {
    float* p = Row(slot);
    switch (options.optimizer) {
      case RowOptimizerKind::kSgd:
        SgdUpdate(p, g, dim, options.lr);
        break;
      case RowOptimizerKind::kAdagrad:
        AdagradUpdate(p, p + dim, g, dim, options.lr, options.eps);
        break;
      case RowOptimizerKind::kAdam:
        AdamUpdate(p, p + dim, p + 2 * dim, g, dim, adam);
        break;
    }
  }

  // SparseAdam's step constants at step t, computed in double as PyTorch's
  // Python floats are and narrowed once.
  AdamStep AdamConstants(uint64_t t) const {
    const double b1 = options.beta1, b2 = options.beta2;
    const double bias1 = 1.0 - std::pow(b1, static_cast<double>(t));
    const double bias2 = 1.0 - std::pow(b2, static_cast<double>(t));
    const double step_size = static_cast<double>(options.lr) * std::sqrt(bias2) / bias1;
    return AdamStep{static_cast<float>(1.0 - b1), static_cast<float>(1.0 - b2),
                    static_cast<float>(-step_size), options.eps};
  }

  const EmbeddingOptions options;
  const uint32_t table;
  const size_t dim;
  const size_t stride;
  const size_t row_bytes;
  const float scale;
  MemoryBudget* const budget;
  const int share;  // of the budget
  uint32_t admit_after = 1;

  std::unordered_map<uint64_t, uint32_t> index;  // id -> slot
  std::vector<Block> blocks;
  int block_shift = 0;
  size_t block_mask = 0;
  uint32_t slots_made = 0;  // slots [0, slots_made) have storage
  std::vector<uint32_t> free_slots;
  uint32_t head = kNoSlot;  // least recently touched
  uint32_t tail = kNoSlot;  // most recently touched
  uint64_t clock = 0;

  std::vector<uint8_t> sketch;  // empty when admit_after is 1
  uint64_t sketch_key = 0;

  // Apply's scratch, kept between calls.
  IdDedup dedup;
  std::vector<uint64_t> unique_ids;
  std::vector<float> summed;

  EmbeddingTableStats stats;
};

EmbeddingTable::EmbeddingTable(uint32_t table, uint32_t dim, const EmbeddingOptions& options,
                               MemoryBudget* budget)
    : table_(table), dim_(dim), impl_(std::make_unique<Impl>(table, dim, options, budget)) {}

EmbeddingTable::~EmbeddingTable() {
  impl_->budget->Give(impl_->index.size() * impl_->row_bytes, impl_->share);
  impl_->budget->Leave(impl_->share);
}

size_t EmbeddingTable::RowBytes() const { return impl_->row_bytes; }

void EmbeddingTable::Pull(const uint64_t* ids, size_t n, uint64_t step, float* out) {
  Impl& t = *impl_;
  t.clock = std::max(t.clock, step);
  for (size_t i = 0; i < n; ++i) {
    float* dst = out + i * t.dim;
    auto it = t.index.find(ids[i]);
    if (it == t.index.end()) {
      InitRow(t.options.seed, table_, ids[i], t.scale, dst, t.dim);
      continue;
    }
    std::copy_n(t.Row(it->second), t.dim, dst);
    t.Touch(it->second);
  }
  t.stats.pulled += n;
}

void EmbeddingTable::Apply(const uint64_t* ids, size_t n, const float* grads, uint64_t step) {
  Impl& t = *impl_;
  t.clock = std::max(t.clock, step);
  t.EvictIdle();
  t.GiveBackBorrowed();
  t.SumDuplicates(ids, n, grads);
  t.stats.steps++;
  const AdamStep adam =
      t.options.optimizer == RowOptimizerKind::kAdam ? t.AdamConstants(t.stats.steps) : AdamStep{};
  for (size_t u = 0; u < t.unique_ids.size(); ++u) {
    const uint64_t id = t.unique_ids[u];
    const float* g = t.summed.data() + u * t.dim;
    if (!AllFinite(g, t.dim)) {
      t.stats.refused_nonfinite++;
      continue;
    }
    uint32_t slot;
    auto it = t.index.find(id);
    if (it != t.index.end()) {
      slot = it->second;
    } else {
      if (!t.sketch.empty() && !t.CountAndAdmit(id)) {
        t.stats.not_admitted++;
        continue;
      }
      slot = t.Admit(id);
      if (slot == kNoSlot) {
        t.stats.refused_memory++;
        continue;
      }
    }
    t.Update(slot, g, adam);
    t.Touch(slot);
    t.stats.pushed++;
  }
}

size_t SketchCounters() { return kSketchDepth * kSketchWidth; }

EmbeddingRowsState EmbeddingTable::Save() const {
  const Impl& t = *impl_;
  EmbeddingRowsState s;
  s.clock = t.clock;
  s.stats = stats();
  s.ids.reserve(t.index.size());
  s.touched.reserve(t.index.size());
  s.slots.reserve(t.index.size() * t.stride);
  for (uint32_t slot = t.head; slot != kNoSlot; slot = t.Info(slot).next) {
    s.ids.push_back(t.Info(slot).id);
    s.touched.push_back(t.Info(slot).last_touch);
    const float* row = t.Row(slot);
    s.slots.insert(s.slots.end(), row, row + t.stride);
  }
  s.sketch = t.sketch;
  return s;
}

Status EmbeddingTable::Restore(const EmbeddingRowsState& saved) {
  Impl& t = *impl_;
  const std::string what = "embedding table " + std::to_string(table_) + ": ";
  if (!t.index.empty()) return InvalidArgumentError(what + "restored over rows it holds");
  const size_t n = saved.ids.size();
  if (saved.touched.size() != n || saved.slots.size() != n * t.stride) {
    return InvalidArgumentError(what + "saved rows of " + std::to_string(saved.slots.size()) +
                                " floats for " + std::to_string(n) + " ids, a row has " +
                                std::to_string(t.stride));
  }
  if (saved.sketch.size() != t.sketch.size()) {
    return InvalidArgumentError(what + "a saved admission sketch of " +
                                std::to_string(saved.sketch.size()) +
                                " counters, this table's has " + std::to_string(t.sketch.size()));
  }
  t.dedup.Reset(n);  // Apply's scratch: the table holds no rows, so no Apply runs now
  for (uint64_t id : saved.ids) {
    bool fresh;
    t.dedup.FindOrInsert(id, 0, &fresh);
    if (!fresh) return InvalidArgumentError(what + "row " + std::to_string(id) + " is saved twice");
  }
  t.stats = saved.stats;
  t.stats.rows = 0;
  t.sketch = saved.sketch;
  for (size_t i = 0; i < n; ++i) {
    t.clock = saved.touched[i];
    // Admit counts an admission; the saved counters hold this row's already.
    const uint64_t admitted = t.stats.admitted;
    const uint32_t slot = t.Admit(saved.ids[i]);
    t.stats.admitted = admitted;
    if (slot == kNoSlot) {  // no budget left and no row of its own to give
      t.stats.evicted_memory++;
      continue;
    }
    std::copy_n(saved.slots.data() + i * t.stride, t.stride, t.Row(slot));
  }
  t.clock = saved.clock;
  return OkStatus();
}

EmbeddingTableStats EmbeddingTable::stats() const {
  EmbeddingTableStats s = impl_->stats;
  s.rows = impl_->index.size();
  return s;
}

}  // namespace gradsync::server
