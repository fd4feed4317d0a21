// The ring when ranks disagree, stop, die, or receive garbage: every rank
// fails in time with the same explanation, and bad messages are refused.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "client/ring.h"
#include "client/ring_plan.h"
#include "client/ring_test_util.h"
#include "gtest/gtest.h"
#include "wire/test_util.h"

namespace gradsync::client {
namespace {

using std::chrono::steady_clock;

double SecondsSince(steady_clock::time_point t) {
  return std::chrono::duration<double>(steady_clock::now() - t).count();
}

RingOptions FastOptions() {
  RingOptions o = SmallChunks();
  o.abort_grace = Millis(300);
  return o;
}

TEST(RingFaultTest, DisagreeingStepFailsEveryRankWithinASecondNamingBothRanks) {
  const int n = 4;
  Ring ring(n, FastOptions());
  std::vector<std::vector<float>> bufs(n, std::vector<float>(5000, 1.0f));
  const auto start = steady_clock::now();
  auto st = ring.Run([&](int r) {
    OpTag tag = Tag(1);
    if (r == 2) tag.step = 4;  // rank 2 is a step ahead
    return ring[r].AllReduce(bufs[r].data(), bufs[r].size(), DType::kF32, ReduceOp::kSum, tag,
                             Deadline::After(std::chrono::seconds(30)));
  });
  EXPECT_LT(SecondsSince(start), 1.0);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kAborted) << r << ": " << st[r].ToString();
    EXPECT_NE(st[r].message().find("ranks disagree"), std::string::npos) << st[r].ToString();
    EXPECT_NE(st[r].message().find("step 4"), std::string::npos) << st[r].ToString();
  }
  // The ring stays broken: later calls return the same error at once.
  Status again = ring[0].AllReduce(bufs[0].data(), 1, DType::kF32, ReduceOp::kSum, Tag(2), Soon());
  EXPECT_EQ(again.message(), st[0].message());
}

TEST(RingFaultTest, DifferentSizesAreAMismatchNotAHang) {
  const int n = 3;
  Ring ring(n, FastOptions());
  std::vector<std::vector<float>> bufs(n, std::vector<float>(9000, 1.0f));
  const auto start = steady_clock::now();
  auto st = ring.Run([&](int r) {
    const size_t count = r == 1 ? 8000 : 9000;
    return ring[r].AllReduce(bufs[r].data(), count, DType::kF32, ReduceOp::kSum, Tag(1),
                             Deadline::After(std::chrono::seconds(30)));
  });
  EXPECT_LT(SecondsSince(start), 1.0);
  for (int r = 0; r < n; ++r) EXPECT_EQ(st[r].code(), StatusCode::kAborted) << st[r].ToString();
}

TEST(RingFaultTest, AStalledRankIsNamedByEveryOtherRankByTheDeadline) {
  // In rank order and in another ring order.
  for (const auto& [stalled, order] : std::vector<std::pair<int, std::vector<int>>>{
           {0, {}}, {2, {}}, {0, {2, 0, 3, 1}}, {3, {2, 0, 3, 1}}}) {
    const int n = 4;
    Ring ring(n, FastOptions(), nullptr, order);
    std::vector<std::vector<float>> bufs(n, std::vector<float>(20000, 1.0f));
    const auto start = steady_clock::now();
    auto st = ring.Run([&](int r) {
      if (r == stalled) return Status();  // never takes part
      return ring[r].AllReduce(bufs[r].data(), bufs[r].size(), DType::kF32, ReduceOp::kSum, Tag(1),
                               Deadline::After(Millis(1500)));
    });
    const double took = SecondsSince(start);
    EXPECT_GE(took, 1.0);
    EXPECT_LT(took, 2.0);
    const std::string want = "rank " + std::to_string(stalled) + " stopped contributing";
    for (int r = 0; r < n; ++r) {
      if (r == stalled) continue;
      EXPECT_EQ(st[r].code(), StatusCode::kDeadlineExceeded) << st[r].ToString();
      EXPECT_NE(st[r].message().find(want), std::string::npos)
          << "rank " << r << ": " << st[r].ToString();
    }
  }
}

