#include "ps/ps_checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/private_files.h"
#include "ps/ps_bytes.h"

namespace gradsync::server {
namespace {

constexpr char kMagic[8] = {'G', 'S', 'P', 'S', 'C', 'K', 'P', 'T'};

void WriteSnap(ByteWriter& w, const Snapshot& s) {
  w.U64(s.version);
  w.U8(s.values ? 1 : 0);
  if (s.values) w.Floats(*s.values);
}

bool ReadSnap(ByteReader& r, Snapshot* s) {
  uint8_t has;
  if (!r.U64(&s->version) || !r.U8(&has) || has > 1) return false;
  if (has == 0) return true;
  std::vector<float> values;
  if (!r.Floats(&values)) return false;
  s->values = std::make_shared<std::vector<float>>(std::move(values));  // Snapshot
  return true;
}

void EncodeKey(ByteWriter& w, const KeyTable::Key& key, const KeyState& k) {
  w.U32(key.first);
  w.U32(key.second);
  w.U64(k.num_elements);
  w.U8(k.initialised ? 1 : 0);
  w.U64(k.version);
  w.U64(k.closed);
  w.Floats(k.params);
  w.Floats(k.slots.velocity);
  w.Floats(k.slots.m);
  w.Floats(k.slots.v);
  w.U64(k.slots.steps);
  w.U32(static_cast<uint32_t>(k.open.size()));
  for (const auto& [round, contributions] : k.open) {
    w.U64(round);
    w.U32(static_cast<uint32_t>(contributions.size()));
    for (const auto& [worker, c] : contributions) {
      w.I32(worker);
      w.U64(c.version);
      w.Floats(c.grad);
    }
  }
  w.U32(static_cast<uint32_t>(k.results.size()));
  for (const auto& [round, snap] : k.results) {
    w.U64(round);
    WriteSnap(w, snap);
  }
  WriteSnap(w, k.latest);
  w.U32(static_cast<uint32_t>(k.taken.size()));
  for (const auto& [worker, t] : k.taken) {
    w.I32(worker);
    w.U64(t.floor);
    w.U32(static_cast<uint32_t>(t.above.size()));
    for (uint64_t round : t.above) w.U64(round);
  }
}

// Reads one key; on failure `why` says what is wrong.
class KeyDecoder {
 public:
  KeyDecoder(ByteReader& r, int32_t num_workers) : r_(r), num_workers_(num_workers) {}

  bool Decode(KeyTable::Key* key, KeyState* k, std::string* why) {
    uint8_t initialised;
    if (!r_.U32(&key->first) || !r_.U32(&key->second) || !r_.U64(&k->num_elements) ||
        !r_.U8(&initialised) || initialised > 1 || !r_.U64(&k->version) || !r_.U64(&k->closed)) {
      return Fail("its counters are truncated", why);
    }
    k->initialised = initialised == 1;
    num_elements_ = k->num_elements;
    if (!r_.Floats(&k->params) || !r_.Floats(&k->slots.velocity) || !r_.Floats(&k->slots.m) ||
        !r_.Floats(&k->slots.v) || !r_.U64(&k->slots.steps)) {
      return Fail("its parameters or optimizer slots are truncated", why);
    }
    for (const auto* v : {&k->params, &k->slots.velocity, &k->slots.m, &k->slots.v}) {
      if (!Sized(*v)) return Fail("parameters or slots of the wrong size", why);
    }
    if (k->initialised && (k->num_elements == 0 || k->params.size() != k->num_elements)) {
      return Fail("it is initialised but holds " + std::to_string(k->params.size()) +
                      " parameters for " + std::to_string(k->num_elements) + " elements",
                  why);
    }
    return DecodeOpen(k, why) && DecodeResults(k, why) && DecodeTaken(k, why);
  }

 private:
  bool Fail(const std::string& what, std::string* why) {
    *why = what;
    return false;
  }
  bool Sized(const std::vector<float>& v) const { return v.empty() || v.size() == num_elements_; }
  bool Worker(int32_t w) const { return w >= 0 && w < num_workers_; }

