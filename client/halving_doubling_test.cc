#include "client/halving_doubling.h"

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "client/ring_test_util.h"

namespace gradsync::client {
namespace {

std::string PairName(int rank, int level) {
  return "w" + std::to_string(rank) + "/pair" + std::to_string(level);
}
std::string PairEndpoint(int rank, int level) { return "inproc://" + PairName(rank, level); }

// A worker's ring, slowed: each all-reduce first waits `delay`.
class SlowRing : public Collectives {
 public:
  SlowRing(Collectives* ring, Millis delay) : ring_(ring), delay_(delay) {}
  const char* name() const override { return ring_->name(); }
  int rank() const override { return ring_->rank(); }
  int world_size() const override { return ring_->world_size(); }
  Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
                   Deadline deadline) override {
    std::this_thread::sleep_for(delay_);
    return ring_->AllReduce(data, count, dtype, op, tag, deadline);
  }
  Status AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                   Deadline deadline) override {
    return ring_->AllGather(in, bytes, out, tag, deadline);
  }
  Status Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                   Deadline deadline) override {
    return ring_->Broadcast(data, bytes, root, tag, deadline);
  }

 private:
  Collectives* ring_;
  Millis delay_;
};

// A job of n workers over the in-process transport: each worker's ring
// (`others`, its all-reduces slowed by `ring_delay`) and its pair rings,
// and its HalvingDoubling (`measure`: as ring_algorithm=auto).
class Job {
 public:
  explicit Job(int n, RingOptions options = SmallChunks(), bool measure = false,
               Millis ring_delay = Millis{0})
      : n_(n), ring_(n, options) {
    const int levels = HalvingDoublingLevels(n);
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < levels; ++k) {
        transports_.push_back(ring_.net().NewTransport(PairName(r, k)));
        EXPECT_TRUE(transports_.back()->Listen(PairEndpoint(r, k)).ok());
      }
    }
    for (int r = 0; r < n; ++r) {
      std::vector<std::unique_ptr<RingCollectives>> pairs;
      for (int k = 0; k < levels; ++k) {
        const int partner = HalvingDoublingPartner(r, k);
        RingPeers job;
        job.rank = r;
        job.world_size = n;
        job.sender = wire::Sender{wire::Role::Worker, r, kJob};
        const RingPeers p =
            HalvingDoublingPairPeers(job, k, PairEndpoint(partner, k), PairName(partner, k));
        auto pair = RingCollectives::Create(transports_[static_cast<size_t>(r * levels + k)].get(),
                                            p, options, nullptr);
        EXPECT_TRUE(pair.ok()) << pair.status().ToString();
        pairs.push_back(std::move(*pair));
      }
      slow_.push_back(std::make_unique<SlowRing>(&ring_[r], ring_delay));
      auto hd = HalvingDoubling::Create(r, n, std::move(pairs), slow_.back().get(), measure);
      EXPECT_TRUE(hd.ok()) << hd.status().ToString();
      hds_.push_back(std::move(*hd));
    }
  }

  HalvingDoubling& operator[](int r) { return *hds_[static_cast<size_t>(r)]; }
  std::vector<Status> Run(const std::function<Status(int)>& fn) { return RunRanks(n_, fn); }

 private:
  int n_;
  Ring ring_;
  std::vector<std::unique_ptr<wire::InProcTransport>> transports_;
  std::vector<std::unique_ptr<SlowRing>> slow_;
  std::vector<std::unique_ptr<HalvingDoubling>> hds_;
};

struct Case {
  int world;
  size_t count;
  bool doubling;  // every count within small_bytes: recursive doubling
};

RingOptions OptionsOf(const Case& c) {
  RingOptions o = SmallChunks();
  if (c.doubling) o.small_bytes = size_t{1} << 20;
  return o;
}

class HalvingDoublingSizesTest : public ::testing::TestWithParam<Case> {};

