#include "ps/embedding_table.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync::server {
namespace {

constexpr size_t kDim = 8;
constexpr float kScale = 0.5f;
constexpr size_t kBigBudget = size_t{1} << 30;

EmbeddingOptions Options(RowOptimizerKind kind) {
  EmbeddingOptions o;
  o.optimizer = kind;
  o.lr = 0.05f;
  o.eps = kind == RowOptimizerKind::kAdagrad ? 1e-10f : 1e-8f;
  o.beta1 = 0.9f;
  o.beta2 = 0.99f;
  o.seed = 17;
  o.init_scale = kScale;
  return o;
}

std::vector<float> Init(const EmbeddingOptions& o, uint32_t table, uint64_t id, size_t dim = kDim,
                        float scale = kScale) {
  std::vector<float> row(dim);
  InitRow(o.seed, table, id, scale, row.data(), dim);
  return row;
}

std::vector<float> PullOne(EmbeddingTable* table, uint64_t id, uint64_t step) {
  std::vector<float> row(table->dim());
  table->Pull(&id, 1, step, row.data());
  return row;
}

void PushOne(EmbeddingTable* table, uint64_t id, const std::vector<float>& g, uint64_t step) {
  table->Apply(&id, 1, g.data(), step);
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The rows a test reads back, compared bit for bit.
void ExpectRowsEqual(const std::vector<float>& got, const std::vector<float>& want,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t j = 0; j < got.size(); ++j) ASSERT_EQ(got[j], want[j]) << what << " element " << j;
}

TEST(InitRowTest, IsAPureFunctionOfSeedTableAndId) {
  std::vector<float> a(64), b(64);
  InitRow(1, 2, 3, 1.0f, a.data(), a.size());
  InitRow(1, 2, 3, 1.0f, b.data(), b.size());
  EXPECT_TRUE(BitEqual(a, b));
  // Pinned, so that a change of the hash (which every shard and reference
  // must agree on) shows here.
  const float pinned[4] = {a[0], a[1], a[2], a[3]};
  // (Computed apart from this code, from the formula in embedding_table.h.)
  const float want[4] = {-0x1.8990b4p-1f, 0x1.4c1f9p-3f, 0x1.0d86dp-1f, 0x1.5d1cbp-2f};
  for (int j = 0; j < 4; ++j) EXPECT_EQ(pinned[j], want[j]) << "element " << j;
  // A prefix of a wider row is the narrower row.
  std::vector<float> narrow(5);
  InitRow(1, 2, 3, 1.0f, narrow.data(), narrow.size());
  for (size_t j = 0; j < narrow.size(); ++j) EXPECT_EQ(narrow[j], a[j]);
  InitRow(1, 2, 4, 1.0f, b.data(), b.size());
  EXPECT_FALSE(BitEqual(a, b)) << "id";
  InitRow(1, 3, 3, 1.0f, b.data(), b.size());
  EXPECT_FALSE(BitEqual(a, b)) << "table";
  InitRow(2, 2, 3, 1.0f, b.data(), b.size());
  EXPECT_FALSE(BitEqual(a, b)) << "seed";
  // Scale multiplies.
  InitRow(1, 2, 3, 0.25f, b.data(), b.size());
  for (size_t j = 0; j < a.size(); ++j) EXPECT_EQ(b[j], 0.25f * a[j]);
}

TEST(InitRowTest, IsUniformInMinusScaleToScale) {
  const float scale = 0.3f;
  std::vector<float> row(64);
  double sum = 0, sum_sq = 0;
  float lo = scale, hi = -scale;
  size_t count = 0;
  for (uint64_t id = 0; id < 2000; ++id) {
    InitRow(99, 1, id * 0x9E3779B97F4A7C15ull, scale, row.data(), row.size());
    for (float x : row) {
      ASSERT_GE(x, -scale);
      ASSERT_LT(x, scale);
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      sum += x;
      sum_sq += static_cast<double>(x) * x;
      ++count;
    }
  }
  const double mean = sum / count;
  const double var = sum_sq / count - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01 * scale);
  EXPECT_NEAR(var, scale * scale / 3.0, 0.01 * scale * scale);  // uniform's variance
  EXPECT_LT(lo, -0.99f * scale);
  EXPECT_GT(hi, 0.99f * scale);
}

TEST(EmbeddingTableTest, RowBytesIsTheFloatsPlusTheAllowance) {
  MemoryBudget budget(0);
  EXPECT_EQ(EmbeddingTable(0, kDim, Options(RowOptimizerKind::kSgd), &budget).RowBytes(),
            kDim * 4 + 64);
  EXPECT_EQ(EmbeddingTable(0, kDim, Options(RowOptimizerKind::kAdagrad), &budget).RowBytes(),
            2 * kDim * 4 + 64);
  EXPECT_EQ(EmbeddingTable(0, kDim, Options(RowOptimizerKind::kAdam), &budget).RowBytes(),
            3 * kDim * 4 + 64);
}

