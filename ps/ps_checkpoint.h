// Checkpoints of a parameter-server shard: the state of every key the shard
// holds (KeyState, ps/ps_key_table.h) in a binary file of our own, so a
// restarted shard continues exactly where the saved one stood. Held pulls are
// not saved: workers send unanswered pulls again.
//
// File <dir>/shard-<rank>.ckpt, all integers little-endian, floats as their
// IEEE-754 bits:
//   header (48 bytes): magic "GSPSCKPT", format version u32, shard rank i32,
//     ps mode u8, optimizer u8, 2 zero bytes, number of workers i32, job id
//     u64, body length u64, CRC32 of the body u32, CRC32 of the 44 header
//     bytes before it u32.
//   body: journal start u64 (the first journal segment, ps/ps_journal.h,
//     whose pushes the checkpoint does not hold); key threads u32, then for
//     each the dead workers (u32 count, i32 ranks); keys u64, then each key:
//     bucket u32, partition u32, num_elements u64, initialised u8, version
//     u64, closed u64, params, optimizer slots (velocity, m, v, steps u64),
//     open rounds (u32 count; round u64, contributions u32, each worker i32,
//     version u64, gradient), results (u32 count; round u64, snapshot),
//     latest (snapshot), taken rounds (u32 count; worker i32, floor u64,
//     rounds above u32 count, each u64); then (format 2) the embedding
//     table partitions (u32 count), each: table u32, partition u32, width
//     u32, row optimizer u8, clock u64, nine counters u64 (pulled, pushed,
//     admitted, not admitted, evicted idle, evicted for memory, refused for
//     memory, refused non-finite, steps), rows u64 count, their ids u64s,
//     last touches u64s (least recently touched first), their floats
//     (float vector), the admission sketch (u64 count, u8 counters); closed
//     u64, open rounds (u32 count; round u64, pushed ranks u32 count of i32,
//     parts u32 count of rank i32, part u32, ids u64 count and u64s,
//     gradients float vector), applied (u32 count; rank i32, round u64,
//     part u32). A float vector is a u64 count and the floats; a snapshot
//     is version u64, has values u8, [float vector]. Format 1 files (no
//     embedding section) are read as holding no embedding tables.
//
// WriteCheckpoint writes <dir>/shard-<rank>.ckpt.tmp, fsyncs it, renames it
// over shard-<rank>.ckpt and fsyncs the directory: the file is always one
// whole checkpoint, the previous or the new.
//
// DecodeCheckpoint checks everything before it returns a state, so a bad
// file is never half-applied. Errors name the file and what is wrong:
//   DataLoss: truncated or trailing bytes, bad magic, an unknown format
//     version, a CRC mismatch, or a body that contradicts itself (sizes
//     that disagree with num_elements, workers out of range, keys out of
//     order).
//   FailedPrecondition: a checkpoint of another job.
//   InvalidArgument: this job's, but of another shard rank, ps mode,
//     optimizer or number of workers.
// ReadCheckpoint: NotFound when there is no checkpoint.
//
// Thread-safety: pure functions; concurrent writes to one directory and rank
// are the caller's to prevent.
#ifndef GRADSYNC_PS_PS_CHECKPOINT_H_
#define GRADSYNC_PS_PS_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "ps/embedding_service.h"
#include "ps/optimizer.h"
#include "ps/ps_key_table.h"

namespace gradsync::server {

constexpr uint32_t kCheckpointFormat = 2;
constexpr size_t kCheckpointHeaderBytes = 48;

struct ShardState {
  uint64_t job_id = 0;
  int32_t rank = 0;
  PsMode mode = PsMode::kSync;
  OptimizerKind optimizer = OptimizerKind::kNone;
  int32_t num_workers = 1;
  uint64_t journal_start = 0;
  // dead[i]: the workers key thread i had declared dead; thread i holds the
  // keys with PartitionKey(bucket, partition) % dead.size() == i.
  std::vector<std::set<int32_t>> dead;
  std::map<KeyTable::Key, KeyState> keys;  // held pulls are not saved
  std::vector<EmbeddingPartState> embeddings;
};

// What a checkpoint must match to be loaded.
struct CheckpointExpect {
  uint64_t job_id = 0;
  int32_t rank = 0;
  PsMode mode = PsMode::kSync;
  OptimizerKind optimizer = OptimizerKind::kNone;
  int32_t num_workers = 1;
};

std::string EncodeCheckpoint(const ShardState& state);
// `name` names the bytes in errors (the file's path).
StatusOr<ShardState> DecodeCheckpoint(const std::string& bytes, const CheckpointExpect& expect,
                                      const std::string& name);

std::string CheckpointPath(const std::string& dir, int32_t rank);
// Returns the bytes written.
StatusOr<uint64_t> WriteCheckpoint(const std::string& dir, const ShardState& state);
StatusOr<ShardState> ReadCheckpoint(const std::string& dir, const CheckpointExpect& expect);

// zlib's CRC-32, continued from `crc` (0 to start).
uint32_t Crc32(uint32_t crc, const void* data, size_t size);
// fsyncs the directory `dir`, so renames and new files in it are durable.
Status SyncDirectory(const std::string& dir);
// Reads the whole file at `path` into `bytes`, refusing a symbolic link
// (O_NOFOLLOW); the error names the path.
Status ReadWholeFile(const std::string& path, std::string* bytes);
// Creates `dir` (one level, mode 0700) unless it exists; an existing one
// must be a directory, not a symbolic link, owned by this user
// (common/private_files.h). Checkpoints and journal segments in it are
// created 0600 without following links.
Status MakeDirectory(const std::string& dir);

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_PS_CHECKPOINT_H_
