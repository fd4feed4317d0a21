// Properties of PowerSGD, with ranks as threads whose sums add every rank's
// buffer in rank order (so every rank gets the same bits, as a backend
// does).
#include "compression/powersgd.h"

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "compression/test_util.h"
#include "gtest/gtest.h"

namespace gradsync::compression {
namespace {

using testing_util::Gaussian;

constexpr uint64_t kSeed = 42;

// Sums data[0, count) over all ranks in place, as the ring does.
using SumFn = std::function<Status(float* data, size_t count)>;

// A PowerSgd reduction of data[0, n) of the bucket with `sum` between its
// steps; and of one tensor (PowerSgd::BeginTensor).
Status Finish(PowerSgd& p, PowerSgd::Factor f, float* data, int world_size, const SumFn& sum) {
  if (f.count > 0) {
    GS_RETURN_IF_ERROR(sum(f.data, f.count));
    const PowerSgd::Factor q = p.Middle();
    GS_RETURN_IF_ERROR(sum(q.data, q.count));
  }
  p.Finish(data, world_size);
  return OkStatus();
}
Status Reduce(PowerSgd& p, float* data, size_t n, const CompressContext& ctx, int world_size,
              const SumFn& sum) {
  return Finish(p, p.Begin(data, n, ctx), data, world_size, sum);
}
Status ReduceTensor(PowerSgd& p, float* data, PowerSgdShape shape, const CompressContext& ctx,
                    uint32_t tensor, int world_size, const SumFn& sum) {
  return Finish(p, p.BeginTensor(data, shape, ctx, tensor), data, world_size, sum);
}

class Ranks {
 public:
  explicit Ranks(int n) : n_(n), slots_(static_cast<size_t>(n)) {}

  int size() const { return n_; }

  SumFn SumFor(int rank) {
    return [this, rank](float* data, size_t count) {
      slots_[static_cast<size_t>(rank)].assign(data, data + count);
      Wait();
      std::vector<float> total(count, 0.0f);
      for (const std::vector<float>& s : slots_) {
        for (size_t i = 0; i < count; ++i) total[i] += s[i];
      }
      Wait();  // every rank has read the slots before they are reused
      std::copy(total.begin(), total.end(), data);
      return Status();
    };
  }

  // Runs fn(rank) on one thread per rank.
  void Run(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r) threads.emplace_back([&fn, r] { fn(r); });
    for (std::thread& t : threads) t.join();
  }

 private:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t generation = generation_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

  const int n_;
  std::vector<std::vector<float>> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
};

// One training job: `world` ranks, each with its own PowerSgd.
struct Job {
  Job(int world, int rank) : ranks(world) {
    for (int r = 0; r < world; ++r) psgd.push_back(std::make_unique<PowerSgd>(rank));
  }

  // Reduces every rank's data[r] of bucket 0 at `step`; all must succeed.
  void Step(std::vector<std::vector<float>>* data, uint64_t step) {
    std::vector<Status> st(static_cast<size_t>(ranks.size()));
    ranks.Run([&](int r) {
      std::vector<float>& d = (*data)[static_cast<size_t>(r)];
      st[static_cast<size_t>(r)] =
          Reduce(*psgd[static_cast<size_t>(r)], d.data(), d.size(), CompressContext{kSeed, step, 0},
                 ranks.size(), ranks.SumFor(r));
    });
    for (const Status& s : st) ASSERT_TRUE(s.ok()) << s;
  }

  std::vector<float> Residual(int r) const {
    const std::vector<float>* e = psgd[static_cast<size_t>(r)]->Residual(0);
    EXPECT_NE(e, nullptr);
    return e ? *e : std::vector<float>();
  }