TEST(EmbeddingTableTest, PullOfUnseenIdsReadsTheInitializerAndCreatesNoRows) {
  MemoryBudget budget(kBigBudget);
  EmbeddingOptions o = Options(RowOptimizerKind::kAdagrad);
  o.init_scale = 0;  // 1 / sqrt(dim)
  const uint32_t dim = 16;
  EmbeddingTable table(5, dim, o, &budget);
  const std::vector<uint64_t> ids = {0, 7, 7, ~uint64_t{0}};
  std::vector<float> out(ids.size() * dim);
  table.Pull(ids.data(), ids.size(), 3, out.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<float> got(out.begin() + i * dim, out.begin() + (i + 1) * dim);
    ExpectRowsEqual(got, Init(o, 5, ids[i], dim, 0.25f), "id " + std::to_string(ids[i]));
  }
  const EmbeddingTableStats s = table.stats();
  EXPECT_EQ(s.rows, 0u);
  EXPECT_EQ(s.pulled, ids.size());
  EXPECT_EQ(s.admitted, 0u);
  EXPECT_EQ(budget.used(), 0u);
}

// The one-process reference: a dense table of `kVocab` rows initialised by
// InitRow, every step a random batch with duplicate ids and random gradients,
// duplicates summed in the order they come and each unique row updated in
// plain loops by PyTorch's sparse formulas. The EmbeddingTable gets the raw
// batches; every row must agree bit for bit, during and after.
class ReferenceTest : public ::testing::TestWithParam<RowOptimizerKind> {};

