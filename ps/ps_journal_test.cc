#include "ps/ps_journal.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "gtest/gtest.h"
#include "ps/ps_checkpoint.h"

namespace gradsync::server {
namespace {

constexpr int32_t kRank = 1;
constexpr uint64_t kJob = 99;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

JournalRecord Push(uint32_t bucket, int32_t worker, uint64_t round, std::vector<float> values) {
  JournalRecord r;
  r.bucket = bucket;
  r.partition = bucket % 3;
  r.worker = worker;
  r.round = round;
  r.version = round - 1;
  r.num_elements = values.size();
  // Two frames, as a push may arrive in.
  const size_t half = values.size() / 2 * sizeof(float);
  auto owner = std::make_shared<std::vector<float>>(std::move(values));
  const auto* bytes = reinterpret_cast<const uint8_t*>(owner->data());
  r.payloads.push_back(wire::Payload::Borrow(bytes, half, owner));
  r.payloads.push_back(wire::Payload::Borrow(bytes + half, owner->size() * 4 - half, owner));
  return r;
}

JournalRecord Dead(std::set<int32_t> dead) {
  JournalRecord r;
  r.kind = JournalRecord::Kind::kDead;
  r.thread = 1;
  r.threads = 2;
  r.dead = std::move(dead);
  return r;
}

// An answer that names its step, so the order of sends can be checked.
Outgoing Answer(uint64_t step) {
  return Outgoing{wire::Route::Inbound("w"),
                  wire::MakeData(wire::Sender{wire::Role::Server, kRank, kJob}, wire::MsgType::Ack,
                                 wire::DataFields{}, {}, step)};
}

struct Sent {
  std::mutex mu;
  std::vector<uint64_t> steps;
};

std::unique_ptr<Journal> OpenJournal(const std::string& dir, uint64_t segment, Sent* sent) {
  auto j = Journal::Open(dir, kRank, kJob, segment, [sent](const wire::Route&, wire::Message m) {
    std::lock_guard<std::mutex> lock(sent->mu);
    sent->steps.push_back(m.header_view()->step());
  });
  EXPECT_TRUE(j.ok()) << j.status();
  return std::move(*j);
}

StatusOr<std::vector<JournalRecord>> ReadBack(const std::string& dir, uint64_t from,
                                              JournalReplay* info = nullptr) {
  std::vector<JournalRecord> out;
  auto replay = ReplayJournal(dir, kRank, kJob, from, [&](const JournalRecord& r) {
    out.push_back(r);
    return OkStatus();
  });
  if (!replay.ok()) return replay.status();
  if (info) *info = *replay;
  return out;
}

void ExpectPush(const JournalRecord& r, uint32_t bucket, int32_t worker, uint64_t round,
                const std::vector<float>& values) {
  EXPECT_EQ(r.kind, JournalRecord::Kind::kPush);
  EXPECT_EQ(r.bucket, bucket);
  EXPECT_EQ(r.partition, bucket % 3);
  EXPECT_EQ(r.worker, worker);
  EXPECT_EQ(r.round, round);
  EXPECT_EQ(r.version, round - 1);
  EXPECT_EQ(r.values, values);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(PsJournalTest, RecordsComeBackInOrderAndAnswersLeaveInOrder) {
  const std::string dir = TempDir("order");
  Sent sent;
  auto j = OpenJournal(dir, 0, &sent);
  for (uint64_t i = 1; i <= 50; ++i) {
    std::vector<Outgoing> out;
    out.push_back(Answer(i));
    std::optional<JournalRecord> rec;
    if (i % 5 != 0)
      rec = Push(static_cast<uint32_t>(i), static_cast<int32_t>(i % 4), i,
                 {float(i), -float(i), 0.5f * float(i)});
    if (i == 25) rec = Dead({2, 3});
    j->Append(std::move(rec), std::move(out));
  }
  j->Shutdown();
  ASSERT_TRUE(j->health().ok());
  ASSERT_EQ(sent.steps.size(), 50u);
  for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(sent.steps[i], i + 1);
  auto back = ReadBack(dir, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 41u);
  size_t at = 0;
  for (uint64_t i = 1; i <= 50; ++i) {
    if (i == 25) {
      EXPECT_EQ((*back)[at].kind, JournalRecord::Kind::kDead);
      EXPECT_EQ((*back)[at].thread, 1u);
      EXPECT_EQ((*back)[at].threads, 2u);
      EXPECT_EQ((*back)[at++].dead, (std::set<int32_t>{2, 3}));
    } else if (i % 5 != 0) {
      ExpectPush((*back)[at++], static_cast<uint32_t>(i), static_cast<int32_t>(i % 4), i,
                 {float(i), -float(i), 0.5f * float(i)});
    }
  }
}

TEST(PsJournalTest, EmbeddingPushesComeBackWithTheirIdsAndRows) {
  const std::string dir = TempDir("embedding");
  Sent sent;
  auto j = OpenJournal(dir, 0, &sent);
  const std::vector<uint64_t> ids = {7, 1ull << 60, 7};
  const std::vector<float> grads = {1, 2, 3, 4, 5, 6};  // rows of 2
  JournalRecord r;
  r.kind = JournalRecord::Kind::kEmbeddingPush;
  r.table = 9;
  r.partition = 2;
  r.dim = 2;
  r.worker = 3;
  r.round = 41;
  r.part = 1;
  r.parts = 2;
  r.num_elements = ids.size();
  r.payloads.push_back(wire::Payload::Copy(ids.data(), ids.size() * sizeof(uint64_t)));
  r.payloads.push_back(wire::Payload::Copy(grads.data(), grads.size() * sizeof(float)));
  JournalRecord empty = r;
  empty.num_elements = 0;
  empty.payloads.clear();
  j->Append(std::move(r), {});
  j->Append(std::move(empty), {});
  j->Append(Push(1, 0, 1, {1.5f}), {});
  j->Shutdown();
  ASSERT_TRUE(j->health().ok());
  auto back = ReadBack(dir, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 3u);
  const JournalRecord& e = (*back)[0];
  EXPECT_EQ(e.kind, JournalRecord::Kind::kEmbeddingPush);
  EXPECT_EQ(e.table, 9u);
  EXPECT_EQ(e.partition, 2u);
  EXPECT_EQ(e.dim, 2u);
  EXPECT_EQ(e.worker, 3);
  EXPECT_EQ(e.round, 41u);
  EXPECT_EQ(e.part, 1u);
  EXPECT_EQ(e.parts, 2u);
  EXPECT_EQ(e.ids, ids);
  EXPECT_EQ(e.values, grads);
  EXPECT_TRUE((*back)[1].ids.empty());
  EXPECT_TRUE((*back)[1].values.empty());
  ExpectPush((*back)[2], 1, 0, 1, {1.5f});

  // A record whose count of ids claims more than its bytes is damage, not
  // an allocation.
  const std::string path = JournalSegmentPath(dir, kRank, 0);
  std::string bytes = Slurp(path);
  const size_t count_at = 40 + 8 + 1 + 4 * 3 + 4 + 8 + 4 + 4;  // header, length+CRC, kind, fields
  for (int i = 0; i < 8; ++i) bytes[count_at + i] = static_cast<char>(i == 7 ? 0x7f : 0xff);
  uint32_t len = 0;
  for (int i = 0; i < 4; ++i) len |= uint32_t{static_cast<uint8_t>(bytes[40 + i])} << (8 * i);
  const uint32_t crc = Crc32(0, bytes.data() + 48, len);  // a good CRC over the bad count
  for (int i = 0; i < 4; ++i) bytes[44 + i] = static_cast<char>(crc >> (8 * i));
  Spit(path, bytes);
  auto damaged = ReadBack(dir, 0);
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().code(), StatusCode::kDataLoss) << damaged.status();
  EXPECT_NE(damaged.status().message().find("does not parse"), std::string::npos)
      << damaged.status();
}

TEST(PsJournalTest, RotateStartsASegmentAndDropBeforeDeletesTheOldOnes) {
  const std::string dir = TempDir("rotate");
  Sent sent;
  auto j = OpenJournal(dir, 7, &sent);
  j->Append(Push(1, 0, 1, {1}), {});
  auto next = j->Rotate();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 8u);
  j->Append(Push(2, 1, 2, {2}), {});
  j->Append(Push(3, 2, 3, {3}), {});
  auto segments = ListJournalSegments(dir, kRank);
  ASSERT_TRUE(segments.ok());
  EXPECT_EQ(*segments, (std::vector<uint64_t>{7, 8}));
  ASSERT_TRUE(j->DropBefore(8).ok());
  j->Shutdown();
  EXPECT_EQ(*ListJournalSegments(dir, kRank), (std::vector<uint64_t>{8}));
  auto back = ReadBack(dir, 8);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  ExpectPush((*back)[0], 2, 1, 2, {2});
  ExpectPush((*back)[1], 3, 2, 3, {3});
  EXPECT_EQ(ReadBack(dir, 7).status().code(), StatusCode::kDataLoss);  // segment 7 is gone
  EXPECT_EQ(JournalSegmentPath("/d", 2, 5), "/d/shard-2.log.00000000000000000005");
}

TEST(PsJournalTest, ALastRecordCutShortAnywhereIsATornTailAndTheRestSurvives) {
  const std::string dir = TempDir("torn");
  Sent sent;
  auto j = OpenJournal(dir, 0, &sent);
  j->Append(Push(1, 0, 1, {1, 2, 3, 4}), {});
  j->Append(Push(2, 1, 1, {5, 6, 7, 8}), {});
  j->Shutdown();
  const std::string path = JournalSegmentPath(dir, kRank, 0);
  const std::string whole = Slurp(path);
  const size_t last = 8 + 37 + 16;  // one record of four floats
  for (size_t cut = whole.size() - last; cut < whole.size(); ++cut) {
    Spit(path, whole.substr(0, cut));
    JournalReplay info;
    auto back = ReadBack(dir, 0, &info);
    ASSERT_TRUE(back.ok()) << "cut at " << cut << ": " << back.status();
    ASSERT_EQ(back->size(), 1u) << "cut at " << cut;
    ExpectPush((*back)[0], 1, 0, 1, {1, 2, 3, 4});
    EXPECT_EQ(info.torn_tail, cut != whole.size() - last);
  }
  std::string zeros = whole;
  std::fill(zeros.end() - static_cast<std::ptrdiff_t>(last), zeros.end(), '\0');
  Spit(path, zeros);
  auto back = ReadBack(dir, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->size(), 1u);
}

TEST(PsJournalTest, DamageBeforeTheEndIsDataLossAndNothingIsApplied) {
  const std::string dir = TempDir("damage");
  Sent sent;
  auto j = OpenJournal(dir, 0, &sent);
  j->Append(Push(1, 0, 1, {1, 2}), {});
  j->Append(Push(2, 0, 2, {3, 4}), {});
  ASSERT_TRUE(j->Rotate().ok());
  j->Append(Push(3, 0, 3, {5, 6}), {});
  j->Shutdown();
  const std::string first = JournalSegmentPath(dir, kRank, 0);
  const std::string whole = Slurp(first);
  int applied = 0;
  auto count = [&](const JournalRecord&) {
    ++applied;
    return OkStatus();
  };
  // A flipped bit in the first record of the first segment, and one in the
  // last record of a segment that is not the last.
  for (size_t at : {size_t{40 + 8 + 40}, whole.size() - 1}) {
    std::string bad = whole;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    Spit(first, bad);
    auto r = ReplayJournal(dir, kRank, kJob, 0, count);
    ASSERT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find(first + " is damaged at byte"), std::string::npos)
        << r.status();
  }
  EXPECT_EQ(applied, 0);
  Spit(first, whole);
  auto other_job = ReplayJournal(dir, kRank, kJob + 1, 0, count);
  EXPECT_EQ(other_job.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(other_job.status().message().find("in job 100"), std::string::npos)
      << other_job.status();
  EXPECT_EQ(applied, 0);
  auto ok = ReplayJournal(dir, kRank, kJob, 0, count);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(applied, 3);
  EXPECT_EQ(ok->segments, 2u);
}

TEST(PsJournalTest, SegmentsAreTheOwnersOnly) {
  const std::string dir = TempDir("private_journal");
  Sent sent;
  auto j = OpenJournal(dir, 0, &sent);
  ASSERT_NE(j, nullptr);
  j->Shutdown();
  struct stat st;
  ASSERT_EQ(::lstat(JournalSegmentPath(dir, kRank, 0).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST(PsJournalTest, AnUnwritableDirectoryFailsOpenNamingTheFile) {
  auto j =
      Journal::Open("/nonexistent-dir", kRank, kJob, 0, [](const wire::Route&, wire::Message) {});
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("/nonexistent-dir/shard-1.log."), std::string::npos)
      << j.status();
}

}  // namespace
}  // namespace gradsync::server