// A send its neighbour never took keeps a ring from being Idle (the
// buffer must outlive the send) until the neighbour's transport lets go of
// it; a ring whose operations all completed is Idle.
TEST(RingFaultTest, ARingIsIdleOnceNoSendPointsIntoABuffer) {
  const int n = 3;
  Ring ring(n, FastOptions());
  std::vector<std::vector<float>> bufs(n, std::vector<float>(20000, 1.0f));
  auto done = ring.Run([&](int r) {
    return ring[r].AllReduce(bufs[r].data(), bufs[r].size(), DType::kF32, ReduceOp::kSum, Tag(1),
                             Soon());
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(done[r].ok()) << done[r];
    EXPECT_TRUE(ring[r].Idle()) << r;
  }
  auto st = ring.Run([&](int r) {
    if (r == 1) return Status();  // never takes part
    return ring[r].AllReduce(bufs[r].data(), bufs[r].size(), DType::kF32, ReduceOp::kSum, Tag(2),
                             Deadline::After(Millis(500)));
  });
  EXPECT_FALSE(st[0].ok());
  EXPECT_FALSE(ring[0].Idle()) << "rank 0's first send waits in rank 1's transport";
  EXPECT_TRUE(ring[1].Idle());
  ring.DropTransport(1);
  EXPECT_TRUE(ring[0].Idle());
}

TEST(RingFaultTest, AHealthFailureEndsTheWaitAtOnce) {
  const int n = 3;
  std::atomic<bool> dead{false};
  Ring ring(n, FastOptions(), [&]() -> Status {
    if (dead) return UnavailableError("worker 2 died (missed 5 heartbeats)");
    return Status();
  });
  std::vector<std::vector<float>> bufs(n, std::vector<float>(100, 1.0f));
  const auto start = steady_clock::now();
  auto st = ring.Run([&](int r) {
    if (r == 2) {
      dead = true;  // as the scheduler would announce
      return Status();
    }
    return ring[r].AllReduce(bufs[r].data(), 100, DType::kF32, ReduceOp::kSum, Tag(1),
                             Deadline::After(std::chrono::seconds(30)));
  });
  EXPECT_LT(SecondsSince(start), 1.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kUnavailable) << st[r].ToString();
    EXPECT_NE(st[r].message().find("worker 2 died"), std::string::npos) << st[r].ToString();
  }
}

// Every rank takes part, so no wait ever reaches the poll interval: the
// health check at the start of each operation still ends them all (the
// scheduler went silent while the ring itself runs fine).
TEST(RingFaultTest, AnUnhealthyJobFailsEveryOperationThoughNoneWaits) {
  const int n = 3;
  std::atomic<bool> silent{false};
  RingOptions options = FastOptions();
  options.poll_interval = Millis(60'000);  // a wait never polls health
  Ring ring(n, options, [&]() -> Status {
    if (silent) return UnavailableError("the scheduler stopped answering");
    return Status();
  });
  std::vector<std::vector<float>> bufs(n, std::vector<float>(100, 1.0f));
  std::vector<uint8_t> byte(n, 1), gathered(n * n);
  auto all = [&](uint64_t seq) {
    return ring.Run([&](int r) -> Status {
      GS_RETURN_IF_ERROR(
          ring[r].AllReduce(bufs[r].data(), 100, DType::kF32, ReduceOp::kSum, Tag(seq), Soon()));
      GS_RETURN_IF_ERROR(ring[r].AllGather(&byte[r], 1, &gathered[r * n], Tag(seq + 1), Soon()));
      return ring[r].Broadcast(bufs[r].data(), 16, 1, Tag(seq + 2), Soon());
    });
  };
  for (const Status& s : all(1)) EXPECT_TRUE(s.ok()) << s.ToString();
  silent = true;
  for (const Status& s : all(4)) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("the scheduler stopped answering"), std::string::npos)
        << s.ToString();
  }
}

