#include "client/host_collectives.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/ring_test_util.h"
#include "common/half.h"
#include "gtest/gtest.h"
#include "wire/shm_segment.h"

namespace gradsync::client {
namespace {

constexpr uint32_t kSetupBucket = 0xfffffffdu;

// A job id of this test process's own, so that runs in parallel (and
// leftovers of a killed run) never share segment names.
uint64_t TestJob() {
  static const uint64_t job = (static_cast<uint64_t>(getpid()) << 20) ^ 0x5e9a11;
  return job;
}

HostOptions Small() {
  HostOptions o;
  o.slot_bytes = 4096;   // 1024 f32: buffers past that take several chunks
  o.small_bytes = 8192;  // buffers x ranks up to 8 KiB in one step
  return o;
}

// n ranks, each with its ring (in-process) and its HostCollectives.
class Host {
 public:
  Host(int n, HostOptions options = Small(), uint32_t epoch = 0, std::vector<bool> enabled = {})
      : n_(n), ring_(n) {
    host_.resize(static_cast<size_t>(n));
    std::vector<Status> made = ring_.Run([&](int r) -> Status {
      HostOptions o = options;
      if (!enabled.empty()) o.enabled = enabled[static_cast<size_t>(r)];
      auto host =
          HostCollectives::Create(HostPeers{r, n, TestJob(), epoch}, o, &ring_[r], nullptr, Soon());
      if (!host.ok()) return host.status();
      host_[static_cast<size_t>(r)] = std::move(*host);
      return Status();
    });
    for (const Status& s : made) EXPECT_TRUE(s.ok()) << s.ToString();
  }
  HostCollectives* operator[](int r) { return host_[static_cast<size_t>(r)].get(); }
  std::vector<Status> Run(const std::function<Status(int)>& fn) { return ring_.Run(fn); }
  void Drop(int r) { host_[static_cast<size_t>(r)].reset(); }

 private:
  int n_;
  Ring ring_;
  std::vector<std::unique_ptr<HostCollectives>> host_;
};

// Rank r's element i: small integers, so that every sum is exact.
float Value(int r, size_t i) { return static_cast<float>((r + 1) * 3 + static_cast<int>(i % 17)); }

void ExpectAllOk(const std::vector<Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r].ToString();
  }
}

TEST(HostCollectivesTest, SumsAndAveragesEverySizeExactlyOnEveryRank) {
  for (int n : {2, 3, 4}) {
    Host host(n);
    ASSERT_NE(host[0], nullptr);
    uint64_t seq = 0;
    // One element; a whole-buffer step; several chunks with a remainder and
    // parts that do not divide evenly.
    for (size_t count : {size_t{1}, size_t{7}, size_t{500}, size_t{1024}, size_t{5003}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        std::vector<std::vector<float>> data(static_cast<size_t>(n), std::vector<float>(count));
        const uint64_t s = seq++;
        ExpectAllOk(host.Run([&](int r) {
          auto& d = data[static_cast<size_t>(r)];
          for (size_t i = 0; i < count; ++i) d[i] = Value(r, i);
          return host[r]->AllReduce(d.data(), count, DType::kF32, op, Tag(s), Soon());
        }));
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += Value(r, i);
          if (op == ReduceOp::kAverage) want /= static_cast<float>(n);
          ASSERT_EQ(data[0][i], want) << "n=" << n << " count=" << count << " i=" << i;
        }
        for (int r = 1; r < n; ++r) {
          ASSERT_EQ(std::memcmp(data[0].data(), data[static_cast<size_t>(r)].data(), count * 4), 0)
              << "rank " << r << " differs, n=" << n << " count=" << count;
        }
      }
    }
  }
}