TEST_P(ReferenceTest, MatchesADenseReferenceBitForBit) {
  constexpr size_t kVocab = 50;
  constexpr int kSteps = 200;
  const RowOptimizerKind kind = GetParam();
  const EmbeddingOptions o = Options(kind);
  const uint32_t table_id = 3;
  MemoryBudget budget(kBigBudget);
  EmbeddingTable table(table_id, kDim, o, &budget);

  std::vector<uint64_t> vocab(kVocab);
  for (size_t k = 0; k < kVocab; ++k) vocab[k] = (k + 1) * 0x9E3779B97F4A7C15ull;
  std::vector<float> p(kVocab * kDim), s(kVocab * kDim, 0.0f), m(kVocab * kDim, 0.0f),
      v(kVocab * kDim, 0.0f);
  for (size_t k = 0; k < kVocab; ++k) {
    InitRow(o.seed, table_id, vocab[k], kScale, p.data() + k * kDim, kDim);
  }

  std::mt19937 rng(12345);
  std::uniform_int_distribution<size_t> pick(0, kVocab - 1), size(1, 120);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  uint64_t unique_rows = 0;
  std::map<size_t, bool> seen;
  for (int step = 1; step <= kSteps; ++step) {
    const size_t n = size(rng);
    std::vector<size_t> rows(n);
    std::vector<uint64_t> ids(n);
    std::vector<float> grads(n * kDim);
    for (size_t i = 0; i < n; ++i) {
      rows[i] = pick(rng);
      ids[i] = vocab[rows[i]];
      for (size_t j = 0; j < kDim; ++j) grads[i * kDim + j] = normal(rng);
    }
    table.Apply(ids.data(), n, grads.data(), step);

    std::map<size_t, std::vector<float>> summed;
    for (size_t i = 0; i < n; ++i) {
      auto [it, fresh] =
          summed.try_emplace(rows[i], grads.begin() + i * kDim, grads.begin() + (i + 1) * kDim);
      if (!fresh) {
        for (size_t j = 0; j < kDim; ++j) it->second[j] = it->second[j] + grads[i * kDim + j];
      }
    }
    unique_rows += summed.size();
    const double bias1 = 1.0 - std::pow(static_cast<double>(o.beta1), step);
    const double bias2 = 1.0 - std::pow(static_cast<double>(o.beta2), step);
    const double step_size = static_cast<double>(o.lr) * std::sqrt(bias2) / bias1;
    const float one_minus_b1 = static_cast<float>(1.0 - static_cast<double>(o.beta1));
    const float one_minus_b2 = static_cast<float>(1.0 - static_cast<double>(o.beta2));
    for (const auto& [k, g] : summed) {
      seen[k] = true;
      for (size_t j = 0; j < kDim; ++j) {
        const size_t e = k * kDim + j;
        switch (kind) {
          case RowOptimizerKind::kSgd:
            p[e] = p[e] - o.lr * g[j];
            break;
          case RowOptimizerKind::kAdagrad:
            s[e] = s[e] + g[j] * g[j];
            p[e] = p[e] - o.lr * (g[j] / (std::sqrt(s[e]) + o.eps));
            break;
          case RowOptimizerKind::kAdam: {
            const float m_old = m[e];
            const float m_upd = (g[j] - m_old) * one_minus_b1;
            m[e] = m_old + m_upd;
            const float v_old = v[e];
            const float v_upd = (g[j] * g[j] - v_old) * one_minus_b2;
            v[e] = v_old + v_upd;
            const float numer = m_upd + m_old;
            const float denom = std::sqrt(v_upd + v_old) + o.eps;
            p[e] = p[e] + static_cast<float>(-step_size) * (numer / denom);
            break;
          }
        }
      }
    }

    if (step % 37 == 0) {  // Pulls in between read the same rows.
      std::vector<float> out(kVocab * kDim);
      table.Pull(vocab.data(), kVocab, step, out.data());
      ASSERT_TRUE(BitEqual(out, p)) << "step " << step;
    }
  }
  std::vector<float> out(kVocab * kDim);
  table.Pull(vocab.data(), kVocab, kSteps, out.data());
  for (size_t k = 0; k < kVocab; ++k) {
    ExpectRowsEqual(std::vector<float>(out.begin() + k * kDim, out.begin() + (k + 1) * kDim),
                    std::vector<float>(p.begin() + k * kDim, p.begin() + (k + 1) * kDim),
                    "row " + std::to_string(k));
  }
  const EmbeddingTableStats st = table.stats();
  EXPECT_EQ(st.steps, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(st.pushed, unique_rows);
  EXPECT_EQ(st.admitted, seen.size());
  EXPECT_EQ(st.rows, seen.size());
  EXPECT_EQ(budget.used(), seen.size() * table.RowBytes());
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ReferenceTest,
                         ::testing::Values(RowOptimizerKind::kSgd, RowOptimizerKind::kAdagrad,
                                           RowOptimizerKind::kAdam),
                         [](const ::testing::TestParamInfo<RowOptimizerKind>& info) {
                           return std::string(RowOptimizerName(info.param));
                         });

// Independent of the reference's arithmetic: a first Adam step moves every
// element by about lr against the sign of its gradient, a first Adagrad step
// by lr, SGD by lr * g.
TEST(EmbeddingTableTest, FirstStepsHaveTheTextbookSizes) {
  const std::vector<float> g = {1.0f, -2.0f, 0.5f, -0.25f, 3.0f, -4.0f, 0.125f, 8.0f};
  for (RowOptimizerKind kind :
       {RowOptimizerKind::kSgd, RowOptimizerKind::kAdagrad, RowOptimizerKind::kAdam}) {
    MemoryBudget budget(kBigBudget);
    const EmbeddingOptions o = Options(kind);
    EmbeddingTable table(0, kDim, o, &budget);
    PushOne(&table, 42, g, 1);
    const std::vector<float> init = Init(o, 0, 42), got = PullOne(&table, 42, 1);
    for (size_t j = 0; j < kDim; ++j) {
      const float sign = g[j] > 0 ? 1.0f : -1.0f;
      const float want =
          kind == RowOptimizerKind::kSgd ? init[j] - o.lr * g[j] : init[j] - o.lr * sign;
      EXPECT_NEAR(got[j], want, 1e-6) << RowOptimizerName(kind) << " element " << j;
    }
  }
}

TEST(EmbeddingTableTest, AdamsStepCountsEveryApply) {
  MemoryBudget budget(kBigBudget);
  const EmbeddingOptions o = Options(RowOptimizerKind::kAdam);
  EmbeddingTable table(0, 1, o, &budget);
  const std::vector<float> g1 = {0.5f}, g5 = {-1.5f}, other = {1.0f};
  PushOne(&table, 1, g1, 1);
  for (uint64_t step = 2; step <= 4; ++step) PushOne(&table, 2, other, step);
  PushOne(&table, 1, g5, 5);
  EXPECT_EQ(table.stats().steps, 5u);

  // Row 1 as SparseAdam leaves it after its steps at t = 1 and t = `t2`.
  auto row_after = [&](int t2) {
    float p = Init(o, 0, 1, 1)[0], m = 0, v = 0;
    const std::pair<int, float> steps[] = {{1, g1[0]}, {t2, g5[0]}};
    for (const auto& [t, g] : steps) {
      const double bias1 = 1.0 - std::pow(static_cast<double>(o.beta1), t);
      const double bias2 = 1.0 - std::pow(static_cast<double>(o.beta2), t);
      const float neg_step = static_cast<float>(-(o.lr * std::sqrt(bias2) / bias1));
      m = m + (g - m) * static_cast<float>(1.0 - o.beta1);
      v = v + (g * g - v) * static_cast<float>(1.0 - o.beta2);
      p = p + neg_step * (m / (std::sqrt(v) + o.eps));
    }
    return p;
  };
  ASSERT_NE(row_after(5), row_after(2));
  EXPECT_EQ(PullOne(&table, 1, 5)[0], row_after(5));
}

TEST(EmbeddingTableTest, AdmitsAnIdOnItsNthPush) {
  MemoryBudget budget(kBigBudget);
  EmbeddingOptions o = Options(RowOptimizerKind::kSgd);
  o.admit_after = 3;
  EmbeddingTable table(0, kDim, o, &budget);
  const std::vector<float> g1(kDim, 1.0f), g2(kDim, 2.0f), g3(kDim, 0.25f);
  PushOne(&table, 9, g1, 1);
  PushOne(&table, 9, g2, 2);
  EXPECT_EQ(table.stats().rows, 0u);
  EXPECT_EQ(table.stats().not_admitted, 2u);
  EXPECT_EQ(table.stats().pushed, 0u);
  EXPECT_EQ(budget.used(), 0u);
  ExpectRowsEqual(PullOne(&table, 9, 2), Init(o, 0, 9), "before admission");

  PushOne(&table, 9, g3, 3);
  EXPECT_EQ(table.stats().rows, 1u);
  EXPECT_EQ(table.stats().admitted, 1u);
  EXPECT_EQ(table.stats().pushed, 1u);
  std::vector<float> want = Init(o, 0, 9);
  for (size_t j = 0; j < kDim; ++j) want[j] = want[j] - o.lr * g3[j];
  ExpectRowsEqual(PullOne(&table, 9, 3), want, "after admission");
}

TEST(EmbeddingTableTest, DuplicatesInOnePushCountOnceTowardsAdmission) {
  MemoryBudget budget(kBigBudget);
  EmbeddingOptions o = Options(RowOptimizerKind::kSgd);
  o.admit_after = 2;
  EmbeddingTable table(0, kDim, o, &budget);
  const std::vector<uint64_t> ids = {4, 4, 4};
  const std::vector<float> g(3 * kDim, 1.0f);
  table.Apply(ids.data(), ids.size(), g.data(), 1);
  EXPECT_EQ(table.stats().rows, 0u);
  EXPECT_EQ(table.stats().not_admitted, 1u);
  table.Apply(ids.data(), ids.size(), g.data(), 2);
  EXPECT_EQ(table.stats().rows, 1u);
  std::vector<float> want = Init(o, 0, 4);
  for (size_t j = 0; j < kDim; ++j) want[j] = want[j] - o.lr * 3.0f;
  ExpectRowsEqual(PullOne(&table, 4, 2), want, "summed push");
}

TEST(EmbeddingTableTest, EvictsRowsIdleForMoreThanIdleSteps) {
  MemoryBudget budget(kBigBudget);
  EmbeddingOptions o = Options(RowOptimizerKind::kSgd);
  o.idle_steps = 10;
  EmbeddingTable table(0, kDim, o, &budget);
  const std::vector<float> g(2 * kDim, 1.0f);
  const std::vector<uint64_t> old_ids = {1, 2};
  table.Apply(old_ids.data(), 2, g.data(), 1);
  PushOne(&table, 3, std::vector<float>(kDim, 1.0f), 11);  // idle for 10: kept
  EXPECT_EQ(table.stats().rows, 3u);
  EXPECT_EQ(table.stats().evicted_idle, 0u);
  PushOne(&table, 3, std::vector<float>(kDim, 1.0f), 20);  // idle for 19: gone
  EXPECT_EQ(table.stats().evicted_idle, 2u);
  EXPECT_EQ(table.stats().rows, 1u);
  EXPECT_EQ(budget.used(), table.RowBytes());
  ExpectRowsEqual(PullOne(&table, 1, 20), Init(o, 0, 1), "evicted row 1");
  ExpectRowsEqual(PullOne(&table, 2, 20), Init(o, 0, 2), "evicted row 2");
  EXPECT_EQ(table.stats().rows, 1u);  // pulls create nothing

  // A pull keeps a row alive: 3 is read at 25, so at 35 it has been idle 10.
  PullOne(&table, 3, 25);
  PushOne(&table, 4, std::vector<float>(kDim, 1.0f), 35);
  EXPECT_EQ(table.stats().evicted_idle, 2u);
  EXPECT_EQ(table.stats().rows, 2u);
  PushOne(&table, 4, std::vector<float>(kDim, 1.0f), 36);
  EXPECT_EQ(table.stats().evicted_idle, 3u);
  EXPECT_EQ(table.stats().rows, 1u);

  // An evicted id is admitted anew and starts from its initializer.
  PushOne(&table, 1, std::vector<float>(kDim, 2.0f), 37);
  std::vector<float> want = Init(o, 0, 1);
  for (size_t j = 0; j < kDim; ++j) want[j] = want[j] - o.lr * 2.0f;
  ExpectRowsEqual(PullOne(&table, 1, 37), want, "readmitted row 1");
}

TEST(EmbeddingTableTest, KeepsTheMostRecentRowsWithinTheBudget) {
  constexpr size_t kRows = 16;
  const EmbeddingOptions o = Options(RowOptimizerKind::kAdagrad);
  const size_t row_bytes = 2 * kDim * 4 + 64;
  // Room for kRows rows and not quite one more.
  MemoryBudget budget(kRows * row_bytes + row_bytes - 1);
  EmbeddingTable table(0, kDim, o, &budget);
  ASSERT_EQ(table.RowBytes(), row_bytes);
  const std::vector<float> g(kDim, 1.0f);
  for (uint64_t id = 0; id < 10 * kRows; ++id) {
    PushOne(&table, id, g, id + 1);
    ASSERT_LE(budget.used(), budget.limit());
    ASSERT_EQ(budget.used(), table.stats().rows * row_bytes);
  }
  EmbeddingTableStats s = table.stats();
  EXPECT_EQ(s.rows, kRows);
  EXPECT_EQ(s.admitted, 10 * kRows);
  EXPECT_EQ(s.evicted_memory, 9 * kRows);
  EXPECT_EQ(s.refused_memory, 0u);
  for (uint64_t id = 0; id < 10 * kRows; ++id) {
    const bool present = id >= 9 * kRows;
    EXPECT_EQ(!BitEqual(PullOne(&table, id, 10 * kRows), Init(o, 0, id)), present) << "id " << id;
  }

  // Least recently touched goes first: a pulled row outlives the rows pushed
  // after it.
  const uint64_t oldest = 9 * kRows, next_oldest = 9 * kRows + 1;
  PullOne(&table, oldest, 200);
  PushOne(&table, 1000, g, 201);
  EXPECT_FALSE(BitEqual(PullOne(&table, oldest, 201), Init(o, 0, oldest)));
  EXPECT_TRUE(BitEqual(PullOne(&table, next_oldest, 201), Init(o, 0, next_oldest)));

  // One push of more new ids than fit keeps its last kRows.
  std::vector<uint64_t> ids(3 * kRows);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 5000 + i;
  const std::vector<float> grads(ids.size() * kDim, 1.0f);
  table.Apply(ids.data(), ids.size(), grads.data(), 300);
  EXPECT_LE(budget.used(), budget.limit());
  EXPECT_EQ(table.stats().rows, kRows);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(!BitEqual(PullOne(&table, ids[i], 300), Init(o, 0, ids[i])), i >= 2 * kRows)
        << "id " << ids[i];
  }
}

