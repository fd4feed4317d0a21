#include "ps/ps_journal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/private_files.h"
#include "ps/ps_bytes.h"
#include "ps/ps_checkpoint.h"

namespace gradsync::server {
namespace {

using Apply = std::function<Status(const JournalRecord&)>;

constexpr char kMagic[8] = {'G', 'S', 'P', 'S', 'J', 'R', 'N', 'L'};
constexpr uint32_t kJournalFormat = 1;
constexpr size_t kSegmentHeaderBytes = 40;
constexpr size_t kMaxBatch = 512;
constexpr size_t kWriteChunk = size_t{8} << 20;

Status Errno(const std::string& what) { return InternalError(what + ": " + std::strerror(errno)); }

std::string SegmentPrefix(int32_t rank) { return "shard-" + std::to_string(rank) + ".log."; }

std::string SegmentHeader(int32_t rank, uint64_t job_id, uint64_t segment) {
  std::string out(kMagic, sizeof(kMagic));
  ByteWriter w(&out);
  w.U32(kJournalFormat);
  w.I32(rank);
  w.U64(job_id);
  w.U64(segment);
  w.U32(0);
  w.U32(Crc32(0, out.data(), out.size()));
  return out;
}

// Parses a record body; false when it contradicts itself.
bool DecodeRecord(const char* body, size_t size, JournalRecord* rec) {
  ByteReader r(body, size);
  uint8_t kind;
  if (!r.U8(&kind)) return false;
  if (kind == static_cast<uint8_t>(JournalRecord::Kind::kPush)) {
    rec->kind = JournalRecord::Kind::kPush;
    return r.U32(&rec->bucket) && r.U32(&rec->partition) && r.I32(&rec->worker) &&
           r.U64(&rec->round) && r.U64(&rec->version) && r.U64(&rec->num_elements) &&
           r.left() == rec->num_elements * sizeof(float) &&
           r.FloatsOf(rec->num_elements, &rec->values);
  }
  if (kind == static_cast<uint8_t>(JournalRecord::Kind::kEmbeddingPush)) {
    rec->kind = JournalRecord::Kind::kEmbeddingPush;
    uint64_t n = 0;
    if (!r.U32(&rec->table) || !r.U32(&rec->partition) || !r.U32(&rec->dim) ||
        !r.I32(&rec->worker) || !r.U64(&rec->round) || !r.U32(&rec->part) || !r.U32(&rec->parts) ||
        !r.U64(&n)) {
      return false;
    }
    // Each id takes 8 bytes and dim floats: bounded by what is left before
    // anything is allocated.
    const uint64_t per_id = sizeof(uint64_t) + uint64_t{rec->dim} * sizeof(float);
    if (n > r.left() / per_id || r.left() != n * per_id) return false;
    rec->num_elements = n;
    return r.U64sOf(n, &rec->ids) && r.FloatsOf(n * rec->dim, &rec->values);
  }
  if (kind != static_cast<uint8_t>(JournalRecord::Kind::kDead)) return false;
  rec->kind = JournalRecord::Kind::kDead;
  uint32_t n;
  if (!r.U32(&rec->thread) || !r.U32(&rec->threads) || !r.Count(&n, 4) || rec->threads == 0 ||
      rec->thread >= rec->threads || r.left() != n * sizeof(int32_t)) {
    return false;
  }
  for (uint32_t i = 0; i < n; ++i) {
    int32_t w = 0;
    r.I32(&w);
    rec->dead.insert(w);
  }
  return true;
}

// Damage from `at` to the end that a crash explains: a record running past
// the end of the file, or nothing but zeros.
bool TornTail(const std::string& bytes, size_t at) {
  if (bytes.size() - at < 8) return true;
  ByteReader r(bytes.data() + at, 8);
  uint32_t len;
  r.U32(&len);
  if (at + 8 + len >= bytes.size()) return true;
  return std::all_of(bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.end(),
                     [](char c) { return c == 0; });
}

// Checks one segment and, when `apply` is set, applies its records.
Status ScanSegment(const std::string& path, const std::string& bytes, int32_t rank, uint64_t job_id,
                   uint64_t segment, bool last, const Apply* apply, JournalReplay* out) {
  auto damaged = [&](size_t at, const std::string& what) {
    return DataLossError("journal " + path + " is damaged at byte " + std::to_string(at) + ": " +
                         what);
  };
  const bool zeros = std::all_of(bytes.begin(), bytes.end(), [](char c) { return c == 0; });
  if (bytes.size() < kSegmentHeaderBytes || (last && zeros)) {
    if (last) {
      out->torn_tail = true;
      return OkStatus();
    }
    return damaged(0, "truncated header");
  }
  if (bytes.compare(0, kSegmentHeaderBytes, SegmentHeader(rank, job_id, segment)) != 0) {
    return damaged(0, "the header is not that of segment " + std::to_string(segment) +
                          " of shard " + std::to_string(rank) + " in job " +
                          std::to_string(job_id));
  }
  size_t at = kSegmentHeaderBytes;
  while (at < bytes.size()) {
    uint32_t len = 0, crc = 0;
    ByteReader head(bytes.data() + at, bytes.size() - at);
    JournalRecord rec;
    const bool whole = head.U32(&len) && head.U32(&crc) && head.left() >= len;
    const char* body = bytes.data() + at + 8;
    const bool ok = whole && Crc32(0, body, len) == crc && DecodeRecord(body, len, &rec);
    if (!ok) {
      if (last && TornTail(bytes, at)) {
        out->torn_tail = true;
        return OkStatus();
      }
      return damaged(at,
                     whole ? "a record fails its CRC or does not parse" : "a record is cut short");
    }
    if (apply != nullptr) {
      GS_RETURN_IF_ERROR((*apply)(rec));
      out->records++;
    }
    at += 8 + len;
  }
  return OkStatus();
}

}  // namespace

std::string JournalSegmentPath(const std::string& dir, int32_t rank, uint64_t segment) {
  char digits[24];
  std::snprintf(digits, sizeof(digits), "%020llu", static_cast<unsigned long long>(segment));
  return dir + "/" + SegmentPrefix(rank) + digits;
}

StatusOr<std::vector<uint64_t>> ListJournalSegments(const std::string& dir, int32_t rank) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Errno("cannot list " + dir);
  const std::string prefix = SegmentPrefix(rank);
  std::vector<uint64_t> out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() != prefix.size() + 20 || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    errno = 0;
    const unsigned long long segment = std::strtoull(digits.c_str(), nullptr, 10);
    if (errno == 0) out.push_back(segment);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

StatusOr<JournalReplay> ReplayJournal(const std::string& dir, int32_t rank, uint64_t job_id,
                                      uint64_t from, const Apply& apply) {
  GS_ASSIGN_OR_RETURN(std::vector<uint64_t> all, ListJournalSegments(dir, rank));
  std::vector<uint64_t> segments;
  for (uint64_t s : all) {
    if (s >= from) segments.push_back(s);
  }
  JournalReplay out;
  out.first_segment = from;
  if (segments.empty() || segments.front() != from) {
    return DataLossError("journal segment " + JournalSegmentPath(dir, rank, from) +
                         ", where the checkpoint's journal starts, is missing");
  }
  for (size_t i = 1; i < segments.size(); ++i) {
    if (segments[i] != segments[i - 1] + 1) {
      return DataLossError("journal segment " + JournalSegmentPath(dir, rank, segments[i - 1] + 1) +
                           " is missing");
    }
  }
  // Everything is checked before anything is applied.
  const Apply* check_only = nullptr;
  for (const Apply* pass : {check_only, &apply}) {
    for (size_t i = 0; i < segments.size(); ++i) {
      const std::string path = JournalSegmentPath(dir, rank, segments[i]);
      std::string bytes;
      GS_RETURN_IF_ERROR(ReadWholeFile(path, &bytes));
      GS_RETURN_IF_ERROR(ScanSegment(path, bytes, rank, job_id, segments[i],
                                     i + 1 == segments.size(), pass, &out));
    }
  }
  out.segments = segments.size();
  out.last_segment = segments.back();
  return out;
}

Journal::Journal(std::string dir, int32_t rank, uint64_t job_id, SendFn send)
    : dir_(std::move(dir)), rank_(rank), job_id_(job_id), send_(std::move(send)), queue_(1024) {}

StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& dir, int32_t rank,
                                                 uint64_t job_id, uint64_t segment, SendFn send) {
  std::unique_ptr<Journal> j(new Journal(dir, rank, job_id, std::move(send)));
  GS_RETURN_IF_ERROR(j->OpenSegment(segment));
  j->writer_ = std::thread([p = j.get()] { p->WriterLoop(); });
  return j;
}