TEST(RingFaultTest, LayoutDifferenceNamesTheFirstDifferingTensorOnEveryRank) {
  const int n = 3;
  Ring ring(n, FastOptions());
  auto st = ring.Run([&](int r) {
    std::vector<wire::TensorSpecFields> layout = {{"fc1.weight", 1000, wire::DType::F32},
                                                  {"fc1.bias", 10, wire::DType::F32},
                                                  {"fc2.weight", 100, wire::DType::F32}};
    if (r == 1) layout[1].num_elements = 20;
    return ring[r].CheckLayout(layout, Deadline::After(std::chrono::seconds(10)));
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kFailedPrecondition) << st[r].ToString();
    EXPECT_NE(st[r].message().find("'fc1.bias' (20 x f32)"), std::string::npos) << st[r].ToString();
    EXPECT_NE(st[r].message().find("tensor #1"), std::string::npos) << st[r].ToString();
  }
}

TEST(RingFaultTest, EqualLayoutsPass) {
  Ring ring(4, FastOptions());
  auto st = ring.Run([&](int r) {
    return ring[r].CheckLayout({{"w", 7, wire::DType::BF16}},
                               Deadline::After(std::chrono::seconds(10)));
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.ToString();
}

std::vector<wire::TensorSpecFields> LargeLayout() {
  std::vector<wire::TensorSpecFields> layout;
  for (size_t i = 0; i < 10000; ++i) {
    std::string name = "model.encoder.layers." + std::to_string(i) + ".";
    name.resize(100, 'w');
    layout.push_back({name, 1 + i % 7, wire::DType::F32});
  }
  return layout;
}

// 10,000 tensors of 100-byte names go in pieces within the default header
// limit; the first difference is still named, wherever it is.
TEST(RingFaultTest, LargeLayoutsAreComparedInPiecesAndTheirFirstDifferenceNamed) {
  const int n = 3;
  auto check = [&](const std::function<void(int, std::vector<wire::TensorSpecFields>*)>& edit) {
    Ring ring(n, FastOptions());
    return ring.Run([&](int r) {
      std::vector<wire::TensorSpecFields> layout = LargeLayout();
      edit(r, &layout);
      return ring[r].CheckLayout(layout, Deadline::After(std::chrono::seconds(30)));
    });
  };
  for (const Status& s : check([](int, auto*) {})) EXPECT_TRUE(s.ok()) << s.ToString();
  auto differ = check([](int r, auto* layout) {
    if (r == 2) (*layout)[9876].num_elements = 99;
  });
  for (const Status& s : differ) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("tensor #9876: "), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("(99 x f32)"), std::string::npos) << s.ToString();
  }
  auto longer = check([](int r, auto* layout) {
    if (r == 0) layout->push_back({"extra", 1, wire::DType::F32});
  });
  for (const Status& s : longer) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    // Ranks 0 (left: 2) and 1 (left: 0) both see it; the first tells all.
    EXPECT_NE(s.message().find("tensor #10000: rank "), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("rank 0 has 'extra' (1 x f32)"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("has no tensor #10000"), std::string::npos) << s.ToString();
  }
}

// Garbage and impostors sent to a rank during an operation are refused with
// an Error reply and counted; the operation still completes correctly.
TEST(RingFaultTest, BadMessagesAreRefusedCountedAndAnsweredWhileTheOpCompletes) {
  const int n = 2;
  Ring ring(n, FastOptions());
  auto intruder = ring.net().NewTransport("intruder");
  auto conn = intruder->Connect(Ring::Endpoint(1));
  ASSERT_TRUE(conn.ok());
  wire::Message garbage;
  garbage.header = {1, 2, 3, 4, 5};
  ASSERT_TRUE(intruder->Send(wire::Route::Connection(*conn), garbage, Soon()).ok());
  // A well-formed RingData claiming to be rank 0, from the wrong peer: its
  // sender rank is right but it comes from rank 3's role in another job.
  wire::Message other_job = wire::SampleMessage(wire::MsgType::RingData);
  ASSERT_TRUE(intruder->Send(wire::Route::Connection(*conn), other_job, Soon()).ok());
  std::vector<std::vector<float>> bufs(n, std::vector<float>(3000));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < 3000; ++i) bufs[r][i] = static_cast<float>(i + r);
  }
  auto st = ring.Run([&](int r) {
    return ring[r].AllReduce(bufs[r].data(), 3000, DType::kF32, ReduceOp::kSum, Tag(1), Soon());
  });
  ASSERT_TRUE(st[0].ok()) << st[0].ToString();
  ASSERT_TRUE(st[1].ok()) << st[1].ToString();
  for (size_t i = 0; i < 3000; ++i) ASSERT_EQ(bufs[1][i], static_cast<float>(2 * i + 1));
  EXPECT_EQ(ring[1].stats().rejected, 2u);
  for (int i = 0; i < 2; ++i) {
    auto reply = intruder->Receive(Deadline::After(std::chrono::seconds(5)));
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    wire::Verdict v = wire::Validate(reply->message, wire::AcceptAllPolicy());
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(v.type, wire::MsgType::Error);
  }
}

