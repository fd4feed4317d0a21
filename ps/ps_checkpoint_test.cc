#include "ps/ps_checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "gtest/gtest.h"

namespace gradsync::server {
namespace {

constexpr int32_t kWorkers = 4;

class StateMaker {
 public:
  explicit StateMaker(uint32_t seed) : rng_(seed) {}

  ShardState Make(int keys) {
    ShardState st;
    st.job_id = rng_() | 1;
    st.rank = Int(0, 7);
    st.mode = static_cast<PsMode>(Int(0, 2));
    st.optimizer = static_cast<OptimizerKind>(Int(0, 3));
    st.num_workers = kWorkers;
    st.journal_start = rng_() % 1000;
    st.dead.resize(Int(1, 3));
    for (auto& d : st.dead) {
      if (Int(0, 1)) d.insert(Int(0, kWorkers - 1));
    }
    for (int i = 0; i < keys; ++i) st.keys[{rng_() % 50, rng_() % 8}] = Key();
    for (int i = 0, parts = Int(0, 2); i < parts; ++i) st.embeddings.push_back(Embedding());
    return st;
  }

  // An embedding table partition; with `sketch`, its admission counters.
  EmbeddingPartState Embedding(bool sketch = false) {
    EmbeddingPartState e;
    e.table = rng_() % 9;
    e.partition = rng_() % 4;
    e.dim = Int(1, 6);
    e.optimizer = static_cast<RowOptimizerKind>(Int(0, 2));
    EmbeddingRowsState& rows = e.rows;
    rows.clock = rng_() % 1000;
    rows.stats.pulled = rng_() % 100;
    rows.stats.steps = rng_() % 100;
    rows.stats.evicted_memory = rng_() % 100;
    for (int i = 0, n = Int(0, 5); i < n; ++i) {
      rows.ids.push_back(rng_());
      rows.touched.push_back(rng_() % 1000);
    }
    rows.slots = Floats(rows.ids.size() * FloatsPerRow(e.optimizer, e.dim));
    if (sketch) {
      rows.sketch.resize(SketchCounters());
      for (uint8_t& c : rows.sketch) c = static_cast<uint8_t>(rng_());
    }
    e.closed = rng_() % 50;
    for (int r = 0, rounds = Int(0, 2); r < rounds; ++r) {
      EmbeddingPartState::OpenRound o;
      o.round = e.closed + static_cast<uint64_t>(r);
      if (Int(0, 1)) o.pushed.insert(Int(0, kWorkers - 1));
      for (int k = 0, parts = Int(0, 3); k < parts; ++k) {
        EmbeddingPartState::Part p;
        p.rank = Int(0, kWorkers - 1);
        p.part = static_cast<uint32_t>(k);
        for (int i = 0, n = Int(0, 3); i < n; ++i) p.ids.push_back(rng_());
        p.grads = Floats(p.ids.size() * e.dim);
        o.parts.push_back(std::move(p));
      }
      e.open.push_back(std::move(o));
    }
    if (Int(0, 1)) e.applied[Int(0, kWorkers - 1)] = {Int(-1, 40), rng_() % 3};
    return e;
  }

 private:
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  std::vector<float> Floats(size_t n) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng_);
    return v;
  }
  // Empty or of n elements.
  std::vector<float> Maybe(size_t n) { return Int(0, 1) ? Floats(n) : std::vector<float>(); }
  Snapshot Snap(size_t n) {
    Snapshot s;
    s.version = rng_() % 100;
    if (Int(0, 1)) s.values = std::make_shared<const std::vector<float>>(Floats(n));
    return s;
  }

  KeyState Key() {
    KeyState k;
    k.num_elements = Int(0, 3) == 0 ? 0 : Int(1, 40);
    const size_t n = k.num_elements;
    k.initialised = n > 0 && Int(0, 1);
    k.params = k.initialised ? Floats(n) : Maybe(n);
    k.slots.velocity = Maybe(n);
    k.slots.m = Maybe(n);
    k.slots.v = Maybe(n);
    k.slots.steps = rng_() % 500;
    k.version = rng_() % 500;
    k.closed = Int(0, 30);
    if (n == 0) return k;
    for (int r = 0, rounds = Int(0, 3); r < rounds; ++r) {
      auto& round = k.open[k.closed + 1 + Int(0, 5)];
      for (int w = 0; w < kWorkers; ++w) {
        if (Int(0, 1)) round[w] = Contribution{Floats(n), rng_() % 100};
      }
    }
    for (int r = 0, kept = Int(0, 4); r < kept && r <= static_cast<int>(k.closed); ++r) {
      k.results[k.closed - r] = Snap(n);
    }
    k.latest = Snap(n);
    for (int w = 0; w < kWorkers; ++w) {
      if (!Int(0, 2)) continue;
      TakenRounds& t = k.taken[w];
      t.floor = Int(0, 20);
      for (int a = 0, above = Int(0, 3); a < above; ++a) t.above.insert(t.floor + 2 + Int(0, 9));
    }
    return k;
  }