Journal::~Journal() { Shutdown(); }

Status Journal::OpenSegment(uint64_t segment) {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  const std::string path = JournalSegmentPath(dir_, rank_, segment);
  auto fd = CreatePrivateFile(path, O_EXCL | O_APPEND);
  if (!fd.ok()) return fd.status().WithPrefix("journal segment");
  fd_ = *fd;
  segment_ = segment;
  buffer_ = SegmentHeader(rank_, job_id_, segment);
  GS_RETURN_IF_ERROR(Flush());
  return SyncDirectory(dir_);
}

void Journal::Append(std::optional<JournalRecord> record, std::vector<Outgoing> out) {
  queue_.Push(Entry{std::move(record), std::move(out), nullptr}, Deadline::Infinite())
      .IgnoreError();
}

StatusOr<uint64_t> Journal::Rotate() {
  auto done = std::make_shared<std::promise<StatusOr<uint64_t>>>();
  auto result = done->get_future();
  Status queued = queue_.Push(Entry{std::nullopt, {}, done}, Deadline::Infinite());
  if (!queued.ok()) return CancelledError("the journal is shut down");
  return result.get();
}

Status Journal::DropBefore(uint64_t segment) {
  GS_ASSIGN_OR_RETURN(std::vector<uint64_t> all, ListJournalSegments(dir_, rank_));
  for (uint64_t s : all) {
    if (s >= segment) break;
    const std::string path = JournalSegmentPath(dir_, rank_, s);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("cannot delete " + path);
  }
  return OkStatus();
}