// A RingData that claims the left neighbour, the operation's fingerprint and
// the chunk's element count, but holds bytes of another type or of another
// size, used to be added from past the end of its frame.
TEST(RingFaultTest, DataOfAnotherTypeOrSizeIsRefusedBeforeItIsRead) {
  const int n = 2;
  RingOptions options = FastOptions();
  options.small_bytes = 0;
  options.chunk_bytes = 4096;  // rank 1 first expects 1024 elements
  Ring ring(n, options);
  auto intruder = ring.net().NewTransport("intruder");
  auto conn = intruder->Connect(Ring::Endpoint(1));
  ASSERT_TRUE(conn.ok());
  auto forge = [&](wire::DType dtype, size_t bytes) {
    wire::RingDataFields f;
    f.dtype = dtype;
    f.num_elements = 1024;
    f.op_fingerprint = RingFingerprint(RingOpKind::kAllReduce, Tag(1), DType::kF32, 3000,
                                       static_cast<uint64_t>(ReduceOp::kSum));
    f.names_hash = Tag(1).names_hash;
    std::vector<uint8_t> bytes_of(bytes, 0x7f);
    wire::Message m =
        wire::MakeRingData(wire::Sender{wire::Role::Worker, 0, kJob}, f,
                           {wire::Payload::Copy(bytes_of.data(), bytes)}, Tag(1).step, Tag(1).seq);
    ASSERT_TRUE(intruder->Send(wire::Route::Connection(*conn), std::move(m), Soon()).ok());
  };
  forge(wire::DType::U8, 1024);
  forge(wire::DType::F32, 16);
  std::vector<std::vector<float>> bufs(n, std::vector<float>(3000));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < 3000; ++i) bufs[r][i] = static_cast<float>(i + r);
  }
  auto st = ring.Run([&](int r) {
    return ring[r].AllReduce(bufs[r].data(), 3000, DType::kF32, ReduceOp::kSum, Tag(1), Soon());
  });
  ASSERT_TRUE(st[0].ok()) << st[0].ToString();
  ASSERT_TRUE(st[1].ok()) << st[1].ToString();
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < 3000; ++i) ASSERT_EQ(bufs[r][i], static_cast<float>(2 * i + 1));
  }
  EXPECT_EQ(ring[1].stats().rejected, 2u);
}