  std::mt19937 rng_;
};

CheckpointExpect ExpectOf(const ShardState& st) {
  return CheckpointExpect{st.job_id, st.rank, st.mode, st.optimizer, st.num_workers};
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void ExpectSnapEq(const Snapshot& a, const Snapshot& b) {
  EXPECT_EQ(a.version, b.version);
  ASSERT_EQ(a.values == nullptr, b.values == nullptr);
  if (a.values) {
    EXPECT_TRUE(SameBits(*a.values, *b.values));
  }
}

void ExpectKeyEq(const KeyState& a, const KeyState& b) {
  EXPECT_EQ(a.num_elements, b.num_elements);
  EXPECT_EQ(a.initialised, b.initialised);
  EXPECT_TRUE(SameBits(a.params, b.params));
  EXPECT_TRUE(SameBits(a.slots.velocity, b.slots.velocity));
  EXPECT_TRUE(SameBits(a.slots.m, b.slots.m));
  EXPECT_TRUE(SameBits(a.slots.v, b.slots.v));
  EXPECT_EQ(a.slots.steps, b.slots.steps);
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.closed, b.closed);
  ASSERT_EQ(a.open.size(), b.open.size());
  for (auto ia = a.open.begin(), ib = b.open.begin(); ia != a.open.end(); ++ia, ++ib) {
    EXPECT_EQ(ia->first, ib->first);
    ASSERT_EQ(ia->second.size(), ib->second.size());
    for (const auto& [w, c] : ia->second) {
      ASSERT_TRUE(ib->second.count(w));
      EXPECT_EQ(c.version, ib->second.at(w).version);
      EXPECT_TRUE(SameBits(c.grad, ib->second.at(w).grad));
    }
  }
  ASSERT_EQ(a.results.size(), b.results.size());
  for (const auto& [round, snap] : a.results) {
    ASSERT_TRUE(b.results.count(round));
    ExpectSnapEq(snap, b.results.at(round));
  }
  ExpectSnapEq(a.latest, b.latest);
  ASSERT_EQ(a.taken.size(), b.taken.size());
  for (const auto& [w, t] : a.taken) {
    ASSERT_TRUE(b.taken.count(w));
    EXPECT_EQ(t.floor, b.taken.at(w).floor);
    EXPECT_EQ(t.above, b.taken.at(w).above);
  }
}

void ExpectEmbeddingEq(const EmbeddingPartState& a, const EmbeddingPartState& b) {
  EXPECT_EQ(a.table, b.table);
  EXPECT_EQ(a.partition, b.partition);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.rows.clock, b.rows.clock);
  EXPECT_EQ(a.rows.stats.pulled, b.rows.stats.pulled);
  EXPECT_EQ(a.rows.stats.steps, b.rows.stats.steps);
  EXPECT_EQ(a.rows.stats.evicted_memory, b.rows.stats.evicted_memory);
  EXPECT_EQ(a.rows.ids, b.rows.ids);
  EXPECT_EQ(a.rows.touched, b.rows.touched);
  EXPECT_TRUE(SameBits(a.rows.slots, b.rows.slots));
  EXPECT_EQ(a.rows.sketch, b.rows.sketch);
  EXPECT_EQ(a.closed, b.closed);
  ASSERT_EQ(a.open.size(), b.open.size());
  for (size_t r = 0; r < a.open.size(); ++r) {
    EXPECT_EQ(a.open[r].round, b.open[r].round);
    EXPECT_EQ(a.open[r].pushed, b.open[r].pushed);
    ASSERT_EQ(a.open[r].parts.size(), b.open[r].parts.size());
    for (size_t k = 0; k < a.open[r].parts.size(); ++k) {
      EXPECT_EQ(a.open[r].parts[k].rank, b.open[r].parts[k].rank);
      EXPECT_EQ(a.open[r].parts[k].part, b.open[r].parts[k].part);
      EXPECT_EQ(a.open[r].parts[k].ids, b.open[r].parts[k].ids);
      EXPECT_TRUE(SameBits(a.open[r].parts[k].grads, b.open[r].parts[k].grads));
    }
  }
  EXPECT_EQ(a.applied, b.applied);
}