TEST(EmbeddingTableTest, AFloodIntoOneTableLeavesAnotherItsShare) {
  constexpr size_t kRows = 8;
  const EmbeddingOptions o = Options(RowOptimizerKind::kSgd);
  MemoryBudget budget(kRows * (kDim * 4 + 64));
  EmbeddingTable a(1, kDim, o, &budget);
  EmbeddingTable b(2, kDim, o, &budget);
  const size_t row = a.RowBytes();
  ASSERT_EQ(budget.FairShare(), kRows / 2 * row);
  const std::vector<float> g(kDim, 1.0f);
  PushOne(&a, 0, g, 1);
  // b floods: it keeps to its share (a's unused part stays free for a)
  // and evicts its own rows.
  for (uint64_t id = 100; id < 200; ++id) PushOne(&b, id, g, 1);
  EXPECT_EQ(b.stats().rows, kRows / 2);
  EXPECT_EQ(b.stats().evicted_memory, 100u - kRows / 2);
  EXPECT_LE(budget.used(), budget.limit());
  // a's share is there for it: no row of a evicted, none refused.
  for (uint64_t id = 1; id < kRows / 2; ++id) PushOne(&a, id, g, 2);
  EXPECT_EQ(a.stats().rows, kRows / 2);
  EXPECT_EQ(a.stats().evicted_memory, 0u);
  EXPECT_EQ(a.stats().refused_memory, 0u);
  EXPECT_EQ(b.stats().rows, kRows / 2);
  EXPECT_EQ(budget.used(), budget.limit());
  // Past its share a gives up its own rows, not b's.
  PushOne(&a, 50, g, 3);
  EXPECT_EQ(a.stats().rows, kRows / 2);
  EXPECT_EQ(a.stats().evicted_memory, 1u);
  EXPECT_EQ(b.stats().rows, kRows / 2);
}