// Without the left neighbour's identity, a message claiming its rank is
// refused, however well formed: before, a forged RingData of another
// operation made every rank fail with "ranks disagree".
TEST(RingFaultTest, AMessageClaimingTheLeftNeighbourUnderAnotherIdentityIsRefused) {
  const int n = 3;
  Ring ring(n, FastOptions());
  auto intruder = ring.net().NewTransport("intruder");
  auto conn = intruder->Connect(Ring::Endpoint(1));
  ASSERT_TRUE(conn.ok());
  std::vector<float> junk(16, 1.0f);
  wire::RingDataFields f;
  f.num_elements = junk.size();
  f.op_fingerprint = 12345;  // another operation's
  ASSERT_TRUE(
      intruder
          ->Send(wire::Route::Connection(*conn),
                 wire::MakeRingData(wire::Sender{wire::Role::Worker, 0, kJob}, f,
                                    {wire::Payload::Copy(junk.data(), junk.size() * 4)}, 0, 0),
                 Soon())
          .ok());
  wire::RingAbortFields abort;
  abort.origin_rank = 0;
  abort.code = wire::ErrorCode::Mismatch;
  abort.message = "forged";
  ASSERT_TRUE(intruder
                  ->Send(wire::Route::Connection(*conn),
                         wire::MakeRingAbort(wire::Sender{wire::Role::Worker, 0, kJob}, abort),
                         Soon())
                  .ok());
  std::vector<std::vector<float>> bufs(n, std::vector<float>(3000));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < 3000; ++i) bufs[r][i] = static_cast<float>(i + r);
  }
  auto st = ring.Run([&](int r) {
    return ring[r].AllReduce(bufs[r].data(), 3000, DType::kF32, ReduceOp::kSum, Tag(1), Soon());
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << st[r].ToString();
  for (size_t i = 0; i < 3000; ++i) ASSERT_EQ(bufs[1][i], static_cast<float>(3 * i + 3));
  EXPECT_EQ(ring[1].stats().rejected, 2u);
}

// A stranger that sends garbage without pause (never 20 ms without a
// message) while the left neighbour sends nothing: the wait still ends at
// its deadline, and at once when the job turns unhealthy.
TEST(RingFaultTest, AGarbageFloodHoldsNoWaitPastItsDeadlineOrAFailedHealthCheck) {
  for (const bool unhealthy : {false, true}) {
    SCOPED_TRACE(unhealthy ? "unhealthy job" : "deadline");
    std::atomic<bool> dead{false};
    Ring ring(2, FastOptions(),
              [&]() -> Status { return dead ? UnavailableError("worker 0 died") : Status(); });
    auto intruder = ring.net().NewTransport("intruder");
    auto conn = intruder->Connect(Ring::Endpoint(1));
    ASSERT_TRUE(conn.ok());
    std::atomic<bool> done{false};
    std::thread flood([&] {
      wire::Message garbage;
      garbage.header.assign(48, 0x5a);
      const Deadline cap = Deadline::After(std::chrono::seconds(15));
      for (uint64_t i = 0; !done && !cap.Expired(); ++i) {
        intruder->Send(wire::Route::Connection(*conn), garbage, Soon()).IgnoreError();
        if (i % 256 == 0) {  // its answers: dropped, so that they do not pile up
          while (intruder->Receive(Deadline::After(Millis(0))).ok()) {
          }
        }
      }
    });
    std::vector<float> buf(3000, 1.0f);
    const auto start = steady_clock::now();
    const Deadline deadline =
        Deadline::After(unhealthy ? std::chrono::seconds(30) : std::chrono::seconds(1));
    std::thread scheduler([&] {  // declares rank 0 dead after 300 ms
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      dead = unhealthy;
    });
    Status s =
        ring[1].AllReduce(buf.data(), buf.size(), DType::kF32, ReduceOp::kSum, Tag(1), deadline);
    const double took = SecondsSince(start);
    done = true;
    flood.join();
    scheduler.join();
    EXPECT_LT(took, unhealthy ? 1.5 : 2.0) << s.ToString();
    if (unhealthy) {
      EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
      EXPECT_NE(s.message().find("worker 0 died"), std::string::npos) << s.ToString();
    } else {
      EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
      EXPECT_NE(s.message().find("rank 0 stopped contributing"), std::string::npos) << s.ToString();
    }
    EXPECT_GT(ring[1].stats().rejected, 100u);
  }
}

// A transport that hands everything to `inner`; the faulty ones below
// change one thing.
class Forwarding : public wire::Transport {
 public:
  explicit Forwarding(wire::Transport* inner) : inner_(inner) {}
  const std::string& identity() const override { return inner_->identity(); }
  StatusOr<std::string> Listen(const std::string& endpoint) override {
    return inner_->Listen(endpoint);
  }
  StatusOr<wire::ConnId> Connect(const std::string& endpoint) override {
    return inner_->Connect(endpoint);
  }
  Status Send(const wire::Route& to, wire::Message m, Deadline deadline) override {
    return inner_->Send(to, std::move(m), deadline);
  }
  void Post(const wire::Route& to, wire::Message m, Deadline deadline,
            std::function<void(const Status&)> done) override {
    inner_->Post(to, std::move(m), deadline, std::move(done));
  }
  StatusOr<wire::Incoming> Receive(Deadline deadline) override { return inner_->Receive(deadline); }
  Status Probe(const std::string& endpoint, Deadline deadline) override {
    return inner_->Probe(endpoint, deadline);
  }
  void Shutdown() override { inner_->Shutdown(); }

 protected:
  wire::Transport* const inner_;
};

// n ranks over in-process transports, each ring over its rank's
// transport or a wrapper of it.
struct InProcRing {
  explicit InProcRing(int n) : n(n) {
    for (int r = 0; r < n; ++r) {
      inproc.push_back(net.NewTransport("w" + std::to_string(r)));
      EXPECT_TRUE(inproc[r]->Listen(Ring::Endpoint(r)).ok());
    }
  }
  // `over[r]`, where given and not null, carries rank r's ring.
  void Form(const std::vector<wire::Transport*>& over = {}) {
    for (int r = 0; r < n; ++r) {
      RingPeers p;
      p.rank = r;
      p.world_size = n;
      p.right_endpoint = Ring::Endpoint((r + 1) % n);
      p.sender = wire::Sender{wire::Role::Worker, r, kJob};
      p.left_identity = "w" + std::to_string((r + n - 1) % n);
      wire::Transport* t = r < static_cast<int>(over.size()) && over[r] != nullptr
                               ? over[r]
                               : static_cast<wire::Transport*>(inproc[r].get());
      auto made = RingCollectives::Create(t, p, FastOptions(), nullptr);
      ASSERT_TRUE(made.ok()) << made.status().ToString();
      ring.push_back(std::move(*made));
    }
  }

  // Every rank all-reduces `count` ones at once (Tag(1)) by `deadline(r)`;
  // `after(r)` runs on rank r's thread once its all-reduce returned.
  std::vector<Status> AllReduceAtOnce(size_t count, const std::function<Deadline(int)>& deadline,
                                      const std::function<void(int)>& after = nullptr) {
    std::vector<std::vector<float>> bufs(n, std::vector<float>(count, 1.0f));
    std::vector<Status> st(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        st[r] = ring[r]->AllReduce(bufs[r].data(), count, DType::kF32, ReduceOp::kSum, Tag(1),
                                   deadline(r));
        if (after) after(r);
      });
    }
    for (auto& t : threads) t.join();
    return st;
  }

  const int n;
  wire::InProcNetwork net;
  std::vector<std::unique_ptr<wire::InProcTransport>> inproc;
  std::vector<std::unique_ptr<RingCollectives>> ring;
};

