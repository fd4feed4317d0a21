// Compressed buckets over the ring, every rank a thread (in-process
// transport): each compressor's average equals the reference computed from
// the same compressors, bit for bit, on every rank.
#include "client/bucket_compression.h"

#include <cmath>
#include <random>

#include "client/ring_test_util.h"
#include "compression/powersgd.h"
#include "compression/registry.h"
#include "compression/topk_compressor.h"
#include "compression/wire_util.h"
#include "gtest/gtest.h"

namespace gradsync::client {
namespace {

constexpr int kWorld = 4;
constexpr size_t kCount = 40000;  // 160 KB: above the default threshold

std::vector<float> Gradient(int rank) {
  std::mt19937 rng(100 + rank);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(kCount);
  for (float& v : g) v = dist(rng);
  return g;
}

std::unique_ptr<BucketCompression> Make(std::map<std::string, std::string> flags) {
  auto bc = BucketCompression::FromConfig(Config::FromMap(std::move(flags)));
  EXPECT_TRUE(bc.ok()) << bc.status().ToString();
  return std::move(*bc);
}

// What the average must be: each rank's gradient through compress and
// decompress, summed in rank order, divided by the world size.
std::vector<float> Reference(const std::string& spec) {
  compression::CompressorRegistry registry;
  compression::RegisterBuiltins(&registry);
  std::vector<float> sum(kCount, 0.0f);
  const compression::CompressContext ctx{7, 3, 0};
  for (int r = 0; r < kWorld; ++r) {
    auto c = registry.Create(spec);
    EXPECT_TRUE(c.ok());
    std::vector<float> g = Gradient(r);
    std::vector<uint8_t> wire((*c)->WireBytes(kCount));
    EXPECT_TRUE((*c)->Compress(g.data(), kCount, ctx, wire.data(), wire.size()).ok());
    std::vector<float> back(kCount);
    EXPECT_TRUE((*c)->Decompress(wire.data(), wire.size(), kCount, ctx, back.data()).ok());
    for (size_t i = 0; i < kCount; ++i) sum[i] += back[i];
  }
  for (float& v : sum) v /= kWorld;
  return sum;
}

class BucketCompressionTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BucketCompressionTest, AverageMatchesTheReferenceOnEveryRank) {
  const std::string spec = GetParam();
  Ring ring(kWorld);
  std::vector<std::unique_ptr<BucketCompression>> bcs;
  std::vector<std::vector<float>> data;
  for (int r = 0; r < kWorld; ++r) {
    bcs.push_back(Make({{"compression", spec}}));
    ASSERT_TRUE(bcs.back()->Assign({{0, DType::kF32, kCount * 4, {"w"}, {}}}).ok());
    data.push_back(Gradient(r));
  }
  EXPECT_EQ(bcs[0]->SpecOf(0), spec);
  std::vector<BucketCompression::Traffic> wire(kWorld);
  auto st = ring.Run([&](int r) {
    return bcs[r]->Reduce(ring[r], 0, data[r].data(), kCount, OpTag{3, 0, 1, 9}, /*seed=*/7, Soon(),
                          &wire[r]);
  });
  const std::vector<float> want = Reference(spec);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    ASSERT_EQ(data[r], data[0]) << "rank " << r << " differs";
  }
  // Summable compressors add compressed values (fp16/bf16 hop by hop, in a
  // different order from the reference); the all-gathered ones decompress
  // and add in rank order exactly as the reference does.
  double tol = 0;
  if (spec == "fp16") tol = 2e-3;
  if (spec == "bf16") tol = 2e-2;
  if (spec == "none" || spec.rfind("randomk", 0) == 0) tol = 1e-5;
  for (size_t i = 0; i < kCount; ++i) {
    if (tol == 0) {
      ASSERT_EQ(data[0][i], want[i]) << i;
    } else {
      ASSERT_NEAR(data[0][i], want[i], tol * (1 + std::fabs(want[i]))) << i;
    }
  }
  // Gathered compressors receive every other rank's contribution.
  const bool gathered = spec == "sign" || spec == "qsgd" || spec.rfind("topk", 0) == 0;
  EXPECT_EQ(wire[0].gathered, gathered);
  EXPECT_EQ(wire[0].received, wire[0].sent * (gathered ? kWorld - 1 : 1));
  if (spec != "none") {
    EXPECT_LT(wire[0].sent, kCount * 4);
  } else {
    EXPECT_EQ(wire[0].sent, kCount * 4);
  }
}

