// libFuzzer target over the parameter server's state files: the checkpoint
// decoder (DecodeCheckpoint, ps/ps_checkpoint.h) and the journal replay
// (ReplayJournal, ps/ps_journal.h). Each input builds a valid file from
// a seed (a checkpoint of a few keys with every part filled in, or a journal
// segment of push, embedding push and dead records; checkpoints with
// embedding tables), damages it as the input says, and
// optionally mends its CRCs (so damage to the body reaches the parsers, not
// only the CRC check), then decodes it. A decoder must refuse with DataLoss,
// FailedPrecondition or InvalidArgument or return a state that is whole:
// any crash, sanitizer report, allocation past the file's size or state that
// does not survive a second round trip is a bug.
//
// Input: byte 0 (bit 0: checkpoint or journal; bit 1: mend CRCs; bit 2: the
// journal's first segment is damaged, not its last; bit 3: a flawed
// builder), bytes 1-4 the seed, then edits of 4 bytes each: offset u16,
// operation, value.
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "ps/ps_checkpoint.h"
#include "ps/ps_journal.h"

namespace gradsync::fuzz {
namespace {

using server::KeyState;
using server::ShardState;

void Check(bool ok) {
  if (!ok) std::abort();
}

class Builder {
 public:
  // A flawed builder now and then gets a size or a worker wrong, as a file
  // written by a buggy or hostile hand would.
  Builder(uint32_t seed, bool flawed) : rng_(seed), flawed_(flawed) {}

  ShardState Checkpoint() {
    ShardState st;
    st.job_id = 77;
    st.rank = 1;
    st.mode = server::PsMode::kSync;
    st.optimizer = server::OptimizerKind::kNone;
    st.num_workers = 3;
    st.journal_start = Int(0, 9);
    st.dead.resize(Int(1, 3));
    for (auto& d : st.dead) {
      if (Int(0, 1)) d.insert(Worker());
    }
    for (int i = 0, n = Int(0, 3); i < n; ++i) st.keys[{Int(0, 9), Int(0, 3)}] = Key();
    for (int i = 0, n = Int(0, 2); i < n; ++i) st.embeddings.push_back(Embedding());
    return st;
  }

  std::string Journal(uint64_t segment) {
    std::string out = Header(segment);
    for (int i = 0, n = Int(0, 4); i < n; ++i) Record(&out);
    return out;
  }