TEST(HostCollectivesTest, HalfPrecisionIsTheSameOnEveryRank) {
  const int n = 3;
  Host host(n);
  ASSERT_NE(host[0], nullptr);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (size_t count : {size_t{300}, size_t{4000}}) {
      std::vector<std::vector<uint16_t>> data(n, std::vector<uint16_t>(count));
      std::vector<std::vector<float>> in(n, std::vector<float>(count));
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) {
          const float v = dist(rng);
          data[r][i] = dtype == DType::kF16 ? FloatToHalf(v) : FloatToBf16(v);
          in[r][i] = dtype == DType::kF16 ? HalfToFloat(data[r][i]) : Bf16ToFloat(data[r][i]);
        }
      }
      ExpectAllOk(host.Run([&](int r) {
        return host[r]->AllReduce(data[r].data(), count, dtype, ReduceOp::kSum, Tag(count), Soon());
      }));
      for (int r = 1; r < n; ++r) ASSERT_EQ(data[r], data[0]) << "rank " << r;
      for (size_t i = 0; i < count; ++i) {
        const float got = dtype == DType::kF16 ? HalfToFloat(data[0][i]) : Bf16ToFloat(data[0][i]);
        EXPECT_NEAR(got, in[0][i] + in[1][i] + in[2][i], 0.07f) << i;
      }
    }
  }
}

TEST(HostCollectivesTest, ManyOperationsOfMixedSizesInARow) {
  const int n = 4;
  Host host(n);
  ASSERT_NE(host[0], nullptr);
  const size_t sizes[] = {1, 3000, 20, 1024, 2048, 5, 4097};
  for (uint64_t k = 0; k < 60; ++k) {
    const size_t count = sizes[k % 7];
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    ExpectAllOk(host.Run([&](int r) {
      for (size_t i = 0; i < count; ++i) data[r][i] = Value(r, i + k);
      return host[r]->AllReduce(data[r].data(), count, DType::kF32, ReduceOp::kSum, Tag(k), Soon());
    }));
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += Value(r, i + k);
      for (int r = 0; r < n; ++r) ASSERT_EQ(data[r][i], want) << "op " << k << " rank " << r;
    }
  }
  EXPECT_EQ(host[0]->stats().operations, 60u);
}

TEST(HostCollectivesTest, AllGatherAndBroadcastGoThroughTheRing) {
  const int n = 3;
  Host host(n);
  ASSERT_NE(host[0], nullptr);
  std::vector<std::vector<int>> out(n, std::vector<int>(n));
  std::vector<int> value(n);
  ExpectAllOk(host.Run([&](int r) -> Status {
    const int mine = 10 + r;
    GS_RETURN_IF_ERROR(host[r]->AllGather(&mine, sizeof(mine), out[r].data(), Tag(1), Soon()));
    value[r] = r == 2 ? 99 : 0;
    return host[r]->Broadcast(&value[r], sizeof(int), 2, Tag(2), Soon());
  }));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r], (std::vector<int>{10, 11, 12}));
    EXPECT_EQ(value[r], 99);
  }
}

TEST(HostCollectivesTest, ARankThatAsksForTheRingKeepsEveryRankOnIt) {
  Host host(3, Small(), 0, {true, false, true});
  for (int r = 0; r < 3; ++r) EXPECT_EQ(host[r], nullptr) << r;
}

TEST(HostCollectivesTest, RanksThatDisagreeAllFailNamingBoth) {
  const int n = 3;
  Host host(n);
  ASSERT_NE(host[0], nullptr);
  std::vector<std::vector<float>> data(n, std::vector<float>(100, 1.0f));
  std::vector<Status> got = host.Run([&](int r) {
    OpTag tag = Tag(5);
    if (r == 1) tag.step = 4;  // a rank a step behind
    return host[r]->AllReduce(data[r].data(), 100, DType::kF32, ReduceOp::kSum, tag, Soon());
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kAborted) << got[r].ToString();
    EXPECT_NE(got[r].message().find("ranks disagree on collective seq 5"), std::string::npos)
        << got[r].message();
  }
  EXPECT_NE(got[0].message().find("rank 1 runs allreduce step 4"), std::string::npos)
      << got[0].message();
  EXPECT_NE(got[1].message().find("rank 0 runs allreduce step 3"), std::string::npos)
      << got[1].message();
  // Broken for good: the next call returns the first error.
  Status again =
      host[0]->AllReduce(data[0].data(), 100, DType::kF32, ReduceOp::kSum, Tag(6), Soon());
  EXPECT_EQ(again.message(), got[0].message());
}