TEST_P(HalvingDoublingSizesTest, SumsAndAveragesAreExactForEveryDtype) {
  const auto [n, count, doubling] = GetParam();
  Job job(n, OptionsOf(GetParam()));
  uint64_t seq = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      std::vector<float> want(count, 0.0f);
      std::vector<std::vector<uint8_t>> bufs(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        std::vector<float> mine(count);
        for (size_t i = 0; i < count; ++i) {
          mine[i] = IntValue(r, i);
          want[i] += mine[i];
        }
        Encode(mine, dtype, &bufs[static_cast<size_t>(r)]);
      }
      if (op == ReduceOp::kAverage) {
        for (float& w : want) w = (dtype == DType::kF32) ? w / n : w * (1.0f / n);
      }
      std::vector<uint8_t> want_bytes;
      Encode(want, dtype, &want_bytes);
      ++seq;
      auto st = job.Run([&](int r) {
        return job[r].AllReduce(bufs[static_cast<size_t>(r)].data(), count, dtype, op, Tag(seq),
                                Soon());
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(st[r].ok()) << r << ": " << st[r].ToString();
        // Sums of integers are exact in any order; the average is one
        // rounding of them, as on the ring.
        ASSERT_EQ(bufs[static_cast<size_t>(r)], want_bytes)
            << "rank " << r << " dtype " << DTypeName(dtype)
            << (op == ReduceOp::kSum ? " sum" : " average");
      }
    }
  }
}

