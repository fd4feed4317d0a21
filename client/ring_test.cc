// The ring collectives with every rank as a thread of this process, over the
// in-process transport.
#include "client/ring.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "client/ring_plan.h"
#include "client/ring_test_util.h"
#include "common/half.h"
#include "gtest/gtest.h"
#include "wire/inproc_transport.h"

namespace gradsync::client {
namespace {

struct Case {
  int world;
  size_t count;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const size_t chunk = kChunkBytes / 4;
  for (int n = 1; n <= 8; ++n) {
    std::set<size_t> counts{
        0, 1, 1009, chunk - 1, chunk + 1, n * chunk - 1, n * chunk + 1, 3 * n * chunk + 17};
    for (size_t count : counts) {
      cases.push_back({n, count});
    }
  }
  return cases;
}

class RingSizesTest : public ::testing::TestWithParam<Case> {};

TEST_P(RingSizesTest, AllReduceOfIntegersIsExactForEveryDtypeAndOp) {
  const Case c = GetParam();
  Ring ring(c.world, SmallChunks());
  uint64_t seq = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      std::vector<float> want(c.count, 0.0f);
      for (int r = 0; r < c.world; ++r) {
        for (size_t i = 0; i < c.count; ++i) want[i] += IntValue(r, i);
      }
      if (op == ReduceOp::kAverage) {
        for (float& w : want) w = (dtype == DType::kF32) ? w / c.world : w * (1.0f / c.world);
      }
      std::vector<std::vector<uint8_t>> bufs(c.world);
      for (int r = 0; r < c.world; ++r) {
        std::vector<float> mine(c.count);
        for (size_t i = 0; i < c.count; ++i) mine[i] = IntValue(r, i);
        Encode(mine, dtype, &bufs[r]);
      }
      std::vector<uint8_t> want_bytes;
      Encode(want, dtype, &want_bytes);
      ++seq;
      auto st = ring.Run([&](int r) {
        return ring[r].AllReduce(bufs[r].data(), c.count, dtype, op, Tag(seq), Soon());
      });
      for (int r = 0; r < c.world; ++r) {
        ASSERT_TRUE(st[r].ok()) << st[r].ToString();
        // Sums of integers are exact; the average is one rounding of them,
        // the same on every rank.
        ASSERT_EQ(bufs[r], want_bytes) << "rank " << r << " dtype " << DTypeName(dtype)
                                       << (op == ReduceOp::kSum ? " sum" : " average");
      }
    }
  }
}

TEST_P(RingSizesTest, AllReduceOfRandomFloatsIsCloseAndIdenticalOnEveryRank) {
  const Case c = GetParam();
  Ring ring(c.world, SmallChunks());
  std::mt19937 rng(c.world * 1000 + c.count);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<std::vector<float>> bufs(c.world, std::vector<float>(c.count));
  std::vector<double> want(c.count, 0.0);
  for (int r = 0; r < c.world; ++r) {
    for (size_t i = 0; i < c.count; ++i) {
      bufs[r][i] = dist(rng);
      want[i] += bufs[r][i];
    }
  }
  auto st = ring.Run([&](int r) {
    return ring[r].AllReduce(bufs[r].data(), c.count, DType::kF32, ReduceOp::kSum, Tag(1), Soon());
  });
  for (int r = 0; r < c.world; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    ASSERT_EQ(bufs[r], bufs[0]) << "rank " << r << " differs from rank 0";
  }
  for (size_t i = 0; i < c.count; ++i) {
    ASSERT_NEAR(bufs[0][i], want[i], 1e-5 * c.world * (1 + std::fabs(want[i]))) << i;
  }
}

TEST_P(RingSizesTest, AllGatherAndBroadcastDeliverExactBytes) {
  const Case c = GetParam();
  Ring ring(c.world, SmallChunks());
  const size_t bytes = c.count * 3 + 1;  // odd byte counts too
  std::vector<std::vector<uint8_t>> in(c.world, std::vector<uint8_t>(bytes));
  std::vector<uint8_t> want;
  for (int r = 0; r < c.world; ++r) {
    for (size_t i = 0; i < bytes; ++i) in[r][i] = static_cast<uint8_t>(i * 31 + r * 7);
    want.insert(want.end(), in[r].begin(), in[r].end());
  }
  std::vector<std::vector<uint8_t>> out(c.world, std::vector<uint8_t>(bytes * c.world));
  auto st = ring.Run(
      [&](int r) { return ring[r].AllGather(in[r].data(), bytes, out[r].data(), Tag(1), Soon()); });
  for (int r = 0; r < c.world; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    ASSERT_EQ(out[r], want) << "rank " << r;
  }
  for (int root = 0; root < c.world; ++root) {
    std::vector<std::vector<uint8_t>> data = in;
    st = ring.Run([&](int r) {
      return ring[r].Broadcast(data[r].data(), bytes, root, Tag(2 + root), Soon());
    });
    for (int r = 0; r < c.world; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r].ToString();
      ASSERT_EQ(data[r], in[root]) << "rank " << r << " root " << root;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndSizes, RingSizesTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "world" + std::to_string(info.param.world) + "_count" +
                                  std::to_string(info.param.count);
                         });

// A ring in an order other than the ranks' (cluster/ring_order.h) gives the
// same results: all-reduce sums, all-gather blocks by rank, broadcast from
// the root rank.
class RingOrderTest : public ::testing::TestWithParam<int> {};

std::vector<int> Shuffled(int n) {
  std::vector<int> order;
  for (int r = 0; r < n; ++r) order.push_back(r);
  std::mt19937 rng(static_cast<unsigned>(n));
  std::shuffle(order.begin() + 1, order.end(), rng);
  std::swap(order[0], order[static_cast<size_t>(n / 2)]);  // rank 0 away from the start
  return order;
}