TEST(HostCollectivesTest, ARankThatStopsContributingIsNamedAtTheDeadline) {
  const int n = 3;
  Host host(n);
  ASSERT_NE(host[0], nullptr);
  std::vector<std::vector<float>> data(n, std::vector<float>(3000, 1.0f));
  std::vector<Status> got = host.Run([&](int r) -> Status {
    if (r == 2) return Status();  // never calls
    return host[r]->AllReduce(data[r].data(), 3000, DType::kF32, ReduceOp::kSum, Tag(1),
                              Deadline::After(std::chrono::milliseconds(300)));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kDeadlineExceeded) << got[r].ToString();
    EXPECT_NE(got[r].message().find("rank 2 stopped contributing"), std::string::npos)
        << got[r].message();
  }
}

TEST(HostCollectivesTest, ARankThatShutsDownIsNamedBeforeTheDeadline) {
  const int n = 3;
  Host host(n);
  ASSERT_NE(host[0], nullptr);
  std::vector<std::vector<float>> data(n, std::vector<float>(3000, 1.0f));
  const auto start = std::chrono::steady_clock::now();
  std::vector<Status> got = host.Run([&](int r) -> Status {
    if (r == 2) {
      host.Drop(2);  // gone without a word but its segment's
      return Status();
    }
    return host[r]->AllReduce(data[r].data(), 3000, DType::kF32, ReduceOp::kSum, Tag(1),
                              Deadline::After(std::chrono::minutes(10)));
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::minutes(5));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kAborted) << got[r].ToString();
    EXPECT_NE(got[r].message().find("rank 2 gave up: rank 2 shut down"), std::string::npos)
        << got[r].message();
  }
}

TEST(HostCollectivesTest, TheHealthCheckEndsAWait) {
  const int n = 2;
  Ring ring(n);
  std::atomic<bool> dead{false};
  std::vector<std::unique_ptr<HostCollectives>> host(n);
  ExpectAllOk(ring.Run([&](int r) -> Status {
    HealthCheck health = [&]() -> Status {
      return dead.load() ? UnavailableError("worker 1 was declared dead") : Status();
    };
    GS_ASSIGN_OR_RETURN(host[r], HostCollectives::Create(HostPeers{r, n, TestJob() + 1, 0}, Small(),
                                                         &ring[r], health, Soon()));
    return Status();
  }));
  ASSERT_NE(host[0], nullptr);
  std::vector<float> data(100, 1.0f);
  std::thread declare([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    dead.store(true);
  });
  Status got = host[0]->AllReduce(data.data(), 100, DType::kF32, ReduceOp::kSum, Tag(1),
                                  Deadline::After(std::chrono::minutes(10)));
  declare.join();
  EXPECT_EQ(got.code(), StatusCode::kUnavailable) << got.ToString();
  EXPECT_NE(got.message().find("worker 1 was declared dead"), std::string::npos) << got.message();
}

// Rank 1 is played by the test: it takes part in the setup over its ring
// and then writes its segment as it likes.
class HostilePeer : public ::testing::Test {
 protected:
  void SetUp() override {
    ring_ = std::make_unique<Ring>(2);
    const uint64_t job = TestJob() + 2;
    std::vector<Status> made = ring_->Run([&](int r) -> Status {
      if (r == 0) {
        HostOptions options = Small();
        options.refusals = refusals_;
        GS_ASSIGN_OR_RETURN(host_, HostCollectives::Create(HostPeers{0, 2, job, 0}, options,
                                                           &(*ring_)[0], nullptr, Soon()));
        return Status();
      }
      GS_ASSIGN_OR_RETURN(segment_,
                          wire::ShmSegment::Create(HostCollectives::SegmentName(job, 0, 1),
                                                   HostCollectives::SegmentBytes(Small())));
      for (uint64_t step : {0, 1}) {
        uint8_t vote = 1, all[2];
        GS_RETURN_IF_ERROR(
            (*ring_)[1].AllGather(&vote, 1, all, OpTag{step, kSetupBucket, 0, 0}, Soon()));
      }
      return Status();
    });
    for (const Status& s : made) ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_NE(host_, nullptr);
  }
  void Write64(size_t offset, uint64_t v) {
    std::memcpy(segment_->mutable_data() + offset, &v, sizeof(v));
  }
  Status Reduce(Millis deadline = Millis(60000)) {
    std::vector<float> data(100, 1.0f);
    return host_->AllReduce(data.data(), 100, DType::kF32, ReduceOp::kSum, Tag(1),
                            Deadline::After(deadline));
  }