Status Journal::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_;
}

void Journal::Fail(const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (health_.ok()) health_ = why;
}

void Journal::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  queue_.Close();
  if (writer_.joinable()) writer_.join();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Journal::WriterLoop() {
  for (;;) {
    auto first = queue_.Pop(Deadline::Infinite());
    if (!first.ok()) return;
    std::vector<Entry> batch;
    batch.push_back(std::move(*first));
    while (batch.size() < kMaxBatch) {
      auto more = queue_.Pop(Deadline::Past());
      if (!more.ok()) break;
      batch.push_back(std::move(*more));
    }
    Process(batch);
  }
}

void Journal::Process(std::vector<Entry>& batch) {
  std::vector<Outgoing> ready;
  // Answers leave only once every record before them is on disk.
  auto release = [&] {
    if (health().ok()) {
      Status s = Flush();
      if (!s.ok()) Fail(s);
    }
    if (health().ok()) {
      for (Outgoing& o : ready) send_(o.to, std::move(o.message));
    }
    ready.clear();
  };
  for (Entry& e : batch) {
    if (e.rotate) {
      release();
      Status s = health();
      if (s.ok()) s = OpenSegment(segment_ + 1);
      if (!s.ok()) {
        Fail(s);
        e.rotate->set_value(s);
      } else {
        e.rotate->set_value(segment_);
      }
      continue;
    }
    if (e.record && health().ok()) Write(*e.record);
    for (Outgoing& o : e.out) ready.push_back(std::move(o));
  }
  release();
}

void Journal::Write(const JournalRecord& rec) {
  std::string head;
  ByteWriter w(&head);
  w.U8(static_cast<uint8_t>(rec.kind));
  if (rec.kind == JournalRecord::Kind::kPush) {
    w.U32(rec.bucket);
    w.U32(rec.partition);
    w.I32(rec.worker);
    w.U64(rec.round);
    w.U64(rec.version);
    w.U64(rec.num_elements);
  } else if (rec.kind == JournalRecord::Kind::kEmbeddingPush) {
    w.U32(rec.table);
    w.U32(rec.partition);
    w.U32(rec.dim);
    w.I32(rec.worker);
    w.U64(rec.round);
    w.U32(rec.part);
    w.U32(rec.parts);
    w.U64(rec.num_elements);
  } else {
    w.U32(rec.thread);
    w.U32(rec.threads);
    w.U32(static_cast<uint32_t>(rec.dead.size()));
    for (int32_t r : rec.dead) w.I32(r);
  }
  // The values exactly as the key table copied them: frames in order, cut
  // or zero-padded to num_elements floats (an embedding push: its ids and
  // their rows).
  const size_t want = rec.kind == JournalRecord::Kind::kPush ? rec.num_elements * 4
                      : rec.kind == JournalRecord::Kind::kEmbeddingPush
                          ? rec.num_elements * (sizeof(uint64_t) + size_t{rec.dim} * sizeof(float))
                          : 0;
  const size_t start = buffer_.size();
  ByteWriter out(&buffer_);
  out.U32(static_cast<uint32_t>(head.size() + want));
  out.U32(0);  // the CRC, once the body is in place
  buffer_ += head;
  size_t copied = 0;
  for (const wire::Payload& p : rec.payloads) {
    const size_t n = std::min(p.size, want - copied);
    buffer_.append(reinterpret_cast<const char*>(p.data), n);
    copied += n;
  }
  buffer_.append(want - copied, '\0');
  const uint32_t crc = Crc32(0, buffer_.data() + start + 8, head.size() + want);
  for (int i = 0; i < 4; ++i) buffer_[start + 4 + i] = static_cast<char>(crc >> (8 * i));
  if (buffer_.size() >= kWriteChunk) {
    Status s = Flush();
    if (!s.ok()) Fail(s);
  }
}

Status Journal::Flush() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot write journal segment " + std::to_string(segment_));
    done += static_cast<size_t>(n);
    dirty_ = true;
  }
  buffer_.clear();
  if (dirty_ && ::fdatasync(fd_) != 0) {
    return Errno("cannot sync journal segment " + std::to_string(segment_));
  }
  dirty_ = false;
  return OkStatus();
}

}  // namespace gradsync::server