// During top-k's warm-up every rank sends the step's larger share, and the
// ranks agree: the same average on every rank, past the warm-up too.
TEST(BucketCompressionWarmupTest, EveryRankFollowsTheStepsRatio) {
  Ring ring(kWorld);
  std::vector<std::unique_ptr<BucketCompression>> bcs;
  for (int r = 0; r < kWorld; ++r) {
    bcs.push_back(Make({{"compression", "topk:ratio=0.01,ef=1,warmup=4"}}));
    ASSERT_TRUE(bcs.back()->Assign({{0, DType::kF32, kCount * 4, {"w"}, {}}}).ok());
  }
  for (uint64_t step = 0; step < 6; ++step) {
    SCOPED_TRACE(step);
    std::vector<std::vector<float>> data;
    for (int r = 0; r < kWorld; ++r) data.push_back(Gradient(r));
    std::vector<BucketCompression::Traffic> wire(kWorld);
    auto st = ring.Run([&](int r) {
      return bcs[r]->Reduce(ring[r], 0, data[r].data(), kCount, OpTag{step, 0, 1, 9}, 7, Soon(),
                            &wire[r]);
    });
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r].ToString();
      ASSERT_EQ(data[r], data[0]) << "rank " << r << " differs";
    }
    const double ratio = compression::TopKCompressor::WarmupRatio(0.01, 4, step);
    EXPECT_EQ(wire[0].sent, compression::KeepCount(ratio, kCount) * 8);
  }
}