  Ranks ranks;
  std::vector<std::unique_ptr<PowerSgd>> psgd;
};

std::vector<std::vector<float>> Gradients(int world, size_t n, uint32_t seed) {
  std::vector<std::vector<float>> g;
  for (int r = 0; r < world; ++r) g.push_back(Gaussian(n, 1.0f, seed + 17 * r));
  return g;
}

double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

void ExpectFinite(const std::vector<float>& v, const std::string& what) {
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_TRUE(std::isfinite(v[i])) << what << " [" << i << "]";
}

TEST(PowerSgdShapeTest, CoversEveryElementWithFewestRows) {
  EXPECT_EQ(PowerSgdShapeOf(0).rows, 0u);
  for (size_t n = 1; n < 5000; n += (n < 200 ? 1 : 97)) {
    const PowerSgdShape s = PowerSgdShapeOf(n);
    EXPECT_GE(s.rows * s.rows, n) << n;
    EXPECT_LT((s.rows - 1) * (s.rows - 1), n) << n;
    EXPECT_GE(s.rows * s.cols, n) << n;
    EXPECT_LT(s.rows * (s.cols - 1), n) << n;
    EXPECT_LE(s.cols, s.rows) << n;
  }
}

TEST(PowerSgdOrthonormaliseTest, ColumnsAreOrthonormalEvenWhenDependent) {
  for (size_t rows : {1u, 2u, 5u, 33u, 300u}) {
    for (size_t cols : {1u, 2u, 4u, 16u}) {
      if (cols > rows) continue;
      for (int kind = 0; kind < 4; ++kind) {
        std::vector<float> m = Gaussian(rows * cols, 3.0f, static_cast<uint32_t>(rows + cols));
        for (size_t k = 1; k < cols; ++k) {
          float* col = &m[k * rows];
          if (kind == 1) std::fill(col, col + rows, 0.0f);             // zero
          if (kind == 2) std::copy(m.begin(), m.begin() + rows, col);  // repeated
          if (kind == 3)
            for (size_t i = 0; i < rows; ++i) col[i] *= 1e-30f;  // tiny
        }
        OrthonormaliseColumns(m.data(), rows, cols, 7);
        for (size_t a = 0; a < cols; ++a) {
          for (size_t b = 0; b <= a; ++b) {
            double dot = 0;
            for (size_t i = 0; i < rows; ++i) dot += double{m[a * rows + i]} * m[b * rows + i];
            EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-5)
                << rows << "x" << cols << " kind " << kind << " columns " << a << "," << b;
          }
        }
      }
    }
  }
}

// World size x element count.
class PowerSgdRanksTest : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(PowerSgdRanksTest, FullRankGivesTheAverage) {
  const auto [world, n] = GetParam();
  if (PowerSgdShapeOf(n).cols > static_cast<size_t>(PowerSgd::kMaxRank)) {
    GTEST_SKIP() << "more columns than the largest rank";
  }
  Job job(world, PowerSgd::kMaxRank);
  std::vector<std::vector<float>> data = Gradients(world, n, 1);
  std::vector<double> avg(n, 0.0);
  for (const auto& g : data)
    for (size_t i = 0; i < n; ++i) avg[i] += g[i] / world;
  job.Step(&data, 0);
  const double tol = 1e-4 * (1 + MaxAbs(avg));
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(data[0][i], avg[i], tol) << i;
}

// The average equals the mean of what each rank contributed, M_r - e_new_r.
TEST_P(PowerSgdRanksTest, AverageIsWhatRanksContributed) {
  const auto [world, n] = GetParam();
  Job job(world, 2);
  std::vector<std::vector<float>> old_e(static_cast<size_t>(world), std::vector<float>(n, 0.0f));
  for (uint64_t step = 0; step < 4; ++step) {
    std::vector<std::vector<float>> data = Gradients(world, n, 10 + static_cast<uint32_t>(step));
    std::vector<double> want(n, 0.0);
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < n; ++i) want[i] += double{data[r][i] + old_e[r][i]} / world;
    }
    job.Step(&data, step);
    for (int r = 0; r < world; ++r) {
      old_e[r] = job.Residual(r);
      for (size_t i = 0; i < n; ++i) want[i] -= double{old_e[r][i]} / world;
    }
    const double tol = 1e-5 * (1 + MaxAbs(want));
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(data[0][i], want[i], tol) << "step " << step;
  }
}