 private:
  uint32_t Int(int lo, int hi) {
    return static_cast<uint32_t>(std::uniform_int_distribution<int>(lo, hi)(rng_));
  }
  bool Flaw() { return flawed_ && Int(0, 7) == 0; }
  size_t Size(size_t n) { return Flaw() ? n + Int(0, 2) - (n > 0 ? 1 : 0) : n; }
  int32_t Worker() { return static_cast<int32_t>(Flaw() ? Int(0, 5) - 1 : Int(0, 2)); }
  std::vector<float> Floats(size_t n) {
    return std::vector<float>(Size(n), static_cast<float>(Int(0, 9)));
  }
  server::Snapshot Snap(size_t n) {
    server::Snapshot s;
    s.version = Int(0, 99);
    if (Int(0, 1)) s.values = std::make_shared<const std::vector<float>>(Floats(n));
    return s;
  }
  KeyState Key() {
    KeyState k;
    k.num_elements = Int(0, 3) == 0 ? 0 : Int(1, 6);
    const size_t n = k.num_elements;
    k.initialised = (n > 0 || Flaw()) && Int(0, 1);
    k.params = Floats(n);
    if (Int(0, 1)) k.slots.velocity = Floats(n);
    k.slots.steps = Int(0, 9);
    k.version = Int(0, 50);
    k.closed = Int(0, 5);
    if (n == 0) return k;
    k.open[Flaw() ? k.closed : k.closed + 1][Worker()] = server::Contribution{Floats(n), 1};
    k.results[Flaw() ? k.closed + 1 : k.closed] = Snap(n);
    k.latest = Snap(n);
    server::TakenRounds& t = k.taken[Worker()];
    t.floor = Int(0, 5);
    t.above.insert(Flaw() ? t.floor : t.floor + 2);
    return k;
  }
  // An embedding table partition (no admission sketch: the fuzzer's files
  // stay small).
  server::EmbeddingPartState Embedding() {
    server::EmbeddingPartState e;
    e.table = Int(0, 9);
    e.partition = Int(0, 2);
    e.dim = Int(1, 3);
    e.optimizer = static_cast<server::RowOptimizerKind>(Int(0, 2));
    const size_t rows = Int(0, 3);
    for (size_t i = 0; i < rows; ++i) {
      e.rows.ids.push_back(Int(0, 99));
      e.rows.touched.push_back(Int(0, 9));
    }
    e.rows.slots = Floats(rows * server::FloatsPerRow(e.optimizer, e.dim));
    e.rows.stats.steps = Int(0, 9);
    e.closed = Int(0, 5);
    if (Int(0, 1)) {
      server::EmbeddingPartState::OpenRound o;
      o.round = e.closed;
      o.pushed.insert(Worker());
      o.parts.push_back({Worker(), 0, {Int(0, 99)}, Floats(e.dim)});
      e.open.push_back(std::move(o));
    }
    if (Int(0, 1)) e.applied[Worker()] = {Int(0, 5), 0};
    return e;
  }
  static void Put(std::string* out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
  }
  // As ps/ps_journal.h lays a segment out.
  static std::string Header(uint64_t segment) {
    std::string out = "GSPSJRNL";
    Put(&out, 1, 4);
    Put(&out, 1, 4);
    Put(&out, 77, 8);
    Put(&out, segment, 8);
    Put(&out, 0, 4);
    Put(&out, server::Crc32(0, out.data(), out.size()), 4);
    return out;
  }
  void Record(std::string* out) {
    std::string body;
    if (Int(0, 3) == 0) {  // an embedding push
      const uint32_t n = Int(0, 3), dim = Int(1, 3);
      Put(&body, 3, 1);
      Put(&body, Int(0, 9), 4);
      Put(&body, Int(0, 2), 4);
      Put(&body, dim, 4);
      Put(&body, static_cast<uint32_t>(Worker()), 4);
      Put(&body, Int(0, 5), 8);
      Put(&body, 0, 4);
      Put(&body, 1, 4);
      Put(&body, n, 8);
      body.append(8 * n + 4 * Size(n * dim), '\x01');
    } else if (Int(0, 2) > 0) {
      const uint32_t n = Int(0, 5);
      Put(&body, 1, 1);
      Put(&body, Int(0, 3), 4);
      Put(&body, Int(0, 3), 4);
      Put(&body, Int(0, 2), 4);
      Put(&body, Int(1, 5), 8);
      Put(&body, Int(0, 5), 8);
      Put(&body, n, 8);
      body.append(4 * Size(n), '\x01');
    } else {
      Put(&body, 2, 1);
      Put(&body, Flaw() ? 2 : 0, 4);
      Put(&body, Flaw() ? 0 : 2, 4);
      Put(&body, 1, 4);
      Put(&body, static_cast<uint32_t>(Worker()), 4);
    }
    Put(out, body.size(), 4);
    Put(out, server::Crc32(0, body.data(), body.size()), 4);
    *out += body;
  }

  std::mt19937 rng_;
  bool flawed_;
};

// Applies 4-byte edits: offset u16, operation (xor, set, erase 1-8 bytes,
// insert 1-8 copies of a byte; the bits above choose the byte), value.
void Damage(const uint8_t* data, size_t size, std::string* bytes) {
  for (size_t i = 0; i + 4 <= size && !bytes->empty(); i += 4) {
    const size_t at = (data[i] | (size_t{data[i + 1]} << 8)) % bytes->size();
    const uint8_t value = data[i + 3];
    switch (data[i + 2] & 3) {
      case 0:
        (*bytes)[at] = static_cast<char>((*bytes)[at] ^ value);
        break;
      case 1:
        (*bytes)[at] = static_cast<char>(value);
        break;
      case 2:
        bytes->erase(at, 1 + (data[i + 2] >> 5));
        break;
      default:
        bytes->insert(at, 1 + (data[i + 2] >> 5), static_cast<char>(value));
        break;
    }
  }
}

void PutAt(std::string* bytes, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) (*bytes)[at + i] = static_cast<char>(v >> (8 * i));
}

uint64_t GetAt(const std::string& bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(bytes[at + i])} << (8 * i);
  return v;
}

// The checkpoint's body CRC and header CRC made to match (the body length
// as it says).
void MendCheckpoint(std::string* bytes) {
  if (bytes->size() < server::kCheckpointHeaderBytes) return;
  const size_t body = bytes->size() - server::kCheckpointHeaderBytes;
  PutAt(bytes, 40, server::Crc32(0, bytes->data() + 48, body), 4);
  PutAt(bytes, 44, server::Crc32(0, bytes->data(), 44), 4);
}

