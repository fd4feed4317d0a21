// Collectives striped over several rings, every rank a thread of this
// process, each lane over its own in-process transport.
#include "client/ring_lanes.h"

#include <cstring>
#include <thread>

#include "client/ring_test_util.h"
#include "gtest/gtest.h"
#include "wire/inproc_transport.h"
#include "wire/message.h"

namespace gradsync::client {
namespace {

// `n` ranks, each with `lanes` rings over transports of its own.
class Lanes {
 public:
  Lanes(int n, size_t lanes) : n_(n) {
    for (size_t k = 0; k < lanes; ++k) {
      for (int r = 0; r < n; ++r) {
        transports_.push_back(net_.NewTransport(Identity(r, k)));
        EXPECT_TRUE(transports_.back()->Listen(Endpoint(r, k)).ok());
      }
    }
    for (int r = 0; r < n; ++r) {
      auto alarm = std::make_shared<LaneAlarm>();
      std::vector<std::unique_ptr<RingCollectives>> rings;
      for (size_t k = 0; k < lanes; ++k) {
        RingPeers p;
        p.rank = r;
        p.world_size = n;
        p.right_endpoint = Endpoint((r + 1) % n, k);
        p.sender = wire::Sender{wire::Role::Worker, r, kJob};
        p.left_identity = Identity((r + n - 1) % n, k);
        RingOptions options;
        options.poll_interval = Millis(5);
        auto ring = RingCollectives::Create(transport(r, k), p, options,
                                            [alarm] { return alarm->status(); });
        EXPECT_TRUE(ring.ok()) << ring.status();
        rings.push_back(std::move(*ring));
      }
      lanes_.push_back(std::make_unique<RingLanes>(std::move(rings), alarm));
    }
  }

  static std::string Identity(int r, size_t k) {
    const std::string id = "w" + std::to_string(r);
    return k == 0 ? id : wire::LaneIdentity(id, static_cast<int>(k));
  }
  static std::string Endpoint(int r, size_t k) {
    return "inproc://lane" + std::to_string(k) + "-rank" + std::to_string(r);
  }
  wire::Transport* transport(int r, size_t k) {
    return transports_[k * static_cast<size_t>(n_) + static_cast<size_t>(r)].get();
  }
  RingLanes& operator[](int r) { return *lanes_[static_cast<size_t>(r)]; }

  std::vector<Status> Run(const std::function<Status(int)>& fn) { return RunRanks(n_, fn); }

 private:
  int n_;
  wire::InProcNetwork net_;
  std::vector<std::unique_ptr<wire::InProcTransport>> transports_;
  std::vector<std::unique_ptr<RingLanes>> lanes_;
};

// Integer values: every sum is exact.
float Value(int rank, size_t i) { return static_cast<float>((i * 7 + rank * 13) % 17) - 8.0f; }

TEST(RingLanesTest, AllReduceIsExactAndLargeBuffersUseEveryLane) {
  constexpr int kRanks = 3;
  Lanes lanes(kRanks, 3);
  // Below two slices (one lane), two slices, and more than three (an odd
  // count, uneven slices).
  const size_t counts[] = {1000, (size_t{2} << 20) / 4, (size_t{5} << 20) / 4 + 3};
  uint64_t seq = 0;
  for (size_t count : counts) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      std::vector<std::vector<float>> bufs(kRanks, std::vector<float>(count));
      for (int r = 0; r < kRanks; ++r) {
        for (size_t i = 0; i < count; ++i) bufs[r][i] = Value(r, i);
      }
      ++seq;
      for (const Status& s : lanes.Run([&](int r) {
             return lanes[r].AllReduce(bufs[r].data(), count, DType::kF32, op, Tag(seq), Soon());
           })) {
        ASSERT_TRUE(s.ok()) << s;
      }
      for (size_t i = 0; i < count; ++i) {
        float want = Value(0, i) + Value(1, i) + Value(2, i);
        if (op == ReduceOp::kAverage) want /= kRanks;
        ASSERT_EQ(bufs[0][i], want) << "element " << i << " of " << count;
        ASSERT_EQ(std::memcmp(&bufs[1][i], &bufs[0][i], 4), 0);
        ASSERT_EQ(std::memcmp(&bufs[2][i], &bufs[0][i], 4), 0);
      }
    }
  }
  EXPECT_EQ(lanes[0].lanes(), 3u);
}