// Sum over steps of the averages plus the mean final residual equals the
// sum over steps of the mean gradients.
TEST_P(PowerSgdRanksTest, NothingIsLostOverSteps) {
  const auto [world, n] = GetParam();
  Job job(world, 1);
  std::vector<double> inputs(n, 0.0), outputs(n, 0.0);
  for (uint64_t step = 0; step < 12; ++step) {
    std::vector<std::vector<float>> data = Gradients(world, n, 50 + static_cast<uint32_t>(step));
    for (const auto& g : data)
      for (size_t i = 0; i < n; ++i) inputs[i] += g[i] / world;
    job.Step(&data, step);
    for (size_t i = 0; i < n; ++i) outputs[i] += data[0][i];
  }
  for (int r = 0; r < world; ++r) {
    const std::vector<float> e = job.Residual(r);
    for (size_t i = 0; i < n; ++i) outputs[i] += e[i] / world;
  }
  const double tol = 1e-4 * (1 + MaxAbs(inputs));
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(outputs[i], inputs[i], tol) << i;
}

TEST_P(PowerSgdRanksTest, EveryRankEndsWithTheSameBits) {
  const auto [world, n] = GetParam();
  Job job(world, 4);
  for (uint64_t step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> data = Gradients(world, n, 90 + static_cast<uint32_t>(step));
    job.Step(&data, step);
    ExpectFinite(data[0], "average");
    for (int r = 1; r < world; ++r) {
      ASSERT_EQ(std::memcmp(data[r].data(), data[0].data(), n * sizeof(float)), 0)
          << "rank " << r << " step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldAndSize, PowerSgdRanksTest,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(size_t{1}, size_t{2}, size_t{7},
                                                              size_t{600}, size_t{4097},
                                                              size_t{10007})));

// Rank-3 matrices (25 x 24, n = 600 fills it) A B_r^T sharing their column
// space A: the first power step finds it and the warm start keeps it, so
// the average is exact and every rank's residual, M_r minus its own
// projection, stays zero. With rank 4 the spare column is degenerate and
// replaced.
TEST(PowerSgdTest, RankRMatricesAreRecovered) {
  constexpr int kWorld = 4;
  constexpr size_t kR = 3;
  const PowerSgdShape s = PowerSgdShapeOf(600);
  ASSERT_EQ(s.rows * s.cols, 600u);
  const std::vector<float> a = Gaussian(s.rows * kR, 1.0f, 3);
  std::vector<std::vector<float>> g(kWorld, std::vector<float>(600, 0.0f));
  std::vector<double> avg(600, 0.0);
  for (int r = 0; r < kWorld; ++r) {
    const std::vector<float> b = Gaussian(s.cols * kR, 1.0f, 4 + r);
    for (size_t i = 0; i < 600; ++i) {
      for (size_t k = 0; k < kR; ++k) {
        g[r][i] += a[k * s.rows + i / s.cols] * b[k * s.cols + i % s.cols];
      }
      avg[i] += g[r][i] / kWorld;
    }
  }
  for (int rank : {3, 4}) {
    Job job(kWorld, rank);
    for (uint64_t step = 0; step < 3; ++step) {
      std::vector<std::vector<float>> data = g;
      job.Step(&data, step);
      for (size_t i = 0; i < 600; ++i) {
        ASSERT_NEAR(data[0][i], avg[i], 1e-4 * (1 + std::fabs(avg[i]))) << rank << " " << i;
      }
      for (int r = 0; r < kWorld; ++r) {
        for (float e : job.Residual(r)) ASSERT_NEAR(e, 0.0f, 1e-4) << "rank " << r;
      }
    }
  }
}