  bool DecodeOpen(KeyState* k, std::string* why) {
    uint32_t rounds;
    if (!r_.Count(&rounds, 12)) return Fail("its open rounds are truncated", why);
    for (uint32_t i = 0; i < rounds; ++i) {
      uint64_t round;
      uint32_t n;
      if (!r_.U64(&round) || !r_.Count(&n, 20)) return Fail("an open round is truncated", why);
      if (round <= k->closed || k->open.count(round)) {
        return Fail("open round " + std::to_string(round) + " is closed or repeated", why);
      }
      auto& contributions = k->open[round];
      for (uint32_t j = 0; j < n; ++j) {
        int32_t worker;
        Contribution c;
        if (!r_.I32(&worker) || !r_.U64(&c.version) || !r_.Floats(&c.grad)) {
          return Fail("a contribution to round " + std::to_string(round) + " is truncated", why);
        }
        if (!Worker(worker) || contributions.count(worker) || c.grad.size() != k->num_elements) {
          return Fail("round " + std::to_string(round) + " holds a contribution of worker " +
                          std::to_string(worker) + " that is repeated, out of range or of " +
                          std::to_string(c.grad.size()) + " elements",
                      why);
        }
        contributions[worker] = std::move(c);
      }
    }
    return true;
  }

  bool DecodeResults(KeyState* k, std::string* why) {
    uint32_t n;
    if (!r_.Count(&n, 17)) return Fail("its results are truncated", why);
    for (uint32_t i = 0; i < n; ++i) {
      uint64_t round;
      Snapshot s;
      if (!r_.U64(&round) || !ReadSnap(r_, &s)) return Fail("a result is truncated", why);
      if (k->results.count(round) || round > k->closed) {
        return Fail("result of round " + std::to_string(round) + " is repeated or not closed", why);
      }
      if (s.values && s.values->size() != k->num_elements) {
        return Fail("result of round " + std::to_string(round) + " has the wrong size", why);
      }
      k->results[round] = std::move(s);
    }
    if (!ReadSnap(r_, &k->latest)) return Fail("its latest parameters are truncated", why);
    if (k->latest.values && k->latest.values->size() != k->num_elements) {
      return Fail("its latest parameters have the wrong size", why);
    }
    return true;
  }

  bool DecodeTaken(KeyState* k, std::string* why) {
    uint32_t n;
    if (!r_.Count(&n, 16)) return Fail("its taken rounds are truncated", why);
    for (uint32_t i = 0; i < n; ++i) {
      int32_t worker;
      TakenRounds t;
      uint32_t above;
      if (!r_.I32(&worker) || !r_.U64(&t.floor) || !r_.Count(&above, 8)) {
        return Fail("taken rounds are truncated", why);
      }
      if (!Worker(worker) || k->taken.count(worker)) {
        return Fail(
            "taken rounds of worker " + std::to_string(worker) + " are repeated or out of range",
            why);
      }
      for (uint32_t j = 0; j < above; ++j) {
        uint64_t round;
        if (!r_.U64(&round)) return Fail("taken rounds are truncated", why);
        if (round <= t.floor + 1 || (!t.above.empty() && round <= *t.above.rbegin())) {
          return Fail("taken rounds of worker " + std::to_string(worker) + " are out of order",
                      why);
        }
        t.above.insert(round);
      }
      k->taken[worker] = std::move(t);
    }
    return true;
  }