void ExpectStateEq(const ShardState& a, const ShardState& b) {
  ASSERT_EQ(a.embeddings.size(), b.embeddings.size());
  for (size_t i = 0; i < a.embeddings.size(); ++i) {
    SCOPED_TRACE("embedding partition " + std::to_string(i));
    ExpectEmbeddingEq(a.embeddings[i], b.embeddings[i]);
  }
  EXPECT_EQ(a.job_id, b.job_id);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.mode, b.mode);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.num_workers, b.num_workers);
  EXPECT_EQ(a.journal_start, b.journal_start);
  EXPECT_EQ(a.dead, b.dead);
  ASSERT_EQ(a.keys.size(), b.keys.size());
  for (const auto& [key, k] : a.keys) {
    ASSERT_TRUE(b.keys.count(key)) << key.first << "/" << key.second;
    SCOPED_TRACE("bucket " + std::to_string(key.first) + " partition " +
                 std::to_string(key.second));
    ExpectKeyEq(k, b.keys.at(key));
  }
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

TEST(PsCheckpointTest, RandomStatesRoundTripBitForBit) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const ShardState st = StateMaker(seed).Make(static_cast<int>(seed % 9));
    const std::string bytes = EncodeCheckpoint(st);
    auto back = DecodeCheckpoint(bytes, ExpectOf(st), "mem");
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectStateEq(st, *back);
    EXPECT_EQ(EncodeCheckpoint(*back), bytes);
  }
}

TEST(PsCheckpointTest, EmbeddingTablesWithTheirSketchRoundTrip) {
  StateMaker maker(99);
  ShardState st = maker.Make(2);
  st.embeddings.push_back(maker.Embedding(/*sketch=*/true));
  const std::string bytes = EncodeCheckpoint(st);
  auto back = DecodeCheckpoint(bytes, ExpectOf(st), "mem");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectStateEq(st, *back);
}

// A checkpoint of format 1 (before embedding tables) reads as one without
// tables: the same bytes less the embedding count, renumbered and
// re-checksummed.
TEST(PsCheckpointTest, AFormatOneCheckpointReadsWithNoEmbeddingTables) {
  ShardState st = StateMaker(31).Make(4);
  st.embeddings.clear();
  std::string bytes = EncodeCheckpoint(st);
  bytes.resize(bytes.size() - 4);  // the u32 count of embedding partitions, 0
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<char>(v >> (8 * i));
  };
  const size_t body = bytes.size() - kCheckpointHeaderBytes;
  put32(8, 1);  // the format
  for (int i = 0; i < 8; ++i) bytes[32 + i] = static_cast<char>(uint64_t{body} >> (8 * i));
  put32(40, Crc32(0, bytes.data() + kCheckpointHeaderBytes, body));
  put32(44, Crc32(0, bytes.data(), kCheckpointHeaderBytes - 4));
  auto back = DecodeCheckpoint(bytes, ExpectOf(st), "old");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectStateEq(st, *back);
  put32(8, 9);
  put32(44, Crc32(0, bytes.data(), kCheckpointHeaderBytes - 4));
  auto newer = DecodeCheckpoint(bytes, ExpectOf(st), "new");
  EXPECT_NE(newer.status().message().find("format version 9, this build reads 1 to 2"),
            std::string::npos)
      << newer.status();
}