// A single rank contributes all of it: average + new residual == g + old
// residual, up to the rounding of the residual's subtraction.
TEST(PowerSgdTest, ContributionPlusResidualIsTheInput) {
  for (size_t n : {1u, 5u, 1000u, 4099u}) {
    PowerSgd p(2);
    std::vector<float> old_e(n, 0.0f);
    for (uint64_t step = 0; step < 5; ++step) {
      std::vector<float> g = Gaussian(n, 1.0f, 200 + static_cast<uint32_t>(step)), out = g;
      ASSERT_TRUE(Reduce(p, out.data(), n, {kSeed, step, 3}, 1, [](float*, size_t) {
                    return Status();
                  }).ok());
      const std::vector<float>& e = *p.Residual(3);
      for (size_t i = 0; i < n; ++i) {
        const float m = g[i] + old_e[i];
        ASSERT_NEAR(double{out[i]} + e[i], m, 1.2e-7 * std::fabs(e[i]) + 1e-30) << n << " " << i;
      }
      old_e = e;
    }
  }
}

TEST(PowerSgdTest, CountChangeStartsAfresh) {
  PowerSgd used(4), fresh(4);
  auto identity = [](float*, size_t) { return Status(); };
  std::vector<float> big = Gaussian(1000, 1.0f, 5);
  ASSERT_TRUE(Reduce(used, big.data(), big.size(), {kSeed, 0, 1}, 1, identity).ok());
  ASSERT_EQ(used.Residual(1)->size(), 1000u);
  std::vector<float> a = Gaussian(500, 1.0f, 6), b = a;
  ASSERT_TRUE(Reduce(used, a.data(), a.size(), {kSeed, 1, 1}, 1, identity).ok());
  ASSERT_TRUE(Reduce(fresh, b.data(), b.size(), {kSeed, 1, 1}, 1, identity).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(*used.Residual(1), *fresh.Residual(1));
}

// Zeros, one element, a prime count: never NaN; a zero step (which zeroes
// the warm-start Q) does not stop later steps from finding the gradient.
TEST(PowerSgdTest, DegenerateInputsStayFinite) {
  for (size_t n : {1u, 2u, 3u, 997u, 10007u}) {
    Job job(2, 2);
    std::vector<std::vector<float>> zeros(2, std::vector<float>(n, 0.0f));
    job.Step(&zeros, 0);
    EXPECT_EQ(zeros[0], std::vector<float>(n, 0.0f)) << n;
    ExpectFinite(job.Residual(0), "residual");
    // Ones padded with zeros: rank 2 at most (full rows, the last row).
    const std::vector<float> ones(n, 1.0f);
    std::vector<std::vector<float>> data;
    for (uint64_t step = 1; step < 5; ++step) {
      data.assign(2, ones);
      job.Step(&data, step);
      ExpectFinite(data[0], "average");
      ExpectFinite(job.Residual(0), "residual");
    }
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(data[1][i], 1.0f, 1e-4) << n << " " << i;
  }
}

TEST(PowerSgdTest, FailedSumLeavesDataAndStateAlone) {
  PowerSgd p(2);
  auto identity = [](float*, size_t) { return Status(); };
  std::vector<float> g = Gaussian(300, 1.0f, 8);
  ASSERT_TRUE(Reduce(p, g.data(), g.size(), {kSeed, 0, 0}, 1, identity).ok());
  const std::vector<float> residual = *p.Residual(0);
  for (int fail_at : {1, 2}) {
    std::vector<float> data = Gaussian(300, 1.0f, 9), before = data;
    int calls = 0;
    Status s = Reduce(p, data.data(), data.size(), {kSeed, 1, 0}, 1, [&](float*, size_t) {
      return ++calls == fail_at ? UnavailableError("peer died") : Status();
    });
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_EQ(data, before);
    EXPECT_EQ(*p.Residual(0), residual);
  }
}

TEST(PowerSgdTest, WireBytesAreBothFactors) {
  EXPECT_EQ(PowerSgd(2).WireBytes(1024), (32u + 32u) * 2 * 4);
  EXPECT_EQ(PowerSgd(4).WireBytes(600), (25u + 24u) * 4 * 4);
  EXPECT_EQ(PowerSgd(64).WireBytes(10), (4u + 3u) * 3 * 4);  // rank capped at cols
  EXPECT_EQ(PowerSgd(4).WireBytes(0), 0u);
}

TEST(PowerSgdTest, SpecsAreCheckedAtCreate) {
  EXPECT_EQ(PowerSgd::Create("powersgd").value()->rank(), PowerSgd::kDefaultRank);
  EXPECT_EQ(PowerSgd::Create("powersgd:rank=8,ef=1").value()->rank(), 8);
  EXPECT_EQ(PowerSgd::Create("powersgd:rank=64").value()->rank(), 64);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"powersgd:rank=0", "rank must be in [1, 64]"},
      {"powersgd:rank=65", "rank must be in [1, 64]"},
      {"powersgd:rank=-1", "bad value"},
      {"powersgd:ef=0", "always uses error feedback"},
      {"powersgd:ratio=0.1", "takes no option \"ratio\""},
      {"topk:ratio=0.1", "not a powersgd spec"},
  };
  for (const auto& [spec, why] : bad) {
    auto p = PowerSgd::Create(spec);
    ASSERT_EQ(p.status().code(), StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(p.status().message().find(why), std::string::npos) << p.status();
  }
  EXPECT_TRUE(PowerSgd::Names("powersgd"));
  EXPECT_TRUE(PowerSgd::Names("powersgd:rank=2"));
  EXPECT_FALSE(PowerSgd::Names("powersgd2"));
  EXPECT_FALSE(PowerSgd::Names("topk:ratio=0.1"));
}

}  // namespace
}  // namespace gradsync::compression