INSTANTIATE_TEST_SUITE_P(Compressors, BucketCompressionTest,
                         ::testing::Values("none", "fp16", "bf16", "randomk:ratio=0.1",
                                           "topk:ratio=0.05", "topk_sampled_fp16:ratio=0.05",
                                           "sign", "qsgd"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

// fp16 at a larger world: each rank's values near 8000, whose sum over 16
// ranks (128,000) is past fp16's largest value (65504). The average comes
// back finite and right because the values are divided before the cast.
TEST(BucketCompressionFp16Test, LargeWorldSumsDoNotOverflow) {
  constexpr int kRanks = 16;
  constexpr size_t kN = 20000;
  Ring ring(kRanks);
  std::vector<std::unique_ptr<BucketCompression>> bcs;
  std::vector<std::vector<float>> data;
  for (int r = 0; r < kRanks; ++r) {
    bcs.push_back(Make({{"compression", "fp16"}}));
    ASSERT_TRUE(bcs.back()->Assign({{0, DType::kF32, kN * 4, {"w"}, {}}}).ok());
    std::vector<float> g(kN);
    for (size_t i = 0; i < kN; ++i) g[i] = 8000.0f + static_cast<float>((i + r) % 64) - 32.0f;
    data.push_back(std::move(g));
  }
  std::vector<BucketCompression::Traffic> wire(kRanks);
  auto st = ring.Run([&](int r) {
    return bcs[r]->Reduce(ring[r], 0, data[r].data(), kN, OpTag{1, 0, 1, 9}, 7, Soon(), &wire[r]);
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    ASSERT_EQ(data[r], data[0]) << "rank " << r;
  }
  for (size_t i = 0; i < kN; ++i) {
    double want = 0;
    for (int r = 0; r < kRanks; ++r) want += 8000.0 + static_cast<double>((i + r) % 64) - 32.0;
    want /= kRanks;
    ASSERT_TRUE(std::isfinite(data[0][i])) << i;
    // Each of the 15 additions rounds the partial sum (of values near 500,
    // reaching 8000) to fp16, whose spacing between 4096 and 8192 is 4.
    ASSERT_NEAR(data[0][i], want, 30.0) << i;
  }
}

// PowerSGD over the ring, two steps (the second warm-started): every rank
// ends with the same bits, equal to standalone PowerSgd instances summing
// over another ring; at full rank (rank 64 of a 64 x 64 bucket) that is the
// plain average.
class PowerSgdBucketTest : public ::testing::TestWithParam<std::tuple<std::string, size_t>> {};

TEST_P(PowerSgdBucketTest, SameBitsOnEveryRankAsStandalonePowerSgd) {
  const auto [spec, count] = GetParam();
  Ring ring(kWorld), reference_ring(kWorld);
  std::vector<std::unique_ptr<BucketCompression>> bcs;
  std::vector<std::unique_ptr<compression::PowerSgd>> reference;
  for (int r = 0; r < kWorld; ++r) {
    bcs.push_back(Make({{"compression", spec}, {"compression_min_bytes", "0"}}));
    ASSERT_TRUE(bcs.back()->Assign({{5, DType::kF32, count * 4, {"w"}, {}}}).ok());
    reference.push_back(compression::PowerSgd::Create(spec).value());
  }
  for (uint64_t step = 1; step <= 2; ++step) {
    std::vector<std::vector<float>> data, want;
    for (int r = 0; r < kWorld; ++r) data.push_back(Gradient(r + 10 * static_cast<int>(step)));
    for (auto& d : data) d.resize(count);
    want = data;
    std::vector<BucketCompression::Traffic> wire(kWorld);
    const OpTag tag{step, 5, step, 9};
    auto st = ring.Run([&](int r) {
      return bcs[r]->Reduce(ring[r], 5, data[r].data(), count, tag, /*seed=*/7, Soon(), &wire[r]);
    });
    auto ref_st = reference_ring.Run([&](int r) -> Status {
      compression::PowerSgd& p = *reference[r];
      auto sum = [&](compression::PowerSgd::Factor f) {
        return reference_ring[r].AllReduce(f.data, f.count, DType::kF32, ReduceOp::kSum, tag,
                                           Soon());
      };
      GS_RETURN_IF_ERROR(sum(p.Begin(want[r].data(), count, {7, step, 5})));
      GS_RETURN_IF_ERROR(sum(p.Middle()));
      p.Finish(want[r].data(), kWorld);
      return Status();
    });
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r].ToString();
      ASSERT_TRUE(ref_st[r].ok()) << ref_st[r].ToString();
      ASSERT_EQ(data[r], want[0]) << "rank " << r << " step " << step;
    }
    const size_t bytes = reference[0]->WireBytes(count);
    EXPECT_EQ(wire[0].sent, bytes);
    EXPECT_EQ(wire[0].received, bytes);
    EXPECT_FALSE(wire[0].gathered);
  }
}

TEST(PowerSgdBucketTest, FullRankIsThePlainAverage) {
  constexpr size_t kSquare = 64 * 64;
  Ring ring(kWorld);
  std::vector<std::unique_ptr<BucketCompression>> bcs;
  std::vector<std::vector<float>> data;
  std::vector<double> avg(kSquare, 0.0);
  for (int r = 0; r < kWorld; ++r) {
    bcs.push_back(Make({{"compression", "powersgd:rank=64"}, {"compression_min_bytes", "0"}}));
    ASSERT_TRUE(bcs.back()->Assign({{0, DType::kF32, kSquare * 4, {"w"}, {}}}).ok());
    data.push_back(Gradient(r));
    data.back().resize(kSquare);
    for (size_t i = 0; i < kSquare; ++i) avg[i] += data.back()[i] / kWorld;
  }
  std::vector<BucketCompression::Traffic> wire(kWorld);
  auto st = ring.Run([&](int r) {
    return bcs[r]->Reduce(ring[r], 0, data[r].data(), kSquare, OpTag{3, 0, 1, 9}, 7, Soon(),
                          &wire[r]);
  });
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(st[r].ok()) << st[r].ToString();
  for (size_t i = 0; i < kSquare; ++i) ASSERT_NEAR(data[1][i], avg[i], 1e-4) << i;
  EXPECT_EQ(wire[0].sent, (64u + 64u) * 64 * 4);
}

INSTANTIATE_TEST_SUITE_P(Ranks, PowerSgdBucketTest,
                         ::testing::Values(std::make_tuple("powersgd:rank=4", kCount),
                                           std::make_tuple("powersgd:rank=1,ef=1", size_t{997})));

TEST(BucketCompressionChoiceTest, ThresholdDtypeAndOverrides) {
  auto bc = Make({{"compression", "topk:ratio=0.01,ef=1"},
                  {"compression_min_bytes", "1000"},
                  {"compression_overrides", "2=fp16;fc.bias=sign"}});
  ASSERT_TRUE(bc->Assign({{0, DType::kF32, 4000, {"a", "b"}, {}},
                          {1, DType::kF32, 400, {"tiny"}, {}},
                          {2, DType::kF32, 4000, {"c"}, {}},
                          {3, DType::kF32, 4000, {"d", "fc.bias"}, {}},
                          {4, DType::kBF16, 4000, {"e"}, {}}})
                  .ok());
  EXPECT_EQ(bc->SpecOf(0), "topk:ratio=0.01,ef=1");
  EXPECT_EQ(bc->SpecOf(1), "none");  // below compression_min_bytes
  EXPECT_EQ(bc->SpecOf(2), "fp16");  // bucket override
  EXPECT_EQ(bc->SpecOf(3), "sign");  // tensor override
  EXPECT_EQ(bc->SpecOf(4), "none");  // only f32 buckets are compressed
}

TEST(BucketCompressionChoiceTest, BadSpecsAreRefusedAtStart) {
  auto bad = BucketCompression::FromConfig(Config::FromMap({{"compression", "zip"}}));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  auto bad_override =
      BucketCompression::FromConfig(Config::FromMap({{"compression_overrides", "w=topk:ratio=7"}}));
  EXPECT_EQ(bad_override.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_override.status().message().find("compression_overrides w"), std::string::npos);
  auto no_ef = BucketCompression::FromConfig(Config::FromMap({{"compression", "powersgd:ef=0"}}));
  EXPECT_EQ(no_ef.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_ef.status().message().find("error feedback"), std::string::npos);
  auto bad_rank = BucketCompression::FromConfig(
      Config::FromMap({{"compression_overrides", "3=powersgd:rank=65"}}));
  EXPECT_EQ(bad_rank.status().code(), StatusCode::kInvalidArgument);
}

TEST(BucketCompressionChoiceTest, PowerSgdIsAChoiceLikeAnyCompressor) {
  auto bc = Make({{"compression", "powersgd:rank=2"},
                  {"compression_min_bytes", "1000"},
                  {"compression_overrides", "b=powersgd:rank=8,ef=1;2=fp16"}});
  ASSERT_TRUE(bc->Assign({{0, DType::kF32, 4000, {"a"}, {}},
                          {1, DType::kF32, 4000, {"b"}, {}},
                          {2, DType::kF32, 4000, {"c"}, {}}})
                  .ok());
  EXPECT_EQ(bc->SpecOf(0), "powersgd:rank=2");
  EXPECT_EQ(bc->SpecOf(1), "powersgd:rank=8,ef=1");
  EXPECT_EQ(bc->SpecOf(2), "fp16");
}

}  // namespace
}  // namespace gradsync::client

