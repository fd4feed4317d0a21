#include "ps/embedding_service.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "wire/message.h"
#include "wire/validate.h"

namespace gradsync::server {
namespace {

using wire::ErrorCode;
using wire::MsgType;

constexpr uint32_t kTable = 7;
constexpr uint32_t kDim = 8;
constexpr uint64_t kJob = 42;
constexpr uint64_t kSeed = 3;
constexpr float kInitScale = 0.5f;
constexpr size_t kBudget = size_t{64} << 20;

EmbeddingServiceOptions Options(PsMode mode, float lr = 0.5f) {
  EmbeddingServiceOptions o;
  o.mode = mode;
  o.table.optimizer = RowOptimizerKind::kSgd;
  o.table.lr = lr;
  o.table.seed = kSeed;
  o.table.init_scale = kInitScale;
  return o;
}

// Rows of `ids`, row i all `value + i` (powers of two keep the math exact).
std::vector<float> Grads(size_t num_ids, float value, uint32_t dim = kDim) {
  std::vector<float> g(num_ids * dim);
  for (size_t i = 0; i < g.size(); ++i) g[i] = value * static_cast<float>(1 + i / dim);
  return g;
}

std::vector<float> InitRows(const std::vector<uint64_t>& ids) {
  std::vector<float> rows(ids.size() * kDim);
  for (size_t i = 0; i < ids.size(); ++i) {
    InitRow(kSeed, kTable, ids[i], kInitScale, rows.data() + i * kDim, kDim);
  }
  return rows;
}

// rows - lr * grads, element by element (one rounding each, as SGD does).
std::vector<float> Stepped(std::vector<float> rows, const std::vector<float>& grads, float lr) {
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = rows[i] - lr * grads[i];
  return rows;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One answer of the service, decoded.
struct Answer {
  std::string to;
  MsgType type = MsgType::Error;
  uint64_t seq = 0;
  uint64_t round = 0;
  uint32_t epoch = 0;
  ErrorCode code = ErrorCode::Unknown;
  std::string error;
  std::vector<float> rows;
};

// A service under test, with the worker side's message builders.
class Harness {
 public:
  Harness(const EmbeddingServiceOptions& options, int32_t num_workers,
          std::vector<std::string> identities)
      : budget_(kBudget),
        service_(options, &budget_, wire::Sender{wire::Role::Server, 0, kJob}, num_workers,
                 identities),
        identities_(std::move(identities)) {}

  EmbeddingService& service() { return service_; }
  void StartEpoch(uint32_t epoch, int32_t num_workers, std::vector<std::string> identities) {
    epoch_ = epoch;
    identities_ = identities;
    service_.StartEpoch(epoch, num_workers, std::move(identities));
  }

  // The fields of a message; tests change the rest.
  wire::EmbeddingFields Fields(uint64_t round) const {
    wire::EmbeddingFields f;
    f.table = kTable;
    f.dim = kDim;
    f.round = round;
    return f;
  }
  // The membership epoch the next messages say they are of (default: the
  // harness's).
  void SendAsEpoch(uint32_t epoch) { send_epoch_ = epoch; }

  // Worker `rank`'s pull, from `identity` ("": the rank's own).
  void Pull(int32_t rank, const std::vector<uint64_t>& ids, wire::EmbeddingFields f, uint64_t seq,
            const std::string& identity = "") {
    f.num_ids = ids.size();
    std::vector<wire::Payload> p;
    p.push_back(wire::Payload::Copy(ids.data(), ids.size() * sizeof(uint64_t)));
    Send(rank, identity,
         wire::MakeEmbedding(Worker(rank), MsgType::EmbeddingPull, f, std::move(p), seq,
                             send_epoch_.value_or(epoch_)));
  }
  void Pull(int32_t rank, const std::vector<uint64_t>& ids, uint64_t round, uint64_t seq) {
    Pull(rank, ids, Fields(round), seq);
  }
  void Push(int32_t rank, const std::vector<uint64_t>& ids, const std::vector<float>& grads,
            wire::EmbeddingFields f, uint64_t seq, const std::string& identity = "") {
    f.num_ids = ids.size();
    std::vector<wire::Payload> p;
    p.push_back(wire::Payload::Copy(ids.data(), ids.size() * sizeof(uint64_t)));
    p.push_back(wire::Payload::Copy(grads.data(), grads.size() * sizeof(float)));
    Send(rank, identity,
         wire::MakeEmbedding(Worker(rank), MsgType::EmbeddingPush, f, std::move(p), seq,
                             send_epoch_.value_or(epoch_)));
  }
  void Push(int32_t rank, const std::vector<uint64_t>& ids, const std::vector<float>& grads,
            uint64_t round, uint64_t seq) {
    Push(rank, ids, grads, Fields(round), seq);
  }

  void SetDead(const std::set<int32_t>& dead) { service_.SetDead(dead, &out_); }

  // The answers since the last call, decoded.
  std::vector<Answer> Take() {
    std::vector<Answer> answers;
    const wire::Policy policy =
        wire::Policy::Accepting({MsgType::EmbeddingRows, MsgType::EmbeddingAck, MsgType::Error});
    for (const Outgoing& o : out_) {
      const wire::Verdict v = wire::Validate(o.message, policy);
      EXPECT_TRUE(v.ok()) << v.detail;
      if (!v.ok()) continue;
      Answer a;
      a.to = o.to.identity;
      a.type = v.header->type();
      a.seq = v.header->seq();
      if (a.type == MsgType::Error) {
        const wire::ErrorBody& e = *v.header->body_as_ErrorBody();
        a.code = e.code();
        a.error = e.message() == nullptr ? "" : e.message()->str();
      } else {
        const wire::EmbeddingBody& b = *v.header->body_as_EmbeddingBody();
        a.round = b.round();
        a.epoch = v.header->epoch();
        if (a.type == MsgType::EmbeddingRows) {
          a.rows.resize(o.message.payloads[0].size / sizeof(float));
          if (!a.rows.empty()) {  // a pull of no rows has an empty frame
            std::memcpy(a.rows.data(), o.message.payloads[0].data, a.rows.size() * sizeof(float));
          }
        }
      }
      answers.push_back(std::move(a));
    }
    out_.clear();
    return answers;
  }

  // The one answer since the last call, which must be of `type` with `seq`.
  Answer TakeOne(MsgType type, uint64_t seq) {
    std::vector<Answer> answers = Take();
    EXPECT_EQ(answers.size(), 1u);
    if (answers.empty()) return Answer();
    EXPECT_EQ(answers[0].type, type) << answers[0].error;
    EXPECT_EQ(answers[0].seq, seq);
    return answers[0];
  }

  // Whether the last message sent changed the service (Handle's answer).
  bool took() const { return took_; }

  // Rows of `ids` as a pull of `round` by worker 0 reads them (answered at once).
  std::vector<float> Read(const std::vector<uint64_t>& ids, uint64_t round) {
    Pull(0, ids, round, 999);
    return TakeOne(MsgType::EmbeddingRows, 999).rows;
  }

 private:
  static wire::Sender Worker(int32_t rank) { return wire::Sender{wire::Role::Worker, rank, kJob}; }

  void Send(int32_t rank, const std::string& identity, wire::Message msg) {
    const wire::Verdict v = wire::Validate(
        msg, wire::Policy::Accepting({MsgType::EmbeddingPull, MsgType::EmbeddingPush}));
    ASSERT_TRUE(v.ok()) << v.detail;
    std::string from = identity;
    if (from.empty()) {
      from = rank >= 0 && static_cast<size_t>(rank) < identities_.size() ? identities_[rank] : "x";
    }
    took_ = service_.Handle(wire::Route::Inbound(from), *v.header, msg, &out_);
  }

  MemoryBudget budget_;
  EmbeddingService service_;
  std::vector<std::string> identities_;
  uint32_t epoch_ = 0;
  std::optional<uint32_t> send_epoch_;
  std::vector<Outgoing> out_;
  bool took_ = false;
};

const std::vector<std::string> kTwo = {"w0", "w1"};
const std::vector<uint64_t> kIds = {1, 2};

TEST(EmbeddingServiceTest, SyncHoldsPullUntilEveryWorkerPushed) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  const std::vector<float> init = h.Read(kIds, 0);
  EXPECT_TRUE(BitEqual(init, InitRows(kIds)));

  h.Pull(0, kIds, 1, 1);
  EXPECT_TRUE(h.Take().empty());
  EXPECT_EQ(h.service().stats().held_pulls, 1u);

  const std::vector<float> g0 = Grads(2, 1.0f), g1 = Grads(2, 2.0f);
  h.Push(0, kIds, g0, 0, 2);
  EXPECT_EQ(h.TakeOne(MsgType::EmbeddingAck, 2).round, 0u);
  EXPECT_EQ(h.service().stats().rounds, 0u);

  h.Push(1, kIds, g1, 0, 3);
  std::vector<Answer> a = h.Take();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].type, MsgType::EmbeddingAck);
  EXPECT_EQ(a[0].seq, 3u);
  EXPECT_EQ(a[0].to, "w1");
  EXPECT_EQ(a[1].type, MsgType::EmbeddingRows);
  EXPECT_EQ(a[1].seq, 1u);
  EXPECT_EQ(a[1].to, "w0");
  EXPECT_EQ(a[1].round, 1u);
  std::vector<float> avg(g0.size());
  for (size_t i = 0; i < avg.size(); ++i) avg[i] = (g0[i] + g1[i]) * 0.5f;
  EXPECT_TRUE(BitEqual(a[1].rows, Stepped(init, avg, 0.5f)));
  EXPECT_EQ(h.service().stats().rounds, 1u);
  EXPECT_EQ(h.service().stats().rows.steps, 1u);
}