// A transport that loses the `lose`-th message it receives, as a same-host
// link whose framing broke: Receive returns DataLoss instead of it.
class LosesAMessage : public Forwarding {
 public:
  LosesAMessage(wire::Transport* inner, int lose) : Forwarding(inner), lose_(lose) {}
  StatusOr<wire::Incoming> Receive(Deadline deadline) override {
    auto got = inner_->Receive(deadline);
    if (got.ok() && ++received_ == lose_) {
      return DataLossError("the same-host link from w1 carries a bad frame table");
    }
    return got;
  }

 private:
  const int lose_;
  int received_ = 0;
};

// Rank 2's transport loses a message of its left neighbour's: rank 2 fails
// with DataLoss, tells its right neighbour, and ends (its transport goes,
// and what it held of rank 1's sends with it); ranks 3 and 0 hear of the
// loss through the ring's abort and rank 1 fails too, long before the 30 s
// deadline.
TEST(RingFaultTest, AMessageItsTransportLostFailsEveryRankAtOnce) {
  const int n = 4;
  InProcRing rings(n);
  auto& inproc = rings.inproc;
  auto& ring = rings.ring;
  LosesAMessage loses(inproc[2].get(), 3);
  rings.Form({nullptr, nullptr, &loses});
  const auto start = steady_clock::now();
  const std::vector<Status> st = rings.AllReduceAtOnce(
      20000, [](int) { return Deadline::After(std::chrono::seconds(30)); },
      [&](int r) {
        if (r == 2) inproc[2].reset();
      });
  EXPECT_LT(SecondsSince(start), 10.0);
  EXPECT_EQ(st[2].code(), StatusCode::kDataLoss) << st[2].ToString();
  for (int r : {3, 0}) {
    EXPECT_NE(st[r].message().find("bad frame table"), std::string::npos)
        << "rank " << r << ": " << st[r].ToString();
  }
  EXPECT_FALSE(st[1].ok());
  ring.clear();
}

