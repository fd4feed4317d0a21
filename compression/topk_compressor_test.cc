#include "compression/topk_compressor.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/half.h"
#include "compression/test_util.h"
#include "compression/topk_select.h"
#include "compression/wire_util.h"
#include "gtest/gtest.h"

namespace gradsync::compression {
namespace {

using testing_util::CompressUnaligned;
using testing_util::DecompressUnaligned;
using testing_util::Gaussian;
using testing_util::Laplace;
using testing_util::TestSizes;

struct Variant {
  TopKMethod method;
  TopKValues values;
  const char* name;
};

const Variant kVariants[] = {
    {TopKMethod::kExact, TopKValues::kFp32, "topk"},
    {TopKMethod::kExact, TopKValues::kFp16, "topk_fp16"},
    {TopKMethod::kSampled, TopKValues::kFp32, "topk_sampled"},
    {TopKMethod::kSampled, TopKValues::kFp16, "topk_sampled_fp16"},
};

std::unique_ptr<TopKCompressor> Make(const Variant& v, double ratio) {
  StatusOr<std::unique_ptr<TopKCompressor>> c = TopKCompressor::Create(v.method, v.values, ratio);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

// The reference: sort all indices by (|x| descending, index ascending) with
// the magnitude key, keep k, return them ascending.
std::vector<uint32_t> ReferenceTopK(const std::vector<float>& in, size_t k) {
  std::vector<uint32_t> order(in.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const uint32_t ka = MagnitudeKey(in[a]), kb = MagnitudeKey(in[b]);
    return ka != kb ? ka > kb : a < b;
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// Inputs of several shapes, including heavy ties and special values.
std::vector<std::vector<float>> Inputs(size_t n, uint32_t seed) {
  std::vector<std::vector<float>> inputs = {Gaussian(n, 1e-3f, seed), Laplace(n, 1.0f, seed + 1)};
  std::vector<float> ties = Gaussian(n, 2.0f, seed + 2);
  for (float& x : ties) x = std::round(x);  // Few distinct magnitudes.
  inputs.push_back(ties);
  inputs.push_back(std::vector<float>(n, -0.5f));  // All equal.
  std::vector<float> specials = Gaussian(n, 1.0f, seed + 3);
  const float s[] = {std::numeric_limits<float>::infinity(), -0.0f, std::nanf(""),
                     -std::numeric_limits<float>::infinity()};
  for (size_t i = 0; i < n && i < 4; ++i) specials[(i * 7919) % n] = s[i];
  inputs.push_back(specials);
  return inputs;
}

std::vector<uint32_t> WireIndices(const std::vector<uint8_t>& wire, size_t k) {
  std::vector<uint32_t> idx(k);
  if (k > 0) std::memcpy(idx.data(), wire.data(), 4 * k);
  return idx;
}

float Expected(const Variant& v, float x) {
  return v.values == TopKValues::kFp32 ? x : HalfToFloat(FloatToHalf(x));
}

bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof(a)) == 0;
}

TEST(TopKCompressorTest, NamesAndSummable) {
  for (const Variant& v : kVariants) {
    auto c = Make(v, 0.01);
    EXPECT_EQ(c->name(), v.name);
    EXPECT_FALSE(c->summable());
  }
}

TEST(TopKCompressorTest, ValuesOfEveryNameAreTheCompressorsOwn) {
  for (TopKMethod m : {TopKMethod::kExact, TopKMethod::kSampled}) {
    for (TopKValues v : {TopKValues::kFp32, TopKValues::kFp16}) {
      auto c = TopKCompressor::Create(m, v, 0.01);
      ASSERT_TRUE(c.ok());
      EXPECT_EQ(TopKCompressor::ValuesOf((*c)->name()), v) << (*c)->name();
    }
  }
  EXPECT_EQ(TopKCompressor::ValuesOf("_fp16"), TopKValues::kFp32);
}

TEST(TopKCompressorTest, RejectsBadRatios) {
  for (double r : {0.0, -0.1, 1.5, std::nan("")}) {
    EXPECT_EQ(TopKCompressor::Create(TopKMethod::kExact, TopKValues::kFp32, r).status().code(),
              StatusCode::kInvalidArgument)
        << r;
  }
}

// WireBytes(n) == ceil(ratio * n) * (4 + value bytes), no header.
TEST(TopKCompressorTest, WireBytesIsExactlyKTimesEntrySize) {
  struct Case {
    double ratio;
    size_t n, k;
  };
  const Case cases[] = {{0.01, 0, 0},           {0.01, 1, 1},      {0.01, 100, 1}, {0.01, 101, 2},
                        {0.01, 1000, 10},       {0.01, 1001, 11},  {0.5, 7, 4},    {1.0, 9, 9},
                        {0.001, 1 << 20, 1049}, {0.1, 65537, 6554}};
  for (const Case& tc : cases) {
    for (const Variant& v : kVariants) {
      auto c = Make(v, tc.ratio);
      const size_t entry = v.values == TopKValues::kFp32 ? 8 : 6;
      EXPECT_EQ(c->KeepCount(tc.n), tc.k) << tc.ratio << " " << tc.n;
      EXPECT_EQ(c->WireBytes(tc.n), tc.k * entry) << v.name << " " << tc.n;
      const std::vector<float> in = Gaussian(tc.n, 1.0f, 5);
      EXPECT_EQ(CompressUnaligned(*c, in, {}).size(), tc.k * entry);
    }
  }
}

TEST(TopKCompressorTest, WarmupRampsFromAQuarterDownToTheRatio) {
  constexpr uint64_t kWarmup = 40;
  EXPECT_DOUBLE_EQ(TopKCompressor::WarmupRatio(0.01, kWarmup, 0), 0.25);
  EXPECT_DOUBLE_EQ(TopKCompressor::WarmupRatio(0.01, kWarmup, kWarmup / 2), 0.05);  // sqrt(.25 .01)
  EXPECT_EQ(TopKCompressor::WarmupRatio(0.01, kWarmup, kWarmup), 0.01);
  EXPECT_EQ(TopKCompressor::WarmupRatio(0.01, kWarmup, 1000000), 0.01);
  EXPECT_EQ(TopKCompressor::WarmupRatio(0.01, 0, 0), 0.01);      // no warm-up
  EXPECT_EQ(TopKCompressor::WarmupRatio(0.5, kWarmup, 0), 0.5);  // above the start already
  double last = 1;
  for (uint64_t t = 0; t <= kWarmup; ++t) {
    const double r = TopKCompressor::WarmupRatio(0.01, kWarmup, t);
    EXPECT_LT(r, last) << t;
    EXPECT_GE(r, 0.01) << t;
    last = r;
  }
  // The compressor follows the step it is given; until then it is at the
  // spec's ratio (a receiver decoding a stated ratio).
  auto c = TopKCompressor::Create(TopKMethod::kExact, TopKValues::kFp32, 0.01, kWarmup);
  ASSERT_TRUE(c.ok());
  const size_t n = 10000;
  EXPECT_EQ((*c)->WireBytes(n), 100u * 8);
  (*c)->BeginStep(0);
  EXPECT_EQ((*c)->WireBytes(n), 2500u * 8);
  (*c)->BeginStep(kWarmup / 2);
  EXPECT_EQ((*c)->KeepCount(n), 500u);
  const std::vector<float> g = Gaussian(n, 1.0f, 3);
  std::vector<uint8_t> wire((*c)->WireBytes(n));
  ASSERT_TRUE((*c)->Compress(g.data(), n, {1, kWarmup / 2, 0}, wire.data(), wire.size()).ok());
  std::vector<float> back(n);
  ASSERT_TRUE((*c)->Decompress(wire.data(), wire.size(), n, {}, back.data()).ok());
  EXPECT_EQ(std::count_if(back.begin(), back.end(), [](float v) { return v != 0; }), 500);
  (*c)->BeginStep(kWarmup);
  EXPECT_EQ((*c)->WireBytes(n), 100u * 8);
}

TEST(TopKCompressorTest, SizeChecks) {
  for (const Variant& v : kVariants) {
    auto c = Make(v, 0.1);
    for (size_t n : {size_t{1}, size_t{10}, size_t{1000}}) {
      testing_util::ExpectSizeChecks(*c, n);
    }
  }
}

void ExpectReferenceRoundTrip(TopKCompressor& c, const Variant& v, const std::vector<float>& in) {
  const size_t n = in.size();
  const CompressContext ctx{3, n, 1};
  const size_t k = c.KeepCount(n);
  const std::vector<uint8_t> wire = CompressUnaligned(c, in, ctx);
  const std::vector<uint32_t> idx = WireIndices(wire, k);
  ASSERT_EQ(idx, ReferenceTopK(in, k)) << v.name << " n=" << n;
  const std::vector<float> out = DecompressUnaligned(c, wire, n, ctx);
  std::vector<bool> kept(n, false);
  for (uint32_t i : idx) kept[i] = true;
  for (size_t i = 0; i < n; ++i) {
    const float want = kept[i] ? Expected(v, in[i]) : 0.0f;
    ASSERT_TRUE(SameFloat(out[i], want)) << v.name << " n=" << n << " i=" << i;
  }
}

// Every variant sends exactly the reference set (ties to the lower index),
// ascending, with the element values; Decompress puts them back and zeros
// everything else.
TEST(TopKCompressorTest, SelectsTheReferenceSetAndRoundTrips) {
  for (const Variant& v : kVariants) {
    for (double ratio : {0.01, 0.1, 1.0}) {
      auto c = Make(v, ratio);
      for (size_t n : TestSizes()) {
        if (n > 100000) continue;  // Below, for fewer inputs.
        for (const std::vector<float>& in : Inputs(n, n + 11)) {
          ExpectReferenceRoundTrip(*c, v, in);
        }
      }
    }
  }
}

TEST(TopKCompressorTest, SelectsTheReferenceSetForLargeBuckets) {
  for (const Variant& v : kVariants) {
    auto c = Make(v, 0.01);
    ExpectReferenceRoundTrip(*c, v, Laplace((1 << 20) + 3, 1.0f, 17));
    if (v.method == TopKMethod::kSampled) {
      EXPECT_FALSE(c->last_sampled_stats().fell_back);
    }
  }
}

// A hinted threshold selects the same set, in one pass when exactly k
// elements reach it (the k-th largest key with no ties there) and as usual
// otherwise: a key a little below or above, one every element reaches,
// one none does, and inputs with heavy ties at the k-th.
TEST(TopKCompressorTest, AHintedThresholdSelectsTheReferenceSet) {
  for (const Variant& v : kVariants) {
    auto c = Make(v, 0.01);
    for (size_t n : {size_t{1000}, size_t{70001}}) {
      for (const std::vector<float>& in : Inputs(n, n + 3)) {
        const size_t k = c->KeepCount(n);
        std::vector<uint32_t> keys(n);
        for (size_t i = 0; i < n; ++i) keys[i] = MagnitudeKey(in[i]);
        std::vector<uint32_t> sorted = keys;
        std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
        const uint32_t kth = sorted[k - 1];
        for (uint32_t hint : {kth, kth - 1, kth + 1, 1u, 0x7FFFFFFFu}) {
          c->HintThreshold(hint);
          ExpectReferenceRoundTrip(*c, v, in);
        }
      }
    }
  }
}

// On gradient-like data the sampled threshold keeps 0.8k..1.3k candidates
// without falling back, over many contexts (different samples).
TEST(TopKCompressorTest, SampledCandidateCountIsNearK) {
  int sampled = 0;
  for (double ratio : {0.001, 0.01, 0.05}) {
    auto c = Make(kVariants[2], ratio);
    for (size_t n : {size_t{1} << 18, size_t{1} << 20, size_t{3} << 20}) {
      for (uint32_t seed = 0; seed < 6; ++seed) {
        const std::vector<float> in =
            seed % 2 == 0 ? Gaussian(n, 1e-2f, seed) : Laplace(n, 1e-2f, seed);
        std::vector<uint8_t> wire(c->WireBytes(n));
        const CompressContext ctx{seed * 77 + 1, seed, 4};
        ASSERT_TRUE(c->Compress(in.data(), n, ctx, wire.data(), wire.size()).ok());
        const TopKCompressor::SampledStats& stats = c->last_sampled_stats();
        const double k = static_cast<double>(c->KeepCount(n));
        SCOPED_TRACE(testing::Message() << "ratio=" << ratio << " n=" << n << " seed=" << seed);
        ASSERT_EQ(stats.sample_size, c->SampleSize(n));
        if (stats.sample_size == 0) continue;  // Exact by design.
        ++sampled;
        EXPECT_FALSE(stats.fell_back);
        EXPECT_GE(static_cast<double>(stats.candidates), 0.8 * k);
        EXPECT_LE(static_cast<double>(stats.candidates), 1.3 * k);
      }
    }
  }
  EXPECT_EQ(sampled, 8 * 6);  // All but ratio 0.001 at n = 2^18.
}

TEST(TopKCompressorTest, SampleSizeFollowsTheDocumentedRule) {
  auto c = Make(kVariants[2], 0.01);
  EXPECT_EQ(c->SampleSize(1 << 20), 64000u / 64 * 64);
  EXPECT_EQ(c->SampleSize(10'000'000), 100'000u / 64 * 64);
  EXPECT_EQ(c->SampleSize(100'000), 50'000u / 64 * 64);
  EXPECT_EQ(c->SampleSize(50'000), 0u);  // 0.01 * 24'960 < 400.
  EXPECT_EQ(Make(kVariants[0], 0.01)->SampleSize(1 << 20), 0u);
}

TEST(TopKCompressorTest, SampledIsDeterministicPerContext) {
  auto a = Make(kVariants[3], 0.01);
  auto b = Make(kVariants[3], 0.01);
  const std::vector<float> in = Laplace(1 << 20, 1.0f, 8);
  const CompressContext ctx{42, 9, 2};
  EXPECT_EQ(CompressUnaligned(*a, in, ctx), CompressUnaligned(*b, in, ctx));
}

// Falls back to exact when the threshold cannot separate (mostly zeros).
TEST(TopKCompressorTest, SampledFallsBackOnHeavyTies) {
  auto c = Make(kVariants[2], 0.01);
  std::vector<float> in(1 << 20, 0.0f);
  for (size_t i = 0; i < in.size(); i += 1000) in[i] = 1.0f;  // ~0.1% nonzero
  const std::vector<uint8_t> wire = CompressUnaligned(*c, in, {1, 2, 3});
  EXPECT_TRUE(c->last_sampled_stats().fell_back);
  EXPECT_EQ(WireIndices(wire, c->KeepCount(in.size())), ReferenceTopK(in, c->KeepCount(in.size())));
}

TEST(TopKCompressorTest, DecompressRejectsBadIndicesAndWritesNothing) {
  auto c = Make(kVariants[0], 0.5);
  const size_t n = 8;  // k = 4.
  const std::vector<std::vector<int32_t>> bad = {
      {0, 1, 2, 8}, {-1, 1, 2, 3}, {0, 2, 2, 3}, {3, 2, 1, 0}, {0, 1, 2, 1 << 30}};
  for (const std::vector<int32_t>& idx : bad) {
    std::vector<uint8_t> wire(c->WireBytes(n), 0);
    std::memcpy(wire.data(), idx.data(), 16);
    std::vector<float> out(n, 9.0f);
    Status s = c->Decompress(wire.data(), wire.size(), n, {}, out.data());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << idx[3];
    EXPECT_EQ(out, std::vector<float>(n, 9.0f));
  }
}

// A payload lent from shared memory can change while it is decoded: another
// process flips the last index between one in range and one 8 GiB past the
// output. Whatever it reads, Decompress and SubtractDecompressed either
// refuse the payload or write within the output.
TEST(TopKCompressorTest, DecodesSafelyWhileAnotherProcessRewritesTheIndices) {
  auto c = Make(kVariants[0], 0.01);
  const size_t n = size_t{1} << 20;  // a 4 MiB output
  const size_t k = c->KeepCount(n);
  const size_t bytes = c->WireBytes(n);
  struct Words {
    std::atomic<uint32_t> started, stop;
  };
  void* map = mmap(nullptr, sizeof(Words) + bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto* words = new (map) Words{{0}, {0}};
  uint8_t* wire = static_cast<uint8_t*>(map) + sizeof(Words);
  for (size_t j = 0; j < k; ++j) {
    StoreAt<uint32_t>(wire, j, static_cast<uint32_t>(j));
    StoreAt<float>(wire, k + j, 1.0f);
  }
  const uint32_t good = static_cast<uint32_t>(n - 1), bad = 0x7FFFFFF0u;
  auto* last = reinterpret_cast<std::atomic<uint32_t>*>(wire + 4 * (k - 1));
  const pid_t writer = fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    words->started.store(1);
    while (words->stop.load(std::memory_order_relaxed) == 0) {
      last->store(bad, std::memory_order_relaxed);
      last->store(good, std::memory_order_relaxed);
    }
    _exit(0);
  }
  while (words->started.load() == 0) sched_yield();
  std::vector<float> out(n);
  std::vector<float> scratch;
  int taken = 0, refused = 0;
  for (int i = 0; i < 200000 && (taken < 20 || refused < 20); ++i) {
    const Status s = i % 2 == 0 ? c->Decompress(wire, bytes, n, {}, out.data())
                                : c->SubtractDecompressed(wire, bytes, n, {}, out.data(), &scratch);
    (s.ok() ? taken : refused) += 1;
  }
  words->stop.store(1);
  int status = 0;
  ASSERT_EQ(waitpid(writer, &status, 0), writer);
  munmap(map, sizeof(Words) + bytes);
  EXPECT_GE(taken, 20);
  EXPECT_GE(refused, 20);  // the writer's flips were seen
}

TEST(TopKCompressorTest, Fp16ValuesOverflowToSignedInfinity) {
  auto c = Make(kVariants[1], 1.0);
  const std::vector<float> in = {1e5f, -7e4f, 65504.0f, 1.0f};
  const std::vector<float> out = DecompressUnaligned(*c, CompressUnaligned(*c, in, {}), 4, {});
  EXPECT_EQ(out[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[2], 65504.0f);
  EXPECT_EQ(out[3], 1.0f);
}

// The vector scan and the scalar one agree, including the cap.
// Against a sort: every rank of key sets with every bit in use (top bits
// set, one shared top digit, heavy ties, all equal), so that each digit of
// the radix selection is exercised.
TEST(TopKSelectTest, KthLargestKeyMatchesASort) {
  std::mt19937 rng(7);
  std::vector<std::vector<uint32_t>> sets;
  for (size_t m : {size_t{1}, size_t{2}, size_t{7}, size_t{1000}, size_t{70001}}) {
    std::vector<uint32_t> any(m), shared_top(m), ties(m), equal(m, 0xFFFFFFFFu);
    for (size_t j = 0; j < m; ++j) {
      any[j] = rng();
      shared_top[j] = 0x5A000000u | (rng() & 0x001FFFFFu);  // one top digit
      ties[j] = 0x80000000u + (rng() % 3) * 0x401u;
    }
    sets.insert(sets.end(), {any, shared_top, ties, equal});
  }
  std::vector<uint32_t> scratch;
  for (const std::vector<uint32_t>& keys : sets) {
    std::vector<uint32_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
    const size_t m = keys.size();
    for (size_t rank : {size_t{1}, size_t{2}, m / 100 + 1, m / 2 + 1, m}) {
      if (rank > m) continue;
      const KthKey kth = KthLargestKey(keys.data(), m, rank, &scratch);
      ASSERT_EQ(kth.key, sorted[rank - 1]) << m << " " << rank;
      const size_t greater = static_cast<size_t>(
          std::count_if(keys.begin(), keys.end(), [&](uint32_t v) { return v > kth.key; }));
      ASSERT_EQ(kth.greater, greater) << m << " " << rank;
    }
  }
}

TEST(TopKSelectTest, CollectAtLeastMatchesScalar) {
  for (size_t n : TestSizes()) {
    const std::vector<float> in = Laplace(n, 1.0f, n + 5);
    for (float t : {0.0f, 0.5f, 3.0f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
      for (size_t cap : {size_t{0}, size_t{5}, n}) {
        std::vector<uint32_t> a(cap + 8), b(cap + 8), ka(cap + 8), kb(cap + 8);
        const uint32_t key = MagnitudeKey(t);
        const size_t ca = CollectAtLeast(in.data(), n, key, a.data(), ka.data(), cap);
        const size_t cb = CollectAtLeastScalar(in.data(), n, key, b.data(), kb.data(), cap);
        ASSERT_EQ(ca, cb) << n << " " << t << " " << cap;
        const size_t valid = std::min(ca, cap);
        ASSERT_TRUE(std::equal(a.begin(), a.begin() + valid, b.begin()));
        ASSERT_TRUE(std::equal(ka.begin(), ka.begin() + valid, kb.begin()));
        // And the scalar result is the definition.
        size_t want = 0;
        for (size_t i = 0; i < n; ++i) {
          if (MagnitudeKey(in[i]) >= key) {
            if (want < cap) {
              ASSERT_EQ(b[want], i);
              ASSERT_EQ(kb[want], MagnitudeKey(in[i]));
            }
            ++want;
          }
        }
        ASSERT_EQ(cb, std::min(want, cap + 1));
      }
    }
  }
}

}  // namespace
}  // namespace gradsync::compression