TEST(EmbeddingTableTest, ATableThatBorrowedGivesBackAtItsNextStep) {
  constexpr size_t kRows = 8;
  const EmbeddingOptions o = Options(RowOptimizerKind::kSgd);
  MemoryBudget budget(kRows * (kDim * 4 + 64));
  auto a = std::make_unique<EmbeddingTable>(1, kDim, o, &budget);
  const std::vector<float> g(kDim, 1.0f);
  for (uint64_t id = 0; id < kRows; ++id) PushOne(a.get(), id, g, 1);
  ASSERT_EQ(a->stats().rows, kRows);  // alone, a may fill the budget
  ASSERT_EQ(budget.used(), budget.limit());
  std::vector<std::vector<float>> before;
  for (uint64_t id = 0; id < kRows; ++id) before.push_back(PullOne(a.get(), id, 1));

  EmbeddingTable b(2, kDim, o, &budget);  // joins: each is owed half
  const std::vector<uint64_t> ids = {100, 101, 102};
  const std::vector<float> grads(ids.size() * kDim, 1.0f);
  b.Apply(ids.data(), ids.size(), grads.data(), 2);
  EXPECT_EQ(b.stats().refused_memory, 3u);  // a still holds it: counted
  EXPECT_EQ(b.stats().rows, 0u);
  ExpectRowsEqual(PullOne(&b, 100, 2), Init(o, 2, 100), "refused id");
  EXPECT_TRUE(budget.pressed());

  // a's next step gives back down to its share, least recently used first.
  PushOne(a.get(), 7, g, 3);
  EXPECT_EQ(a->stats().rows, kRows / 2);
  EXPECT_EQ(a->stats().evicted_memory, kRows / 2);
  EXPECT_FALSE(budget.pressed());
  for (uint64_t id = kRows / 2; id < kRows - 1; ++id) {
    ExpectRowsEqual(PullOne(a.get(), id, 3), before[id], "a's row " + std::to_string(id));
  }
  b.Apply(ids.data(), ids.size(), grads.data(), 4);
  EXPECT_EQ(b.stats().rows, 3u);
  EXPECT_EQ(a->stats().rows, kRows / 2);

  a.reset();  // its bytes and its share come back
  EXPECT_EQ(budget.used(), 3 * b.RowBytes());
  EXPECT_EQ(budget.FairShare(), budget.limit());
}