// A worker whose ids miss this shard still asks it, for no rows: the answer
// waits for the round before, which keeps the worker's next (empty) push
// within a round of the last closed one.
TEST(EmbeddingServiceTest, SyncHoldsAPullOfNoRowsUntilTheRoundBeforeCloses) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  h.Push(0, {}, {}, 0, 1);
  h.TakeOne(MsgType::EmbeddingAck, 1);
  h.Pull(0, {}, 1, 2);
  EXPECT_TRUE(h.Take().empty());
  h.Push(1, kIds, Grads(2, 1.0f), 0, 3);
  std::vector<Answer> a = h.Take();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[1].type, MsgType::EmbeddingRows);
  EXPECT_EQ(a[1].seq, 2u);
  EXPECT_EQ(a[1].round, 1u);
  EXPECT_TRUE(a[1].rows.empty());
  // Now round 1's push is within a round of the last closed one.
  h.Push(0, {}, {}, 1, 4);
  h.TakeOne(MsgType::EmbeddingAck, 4);
}

// Gradients whose sums round differently in another order.
std::vector<float> Uneven(size_t num_ids, uint32_t seed) {
  std::vector<float> g(num_ids * kDim);
  uint32_t x = seed * 2654435761u + 1;
  for (float& v : g) {
    x = x * 1664525u + 1013904223u;
    // Full mantissas at magnitudes from 1/3 to 30: sums round.
    v = (static_cast<float>(x >> 8) * 0x1p-24f * 2.0f - 1.0f) * float(1 + (x & 31)) / 3.0f;
  }
  return g;
}