namespace gradsync::client {
namespace {

// A bucket of a 40 x 30 weight of rank 2 on every rank, its bias and a
// second 8 x 16 weight: each weight is its own matrix and comes back
// exactly (rank 4 >= 2), the bias is averaged uncompressed, every rank ends
// with the same bits, and the traffic is the factors plus the bias.
TEST(PowerSgdBucketTest, RegisteredShapesMakeOneMatrixPerTensor) {
  const size_t kW = 40 * 30, kB = 30, kV = 8 * 16;
  const std::vector<BucketTensor> layout = {{0, kW, 40, 30}, {kW, kB, 0, 0}, {kW + kB, kV, 8, 16}};
  const size_t n = kW + kB + kV;
  Ring ring(kWorld);
  std::vector<std::unique_ptr<BucketCompression>> bcs;
  std::vector<std::vector<float>> data;
  std::vector<double> avg(n, 0.0);
  for (int r = 0; r < kWorld; ++r) {
    bcs.push_back(Make({{"compression", "powersgd:rank=4"}, {"compression_min_bytes", "0"}}));
    ASSERT_TRUE(bcs.back()->Assign({{0, DType::kF32, n * 4, {"w", "b", "v"}, layout}}).ok());
    std::vector<float> g(n);
    // Rank 2 per weight, the same column space on every rank.
    for (size_t i = 0; i < kW; ++i) {
      g[i] =
          static_cast<float>((i / 30 % 7) * (i % 30 % 5) + (r + 1) * (i / 30 % 3) * (i % 30 % 2));
    }
    for (size_t i = 0; i < kB; ++i) g[kW + i] = static_cast<float>(r * 3 + i);
    for (size_t i = 0; i < kV; ++i)
      g[kW + kB + i] = static_cast<float>((i / 16 + 1) * (i % 16 % 4));
    for (size_t i = 0; i < n; ++i) avg[i] += g[i] / kWorld;
    data.push_back(std::move(g));
  }
  std::vector<BucketCompression::Traffic> wire(kWorld);
  auto st = ring.Run([&](int r) {
    return bcs[r]->Reduce(ring[r], 0, data[r].data(), n, OpTag{3, 0, 1, 9}, 7, Soon(), &wire[r]);
  });
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(st[r].ok()) << st[r].ToString();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(data[0][i], avg[i], 1e-3 * (1 + std::fabs(avg[i]))) << i;
    ASSERT_EQ(data[0][i], data[kWorld - 1][i]) << i;
  }
  for (size_t i = 0; i < kB; ++i) ASSERT_EQ(data[0][kW + i], static_cast<float>(avg[kW + i])) << i;
  EXPECT_EQ(wire[0].sent, ((40u + 30u) * 4 + (8u + 16u) * 4 + kB) * 4);
}

}  // namespace
}  // namespace gradsync::client