TEST(EmbeddingTableTest, RefusesGradientRowsWithNaNOrInfinity) {
  MemoryBudget budget(kBigBudget);
  const EmbeddingOptions o = Options(RowOptimizerKind::kAdagrad);
  EmbeddingTable table(0, kDim, o, &budget);
  const std::vector<float> g(kDim, 0.5f);
  PushOne(&table, 2, g, 1);  // 2 has a row with state
  const std::vector<float> row2 = PullOne(&table, 2, 1);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<uint64_t> ids = {1, 2, 3, 4, 5, 5};
  std::vector<float> grads(ids.size() * kDim, 0.25f);
  grads[1 * kDim + 3] = nan;          // 2: existing row
  grads[2 * kDim + 0] = inf;          // 3: new id
  grads[3 * kDim + kDim - 1] = -inf;  // 4: new id
  grads[5 * kDim + 2] = nan;          // 5: its duplicate's sum is NaN
  table.Apply(ids.data(), ids.size(), grads.data(), 2);
  EmbeddingTableStats s = table.stats();
  EXPECT_EQ(s.refused_nonfinite, 4u);
  EXPECT_EQ(s.pushed, 2u);  // 2 at step 1, 1 now
  EXPECT_EQ(s.rows, 2u);
  ExpectRowsEqual(PullOne(&table, 2, 2), row2, "row 2 after NaN");
  for (uint64_t id : {3, 4, 5}) {
    ExpectRowsEqual(PullOne(&table, id, 2), Init(o, 0, id), "id " + std::to_string(id));
  }
  std::vector<float> want1 = Init(o, 0, 1);
  for (size_t j = 0; j < kDim; ++j) {
    const float sum = 0.25f * 0.25f;
    want1[j] = want1[j] - o.lr * (0.25f / (std::sqrt(sum) + o.eps));
  }
  ExpectRowsEqual(PullOne(&table, 1, 2), want1, "row 1");

  // Row 2's accumulator did not see the NaN push either.
  PushOne(&table, 2, g, 3);
  std::vector<float> want2 = Init(o, 0, 2);
  float acc = 0;
  for (int k = 0; k < 2; ++k) {
    acc = acc + 0.5f * 0.5f;
    for (size_t j = 0; j < kDim; ++j)
      want2[j] = want2[j] - o.lr * (0.5f / (std::sqrt(acc) + o.eps));
  }
  ExpectRowsEqual(PullOne(&table, 2, 3), want2, "row 2 after a finite push");
}

TEST(EmbeddingTableTest, GivesEveryByteBackWhenDestroyed) {
  MemoryBudget budget(kBigBudget);
  {
    EmbeddingOptions o = Options(RowOptimizerKind::kAdam);
    o.idle_steps = 5;
    EmbeddingTable table(0, kDim, o, &budget);
    const std::vector<float> g(kDim, 1.0f);
    for (uint64_t id = 0; id < 3000; ++id) PushOne(&table, id, g, id / 100 + 1);
    ASSERT_GT(table.stats().evicted_idle, 0u);
    ASSERT_GT(table.stats().rows, 0u);
    EXPECT_EQ(budget.used(), table.stats().rows * table.RowBytes());
  }
  EXPECT_EQ(budget.used(), 0u);
}

TEST(EmbeddingTableTest, ARowOfNoElementsKeepsItsBookkeeping) {
  MemoryBudget budget(kBigBudget);
  EmbeddingTable table(0, 0, Options(RowOptimizerKind::kAdam), &budget);
  EXPECT_EQ(table.RowBytes(), 64u);
  const std::vector<uint64_t> ids = {1, 2, 1};
  table.Apply(ids.data(), ids.size(), nullptr, 1);
  table.Pull(ids.data(), ids.size(), 1, nullptr);
  EXPECT_EQ(table.stats().rows, 2u);
  EXPECT_EQ(table.stats().pushed, 2u);
  EXPECT_EQ(budget.used(), 128u);
}

// Drives `table` through `steps` steps of a fixed, seeded schedule (pulls
// and pushes of overlapping, repeated ids), from step `from`.
void Drive(EmbeddingTable* table, uint64_t from, uint64_t steps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint64_t> id(0, 40);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (uint64_t step = from; step < from + steps; ++step) {
    std::vector<uint64_t> ids(12);
    for (uint64_t& x : ids) x = id(rng);
    std::vector<float> rows(ids.size() * kDim), grads(ids.size() * kDim);
    table->Pull(ids.data(), ids.size(), step, rows.data());
    for (float& x : grads) x = g(rng);
    table->Apply(ids.data(), ids.size(), grads.data(), step);
  }
}