TEST(PsCheckpointTest, AnEmbeddingTableThatContradictsItselfIsRejected) {
  StateMaker maker(8);
  ShardState st = maker.Make(0);
  EmbeddingPartState e;
  e.table = 5;
  e.dim = 4;
  e.optimizer = RowOptimizerKind::kAdam;
  e.rows.ids = {1, 2};
  e.rows.touched = {0, 0};
  e.rows.slots.assign(2 * 4 * 2, 0.0f);  // Adam keeps three floats an element
  st.embeddings = {e};
  auto back = DecodeCheckpoint(EncodeCheckpoint(st), ExpectOf(st), "c");
  ASSERT_EQ(back.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(back.status().message().find("(table 5): its rows are truncated or of another size"),
            std::string::npos)
      << back.status();
  e.rows.slots.assign(2 * 4 * 3, 0.0f);
  e.rows.sketch.assign(100, 1);  // not the sketch's size
  st.embeddings = {e};
  back = DecodeCheckpoint(EncodeCheckpoint(st), ExpectOf(st), "c");
  EXPECT_NE(back.status().message().find("admission sketch"), std::string::npos) << back.status();
  e.rows.sketch.clear();
  e.open.push_back({3, {}, {{0, 0, {7}, {1.0f}}}});  // one gradient for a row of 4
  st.embeddings = {e};
  back = DecodeCheckpoint(EncodeCheckpoint(st), ExpectOf(st), "c");
  EXPECT_NE(back.status().message().find("a part of open round 3"), std::string::npos)
      << back.status();
}

TEST(PsCheckpointTest, EveryTruncationIsRejected) {
  const ShardState st = StateMaker(7).Make(5);
  const std::string bytes = EncodeCheckpoint(st);
  ASSERT_GT(bytes.size(), 500u);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto back = DecodeCheckpoint(bytes.substr(0, n), ExpectOf(st), "mem");
    ASSERT_FALSE(back.ok()) << "accepted the first " << n << " of " << bytes.size() << " bytes";
    ASSERT_EQ(back.status().code(), StatusCode::kDataLoss) << back.status();
  }
  auto shortest = DecodeCheckpoint(bytes.substr(0, 10), ExpectOf(st), "f.ckpt");
  EXPECT_NE(shortest.status().message().find("f.ckpt is damaged: truncated"), std::string::npos)
      << shortest.status();
  auto cut = DecodeCheckpoint(bytes.substr(0, bytes.size() - 1), ExpectOf(st), "mem");
  EXPECT_NE(cut.status().message().find("truncated"), std::string::npos) << cut.status();
  auto longer = DecodeCheckpoint(bytes + "x", ExpectOf(st), "mem");
  EXPECT_NE(longer.status().message().find("trailing bytes"), std::string::npos) << longer.status();
}

TEST(PsCheckpointTest, EveryBitFlipIsRejected) {
  const ShardState st = StateMaker(11).Make(3);
  const std::string bytes = EncodeCheckpoint(st);
  int crc = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      auto back = DecodeCheckpoint(bad, ExpectOf(st), "mem");
      ASSERT_FALSE(back.ok()) << "accepted a flip of bit " << bit << " of byte " << i;
      ASSERT_EQ(back.status().code(), StatusCode::kDataLoss) << back.status();
      crc += back.status().message().find("CRC mismatch") != std::string::npos;
    }
  }
  EXPECT_GT(crc, 0);
  std::string magic = bytes;
  magic[0] = 'X';
  EXPECT_NE(DecodeCheckpoint(magic, ExpectOf(st), "mem").status().message().find("bad magic"),
            std::string::npos);
}

TEST(PsCheckpointTest, AnotherJobRankModeOptimizerOrJobSizeIsRefusedNamingIt) {
  ShardState st = StateMaker(3).Make(2);
  st.rank = 1;
  st.mode = PsMode::kSync;
  st.optimizer = OptimizerKind::kMomentum;
  const std::string bytes = EncodeCheckpoint(st);
  auto refuse = [&](CheckpointExpect e) { return DecodeCheckpoint(bytes, e, "c").status(); };
  CheckpointExpect e = ExpectOf(st);
  e.job_id++;
  EXPECT_EQ(refuse(e).code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refuse(e).message().find("belongs to job"), std::string::npos) << refuse(e);
  e = ExpectOf(st);
  e.rank = 0;
  EXPECT_EQ(refuse(e).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refuse(e).message().find("written by shard 1, this is shard 0"), std::string::npos);
  e = ExpectOf(st);
  e.mode = PsMode::kAsync;
  EXPECT_NE(refuse(e).message().find("holds ps_mode=sync, this shard runs async"),
            std::string::npos)
      << refuse(e);
  e = ExpectOf(st);
  e.optimizer = OptimizerKind::kAdam;
  EXPECT_NE(refuse(e).message().find("optimizer=momentum"), std::string::npos) << refuse(e);
  e = ExpectOf(st);
  e.num_workers = 2;
  EXPECT_NE(refuse(e).message().find("job of 4 workers"), std::string::npos) << refuse(e);
}