TEST(EmbeddingServiceTest, SyncSumsARoundInRankOrderWhateverTheArrival) {
  std::vector<float> rows[2];
  for (int order = 0; order < 2; ++order) {
    // Rows that start near 0 and take the whole step: the sums show.
    EmbeddingServiceOptions o = Options(PsMode::kSync, 1.0f);
    o.table.init_scale = 1e-20f;
    Harness h(o, 2, kTwo);
    const std::vector<uint64_t> ids = {4, 9, 4};  // a duplicate within and across workers
    for (uint64_t round = 0; round < 3; ++round) {
      const int first = (order + static_cast<int>(round)) % 2;
      const int second = 1 - first;
      h.Push(first, ids, Uneven(3, 7 * round + first), round, 10 * round + 1);
      h.Push(second, ids, Uneven(3, 7 * round + second), round, 10 * round + 2);
      h.Take();
    }
    rows[order] = h.Read({4, 9}, 3);
  }
  EXPECT_TRUE(BitEqual(rows[0], rows[1]));
}

TEST(EmbeddingServiceTest, SyncResendOfClosedRoundIsAckedNotApplied) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  h.Push(0, kIds, Grads(2, 1.0f), 0, 1);
  h.Push(1, kIds, Grads(2, 1.0f), 0, 2);
  h.Take();
  const std::vector<float> after = h.Read(kIds, 1);
  EXPECT_TRUE(BitEqual(after, Stepped(InitRows(kIds), Grads(2, 1.0f), 0.5f)));

  h.Push(0, kIds, Grads(2, 1.0f), 0, 3);
  EXPECT_EQ(h.TakeOne(MsgType::EmbeddingAck, 3).round, 0u);
  EXPECT_TRUE(BitEqual(h.Read(kIds, 1), after));
  EXPECT_EQ(h.service().stats().rows.steps, 1u);
  EXPECT_EQ(h.service().stats().rounds, 1u);
}

