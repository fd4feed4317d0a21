// Journal: every push a shard took since its last checkpoint, on disk before
// the shard answers anything that depends on it. A checkpoint alone loses
// the rounds closed after it, whose Replies the workers already used; with
// the journal a restarted shard loads its checkpoint, replays the journal
// and stands exactly where the old process stood when it last answered.
//
// The shard hands every answer to the journal together with the record (if
// any) of the push that caused it. A writer thread takes everything queued,
// writes the records, fdatasyncs once for all of them (group commit) and only
// then sends the answers, in the order they were handed in. So an Ack means
// the push is on disk, and no Reply carries a state the disk does not hold.
//
// Files <dir>/shard-<rank>.log.<segment, 20 digits>. A segment starts with a
// 40-byte header: magic "GSPSJRNL", format version u32, shard rank i32, job
// id u64, segment number u64, 4 zero bytes, CRC32 of the 36 bytes before it
// u32. Records follow: body length u32, CRC32 of the body u32, body:
//   push (kind 1): bucket u32, partition u32, worker i32, round u64,
//     version u64, num_elements u64, num_elements f32 values;
//   dead (kind 2): key thread u32, key threads u32, count u32, worker i32s:
//     from here on the key thread's workers declared dead.
//   embedding push (kind 3): table u32, partition u32, row width u32,
//     worker i32, round u64, part u32, parts u32, number of ids u64, the
//     ids (u64 each), then ids x width f32 gradients: a push an
//     EmbeddingService took (ps/embedding_service.h).
// Integers little-endian, floats as their IEEE-754 bits.
//
// A checkpoint rotates the journal first (Rotate: a new segment for
// everything handed in later), snapshots the keys, writes the checkpoint
// with the new segment as its journal start, and then drops the older
// segments. Replay applies the segments from the journal start in order; a
// push already in the checkpoint is a duplicate to the key table.
//
// Errors: a write or sync failure stops the journal: the answers waiting for
// it are never sent and health() names the failure from then on. Reading
// verifies every segment before any record is applied. A record cut short or
// failing its CRC at the end of the last segment is a write the crash
// interrupted (nothing that depends on it was sent) and ends the journal;
// damage anywhere else is DataLoss naming the file and the offset.
//
// Thread-safety: Append, Rotate, DropBefore and health may be called from any
// thread; Shutdown once, after the last Append.
#ifndef GRADSYNC_PS_PS_JOURNAL_H_
#define GRADSYNC_PS_PS_JOURNAL_H_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/blocking_queue.h"
#include "common/status.h"
#include "ps/ps_key_table.h"
#include "wire/message.h"
#include "wire/transport.h"

namespace gradsync::server {

struct JournalRecord {
  enum class Kind : uint8_t { kPush = 1, kDead = 2, kEmbeddingPush = 3 };
  Kind kind = Kind::kPush;
  // kPush (and kEmbeddingPush: partition, worker, round; num_elements is
  // the number of ids, payloads the ids' frame then the gradients')
  uint32_t bucket = 0;
  uint32_t partition = 0;
  int32_t worker = 0;
  uint64_t round = 0;
  uint64_t version = 0;
  uint64_t num_elements = 0;
  std::vector<wire::Payload> payloads;  // written: num_elements f32 as received
  std::vector<float> values;            // read back
  // kEmbeddingPush
  uint32_t table = 0;
  uint32_t dim = 0;
  uint32_t part = 0;
  uint32_t parts = 1;
  std::vector<uint64_t> ids;  // read back; values: their gradients
  // kDead
  uint32_t thread = 0;
  uint32_t threads = 1;
  std::set<int32_t> dead;
};

struct JournalReplay {
  uint64_t segments = 0;
  uint64_t records = 0;
  uint64_t first_segment = 0;
  uint64_t last_segment = 0;
  bool torn_tail = false;  // the last record was cut short by the crash
};

std::string JournalSegmentPath(const std::string& dir, int32_t rank, uint64_t segment);
// The segment numbers of shard `rank` in `dir`, ascending.
StatusOr<std::vector<uint64_t>> ListJournalSegments(const std::string& dir, int32_t rank);
// Verifies the segments numbered >= `from`, then calls `apply` for each record
// in order. Segments must be of `job_id` and `rank`.
StatusOr<JournalReplay> ReplayJournal(const std::string& dir, int32_t rank, uint64_t job_id,
                                      uint64_t from,
                                      const std::function<Status(const JournalRecord&)>& apply);

class Journal {
 public:
  using SendFn = std::function<void(const wire::Route& to, wire::Message msg)>;

  // Creates segment `segment` (it must not exist) and starts the writer.
  // `send` is called on the writer thread, in order.
  static StatusOr<std::unique_ptr<Journal>> Open(const std::string& dir, int32_t rank,
                                                 uint64_t job_id, uint64_t segment, SendFn send);
  ~Journal();  // Shutdown()

  // Queues `record` and the answers that wait for it; blocks while the queue
  // is full. After Shutdown the answers are dropped.
  void Append(std::optional<JournalRecord> record, std::vector<Outgoing> out);
  // Once everything appended before is on disk, closes the current segment
  // and starts the next; returns the new segment's number.
  StatusOr<uint64_t> Rotate();
  // Deletes the segments numbered below `segment`.
  Status DropBefore(uint64_t segment);
  Status health() const;
  // Writes and sends what is queued, then stops the writer. Idempotent.
  void Shutdown();

 private:
  struct Entry {
    std::optional<JournalRecord> record;
    std::vector<Outgoing> out;
    std::shared_ptr<std::promise<StatusOr<uint64_t>>> rotate;  // a Rotate() request
  };

  Journal(std::string dir, int32_t rank, uint64_t job_id, SendFn send);
  Status OpenSegment(uint64_t segment);
  void WriterLoop();
  void Process(std::vector<Entry>& batch);
  void Write(const JournalRecord& record);
  Status Flush();
  void Fail(const Status& why);

  const std::string dir_;
  const int32_t rank_;
  const uint64_t job_id_;
  const SendFn send_;
  BlockingQueue<Entry> queue_;
  std::thread writer_;

  // Owned by the writer thread (and Open before it starts).
  int fd_ = -1;
  uint64_t segment_ = 0;
  std::string buffer_;  // records written but not yet handed to the kernel
  bool dirty_ = false;  // bytes handed to the kernel but not yet synced

  mutable std::mutex mu_;
  Status health_;           // guarded by mu_
  bool shut_down_ = false;  // guarded by mu_
};

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_PS_JOURNAL_H_