  std::unique_ptr<Ring> ring_;
  std::shared_ptr<wire::TransportRefusals> refusals_ = std::make_shared<wire::TransportRefusals>();
  std::unique_ptr<HostCollectives> host_;
  std::unique_ptr<wire::ShmSegment> segment_;
};

TEST_F(HostilePeer, APhaseOutOfTurnIsRefusedNamingThePeer) {
  Write64(HostCollectives::kPublishedOffset, 1000);
  Status got = Reduce();
  EXPECT_EQ(got.code(), StatusCode::kAborted) << got.ToString();
  EXPECT_NE(got.message().find("rank 1 published phase 1000"), std::string::npos) << got.message();
  EXPECT_EQ(refusals_->dropped.load(), 1u);
}

TEST_F(HostilePeer, ASlotOfAnotherPhaseIsRefused) {
  Write64(HostCollectives::kSlot0Offset, 77);  // the slot's header says phase 77
  Write64(HostCollectives::kPublishedOffset, 1);
  Status got = Reduce();
  EXPECT_EQ(got.code(), StatusCode::kAborted) << got.ToString();
  EXPECT_NE(got.message().find("rank 1's slot for phase 0 holds phase 77"), std::string::npos)
      << got.message();
  EXPECT_EQ(refusals_->dropped.load(), 1u);
}

TEST_F(HostilePeer, AGarbledHeaderIsADisagreement) {
  std::vector<uint8_t> noise(256);
  std::mt19937 rng(3);
  for (auto& b : noise) b = static_cast<uint8_t>(rng());
  std::memcpy(segment_->mutable_data() + HostCollectives::kSlot0Offset + 8, noise.data(),
              noise.size());
  Write64(HostCollectives::kPublishedOffset, 1);
  Status got = Reduce();
  EXPECT_EQ(got.code(), StatusCode::kAborted) << got.ToString();
  EXPECT_NE(got.message().find("ranks disagree"), std::string::npos) << got.message();
  EXPECT_EQ(refusals_->dropped.load(), 0u);  // a disagreement, not a broken segment
}

TEST_F(HostilePeer, AnAbortIsTakenWithItsReasonEscaped) {
  const char why[] = "bad\x01news";
  std::memcpy(segment_->mutable_data() + HostCollectives::kAbortedOffset + 4, why, sizeof(why));
  const uint32_t one = 1;
  std::memcpy(segment_->mutable_data() + HostCollectives::kAbortedOffset, &one, sizeof(one));
  Status got = Reduce();
  EXPECT_EQ(got.code(), StatusCode::kAborted) << got.ToString();
  EXPECT_NE(got.message().find("rank 1 gave up: bad"), std::string::npos) << got.message();
  EXPECT_EQ(got.message().find('\x01'), std::string::npos) << got.message();
}

TEST_F(HostilePeer, AnOwnerThatIsGoneIsNamed) {
  segment_.reset();  // its lock goes, as with a process that died
  Status got = Reduce();
  EXPECT_EQ(got.code(), StatusCode::kUnavailable) << got.ToString();
  EXPECT_NE(got.message().find("worker 1 died (its process no longer holds"), std::string::npos)
      << got.message();
}

}  // namespace
}  // namespace gradsync::client