TEST(PsCheckpointTest, ABodyThatContradictsItselfIsRejectedEvenWithAGoodCrc) {
  ShardState st = StateMaker(5).Make(0);
  KeyState k;
  k.num_elements = 3;
  k.open[1][0] = Contribution{{1, 2}, 0};  // two elements, the key holds three
  st.keys[{4, 2}] = k;
  auto back = DecodeCheckpoint(EncodeCheckpoint(st), ExpectOf(st), "c");
  ASSERT_EQ(back.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(back.status().message().find("bucket 4 partition 2"), std::string::npos)
      << back.status();

  st.keys.clear();
  KeyState w;
  w.num_elements = 1;
  w.taken[kWorkers] = TakenRounds{};  // no such worker
  st.keys[{0, 0}] = w;
  back = DecodeCheckpoint(EncodeCheckpoint(st), ExpectOf(st), "c");
  EXPECT_NE(back.status().message().find("worker 4"), std::string::npos) << back.status();

  st.keys.clear();
  KeyState p;
  p.num_elements = 5;
  p.initialised = true;  // without its parameters
  st.keys[{0, 0}] = p;
  back = DecodeCheckpoint(EncodeCheckpoint(st), ExpectOf(st), "c");
  EXPECT_NE(back.status().message().find("initialised but holds 0 parameters"), std::string::npos)
      << back.status();
}

TEST(PsCheckpointTest, WriteRenamesAWholeFileAndReadFindsIt) {
  const std::string dir = TempDir("write_read");
  ShardState st = StateMaker(21).Make(6);
  auto missing = ReadCheckpoint(dir, ExpectOf(st));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status();
  for (int i = 0; i < 3; ++i) {
    st.journal_start = 10 + i;
    auto bytes = WriteCheckpoint(dir, st);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, EncodeCheckpoint(st).size());
    auto back = ReadCheckpoint(dir, ExpectOf(st));
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectStateEq(st, *back);
  }
  EXPECT_NE(::access(CheckpointPath(dir, st.rank).c_str(), F_OK), -1);
  EXPECT_EQ(::access((CheckpointPath(dir, st.rank) + ".tmp").c_str(), F_OK), -1);
  EXPECT_EQ(CheckpointPath("/d", 3), "/d/shard-3.ckpt");
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(PsCheckpointTest, CheckpointsAndTheirDirectoryAreTheOwnersOnly) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/private_ckpt";
  ASSERT_TRUE(MakeDirectory(dir).ok());
  EXPECT_EQ(ModeOf(dir), 0700u);
  ShardState st = StateMaker(5).Make(3);
  ASSERT_TRUE(WriteCheckpoint(dir, st).ok());
  EXPECT_EQ(ModeOf(CheckpointPath(dir, st.rank)), 0600u);
}

// Another user who can write to the directory plants a link where the
// temporary file goes: the write must not go through it.
TEST(PsCheckpointTest, ALinkPlantedAtTheTemporaryFileIsNotFollowed) {
  const std::string dir = TempDir("planted");
  const std::string victim = dir + "/victim";
  {
    std::FILE* f = std::fopen(victim.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("keep me", f);
    std::fclose(f);
  }
  ShardState st = StateMaker(6).Make(3);
  const std::string path = CheckpointPath(dir, st.rank);
  ASSERT_EQ(::symlink(victim.c_str(), (path + ".tmp").c_str()), 0);
  ASSERT_TRUE(WriteCheckpoint(dir, st).ok());
  struct stat vs;
  ASSERT_EQ(::stat(victim.c_str(), &vs), 0);
  EXPECT_EQ(vs.st_size, 7) << "the checkpoint was written through the link";
  struct stat cs;
  ASSERT_EQ(::lstat(path.c_str(), &cs), 0);
  EXPECT_TRUE(S_ISREG(cs.st_mode));
  EXPECT_TRUE(ReadCheckpoint(dir, ExpectOf(st)).ok());
  ASSERT_EQ(::symlink(victim.c_str(), (dir + "/shard-9.ckpt").c_str()), 0);
  st.rank = 9;
  auto linked = ReadCheckpoint(dir, ExpectOf(st));
  EXPECT_FALSE(linked.ok()) << "a checkpoint was read through a link";
}

TEST(PsCheckpointTest, ACheckpointCutShortOnDiskIsRefusedNamingTheFile) {
  const std::string dir = TempDir("cut");
  ShardState st = StateMaker(8).Make(4);
  ASSERT_TRUE(WriteCheckpoint(dir, st).ok());
  const std::string path = CheckpointPath(dir, st.rank);
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  auto back = ReadCheckpoint(dir, ExpectOf(st));
  ASSERT_EQ(back.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(back.status().message().find(path + " is damaged: truncated"), std::string::npos)
      << back.status();
}

}  // namespace
}  // namespace gradsync::server