// A transport whose messages over routes of `kind` never leave: to inbound
// peers, as ZeroMQ's answers to a peer that never reads; to the right
// neighbour, as to one that failed and reads nothing. Send waits out its
// deadline; a posted message is kept, its payloads held, and reported
// only when the transport goes.
class NeverLeave : public Forwarding {
 public:
  NeverLeave(wire::Transport* inner, wire::Route::Kind kind) : Forwarding(inner), kind_(kind) {}
  ~NeverLeave() override {
    for (auto& done : done_) done(DeadlineExceededError("never sent"));
  }
  Status Send(const wire::Route& to, wire::Message m, Deadline deadline) override {
    if (to.kind != kind_) return inner_->Send(to, std::move(m), deadline);
    std::this_thread::sleep_until(deadline.at());
    return DeadlineExceededError("the peer is not reading");
  }
  void Post(const wire::Route& to, wire::Message m, Deadline deadline,
            std::function<void(const Status&)> done) override {
    if (to.kind != kind_) {
      inner_->Post(to, std::move(m), deadline, std::move(done));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    kept_.push_back(std::move(m));
    if (done) done_.push_back(std::move(done));
  }

 private:
  const wire::Route::Kind kind_;
  std::mutex mu_;
  std::vector<wire::Message> kept_;
  std::vector<std::function<void(const Status&)>> done_;
};

// 2,000 garbage messages wait for rank 1 from a peer that reads none of its
// answers: refusing them costs no waiting (64 answers stay queued, the
// rest go unanswered, counted), so the all-reduce behind them finishes at
// once and right.
TEST(RingFaultTest, RefusalsNeverWaitOnAPeerThatDoesNotRead) {
  InProcRing rings(2);
  auto& ring = rings.ring;
  NeverLeave stuck(rings.inproc[1].get(), wire::Route::Kind::kInbound);
  rings.Form({nullptr, &stuck});
  auto intruder = rings.net.NewTransport("intruder");
  auto conn = intruder->Connect(Ring::Endpoint(1));
  ASSERT_TRUE(conn.ok());
  wire::Message garbage;
  garbage.header.assign(48, 0x5a);
  for (int i = 0; i < 2000; ++i) {
    ASSERT_TRUE(intruder->Send(wire::Route::Connection(*conn), garbage, Soon()).ok());
  }
  std::vector<std::vector<float>> bufs(2, std::vector<float>(3000));
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < 3000; ++i) bufs[r][i] = static_cast<float>(i + r);
  }
  const auto start = steady_clock::now();
  std::vector<Status> st(2);
  std::thread other([&] {
    st[0] = ring[0]->AllReduce(bufs[0].data(), 3000, DType::kF32, ReduceOp::kSum, Tag(1), Soon());
  });
  st[1] = ring[1]->AllReduce(bufs[1].data(), 3000, DType::kF32, ReduceOp::kSum, Tag(1), Soon());
  other.join();
  EXPECT_LT(SecondsSince(start), 2.0);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(st[r].ok()) << st[r].ToString();
  for (size_t i = 0; i < 3000; ++i) ASSERT_EQ(bufs[1][i], static_cast<float>(2 * i + 1));
  EXPECT_EQ(ring[1]->stats().rejected, 2000u);
  EXPECT_EQ(ring[1]->stats().replies_dropped, 2000u - 64u);
  ring.clear();
}