std::vector<float> AllRows(EmbeddingTable* table, uint64_t step) {
  std::vector<uint64_t> ids(41);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  std::vector<float> rows(ids.size() * kDim);
  table->Pull(ids.data(), ids.size(), step, rows.data());
  return rows;
}

class SaveRestoreTest : public ::testing::TestWithParam<RowOptimizerKind> {};

// A table restored from a save goes on as the saved one does, bit for bit:
// its rows, optimizer state (Adam's step count too), LRU order, clock and
// admission counts, and its counters.
TEST_P(SaveRestoreTest, ARestoredTableGoesOnBitForBit) {
  EmbeddingOptions o = Options(GetParam());
  o.admit_after = 2;
  o.idle_steps = 6;
  const size_t row_bytes = FloatsPerRow(o.optimizer, kDim) * sizeof(float) + 64;
  // Room for 24 of the 41 ids: the memory bound evicts too.
  MemoryBudget budget_a(24 * row_bytes), budget_b(24 * row_bytes);
  EmbeddingTable a(3, kDim, o, &budget_a);
  Drive(&a, 1, 30, 5);
  const EmbeddingRowsState saved = a.Save();
  EXPECT_EQ(saved.ids.size(), a.stats().rows);
  EXPECT_EQ(saved.sketch.size(), SketchCounters());
  EmbeddingTable b(3, kDim, o, &budget_b);
  ASSERT_TRUE(b.Restore(saved).ok());
  EXPECT_EQ(budget_b.used(), budget_a.used());
  Drive(&a, 31, 30, 6);
  Drive(&b, 31, 30, 6);
  ExpectRowsEqual(AllRows(&b, 61), AllRows(&a, 61), "after the restore");
  const EmbeddingTableStats sa = a.stats(), sb = b.stats();
  EXPECT_EQ(sb.rows, sa.rows);
  EXPECT_EQ(sb.steps, sa.steps);
  EXPECT_EQ(sb.admitted, sa.admitted);
  EXPECT_EQ(sb.not_admitted, sa.not_admitted);
  EXPECT_EQ(sb.evicted_idle, sa.evicted_idle);
  EXPECT_EQ(sb.evicted_memory, sa.evicted_memory);
  EXPECT_EQ(sb.pulled, sa.pulled);
  EXPECT_GT(sa.evicted_idle + sa.evicted_memory, 0u);
  EXPECT_GT(sa.not_admitted, 0u);
}

INSTANTIATE_TEST_SUITE_P(EveryOptimizer, SaveRestoreTest,
                         ::testing::Values(RowOptimizerKind::kSgd, RowOptimizerKind::kAdagrad,
                                           RowOptimizerKind::kAdam));

TEST(EmbeddingTableTest, ARestoreIntoASmallerBudgetKeepsTheMostRecentRows) {
  const EmbeddingOptions o = Options(RowOptimizerKind::kSgd);
  MemoryBudget big(kBigBudget);
  EmbeddingTable a(0, kDim, o, &big);
  const std::vector<float> g(kDim, 1.0f);
  for (uint64_t id = 0; id < 10; ++id) PushOne(&a, id, g, id + 1);
  MemoryBudget small(4 * a.RowBytes());
  EmbeddingTable b(0, kDim, o, &small);
  ASSERT_TRUE(b.Restore(a.Save()).ok());
  EXPECT_EQ(b.stats().rows, 4u);
  EXPECT_EQ(b.stats().evicted_memory, 6u);
  EXPECT_LE(small.used(), small.limit());
  for (uint64_t id = 0; id < 10; ++id) {
    EXPECT_EQ(BitEqual(PullOne(&b, id, 11), PullOne(&a, id, 11)), id >= 6) << "id " << id;
  }
}

TEST(EmbeddingTableTest, ARestoreThatContradictsItselfLoadsNothing) {
  const EmbeddingOptions o = Options(RowOptimizerKind::kAdagrad);
  MemoryBudget budget(kBigBudget);
  EmbeddingTable a(0, kDim, o, &budget);
  PushOne(&a, 1, std::vector<float>(kDim, 1.0f), 1);
  PushOne(&a, 2, std::vector<float>(kDim, 1.0f), 2);
  EmbeddingRowsState twice = a.Save();
  twice.ids[1] = twice.ids[0];
  EmbeddingRowsState short_rows = a.Save();
  short_rows.slots.pop_back();
  EmbeddingRowsState sketch = a.Save();
  sketch.sketch.resize(10);
  MemoryBudget other(kBigBudget);
  EmbeddingTable b(0, kDim, o, &other);
  EXPECT_NE(b.Restore(twice).message().find("row 1 is saved twice"), std::string::npos);
  EXPECT_NE(b.Restore(short_rows).message().find("saved rows of 31 floats for 2 ids"),
            std::string::npos)
      << b.Restore(short_rows);
  EXPECT_NE(b.Restore(sketch).message().find("admission sketch"), std::string::npos);
  EXPECT_EQ(b.stats().rows, 0u);
  EXPECT_EQ(other.used(), 0u);
  ASSERT_TRUE(b.Restore(a.Save()).ok());
  EXPECT_NE(b.Restore(a.Save()).message().find("restored over rows it holds"), std::string::npos);
}