// Each record's CRC made to match its body, as far as the lengths lead.
void MendJournal(std::string* bytes) {
  size_t at = 40;
  while (at + 8 <= bytes->size()) {
    const uint64_t len = GetAt(*bytes, at, 4);
    if (len > bytes->size() - at - 8) break;
    PutAt(bytes, at + 4, server::Crc32(0, bytes->data() + at + 8, len), 4);
    at += 8 + len;
  }
}

void DecodeCheckpoint(const std::string& bytes) {
  const server::CheckpointExpect expect{77, 1, server::PsMode::kSync, server::OptimizerKind::kNone,
                                        3};
  auto st = server::DecodeCheckpoint(bytes, expect, "fuzz.ckpt");
  if (!st.ok()) {
    const StatusCode c = st.status().code();
    Check(c == StatusCode::kDataLoss || c == StatusCode::kFailedPrecondition ||
          c == StatusCode::kInvalidArgument);
    return;
  }
  for (const auto& [key, k] : st->keys) {
    Check(k.params.empty() || k.params.size() == k.num_elements);
    for (const auto& [round, workers] : k.open) {
      for (const auto& [w, c] : workers) {
        Check(w >= 0 && w < 3 && c.grad.size() == k.num_elements);
      }
    }
  }
  for (const auto& e : st->embeddings) {
    const size_t n = e.rows.ids.size();
    Check(e.rows.touched.size() == n &&
          e.rows.slots.size() == n * server::FloatsPerRow(e.optimizer, e.dim));
    for (const auto& o : e.open) {
      for (const auto& part : o.parts) {
        Check(part.rank >= 0 && part.rank < 3 && part.grads.size() == part.ids.size() * e.dim);
      }
    }
  }
  Check(server::DecodeCheckpoint(server::EncodeCheckpoint(*st), expect, "again").ok());
}

const std::string& Dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/gradsync-state-fuzz-XXXXXX";
    const char* base = std::getenv("TEST_TMPDIR");
    std::string t = base ? std::string(base) + "/state-XXXXXX" : tmpl;
    if (mkdtemp(t.data()) == nullptr) std::abort();
    return t;
  }();
  return dir;
}

void Replay(const std::string& last, const std::string& first) {
  const std::string a = server::JournalSegmentPath(Dir(), 1, 4);
  const std::string b = server::JournalSegmentPath(Dir(), 1, 5);
  for (const auto& [path, bytes] : {std::pair{a, first}, std::pair{b, last}}) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) std::abort();
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  auto replay = server::ReplayJournal(Dir(), 1, 77, 4, [](const server::JournalRecord& r) {
    if (r.kind == server::JournalRecord::Kind::kPush) {
      Check(r.values.size() == r.num_elements);
    } else if (r.kind == server::JournalRecord::Kind::kEmbeddingPush) {
      Check(r.ids.size() == r.num_elements && r.values.size() == r.ids.size() * r.dim);
    } else {
      Check(r.threads > 0 && r.thread < r.threads);
    }
    return OkStatus();
  });
  Check(replay.ok() || replay.status().code() == StatusCode::kDataLoss);
  unlink(a.c_str());
  unlink(b.c_str());
}

}  // namespace
}  // namespace gradsync::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace f = gradsync::fuzz;
  if (size < 5) return 0;
  const uint32_t seed = data[1] | (data[2] << 8) | (data[3] << 16) | (uint32_t{data[4]} << 24);
  f::Builder build(seed, data[0] & 8);
  const bool mend = data[0] & 2;
  if ((data[0] & 1) == 0) {
    std::string bytes = gradsync::server::EncodeCheckpoint(build.Checkpoint());
    f::Damage(data + 5, size - 5, &bytes);
    if (mend) f::MendCheckpoint(&bytes);
    f::DecodeCheckpoint(bytes);
    return 0;
  }
  // Damage lands in the last segment, where a torn tail is allowed, or in
  // the one before it, where it is not.
  std::string first = build.Journal(4), last = build.Journal(5);
  std::string& target = (data[0] & 4) ? first : last;
  f::Damage(data + 5, size - 5, &target);
  if (mend) f::MendJournal(&target);
  f::Replay(last, first);
  return 0;
}