TEST(EmbeddingServiceTest, SyncDeadWorkerNoLongerHoldsRound) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  h.SetDead({1});
  EXPECT_TRUE(h.Take().empty());
  const std::vector<float> g = Grads(2, 1.0f);
  h.Push(0, kIds, g, 0, 1);
  h.TakeOne(MsgType::EmbeddingAck, 1);
  EXPECT_EQ(h.service().stats().rounds, 1u);
  // Divided by the one worker that pushed, not by the two of the epoch.
  EXPECT_TRUE(BitEqual(h.Read(kIds, 1), Stepped(InitRows(kIds), g, 0.5f)));
}

TEST(EmbeddingServiceTest, SyncSetDeadClosesRoundAndAnswersHeldPull) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  const std::vector<float> g = Grads(2, 2.0f);
  h.Push(0, kIds, g, 0, 1);
  h.Pull(0, kIds, 1, 2);
  h.TakeOne(MsgType::EmbeddingAck, 1);
  h.SetDead({1});
  const Answer a = h.TakeOne(MsgType::EmbeddingRows, 2);
  EXPECT_TRUE(BitEqual(a.rows, Stepped(InitRows(kIds), g, 0.5f)));
}

TEST(EmbeddingServiceTest, AsyncAppliesEachPushAtOnce) {
  Harness h(Options(PsMode::kAsync), 2, kTwo);
  const std::vector<float> g0 = Grads(2, 1.0f), g1 = Grads(2, 0.25f);
  h.Push(0, kIds, g0, 0, 1);
  h.TakeOne(MsgType::EmbeddingAck, 1);
  const std::vector<float> once = Stepped(InitRows(kIds), g0, 0.5f);
  EXPECT_TRUE(BitEqual(h.Read(kIds, 5), once));
  h.Push(1, kIds, g1, 3, 2);
  h.TakeOne(MsgType::EmbeddingAck, 2);
  EXPECT_TRUE(BitEqual(h.Read(kIds, 0), Stepped(once, g1, 0.5f)));
  EXPECT_EQ(h.service().stats().rows.steps, 2u);
  EXPECT_EQ(h.service().stats().held_pulls, 0u);
}

TEST(EmbeddingServiceTest, SspPullWaitsForRoundBeyondStaleness) {
  EmbeddingServiceOptions o = Options(PsMode::kSsp);
  o.staleness = 1;
  Harness h(o, 2, kTwo);
  h.Pull(0, kIds, 1, 1);  // needs round -1: answered at once
  EXPECT_TRUE(BitEqual(h.TakeOne(MsgType::EmbeddingRows, 1).rows, InitRows(kIds)));

  h.Pull(0, kIds, 2, 2);  // needs round 0 of both workers
  EXPECT_TRUE(h.Take().empty());
  const std::vector<float> g0 = Grads(2, 1.0f), g1 = Grads(2, 0.5f);
  h.Push(0, kIds, g0, 0, 3);
  h.TakeOne(MsgType::EmbeddingAck, 3);  // worker 1 has not pushed round 0
  h.Push(1, kIds, g1, 0, 4);
  std::vector<Answer> a = h.Take();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].type, MsgType::EmbeddingAck);
  EXPECT_EQ(a[0].seq, 4u);
  EXPECT_EQ(a[1].type, MsgType::EmbeddingRows);
  EXPECT_EQ(a[1].seq, 2u);
  EXPECT_TRUE(BitEqual(a[1].rows, Stepped(Stepped(InitRows(kIds), g0, 0.5f), g1, 0.5f)));
  EXPECT_EQ(h.service().stats().held_pulls, 1u);
}

