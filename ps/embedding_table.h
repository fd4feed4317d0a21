// EmbeddingTable: one sparse embedding table's rows on a parameter-server
// shard (docs/design/embeddings.md).
//
// Rows are keyed by 64-bit ids, with no pre-sized vocabulary: a row gets
// storage the first time its id is admitted, and reads as its initializer
// before that. Every row has the table's fixed width `dim`.
//
// Initializer: row `id` of table `table` is InitRow(seed, table, id): each
// element uniform in [-scale, scale), drawn from a counter-based hash of
// (seed, table, id, element), so every shard, every run and every reference
// computes the same row.
//
// Row-wise optimizers (the optimizer state lives beside the row, created
// with it; rows that a step does not touch do not change), as PyTorch's
// with a sparse gradient, duplicate ids of one step summed first:
//   sgd:      p -= lr * g                                    (torch.optim.SGD)
//   adagrad:  s += g^2; p -= lr * g / (sqrt(s) + eps)        (torch.optim.Adagrad,
//             lr_decay 0, initial_accumulator_value 0)
//   adam:     t += 1 per step of the table; m += (g - m)(1 - b1);
//             v += (g^2 - v)(1 - b2);
//             p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
//                                                              (torch.optim.SparseAdam)
// One Apply is one optimizer step: Adam's t counts Apply calls, whether or
// not they touch a row (SparseAdam's step count).
//
// Admission (admit_after = N >= 1): an id gets a row only once it has been
// pushed N times (counted in a fixed-size count-min sketch, so counting
// unseen ids takes no memory per id). Until then pulls read the
// initializer and its gradients are dropped (counted).
//
// Eviction: a row not touched (pulled or pushed) for more than `idle_steps`
// steps of the table's clock (the largest step a push or pull named) goes
// (counted). Memory: each table of a shard is guaranteed an equal share of
// MemoryBudget's limit (all of it while it is alone). A new row that does
// not fit evicts the table's own least recently touched row first
// (counted); a new row within the table's share that does not fit (a table
// that filled the budget before this one joined still holds it) is not
// admitted (counted, read as its initializer), and the tables over their
// share give back down to it at their next step (counted as evictions). So
// a flood of ids into one table never evicts another table's rows. An evicted row reads as its
// initializer again, and its id must be admitted anew.
//
// Bad input: a gradient row with a NaN or an infinity is refused (counted)
// and changes nothing; the rest of the push is applied.
//
// Thread-safety: a table belongs to one thread at a time; a MemoryBudget is
// shared by the tables of one shard and is thread-safe.
#ifndef GRADSYNC_PS_EMBEDDING_TABLE_H_
#define GRADSYNC_PS_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace gradsync::server {

enum class RowOptimizerKind { kSgd, kAdagrad, kAdam };

struct EmbeddingOptions {
  RowOptimizerKind optimizer = RowOptimizerKind::kAdagrad;
  float lr = 0.01f;
  float eps = 1e-10f;  // adagrad's default; adam's is usually 1e-8
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  uint64_t seed = 0;        // of the initializer
  float init_scale = 0.0f;  // 0: 1 / sqrt(dim)
  uint32_t admit_after = 1;
  uint64_t idle_steps = 0;  // 0: rows never expire
  uint32_t max_dim = 4096;  // widest row a table may declare

  // Reads embedding_optimizer=sgd|adagrad|adam (adagrad), embedding_lr
  // (0.01), embedding_eps (1e-10 for adagrad, 1e-8 for adam), beta1, beta2,
  // embedding_seed (0), embedding_init_scale (0: 1 / sqrt(dim)),
  // embedding_admit_after (1), embedding_idle_steps (0: never).
  // InvalidArgument naming a bad setting.
  static StatusOr<EmbeddingOptions> FromConfig(const Config& config);
};

const char* RowOptimizerName(RowOptimizerKind kind);

// Element j of row `id` of table `table` for `dim` elements at `scale`:
// out[0, dim).
void InitRow(uint64_t seed, uint32_t table, uint64_t id, float scale, float* out, size_t dim);

// The bytes every table of a shard may hold in rows (their values, optimizer
// state and bookkeeping, counted per row by EmbeddingTable::RowBytes), and
// each table's share of them. Every table that joined is guaranteed an
// equal share (limit / tables): the part of a share its table does not use
// stays free for it, so a table alone may fill the whole budget, and one of
// several never takes another's share. A table that holds more than its
// share (it filled the budget before others joined) gives back when one of
// them is refused within its share (pressed()). Thread-safe.
class MemoryBudget {
 public:
  static constexpr int kMaxShares = 1024;