TEST(RingLanesTest, EachLaneCarriesItsSliceOverItsOwnTransport) {
  constexpr int kRanks = 2;
  Lanes lanes(kRanks, 3);
  const size_t count = (size_t{6} << 20) / 4;  // three slices of 2 MiB
  std::vector<std::vector<float>> bufs(kRanks, std::vector<float>(count, 1.0f));
  for (const Status& s : lanes.Run([&](int r) {
         return lanes[r].AllReduce(bufs[r].data(), count, DType::kF32, ReduceOp::kSum, Tag(1),
                                   Soon());
       })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(bufs[0][0], 2.0f);
  EXPECT_EQ(bufs[1][count - 1], 2.0f);
  // Each rank sent half of each of its three slices of 2 MiB, twice (the
  // reduce-scatter and the all-gather): 6 MiB.
  EXPECT_EQ(lanes[0].stats().bytes_sent, size_t{6} << 20);
  // Once a lane's transport is gone, a large all-reduce fails on every rank.
  lanes.transport(1, 2)->Shutdown();
  bool failed_at_once = false;
  for (const Status& s : lanes.Run([&](int r) {
         return lanes[r].AllReduce(bufs[r].data(), count, DType::kF32, ReduceOp::kSum, Tag(2),
                                   Deadline::After(std::chrono::seconds(20)));
       })) {
    EXPECT_FALSE(s.ok());
    failed_at_once = failed_at_once || s.code() != StatusCode::kDeadlineExceeded;
  }
  // Rank 1's lane 2 fails at once, and its other lanes stop on the alarm
  // rather than at the deadline.
  EXPECT_TRUE(failed_at_once);
}

// SetActive(k): buffers are cut over the first k lanes only, exactly; the
// others carry nothing.
TEST(RingLanesTest, OnlyTheActiveLanesCarry) {
  constexpr int kRanks = 3;
  Lanes lanes(kRanks, 3);
  const size_t count = (size_t{6} << 20) / 4;
  for (size_t active : {size_t{1}, size_t{2}, size_t{3}}) {
    SCOPED_TRACE("active " + std::to_string(active));
    std::vector<uint64_t> before(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      lanes[r].SetActive(active);
      EXPECT_EQ(lanes[r].active(), active);
      before[static_cast<size_t>(r)] = lanes[r].stats().bytes_sent;
    }
    std::vector<uint64_t> first_before(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      first_before[static_cast<size_t>(r)] = lanes[r].first().stats().bytes_sent;
    }
    std::vector<std::vector<float>> bufs(kRanks, std::vector<float>(count));
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < count; ++i) bufs[r][i] = Value(r, i);
    }
    for (const Status& s : lanes.Run([&](int r) {
           return lanes[r].AllReduce(bufs[r].data(), count, DType::kF32, ReduceOp::kSum,
                                     Tag(10 + active), Soon());
         })) {
      ASSERT_TRUE(s.ok()) << s;
    }
    for (size_t i = 0; i < count; i += 4099) {
      EXPECT_EQ(bufs[1][i], Value(0, i) + Value(1, i) + Value(2, i)) << i;
    }
    const uint64_t sent = lanes[0].stats().bytes_sent - before[0];
    const uint64_t first = lanes[0].first().stats().bytes_sent - first_before[0];
    // The first lane carries 1/active of the buffer (within a slice's
    // rounding), the idle lanes nothing.
    EXPECT_NEAR(static_cast<double>(first) / static_cast<double>(sent), 1.0 / active, 0.01);
  }
  lanes[0].SetActive(0);
  EXPECT_EQ(lanes[0].active(), 1u);
  lanes[0].SetActive(99);
  EXPECT_EQ(lanes[0].active(), 3u);
}

TEST(RingLanesTest, BroadcastAndAllGatherAreStripedAndSmallOnesTakeTheFirstLane) {
  constexpr int kRanks = 3;
  Lanes lanes(kRanks, 2);
  const size_t bytes = (size_t{3} << 20) + 5;
  std::vector<std::vector<uint8_t>> bufs(kRanks, std::vector<uint8_t>(bytes, 0));
  for (size_t i = 0; i < bytes; ++i) bufs[1][i] = static_cast<uint8_t>(i * 31 + 7);
  for (const Status& s : lanes.Run(
           [&](int r) { return lanes[r].Broadcast(bufs[r].data(), bytes, 1, Tag(1), Soon()); })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(bufs[0], bufs[1]);
  EXPECT_EQ(bufs[2], bufs[1]);
  // The root's second lane carried a part.
  const uint64_t first_lane = lanes[1].first().stats().bytes_sent;
  EXPECT_GT(first_lane, 0u);
  EXPECT_LT(first_lane, lanes[1].stats().bytes_sent);

  std::vector<int32_t> all(2 * kRanks);
  for (const Status& s : lanes.Run([&](int r) {
         std::vector<int32_t> in = {r, r * 10};
         std::vector<int32_t> out(2 * kRanks);
         Status st = lanes[r].AllGather(in.data(), 8, out.data(), Tag(2), Soon());
         if (r == 0) all = out;
         return st;
       })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(all, (std::vector<int32_t>{0, 0, 1, 10, 2, 20}));
  EXPECT_EQ(lanes[0].stats().bytes_sent - lanes[0].first().stats().bytes_sent, 0u);

  // An all-gather of 3 MiB + 1 from each rank goes over both lanes, every
  // rank's block in its place.
  const size_t block = (size_t{3} << 20) + 1;
  std::vector<std::vector<uint8_t>> gathered(kRanks);
  const uint64_t second_before = lanes[2].stats().bytes_sent - lanes[2].first().stats().bytes_sent;
  for (const Status& s : lanes.Run([&](int r) {
         std::vector<uint8_t> in(block);
         for (size_t i = 0; i < block; ++i) in[i] = static_cast<uint8_t>(i * 13 + r * 101);
         gathered[r].resize(block * kRanks);
         return lanes[r].AllGather(in.data(), block, gathered[r].data(), Tag(3), Soon());
       })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(gathered[r], gathered[0]) << "rank " << r;
    for (int q = 0; q < kRanks; ++q) {
      for (size_t i = 0; i < block; i += 4099) {
        ASSERT_EQ(gathered[r][q * block + i], static_cast<uint8_t>(i * 13 + q * 101));
      }
      ASSERT_EQ(gathered[r][q * block + block - 1],
                static_cast<uint8_t>((block - 1) * 13 + q * 101));
    }
  }
  EXPECT_GT(lanes[2].stats().bytes_sent - lanes[2].first().stats().bytes_sent, second_before);
}

}  // namespace
}  // namespace gradsync::client