  ByteReader& r_;
  const int32_t num_workers_;
  uint64_t num_elements_ = 0;
};

Status Corrupt(const std::string& name, const std::string& what) {
  return DataLossError("checkpoint " + name + " is damaged: " + what);
}

void EncodeEmbedding(ByteWriter& w, const EmbeddingPartState& e) {
  w.U32(e.table);
  w.U32(e.partition);
  w.U32(e.dim);
  w.U8(static_cast<uint8_t>(e.optimizer));
  const EmbeddingRowsState& rows = e.rows;
  w.U64(rows.clock);
  const EmbeddingTableStats& c = rows.stats;
  for (uint64_t v : {c.pulled, c.pushed, c.admitted, c.not_admitted, c.evicted_idle,
                     c.evicted_memory, c.refused_memory, c.refused_nonfinite, c.steps}) {
    w.U64(v);
  }
  w.U64(rows.ids.size());
  w.U64s(rows.ids);
  w.U64s(rows.touched);
  w.Floats(rows.slots);
  w.U64(rows.sketch.size());
  for (uint8_t v : rows.sketch) w.U8(v);
  w.U64(e.closed);
  w.U32(static_cast<uint32_t>(e.open.size()));
  for (const auto& o : e.open) {
    w.U64(o.round);
    w.U32(static_cast<uint32_t>(o.pushed.size()));
    for (int32_t r : o.pushed) w.I32(r);
    w.U32(static_cast<uint32_t>(o.parts.size()));
    for (const auto& p : o.parts) {
      w.I32(p.rank);
      w.U32(p.part);
      w.U64(p.ids.size());
      w.U64s(p.ids);
      w.Floats(p.grads);
    }
  }
  w.U32(static_cast<uint32_t>(e.applied.size()));
  for (const auto& [rank, last] : e.applied) {
    w.I32(rank);
    w.U64(static_cast<uint64_t>(last.first));
    w.U32(last.second);
  }
}

// Reads one partition; every count is bounded by the bytes left before
// anything is allocated, and every size checked against the width.
bool DecodeEmbedding(ByteReader& r, int32_t num_workers, EmbeddingPartState* e, std::string* why) {
  auto worker = [&](int32_t rank) {
    if (rank >= 0 && rank < num_workers) return true;
    *why = "worker " + std::to_string(rank) + " is out of range";
    return false;
  };
  uint8_t optimizer = 0;
  if (!r.U32(&e->table) || !r.U32(&e->partition) || !r.U32(&e->dim) || !r.U8(&optimizer)) {
    *why = "truncated";
    return false;
  }
  if (e->dim == 0 || e->dim > (1u << 20) ||
      optimizer > static_cast<uint8_t>(RowOptimizerKind::kAdam)) {
    *why = "a width or row optimizer out of range";
    return false;
  }
  e->optimizer = static_cast<RowOptimizerKind>(optimizer);
  EmbeddingRowsState& rows = e->rows;
  EmbeddingTableStats& c = rows.stats;
  uint64_t n = 0, sketch = 0;
  bool ok = r.U64(&rows.clock);
  for (uint64_t* v : {&c.pulled, &c.pushed, &c.admitted, &c.not_admitted, &c.evicted_idle,
                      &c.evicted_memory, &c.refused_memory, &c.refused_nonfinite, &c.steps}) {
    ok = ok && r.U64(v);
  }
  ok = ok && r.U64(&n) && n <= r.left() / 16 && r.U64sOf(n, &rows.ids) &&
       r.U64sOf(n, &rows.touched) && r.Floats(&rows.slots);
  if (!ok || rows.slots.size() != n * FloatsPerRow(e->optimizer, e->dim)) {
    *why = "its rows are truncated or of another size";
    return false;
  }
  if (!r.U64(&sketch) || (sketch != 0 && sketch != SketchCounters()) || sketch > r.left()) {
    *why = "its admission sketch is truncated or of another size";
    return false;
  }
  rows.sketch.resize(sketch);
  for (uint8_t& v : rows.sketch) r.U8(&v);
  uint32_t rounds = 0;
  if (!r.U64(&e->closed) || !r.Count(&rounds, 16)) {
    *why = "its rounds are truncated";
    return false;
  }
  e->open.resize(rounds);
  for (auto& o : e->open) {
    uint32_t pushed = 0, parts = 0;
    if (!r.U64(&o.round) || !r.Count(&pushed, 4)) {
      *why = "an open round is truncated";
      return false;
    }
    for (uint32_t i = 0; i < pushed; ++i) {
      int32_t rank = 0;
      r.I32(&rank);
      if (!worker(rank)) return false;
      o.pushed.insert(rank);
    }
    if (!r.Count(&parts, 24)) {
      *why = "an open round is truncated";
      return false;
    }
    o.parts.resize(parts);
    for (auto& p : o.parts) {
      if (!r.I32(&p.rank) || !r.U32(&p.part) || !r.U64s(&p.ids) || !r.Floats(&p.grads) ||
          p.grads.size() != p.ids.size() * e->dim) {
        *why =
            "a part of open round " + std::to_string(o.round) + " is truncated or of another size";
        return false;
      }
      if (!worker(p.rank)) return false;
    }
  }
  uint32_t applied = 0;
  if (!r.Count(&applied, 16)) {
    *why = "its applied pushes are truncated";
    return false;
  }
  for (uint32_t i = 0; i < applied; ++i) {
    int32_t rank = 0;
    uint64_t round = 0;
    uint32_t part = 0;
    r.I32(&rank);
    r.U64(&round);
    r.U32(&part);
    if (!worker(rank)) return false;
    e->applied[rank] = {static_cast<int64_t>(round), part};
  }
  return true;
}

StatusOr<ShardState> DecodeBody(ByteReader& r, ShardState st, uint32_t format,
                                const std::string& name) {
  uint32_t threads;
  if (!r.U64(&st.journal_start) || !r.Count(&threads, 4) || threads == 0) {
    return Corrupt(name, "the body is truncated");
  }
  st.dead.resize(threads);
  for (auto& dead : st.dead) {
    uint32_t n;
    if (!r.Count(&n, 4)) return Corrupt(name, "the dead workers are truncated");
    for (uint32_t i = 0; i < n; ++i) {
      int32_t w;
      if (!r.I32(&w)) return Corrupt(name, "the dead workers are truncated");
      if (w < 0 || w >= st.num_workers) {
        return Corrupt(name, "dead worker " + std::to_string(w) + " is out of range");
      }
      dead.insert(w);
    }
  }
  uint64_t keys;
  if (!r.U64(&keys) || keys > r.left() / 64) return Corrupt(name, "the key count is implausible");
  KeyDecoder decoder(r, st.num_workers);
  for (uint64_t i = 0; i < keys; ++i) {
    KeyTable::Key key;
    KeyState k;
    std::string why;
    if (!decoder.Decode(&key, &k, &why)) {
      return Corrupt(name, "key " + std::to_string(i) + " (bucket " + std::to_string(key.first) +
                               " partition " + std::to_string(key.second) + "): " + why);
    }
    if (!st.keys.empty() && !(st.keys.rbegin()->first < key)) {
      return Corrupt(name, "keys are out of order at bucket " + std::to_string(key.first) +
                               " partition " + std::to_string(key.second));
    }
    st.keys.emplace_hint(st.keys.end(), key, std::move(k));
  }
  if (format >= 2) {
    uint32_t parts;
    if (!r.Count(&parts, 64)) return Corrupt(name, "the embedding table count is implausible");
    st.embeddings.resize(parts);
    for (uint32_t i = 0; i < parts; ++i) {
      std::string why;
      if (!DecodeEmbedding(r, st.num_workers, &st.embeddings[i], &why)) {
        return Corrupt(name, "embedding table partition " + std::to_string(i) + " (table " +
                                 std::to_string(st.embeddings[i].table) + "): " + why);
      }
    }
  }
  if (r.left() != 0) {
    return Corrupt(name, std::to_string(r.left()) + " bytes follow the last " +
                             (format >= 2 ? "embedding table" : "key"));
  }
  return st;
}

std::string Hex(uint32_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

Status Errno(const std::string& what) { return InternalError(what + ": " + std::strerror(errno)); }

Status WriteAll(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot write " + path);
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

}  // namespace

uint32_t Crc32(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {
    const uInt n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, n));
    p += n;
    size -= n;
  }
  return crc;
}

std::string EncodeCheckpoint(const ShardState& st) {
  std::string body;
  ByteWriter w(&body);
  w.U64(st.journal_start);
  w.U32(static_cast<uint32_t>(st.dead.size()));
  for (const auto& dead : st.dead) {
    w.U32(static_cast<uint32_t>(dead.size()));
    for (int32_t r : dead) w.I32(r);
  }
  w.U64(st.keys.size());
  for (const auto& [key, k] : st.keys) EncodeKey(w, key, k);
  w.U32(static_cast<uint32_t>(st.embeddings.size()));
  for (const auto& e : st.embeddings) EncodeEmbedding(w, e);

  std::string out(kMagic, sizeof(kMagic));
  ByteWriter h(&out);
  h.U32(kCheckpointFormat);
  h.I32(st.rank);
  h.U8(static_cast<uint8_t>(st.mode));
  h.U8(static_cast<uint8_t>(st.optimizer));
  h.U8(0);
  h.U8(0);
  h.I32(st.num_workers);
  h.U64(st.job_id);
  h.U64(body.size());
  h.U32(Crc32(0, body.data(), body.size()));
  h.U32(Crc32(0, out.data(), out.size()));
  out += body;
  return out;
}

StatusOr<ShardState> DecodeCheckpoint(const std::string& bytes, const CheckpointExpect& expect,
                                      const std::string& name) {
  if (bytes.size() < kCheckpointHeaderBytes) {
    return Corrupt(name, "truncated: " + std::to_string(bytes.size()) +
                             " bytes, the header alone "
                             "needs " +
                             std::to_string(kCheckpointHeaderBytes));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return Corrupt(name, "bad magic (not a gradsync shard checkpoint)");
  }
  ByteReader h(bytes.data() + sizeof(kMagic), kCheckpointHeaderBytes - sizeof(kMagic));
  ShardState st;
  uint32_t format = 0, body_crc = 0, header_crc = 0;
  uint8_t mode = 0, optimizer = 0, pad0 = 0, pad1 = 0;
  uint64_t body_size = 0;
  h.U32(&format);
  h.I32(&st.rank);
  h.U8(&mode);
  h.U8(&optimizer);
  h.U8(&pad0);
  h.U8(&pad1);
  h.I32(&st.num_workers);
  h.U64(&st.job_id);
  h.U64(&body_size);
  h.U32(&body_crc);
  h.U32(&header_crc);
  if (format != 1 && format != kCheckpointFormat) {
    return Corrupt(name, "format version " + std::to_string(format) + ", this build reads 1 to " +
                             std::to_string(kCheckpointFormat));
  }
  const uint32_t header_want = Crc32(0, bytes.data(), kCheckpointHeaderBytes - 4);
  if (header_crc != header_want) {
    return Corrupt(name, "header CRC mismatch (stored " + Hex(header_crc) + ", computed " +
                             Hex(header_want) + ")");
  }
  const uint64_t have = bytes.size() - kCheckpointHeaderBytes;
  if (have != body_size) {
    return Corrupt(name, (have < body_size ? "truncated: " : "trailing bytes: ") +
                             std::to_string(have) + " body bytes, the header says " +
                             std::to_string(body_size));
  }
  const uint32_t body_want = Crc32(0, bytes.data() + kCheckpointHeaderBytes, body_size);
  if (body_crc != body_want) {
    return Corrupt(
        name, "body CRC mismatch (stored " + Hex(body_crc) + ", computed " + Hex(body_want) + ")");
  }
  if (mode > static_cast<uint8_t>(PsMode::kSsp) ||
      optimizer > static_cast<uint8_t>(OptimizerKind::kAdam) || pad0 != 0 || pad1 != 0 ||
      st.num_workers < 1) {
    return Corrupt(name, "header fields out of range");
  }
  st.mode = static_cast<PsMode>(mode);
  st.optimizer = static_cast<OptimizerKind>(optimizer);
  if (st.job_id != expect.job_id) {
    return FailedPreconditionError("checkpoint " + name + " belongs to job " +
                                   std::to_string(st.job_id) + ", this shard serves job " +
                                   std::to_string(expect.job_id));
  }
  std::string differs;
  if (st.rank != expect.rank) {
    differs = "was written by shard " + std::to_string(st.rank) + ", this is shard " +
              std::to_string(expect.rank);
  } else if (st.mode != expect.mode) {
    differs = std::string("holds ps_mode=") + PsModeName(st.mode) + ", this shard runs " +
              PsModeName(expect.mode);
  } else if (st.optimizer != expect.optimizer) {
    differs = std::string("holds optimizer=") + OptimizerName(st.optimizer) +
              " state, this shard runs " + OptimizerName(expect.optimizer);
  } else if (st.num_workers != expect.num_workers) {
    differs = "is of a job of " + std::to_string(st.num_workers) + " workers, this one has " +
              std::to_string(expect.num_workers);
  }
  if (!differs.empty()) return InvalidArgumentError("checkpoint " + name + " " + differs);
  ByteReader body(bytes.data() + kCheckpointHeaderBytes, body_size);
  return DecodeBody(body, std::move(st), format, name);
}

std::string CheckpointPath(const std::string& dir, int32_t rank) {
  return dir + "/shard-" + std::to_string(rank) + ".ckpt";
}

StatusOr<uint64_t> WriteCheckpoint(const std::string& dir, const ShardState& state) {
  const std::string bytes = EncodeCheckpoint(state);
  const std::string path = CheckpointPath(dir, state.rank);
  const std::string tmp = path + ".tmp";
  // A stale temporary file (or a link planted in its place) goes first: the
  // new one is created, never opened.
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) return Errno("cannot remove " + tmp);
  GS_ASSIGN_OR_RETURN(const int fd, CreatePrivateFile(tmp, O_EXCL));
  Status s = WriteAll(fd, bytes, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("cannot fsync " + tmp);
  if (::close(fd) != 0 && s.ok()) s = Errno("cannot close " + tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = Errno("cannot rename " + tmp + " to " + path);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  GS_RETURN_IF_ERROR(SyncDirectory(dir));
  return static_cast<uint64_t>(bytes.size());
}

Status ReadWholeFile(const std::string& path, std::string* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open " + path);
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = Errno("cannot read " + path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    bytes->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return OkStatus();
}

StatusOr<ShardState> ReadCheckpoint(const std::string& dir, const CheckpointExpect& expect) {
  const std::string path = CheckpointPath(dir, expect.rank);
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) {
    return NotFoundError("no checkpoint at " + path);
  }
  std::string bytes;
  GS_RETURN_IF_ERROR(ReadWholeFile(path, &bytes));
  return DecodeCheckpoint(bytes, expect, path);
}

Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open directory " + dir);
  Status s;
  if (::fsync(fd) != 0) s = Errno("cannot fsync directory " + dir);
  ::close(fd);
  return s;
}

Status MakeDirectory(const std::string& dir) {
  return MakePrivateDirectory(dir, "checkpoint directory");
}

}  // namespace gradsync::server