// Expects the one answer to be an Error of `code` for `seq`.
void ExpectRefused(Harness& h, uint64_t seq, ErrorCode code, const std::string& says = "") {
  const Answer a = h.TakeOne(MsgType::Error, seq);
  EXPECT_EQ(a.code, code) << a.error;
  if (!says.empty()) {
    EXPECT_NE(a.error.find(says), std::string::npos) << a.error;
  }
}

TEST(EmbeddingServiceTest, RefusesSendersThatAreNotTheWorker) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  h.Push(2, kIds, Grads(2, 1.0f), h.Fields(0), 1, "w2");  // no rank 2 in this epoch
  ExpectRefused(h, 1, ErrorCode::BadSender);
  h.Push(1, kIds, Grads(2, 1.0f), h.Fields(0), 2, "w0");  // rank 1 from worker 0's identity
  ExpectRefused(h, 2, ErrorCode::BadSender);
  h.Pull(0, kIds, h.Fields(0), 3, "intruder");
  ExpectRefused(h, 3, ErrorCode::BadSender);
  EXPECT_EQ(h.service().stats().refused, 3u);
  EXPECT_EQ(h.service().stats().tables, 0u);
}

TEST(EmbeddingServiceTest, RefusesBadWidths) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  wire::EmbeddingFields zero = h.Fields(0);
  zero.dim = 0;
  h.Pull(0, kIds, zero, 1);
  ExpectRefused(h, 1, ErrorCode::SizeMismatch);
  EXPECT_EQ(h.service().stats().tables, 0u);

  h.Read(kIds, 0);  // makes the table, of 8 elements
  wire::EmbeddingFields narrow = h.Fields(0);
  narrow.dim = 4;
  h.Push(0, kIds, Grads(2, 1.0f, 4), narrow, 2);
  ExpectRefused(h, 2, ErrorCode::Mismatch, "rows of 4 elements, the table's are 8");
  EXPECT_EQ(h.service().stats().refused, 2u);
  EXPECT_EQ(h.service().stats().rows.pushed, 0u);
}

TEST(EmbeddingServiceTest, RefusesOtherEpochs) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  h.StartEpoch(1, 2, kTwo);
  h.SendAsEpoch(0);
  h.Push(0, kIds, Grads(2, 1.0f), 0, 1);
  ExpectRefused(h, 1, ErrorCode::BadSequence);
  h.SendAsEpoch(2);
  h.Pull(0, kIds, 0, 2);
  ExpectRefused(h, 2, ErrorCode::Busy);
  EXPECT_EQ(h.service().stats().refused, 2u);
}

TEST(EmbeddingServiceTest, RefusesSyncPushTooFarAhead) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  h.Push(0, kIds, Grads(2, 1.0f), 1, 1);  // one ahead of round 0: taken
  h.TakeOne(MsgType::EmbeddingAck, 1);
  h.Push(0, kIds, Grads(2, 1.0f), 2, 2);
  ExpectRefused(h, 2, ErrorCode::BadSequence);
  EXPECT_EQ(h.service().stats().refused, 1u);
}

TEST(EmbeddingServiceTest, RefusesPushPastRoundBytes) {
  EmbeddingServiceOptions o = Options(PsMode::kSync);
  o.max_round_bytes = 100;  // a push of an id of 8 elements holds 40 bytes
  Harness h(o, 2, kTwo);
  h.Push(0, kIds, Grads(2, 1.0f), 0, 1);  // 80 bytes
  h.TakeOne(MsgType::EmbeddingAck, 1);
  h.Push(1, {3}, Grads(1, 1.0f), 0, 2);  // 120 bytes in all
  ExpectRefused(h, 2, ErrorCode::Oversized);
  EXPECT_EQ(h.service().stats().refused, 1u);
  EXPECT_EQ(h.service().stats().rounds, 0u);
  // A resend of the part taken (its ack lost) is acknowledged again, full
  // as the rounds are.
  h.Push(0, kIds, Grads(2, 1.0f), 0, 3);
  h.TakeOne(MsgType::EmbeddingAck, 3);
  EXPECT_EQ(h.service().stats().refused, 1u);
}