  explicit MemoryBudget(size_t limit);
  // A share for one table; -1 once kMaxShares tables hold one (such a table
  // takes bytes without a guarantee).
  int Join();
  // Ends `share` (its bytes given back first).
  void Leave(int share);
  // Takes `bytes` for `share` if they fit under the limit less what the
  // other shares still lack of their guarantee; share -1 keeps no
  // guarantee for others. A share refused within its guarantee marks the
  // budget pressed, so that the shares that borrowed give back.
  bool TryTake(size_t bytes, int share = -1);
  void Give(size_t bytes, int share = -1);
  size_t used() const { return used_.load(); }
  size_t used(int share) const;
  size_t limit() const { return limit_; }
  // limit / the shares joined (limit while none did).
  size_t FairShare() const;
  // Whether a share was refused within its guarantee since the last
  // Relieve().
  bool pressed() const { return pressed_.load(std::memory_order_relaxed); }
  void Relieve() { pressed_.store(false, std::memory_order_relaxed); }

 private:
  const size_t limit_;
  std::atomic<size_t> used_{0};
  std::mutex mu_;  // Join and Leave
  std::atomic<int> joined_count_{0};
  std::atomic<int> high_{0};  // shares [0, high_) may be joined
  std::atomic<bool> pressed_{false};
  std::unique_ptr<std::atomic<size_t>[]> share_used_;
  std::unique_ptr<std::atomic<bool>[]> joined_;
};

struct EmbeddingTableStats {
  uint64_t rows = 0;               // rows with storage now
  uint64_t pulled = 0;             // rows read by pulls
  uint64_t pushed = 0;             // gradient rows applied
  uint64_t admitted = 0;           // ids given a row
  uint64_t not_admitted = 0;       // gradient rows dropped: id seen fewer than admit_after times
  uint64_t evicted_idle = 0;       // rows evicted after idle_steps
  uint64_t evicted_memory = 0;     // rows evicted for a new row under the budget
  uint64_t refused_memory = 0;     // ids not admitted: no row to give up
  uint64_t refused_nonfinite = 0;  // gradient rows with a NaN or an infinity
  uint64_t steps = 0;              // Apply calls
};

// A table's rows as EmbeddingTable::Save copies them, for a checkpoint
// (ps/ps_checkpoint.h).
struct EmbeddingRowsState {
  uint64_t clock = 0;
  EmbeddingTableStats stats;      // its counters (rows: ids.size())
  std::vector<uint64_t> ids;      // least recently touched first
  std::vector<uint64_t> touched;  // each row's last touch
  // Each row's values, then its optimizer state (Adagrad's sum of squares,
  // Adam's m and v): FloatsPerRow(optimizer, dim) floats a row.
  std::vector<float> slots;
  std::vector<uint8_t> sketch;  // the admission counts; empty when admit_after is 1
};

// The floats a row of `dim` elements keeps under `optimizer`.
size_t FloatsPerRow(RowOptimizerKind optimizer, uint32_t dim);
// The admission sketch's counters (EmbeddingRowsState::sketch).
size_t SketchCounters();

class EmbeddingTable {
 public:
  // `budget` (shared by the shard's tables) outlives the table.
  EmbeddingTable(uint32_t table, uint32_t dim, const EmbeddingOptions& options,
                 MemoryBudget* budget);
  ~EmbeddingTable();  // gives its rows' bytes back to the budget

  uint32_t id() const { return table_; }
  uint32_t dim() const { return dim_; }
  // What one row costs the budget: its values and optimizer state (floats),
  // and a fixed allowance for its id, clock and index entries.
  size_t RowBytes() const;

  // Writes the rows of ids[0, n) to out[0, n * dim), as of now (the
  // initializer for ids without a row); touches their rows at `step`.
  void Pull(const uint64_t* ids, size_t n, uint64_t step, float* out);
  // One optimizer step over the gradient rows grads[i * dim, (i + 1) * dim)
  // of ids[i], i < n (duplicate ids summed first), at `step` of the table's
  // clock: admits, evicts, refuses and applies as above.
  void Apply(const uint64_t* ids, size_t n, const float* grads, uint64_t step);

  EmbeddingTableStats stats() const;

  // A copy of every row, its state and the table's clock, counters and
  // sketch.
  EmbeddingRowsState Save() const;
  // Loads `saved` into this table, which must hold no rows yet. Rows that
  // do not fit the budget now go least recently touched first (counted as
  // memory evictions). InvalidArgument, loading nothing, when `saved`
  // contradicts itself or this table (sizes, a repeated id).
  Status Restore(const EmbeddingRowsState& saved);

 private:
  struct Impl;
  const uint32_t table_;
  const uint32_t dim_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_EMBEDDING_TABLE_H_