TEST_P(HalvingDoublingSizesTest, RandomFloatsAreCloseAndTheSameBitsOnEveryRank) {
  const auto [n, count, doubling] = GetParam();
  Job job(n, OptionsOf(GetParam()));
  std::mt19937 gen(static_cast<uint32_t>(n * 1000 + count));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> data(static_cast<size_t>(n), std::vector<float>(count));
  std::vector<double> want(count, 0.0);
  for (auto& d : data) {
    for (size_t i = 0; i < count; ++i) {
      d[i] = dist(gen);
      want[i] += d[i];
    }
  }
  auto st = job.Run([&](int r) {
    return job[r].AllReduce(data[static_cast<size_t>(r)].data(), count, DType::kF32, ReduceOp::kSum,
                            Tag(1), Soon());
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << st[r].ToString();
  for (size_t i = 0; i < count; ++i) ASSERT_NEAR(data[0][i], want[i], 1e-4) << i;
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(0, std::memcmp(data[static_cast<size_t>(r)].data(), data[0].data(), count * 4))
        << "rank " << r;
  }
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (int n : {4, 8}) {
    // Fewer elements than workers, uneven halves, one chunk, many chunks.
    for (size_t count : {size_t{1}, size_t{3}, size_t{1023}, size_t{4097}, size_t{50001}}) {
      for (bool doubling : {false, true}) out.push_back({n, count, doubling});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(WorldsAndSizes, HalvingDoublingSizesTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           return "n" + std::to_string(info.param.world) + "_count" +
                                  std::to_string(info.param.count) +
                                  (info.param.doubling ? "_doubling" : "_halving");
                         });

// Up to small_bytes whole buffers with each partner (log2(n) of them);
// past it halves, quarters, ... (2 (n - 1) / n of the buffer, as on the
// ring); all-gathers over the ring.
TEST(HalvingDoublingTest, EachSizeTakesItsWayAndAllGathersTakeTheRing) {
  const int n = 4;
  RingOptions options = SmallChunks();
  options.small_bytes = 64 << 10;
  Job job(n, options);
  std::vector<std::vector<float>> small(n, std::vector<float>(1000, 1.0f));
  std::vector<std::vector<float>> large(n, std::vector<float>(1 << 15, 1.0f));
  std::vector<std::vector<int32_t>> gathered(n, std::vector<int32_t>(n, -1));
  auto st = job.Run([&](int r) -> Status {
    auto expect_sent = [&](uint64_t want) -> Status {
      const uint64_t sent = job[r].stats().bytes_sent;
      if (sent == want) return Status();
      return InternalError("the pairs sent " + std::to_string(sent) + ", not " +
                           std::to_string(want));
    };
    GS_RETURN_IF_ERROR(job[r].AllReduce(small[r].data(), small[r].size(), DType::kF32,
                                        ReduceOp::kSum, Tag(1), Soon()));
    const uint64_t doubled = 2 * small[r].size() * 4;
    GS_RETURN_IF_ERROR(expect_sent(doubled));
    const int32_t mine = r * 10;
    GS_RETURN_IF_ERROR(job[r].AllGather(&mine, sizeof(mine), gathered[r].data(), Tag(2), Soon()));
    GS_RETURN_IF_ERROR(expect_sent(doubled));
    GS_RETURN_IF_ERROR(job[r].AllReduce(large[r].data(), large[r].size(), DType::kF32,
                                        ReduceOp::kSum, Tag(3), Soon()));
    return expect_sent(doubled + 2 * (large[r].size() * 4) * (n - 1) / n);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    EXPECT_EQ(small[r][999], 4.0f);
    EXPECT_EQ(large[r][12345], 4.0f);
    EXPECT_EQ(gathered[r], (std::vector<int32_t>{0, 10, 20, 30}));
    EXPECT_TRUE(job[r].Idle());
  }
}

// ring_algorithm=auto: the all-reduces of a size class past small_bytes go
// by halving and doubling and round the ring by turns, kTrials each way;
// the next one chooses, and every worker takes the same way from then on.
// Sums are exact whichever way; each class is measured on its own, and
// small all-reduces go by recursive doubling throughout.
TEST(HalvingDoublingTest, MeasuredSizesTryBothWaysThenEveryWorkerTakesTheSame) {
  const int n = 4;
  const int trials = HalvingDoubling::kTrials;
  RingOptions options = SmallChunks();
  options.small_bytes = 64 << 10;
  const size_t count = 50001;  // past small_bytes
  const size_t bytes = count * sizeof(float);
  Job job(n, options, /*measure=*/true);
  std::vector<std::string> chosen(n);
  for (int call = 0; call < 2 * trials + 3; ++call) {
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) data[r][i] = IntValue(r, i);
    }
    const uint64_t before = job[0].stats().bytes_sent;
    auto st = job.Run([&](int r) {
      return job[r].AllReduce(data[r].data(), count, DType::kF32, ReduceOp::kSum,
                              Tag(static_cast<uint64_t>(call + 1)), Soon());
    });
    const bool halved = job[0].stats().bytes_sent > before;
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].ok()) << "call " << call << " rank " << r << ": " << st[r].ToString();
      for (size_t i : {size_t{0}, size_t{777}, count - 1}) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += IntValue(q, i);
        ASSERT_EQ(data[r][i], want) << "call " << call << " rank " << r << " element " << i;
      }
      chosen[r] = job[r].ChosenFor(bytes);
    }
    if (call < 2 * trials) {
      EXPECT_EQ(halved, call % 2 == 0) << "call " << call;  // halving first, by turns
      EXPECT_EQ(chosen[0], "") << "call " << call;
      continue;
    }
    ASSERT_TRUE(chosen[0] == "ring" || chosen[0] == "halving_doubling") << chosen[0];
    for (int r = 1; r < n; ++r) EXPECT_EQ(chosen[r], chosen[0]) << "rank " << r;
    EXPECT_EQ(halved, chosen[0] == "halving_doubling") << "call " << call;
  }
  EXPECT_EQ(job[0].ChosenFor(4 * bytes), "");  // another class: not measured yet
  EXPECT_EQ(job[0].ChosenFor(1000), "recursive_doubling");
}

// A ring that takes half a second longer an all-reduce loses to halving and
// doubling on every worker.
TEST(HalvingDoublingTest, MeasuredSizesGoTheFasterWay) {
  const int n = 4;
  const size_t count = 50001;
  Job job(n, SmallChunks(), /*measure=*/true, Millis{500});
  std::vector<std::vector<float>> data(n, std::vector<float>(count, 1.0f));
  for (int call = 0; call < 2 * HalvingDoubling::kTrials + 1; ++call) {
    auto st = job.Run([&](int r) {
      return job[r].AllReduce(data[r].data(), count, DType::kF32, ReduceOp::kAverage,
                              Tag(static_cast<uint64_t>(call + 1)), Soon());
    });
    for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << r << ": " << st[r].ToString();
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(job[r].ChosenFor(count * sizeof(float)), "halving_doubling") << "rank " << r;
    EXPECT_EQ(data[r][4242], 1.0f);
  }
}