// Rank 0's sends are never taken: rank 0 has all it needs from rank 1 and
// waits for its own segment's sends to go out before the all-gather, while
// rank 1, given nothing, times out. Rank 0 hears of it through the ring's
// abort (read while it waits), long before its own 60 s deadline, and
// blames itself, as rank 1 does.
TEST(RingFaultTest, ARankWhoseSendsAreNeverTakenHearsTheRingsAbortWhileItWaits) {
  const int n = 2;
  InProcRing rings(n);
  auto& ring = rings.ring;
  NeverLeave never(rings.inproc[0].get(), wire::Route::Kind::kConnection);
  rings.Form({&never});
  const auto start = steady_clock::now();
  const std::vector<Status> st = rings.AllReduceAtOnce(
      20000, [](int r) { return Deadline::After(std::chrono::seconds(r == 0 ? 60 : 1)); });
  EXPECT_LT(SecondsSince(start), 20.0);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kDeadlineExceeded) << "rank " << r << ": " << st[r];
    EXPECT_NE(st[r].message().find("rank 0 stopped contributing"), std::string::npos)
        << "rank " << r << ": " << st[r];
  }
  ring.clear();
}

// A transport whose sends to its right neighbour go at once (a copy) but
// hold the caller's buffer a while longer, as a busy link does: the rank
// waits for its sends while its left neighbour runs ahead into the next
// all-reduce, and what it reads meanwhile is taken in order.
class SlowToRelease : public Forwarding {
 public:
  explicit SlowToRelease(wire::Transport* inner)
      : Forwarding(inner), releaser_([this] { Run(); }) {}
  ~SlowToRelease() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    releaser_.join();
  }
  void Post(const wire::Route& to, wire::Message m, Deadline deadline,
            std::function<void(const Status&)> done) override {
    if (to.kind != wire::Route::Kind::kConnection) {
      inner_->Post(to, std::move(m), deadline, std::move(done));
      return;
    }
    wire::Message copy;
    copy.header = m.header;
    for (const wire::Payload& p : m.payloads)
      copy.payloads.push_back(wire::Payload::Copy(p.data, p.size));
    inner_->Post(to, std::move(copy), deadline, std::move(done));
    std::lock_guard<std::mutex> lock(mu_);
    held_.push_back({steady_clock::now() + std::chrono::milliseconds(60), std::move(m)});
    cv_.notify_all();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !held_.empty(); });
      if (held_.empty()) return;
      const auto until = held_.front().first;
      cv_.wait_until(lock, until, [&] { return stop_; });
      held_.pop_front();  // its payloads let go of the caller's buffer
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<std::pair<steady_clock::time_point, wire::Message>> held_;
  std::thread releaser_;
};

TEST(RingFaultTest, WhatARankReadsWhileItsSendsAreHeldIsTakenInOrder) {
  const int n = 3, kOps = 8;
  const size_t count = 3000;
  InProcRing rings(n);
  auto& ring = rings.ring;
  SlowToRelease slow(rings.inproc[0].get());
  rings.Form({&slow});
  std::vector<Status> st(n);
  std::vector<std::vector<std::vector<float>>> bufs(
      n, std::vector<std::vector<float>>(kOps, std::vector<float>(count)));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (int op = 0; op < kOps && st[r].ok(); ++op) {
        for (size_t i = 0; i < count; ++i) bufs[r][op][i] = IntValue(r + op, i);
        st[r] = ring[r]->AllReduce(bufs[r][op].data(), count, DType::kF32, ReduceOp::kSum,
                                   Tag(static_cast<uint64_t>(op + 1)), Soon());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    for (int op = 0; op < kOps; ++op) {
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += IntValue(q + op, i);
        ASSERT_EQ(bufs[r][op][i], want) << "rank " << r << " op " << op << " element " << i;
      }
    }
  }
  ring.clear();
}

}  // namespace
}  // namespace gradsync::client