TEST(EmbeddingServiceTest, StartEpochDropsOpenRounds) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  h.Push(0, kIds, Grads(2, 4.0f), 0, 1);
  h.Pull(0, kIds, 1, 2);
  h.TakeOne(MsgType::EmbeddingAck, 1);

  const std::vector<std::string> next = {"w0e1", "w1e1"};
  h.StartEpoch(1, 2, next);
  const std::vector<float> g0 = Grads(2, 1.0f), g1 = Grads(2, 2.0f);
  h.Push(0, kIds, g0, 0, 3);
  h.TakeOne(MsgType::EmbeddingAck, 3);
  EXPECT_EQ(h.service().stats().rounds, 0u);  // worker 0's push of epoch 0 is gone
  h.Push(1, kIds, g1, 0, 4);
  std::vector<Answer> a = h.Take();  // the ack, not the dropped pull's rows
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].type, MsgType::EmbeddingAck);
  EXPECT_EQ(a[0].seq, 4u);
  EXPECT_EQ(a[0].epoch, 1u);
  EXPECT_EQ(h.service().stats().rounds, 1u);

  std::vector<float> avg(g0.size());
  for (size_t i = 0; i < avg.size(); ++i) avg[i] = (g0[i] + g1[i]) * 0.5f;
  EXPECT_TRUE(BitEqual(h.Read(kIds, 1), Stepped(InitRows(kIds), avg, 0.5f)));
}

TEST(EmbeddingServiceTest, PartsCloseRoundOnlyWhenAllTaken) {
  Harness h(Options(PsMode::kSync), 1, {"w0"});
  wire::EmbeddingFields part0 = h.Fields(0);
  part0.parts = 2;
  wire::EmbeddingFields part1 = part0;
  part1.part = 1;
  const std::vector<float> g1 = Grads(1, 1.0f), g2 = Grads(1, 2.0f);
  h.Push(0, {1}, g1, part0, 1);
  h.TakeOne(MsgType::EmbeddingAck, 1);
  h.Pull(0, kIds, 1, 2);
  EXPECT_TRUE(h.Take().empty());
  h.Push(0, {1}, g1, part0, 3);  // a resend of part 0
  h.TakeOne(MsgType::EmbeddingAck, 3);
  EXPECT_EQ(h.service().stats().rounds, 0u);

  h.Push(0, {2}, g2, part1, 4);
  std::vector<Answer> a = h.Take();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].type, MsgType::EmbeddingAck);
  EXPECT_EQ(a[0].seq, 4u);
  EXPECT_EQ(a[1].type, MsgType::EmbeddingRows);
  EXPECT_EQ(a[1].seq, 2u);
  std::vector<float> g = g1;
  g.insert(g.end(), g2.begin(), g2.end());
  EXPECT_TRUE(BitEqual(a[1].rows, Stepped(InitRows(kIds), g, 0.5f)));
  EXPECT_EQ(h.service().stats().rounds, 1u);
  EXPECT_EQ(h.service().stats().rows.pushed, 2u);
}

// Pushes of a 3-worker sync job as the journal would keep them.
struct Journalled {
  int32_t rank;
  uint64_t round;
  std::vector<uint64_t> ids;
  std::vector<float> grads;
  EmbeddingPushRecord Record() const {
    return EmbeddingPushRecord{kTable, 0, kDim,       rank,       round,
                               0,      1, ids.size(), ids.data(), grads.data()};
  }
};

const std::vector<std::string> kThree = {"w0", "w1", "w2"};

EmbeddingServiceOptions AdamOptions(PsMode mode) {
  EmbeddingServiceOptions o = Options(mode, 0.1f);
  o.table.optimizer = RowOptimizerKind::kAdam;
  o.table.eps = 1e-8f;
  o.table.admit_after = 2;
  return o;
}