TEST(HalvingDoublingTest, AWorkerThatDisagreesFailsEveryWorkerAtOnceNamingIt) {
  const int n = 8;
  for (bool doubling : {false, true}) {
    Job job(n, OptionsOf(Case{n, 0, doubling}));
    std::vector<std::vector<float>> data(n, std::vector<float>(10000, 1.0f));
    // Worker 5 all-reduces another size: its level-0 partner (4) sees it
    // first; every other worker learns from its own partners, not from the
    // deadline.
    auto st = job.Run([&](int r) {
      const size_t count = r == 5 ? 9000 : 10000;
      return job[r].AllReduce(data[r].data(), count, DType::kF32, ReduceOp::kSum, Tag(7), Soon());
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(st[r].code(), StatusCode::kAborted)
          << (doubling ? "doubling " : "halving ") << r << ": " << st[r].ToString();
      EXPECT_NE(st[r].message().find("rank 5"), std::string::npos) << r << ": " << st[r].ToString();
    }
    // Broken for good, as a ring.
    EXPECT_EQ(
        job[0].AllReduce(data[0].data(), 10000, DType::kF32, ReduceOp::kSum, Tag(8), Soon()).code(),
        StatusCode::kAborted);
  }
}

TEST(HalvingDoublingTest, AMissingWorkerIsNamedByItsPartnersAtTheDeadline) {
  const int n = 4;
  RingOptions options = SmallChunks();
  options.abort_grace = Millis(200);
  Job job(n, options);
  std::vector<std::vector<float>> data(n, std::vector<float>(10000, 1.0f));
  const Deadline deadline = Deadline::After(std::chrono::seconds(2));
  auto st = job.Run([&](int r) {
    if (r == 3) return Status();  // never runs it
    return job[r].AllReduce(data[r].data(), 10000, DType::kF32, ReduceOp::kSum, Tag(1), deadline);
  });
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(st[r].ok()) << r;
  // Its partners at levels 0 and 1 wait on it and name it.
  for (int r : {1, 2}) {
    EXPECT_EQ(st[r].code(), StatusCode::kDeadlineExceeded) << st[r].ToString();
    EXPECT_NE(st[r].message().find("rank 3 stopped contributing"), std::string::npos)
        << st[r].ToString();
  }
}

TEST(HalvingDoublingTest, CreateRefusesWhatIsNotAPowerOfTwoOrNotItsPairs) {
  Ring ring(4, SmallChunks());
  EXPECT_FALSE(HalvingDoublingFits(2));
  EXPECT_FALSE(HalvingDoublingFits(6));
  EXPECT_TRUE(HalvingDoublingFits(4));
  EXPECT_TRUE(HalvingDoublingFits(64));
  EXPECT_EQ(HalvingDoubling::Create(0, 6, {}, &ring[0]).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(HalvingDoubling::Create(0, 4, {}, &ring[0]).status().code(),
            StatusCode::kInvalidArgument);
  // Two rings, but the first pairs 0 with 2 where level 0 pairs it with 1.
  wire::InProcNetwork net;
  auto t0 = net.NewTransport("a");
  auto t1 = net.NewTransport("b");
  ASSERT_TRUE(t0->Listen("inproc://a").ok());
  ASSERT_TRUE(t1->Listen("inproc://b").ok());
  std::vector<std::unique_ptr<RingCollectives>> pairs;
  for (auto& [t, partner] : {std::pair{t0.get(), 2}, std::pair{t1.get(), 2}}) {
    RingPeers p;
    p.rank = 0;
    p.world_size = 2;
    p.job_ranks = {0, partner};
    p.right_endpoint = "inproc://a";
    p.sender = wire::Sender{wire::Role::Worker, 0, kJob};
    auto pair = RingCollectives::Create(t, p, SmallChunks(), nullptr);
    ASSERT_TRUE(pair.ok()) << pair.status().ToString();
    pairs.push_back(std::move(*pair));
  }
  auto made = HalvingDoubling::Create(0, 4, std::move(pairs), &ring[0]);
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("level 0 is not of ranks 0 and 1"), std::string::npos)
      << made.status().ToString();
}

}  // namespace
}  // namespace gradsync::client