TEST(MemoryBudgetTest, NeverGoesPastItsLimitUnderContention) {
  MemoryBudget budget(1000);
  std::vector<std::thread> threads;
  std::vector<int> taken(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        if (budget.TryTake(7)) {
          ++taken[t];
          if (budget.used() > budget.limit()) std::abort();
          if (i % 2 == 0) {
            budget.Give(7);
            --taken[t];
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  int total = 0;
  for (int n : taken) total += n;
  EXPECT_EQ(budget.used(), static_cast<size_t>(total) * 7);
  EXPECT_LE(budget.used(), 1000u);
  EXPECT_FALSE(budget.TryTake(1001));
}

TEST(EmbeddingOptionsTest, ReadsTheSettings) {
  auto d = EmbeddingOptions::FromConfig(Config::FromMap({}));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->optimizer, RowOptimizerKind::kAdagrad);
  EXPECT_EQ(d->lr, 0.01f);
  EXPECT_EQ(d->eps, 1e-10f);
  EXPECT_EQ(d->beta1, 0.9f);
  EXPECT_EQ(d->beta2, 0.999f);
  EXPECT_EQ(d->seed, 0u);
  EXPECT_EQ(d->init_scale, 0.0f);
  EXPECT_EQ(d->admit_after, 1u);
  EXPECT_EQ(d->idle_steps, 0u);

  auto adam = EmbeddingOptions::FromConfig(Config::FromMap({{"embedding_optimizer", "adam"}}));
  ASSERT_TRUE(adam.ok()) << adam.status();
  EXPECT_EQ(adam->eps, 1e-8f);
  auto sgd = EmbeddingOptions::FromConfig(Config::FromMap({{"embedding_optimizer", "sgd"}}));
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  EXPECT_EQ(sgd->eps, 1e-8f);

  auto o = EmbeddingOptions::FromConfig(Config::FromMap({{"embedding_optimizer", "adam"},
                                                         {"embedding_lr", "0.5"},
                                                         {"embedding_eps", "0.001"},
                                                         {"beta1", "0.8"},
                                                         {"beta2", "0"},
                                                         {"embedding_seed", "77"},
                                                         {"embedding_init_scale", "0.125"},
                                                         {"embedding_admit_after", "255"},
                                                         {"embedding_idle_steps", "1000"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->optimizer, RowOptimizerKind::kAdam);
  EXPECT_EQ(o->lr, 0.5f);
  EXPECT_EQ(o->eps, 0.001f);
  EXPECT_EQ(o->beta1, 0.8f);
  EXPECT_EQ(o->beta2, 0.0f);
  EXPECT_EQ(o->seed, 77u);
  EXPECT_EQ(o->init_scale, 0.125f);
  EXPECT_EQ(o->admit_after, 255u);
  EXPECT_EQ(o->idle_steps, 1000u);
}

TEST(EmbeddingOptionsTest, RefusesBadSettingsNamingThem) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{{"embedding_lr", "0"}}, "embedding_lr"},
      {{{"embedding_lr", "-1"}}, "embedding_lr"},
      {{{"embedding_lr", "inf"}}, "embedding_lr"},
      {{{"embedding_lr", "1e300"}}, "embedding_lr"},  // not finite as a float
      {{{"embedding_lr", "fast"}}, "embedding_lr"},
      {{{"embedding_optimizer", "foo"}}, "embedding_optimizer"},
      {{{"embedding_admit_after", "0"}}, "embedding_admit_after"},
      {{{"embedding_admit_after", "256"}}, "embedding_admit_after"},
      {{{"embedding_eps", "0"}}, "embedding_eps"},
      {{{"beta1", "1"}}, "beta1"},
      {{{"beta2", "-0.1"}}, "beta2"},
      {{{"beta2", "0.99999999"}}, "beta2"},  // 1 as a float
      {{{"embedding_idle_steps", "-1"}}, "embedding_idle_steps"},
      {{{"embedding_init_scale", "-0.5"}}, "embedding_init_scale"},
      {{{"embedding_init_scale", "nan"}}, "embedding_init_scale"},
  };
  for (const auto& [settings, name] : cases) {
    auto o = EmbeddingOptions::FromConfig(Config::FromMap(settings));
    const std::string value = settings.begin()->second;
    ASSERT_FALSE(o.ok()) << name << "=" << value;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(name), std::string::npos) << o.status();
  }
  auto foo = EmbeddingOptions::FromConfig(Config::FromMap({{"embedding_optimizer", "foo"}}));
  EXPECT_NE(foo.status().message().find("'foo'"), std::string::npos) << foo.status();
  auto big = EmbeddingOptions::FromConfig(Config::FromMap({{"embedding_admit_after", "256"}}));
  EXPECT_NE(big.status().message().find("256"), std::string::npos) << big.status();
}

}  // namespace
}  // namespace gradsync::server