// Three workers' pushes of rounds [0, rounds): worker w pushes ids w..w+3 and
// 5, its gradients of value round + w.
std::vector<Journalled> Schedule(uint64_t rounds) {
  std::vector<Journalled> pushes;
  for (uint64_t r = 0; r < rounds; ++r) {
    for (int32_t w = 0; w < 3; ++w) {
      std::vector<uint64_t> ids = {static_cast<uint64_t>(w), static_cast<uint64_t>(w) + 3, 5};
      pushes.push_back({w, r, ids, Grads(ids.size(), 0.25f * static_cast<float>(r + w + 1))});
    }
  }
  return pushes;
}

TEST(EmbeddingServiceTest, HandleSaysWhichPushesTheJournalMustKeep) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  h.Pull(0, kIds, 0, 1);
  EXPECT_FALSE(h.took());
  h.Push(0, kIds, Grads(2, 1.0f), 0, 2);
  EXPECT_TRUE(h.took());
  h.Push(0, kIds, Grads(2, 1.0f), 0, 3);  // a resend
  EXPECT_FALSE(h.took());
  h.Push(1, kIds, Grads(2, 1.0f), 5, 4);  // refused: too far ahead
  EXPECT_FALSE(h.took());
  Harness a(Options(PsMode::kAsync), 1, {"w0"});
  a.Push(0, kIds, Grads(2, 1.0f), 0, 1);
  EXPECT_TRUE(a.took());
}

// A service restored from Save, with a round open, goes on as the saved one.
TEST(EmbeddingServiceTest, ARestoredServiceClosesTheOpenRoundAsTheSavedOne) {
  Harness a(AdamOptions(PsMode::kSync), 3, kThree), b(AdamOptions(PsMode::kSync), 3, kThree);
  const std::vector<Journalled> pushes = Schedule(4);
  // Rounds 0 and 1, and round 2 of workers 0 and 1 only.
  for (size_t i = 0; i < 8; ++i) {
    a.Push(pushes[i].rank, pushes[i].ids, pushes[i].grads, pushes[i].round, i + 1);
  }
  a.Take();
  const std::vector<EmbeddingPartState> saved = a.service().Save();
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].closed, 2u);
  ASSERT_EQ(saved[0].open.size(), 1u);
  EXPECT_EQ(saved[0].open[0].pushed, (std::set<int32_t>{0, 1}));
  ASSERT_TRUE(b.service().Restore(saved[0]).ok());
  EXPECT_NE(b.service().Restore(saved[0]).message().find("restored twice"), std::string::npos);
  // Worker 1's resend of round 2 is a duplicate in the copy too.
  b.Push(1, pushes[7].ids, pushes[7].grads, 2, 50);
  EXPECT_FALSE(b.took());
  for (size_t i = 8; i < pushes.size(); ++i) {
    a.Push(pushes[i].rank, pushes[i].ids, pushes[i].grads, pushes[i].round, i + 1);
    b.Push(pushes[i].rank, pushes[i].ids, pushes[i].grads, pushes[i].round, i + 1);
  }
  a.Take();
  b.Take();
  const std::vector<uint64_t> all = {0, 1, 2, 3, 4, 5, 6};
  EXPECT_TRUE(BitEqual(b.Read(all, 4), a.Read(all, 4)));
  EXPECT_EQ(b.service().stats().rows.steps, a.service().stats().rows.steps);
  EXPECT_EQ(b.service().stats().rows.rows, a.service().stats().rows.rows);
}

TEST(EmbeddingServiceTest, ARestoreOfAnotherOptimizerOrRankIsRefusedNamingIt) {
  Harness a(AdamOptions(PsMode::kSync), 3, kThree);
  a.Push(2, kIds, Grads(2, 1.0f), 0, 1);
  std::vector<EmbeddingPartState> saved = a.service().Save();
  ASSERT_EQ(saved.size(), 1u);
  Harness sgd(Options(PsMode::kSync), 3, kThree);
  EXPECT_NE(sgd.service().Restore(saved[0]).message().find(
                "holds embedding_optimizer=adam state, this shard runs sgd"),
            std::string::npos)
      << sgd.service().Restore(saved[0]);
  Harness two(AdamOptions(PsMode::kSync), 2, kTwo);
  EXPECT_NE(two.service().Restore(saved[0]).message().find("rank 2"), std::string::npos);
  EXPECT_EQ(two.service().stats().tables, 0u);
}