namespace gradsync::compression {
namespace {

// A wide tensor (10 x 128, as a 10-class head) of rank 2 on every rank is
// recovered by its own matrix, each tensor of a bucket keeping its own
// residual and Q.
TEST(PowerSgdTensorTest, EachTensorIsItsOwnMatrix) {
  constexpr int kWorld = 2;
  const PowerSgdShape wide{10, 128};
  const PowerSgdShape tall{48, 6};
  auto low_rank = [](PowerSgdShape s, uint64_t seed) {
    const std::vector<float> a = Gaussian(s.rows * 2, 1.0f, seed);
    const std::vector<float> b = Gaussian(s.cols * 2, 1.0f, seed + 1);
    std::vector<float> m(s.rows * s.cols, 0.0f);
    for (size_t i = 0; i < m.size(); ++i) {
      for (size_t k = 0; k < 2; ++k)
        m[i] += a[k * s.rows + i / s.cols] * b[k * s.cols + i % s.cols];
    }
    return m;
  };
  const std::vector<float> g_wide = low_rank(wide, 11), g_tall = low_rank(tall, 21);
  Ranks ranks(kWorld);
  std::vector<std::unique_ptr<PowerSgd>> p;
  for (int r = 0; r < kWorld; ++r) p.push_back(std::make_unique<PowerSgd>(4));
  EXPECT_EQ(p[0]->RankForMatrix(wide), 4u);
  EXPECT_EQ(p[0]->RankForMatrix({3, 50}), 3u);
  for (uint64_t step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> out_wide(kWorld, g_wide), out_tall(kWorld, g_tall);
    ranks.Run([&](int r) {
      const CompressContext ctx{kSeed, step, 7};
      ASSERT_TRUE(
          ReduceTensor(*p[r], out_wide[r].data(), wide, ctx, 0, kWorld, ranks.SumFor(r)).ok());
      ASSERT_TRUE(
          ReduceTensor(*p[r], out_tall[r].data(), tall, ctx, 1, kWorld, ranks.SumFor(r)).ok());
    });
    for (size_t i = 0; i < g_wide.size(); ++i) {
      ASSERT_NEAR(out_wide[0][i], g_wide[i], 1e-3 * (1 + std::fabs(g_wide[i]))) << step << " " << i;
      ASSERT_EQ(out_wide[0][i], out_wide[1][i]);
    }
    for (size_t i = 0; i < g_tall.size(); ++i) {
      ASSERT_NEAR(out_tall[0][i], g_tall[i], 1e-3 * (1 + std::fabs(g_tall[i]))) << step << " " << i;
    }
  }
  // Bucket-level state of the same bucket id is untouched by the tensors'.
  EXPECT_EQ(p[0]->Residual(7), nullptr);
}

}  // namespace
}  // namespace gradsync::compression