TEST_P(RingOrderTest, EveryCollectiveGivesTheRankOrderResults) {
  const int n = GetParam();
  const std::vector<int> order = Shuffled(n);
  SCOPED_TRACE("order of " + std::to_string(n));
  for (size_t small : {size_t{0}, size_t{1} << 20}) {
    RingOptions options = SmallChunks();
    options.small_bytes = small;
    Ring ring(n, options, nullptr, order);
    const size_t count = 3 * static_cast<size_t>(n) * (kChunkBytes / 4) + 17;
    std::vector<std::vector<float>> bufs(n, std::vector<float>(count));
    std::vector<float> want(count, 0.0f);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        bufs[r][i] = IntValue(r, i);
        want[i] += IntValue(r, i);
      }
    }
    auto st = ring.Run([&](int r) {
      return ring[r].AllReduce(bufs[r].data(), count, DType::kF32, ReduceOp::kSum, Tag(1), Soon());
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r].ToString();
      ASSERT_EQ(bufs[r], want) << "rank " << r << ", small_bytes " << small;
    }
    const size_t bytes = 5000;
    std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(bytes));
    std::vector<uint8_t> gathered;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < bytes; ++i) in[r][i] = static_cast<uint8_t>(i * 31 + r * 7);
      gathered.insert(gathered.end(), in[r].begin(), in[r].end());
    }
    std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(bytes * n));
    st = ring.Run([&](int r) {
      return ring[r].AllGather(in[r].data(), bytes, out[r].data(), Tag(2), Soon());
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r].ToString();
      ASSERT_EQ(out[r], gathered) << "rank " << r;
    }
    for (int root = 0; root < n; ++root) {
      std::vector<std::vector<uint8_t>> data = in;
      st = ring.Run([&](int r) {
        return ring[r].Broadcast(data[r].data(), bytes, root, Tag(3 + root), Soon());
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(st[r].ok()) << st[r].ToString();
        ASSERT_EQ(data[r], in[root]) << "rank " << r << " root " << root;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, RingOrderTest, ::testing::Range(2, 9));

TEST(RingOrderCheckTest, AnOrderThatIsNotOfTheRanksIsRefused) {
  wire::InProcNetwork net;
  auto transport = net.NewTransport("w0");
  for (const std::vector<int>& order :
       {std::vector<int>{0, 1}, std::vector<int>{0, 1, 1}, std::vector<int>{0, 1, 3}}) {
    RingPeers p;
    p.world_size = 3;
    p.order = order;
    p.right_endpoint = "inproc://nowhere";
    auto ring = RingCollectives::Create(transport.get(), p, RingOptions(), nullptr);
    EXPECT_EQ(ring.status().code(), StatusCode::kInvalidArgument);
  }
}

// Buffers up to small_bytes travel whole around the ring and are added in
// rank order: exact on integers, the same bits everywhere on random floats.
class RingSmallPathTest : public ::testing::TestWithParam<int> {};

TEST_P(RingSmallPathTest, WholeBufferRingIsExactAndIdenticalEverywhere) {
  const int n = GetParam();
  Ring ring(n);  // default options: small_bytes = 256 KiB
  std::mt19937 rng(n);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  uint64_t seq = 0;
  for (size_t count : {size_t{1}, size_t{1009}, size_t{65536}}) {
    for (bool integers : {true, false}) {
      std::vector<std::vector<float>> bufs(n, std::vector<float>(count));
      std::vector<double> want(count, 0.0);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) {
          bufs[r][i] = integers ? IntValue(r, i) : dist(rng);
          want[i] += bufs[r][i];
        }
      }
      ++seq;
      auto st = ring.Run([&](int r) {
        return ring[r].AllReduce(bufs[r].data(), count, DType::kF32, ReduceOp::kAverage, Tag(seq),
                                 Soon());
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(st[r].ok()) << st[r].ToString();
        ASSERT_EQ(bufs[r], bufs[0]) << "rank " << r;
      }
      for (size_t i = 0; i < count; ++i) {
        if (integers) {
          ASSERT_EQ(bufs[0][i], static_cast<float>(want[i] / n)) << i;
        } else {
          ASSERT_NEAR(bufs[0][i], want[i] / n, 1e-5 * (1 + std::fabs(want[i]))) << i;
        }
      }
    }
  }
  // Fewer messages than the chunked path: n - 1 per all-reduce.
  EXPECT_EQ(ring[0].stats().messages_received, 6u * static_cast<uint64_t>(n - 1));
}

INSTANTIATE_TEST_SUITE_P(Worlds, RingSmallPathTest, ::testing::Values(1, 2, 3, 4, 5, 8));

// 64 MiB per rank with the default 1 MiB chunks.
class RingLargeTest : public ::testing::TestWithParam<int> {};

TEST_P(RingLargeTest, AllReduce64MiB) {
  const int n = GetParam();
  const size_t count = (size_t{64} << 20) / 4;
  Ring ring(n);
  std::vector<std::vector<float>> bufs(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) bufs[r][i] = IntValue(r, i);
  }
  auto st = ring.Run([&](int r) {
    return ring[r].AllReduce(bufs[r].data(), count, DType::kF32, ReduceOp::kSum, Tag(1), Soon());
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += IntValue(q, i);
      ASSERT_EQ(bufs[r][i], want) << "rank " << r << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, RingLargeTest, ::testing::Values(1, 2, 3, 4, 8));

}  // namespace
}  // namespace gradsync::client