// Replaying the journal of a run gives its rows; replaying a push the
// state holds already changes nothing, in every mode.
TEST(EmbeddingServiceTest, AReplayedJournalGivesTheRowsOnceWhateverIsReplayedTwice) {
  for (PsMode mode : {PsMode::kSync, PsMode::kAsync, PsMode::kSsp}) {
    SCOPED_TRACE(PsModeName(mode));
    EmbeddingServiceOptions o = AdamOptions(mode);
    o.staleness = 1;
    Harness live(o, 3, kThree), replayed(o, 3, kThree);
    const std::vector<Journalled> pushes = Schedule(5);
    for (size_t i = 0; i < pushes.size(); ++i) {
      live.Push(pushes[i].rank, pushes[i].ids, pushes[i].grads, pushes[i].round, i + 1);
      ASSERT_TRUE(live.took());
    }
    live.Take();
    // A checkpoint after the first 7 pushes, then the journal from push 5:
    // pushes 5 and 6 are in both.
    for (size_t i = 0; i < 7; ++i) ASSERT_TRUE(replayed.service().Replay(pushes[i].Record()).ok());
    const std::vector<EmbeddingPartState> saved = replayed.service().Save();
    Harness restored(o, 3, kThree);
    ASSERT_TRUE(restored.service().Restore(saved[0]).ok());
    for (size_t i = 5; i < pushes.size(); ++i) {
      ASSERT_TRUE(restored.service().Replay(pushes[i].Record()).ok());
    }
    const std::vector<uint64_t> all = {0, 1, 2, 3, 4, 5, 6};
    EXPECT_TRUE(BitEqual(restored.Read(all, 5), live.Read(all, 5)));
    EXPECT_EQ(restored.service().stats().rows.steps, live.service().stats().rows.steps);
  }
}

TEST(EmbeddingServiceTest, AReplayThisServiceCouldNotHaveTakenIsRefused) {
  Harness h(Options(PsMode::kSync), 2, kTwo);
  const std::vector<uint64_t> ids = {1};
  const std::vector<float> g(kDim, 1.0f);
  EmbeddingPushRecord r{kTable, 0, kDim, 2, 0, 0, 1, 1, ids.data(), g.data()};
  EXPECT_NE(h.service().Replay(r).message().find("no worker of 2"), std::string::npos);
  r.rank = 0;
  r.round = 9;
  EXPECT_NE(h.service().Replay(r).message().find("ahead of the last closed one"),
            std::string::npos);
  r.round = 0;
  r.dim = 4;
  EXPECT_NE(h.service().Replay(r).message().find("rows of 4 elements, the table's are 8"),
            std::string::npos);
  r.table = kTable + 1;
  r.dim = 0;
  EXPECT_NE(h.service().Replay(r).message().find("a row width of 0"), std::string::npos);
}

TEST(EmbeddingServiceTest, NonFiniteRowRefusedRestApplied) {
  Harness h(Options(PsMode::kSync), 1, {"w0"});
  const std::vector<uint64_t> ids = {1, 2, 3};
  std::vector<float> g = Grads(3, 1.0f);
  g[kDim + 3] = std::numeric_limits<float>::quiet_NaN();  // id 2's row
  h.Push(0, ids, g, 0, 1);
  h.TakeOne(MsgType::EmbeddingAck, 1);
  EXPECT_EQ(h.service().stats().rows.refused_nonfinite, 1u);
  EXPECT_EQ(h.service().stats().rows.pushed, 2u);

  std::vector<float> want = Stepped(InitRows(ids), g, 0.5f);
  const std::vector<float> init = InitRows({2});
  std::copy(init.begin(), init.end(), want.begin() + kDim);
  EXPECT_TRUE(BitEqual(h.Read(ids, 1), want));
}

}  // namespace
}  // namespace gradsync::server
