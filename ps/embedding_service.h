// EmbeddingService: what a shard's key thread does with embedding messages
// (EmbeddingPull, EmbeddingPush; wire/gradsync.fbs), for the tables that
// thread owns (a table is always on the same thread, chosen by its id).
//
// A table is created by the first message that names it, with that
// message's row width; a later message naming another width is refused
// (Mismatch). Rows live in EmbeddingTable (ps/embedding_table.h), under the
// shard's one MemoryBudget.
//
// Consistency, as for dense keys (PsRules::mode):
//   - sync (BSP): each push is of a round (its step). A round closes when
//     every live worker of the epoch has pushed it: the rows' gradients of
//     all its pushes are summed, divided by the number of workers that
//     pushed, and applied as one optimizer step. A pull of round r is
//     answered once round r - 1 has closed (held until then, never
//     blocking the thread). Rounds close in order; a push of a round that
//     closed (a resend) is acknowledged again and not applied twice.
//   - async: each push is applied as it comes, one optimizer step each;
//     pulls are answered at once.
//   - ssp (staleness s): pushes are applied as they come; a pull of round
//     r waits until every live worker has pushed round r - 1 - s.
// Pushes are acknowledged (EmbeddingAck) once taken into their round or
// applied. A worker that died no longer holds rounds back. A new
// membership epoch drops the rounds that had not closed (their workers
// push them again); messages of an earlier epoch are refused
// (BadSequence), of a later one answered Busy (sent again).
//
// Bad input answered with an Error and counted (never applied): a sender
// that is not the epoch's worker of its rank, a width of 0 or past
// max_dim, a width other than the table's, more tables than max_tables, a
// round too far ahead of the last closed one, a push past max_round_bytes. NaN or infinite gradient
// rows are refused by the table (counted), the rest of the push applied.
//
// Thread-safety: one thread at a time (its key thread).
#ifndef GRADSYNC_PS_EMBEDDING_SERVICE_H_
#define GRADSYNC_PS_EMBEDDING_SERVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ps/embedding_table.h"
#include "ps/ps_key_table.h"
#include "wire/message.h"
#include "wire/transport.h"

namespace gradsync::server {

struct EmbeddingServiceOptions {
  EmbeddingOptions table;
  PsMode mode = PsMode::kSync;
  uint64_t staleness = 0;  // ssp
  size_t max_tables = 64;  // per key thread
  // What the sync rounds that have not closed may hold of pushed ids and
  // gradients, over every table of the service: a push past it is refused.
  size_t max_round_bytes = size_t{256} << 20;
};

// The counters of the tables of one service, summed, and its own.
struct EmbeddingServiceStats {
  EmbeddingTableStats rows;
  uint64_t tables = 0;
  uint64_t refused = 0;     // messages answered with an Error
  uint64_t held_pulls = 0;  // pulls that waited for a round
  uint64_t rounds = 0;      // sync rounds closed
};

// One table partition of a service as Save copies it, for a checkpoint:
// its rows, and the sync rounds that had not closed (held pulls are not
// kept: workers send them again).
struct EmbeddingPartState {
  struct Part {
    int32_t rank = 0;
    uint32_t part = 0;
    std::vector<uint64_t> ids;
    std::vector<float> grads;  // ids.size() * dim
  };
  struct OpenRound {
    uint64_t round = 0;
    std::set<int32_t> pushed;  // ranks whose every part was taken
    std::vector<Part> parts;   // in (rank, part) order
  };
  uint32_t table = 0;
  uint32_t partition = 0;
  uint32_t dim = 0;
  RowOptimizerKind optimizer = RowOptimizerKind::kAdagrad;
  EmbeddingRowsState rows;
  uint64_t closed = 0;  // sync
  std::vector<OpenRound> open;
  // async and ssp: each rank's latest round and part applied.
  std::map<int32_t, std::pair<int64_t, uint32_t>> applied;
};

// A push a service took (into a round, or applied): what the journal keeps
// (ps/ps_journal.h), and what Replay takes back.
struct EmbeddingPushRecord {
  uint32_t table = 0;
  uint32_t partition = 0;
  uint32_t dim = 0;
  int32_t rank = 0;
  uint64_t round = 0;
  uint32_t part = 0;
  uint32_t parts = 1;
  uint64_t num_ids = 0;
  const uint64_t* ids = nullptr;  // num_ids
  const float* grads = nullptr;   // num_ids * dim
};

EmbeddingTableStats& operator+=(EmbeddingTableStats& sum, const EmbeddingTableStats& s);
EmbeddingServiceStats& operator+=(EmbeddingServiceStats& sum, const EmbeddingServiceStats& s);

class EmbeddingService {
 public:
  EmbeddingService(const EmbeddingServiceOptions& options, MemoryBudget* budget, wire::Sender self,
                   int32_t num_workers, std::vector<std::string> worker_identities);
  ~EmbeddingService();

  // Handles a verified EmbeddingPull or EmbeddingPush from `from`; answers
  // go into `out`. True when it took a push that changes the service's
  // state (new to its round, or applied): `msg`'s ids and rows are then
  // what the journal must keep.
  bool Handle(const wire::Route& from, const wire::Header& h, const wire::Message& msg,
              std::vector<Outgoing>* out);
  // Takes a journalled push again, as Handle took it, answering nothing; a
  // push the state holds already (it came before the checkpoint the state
  // was restored from) changes nothing. InvalidArgument for a push this
  // service could not have taken.
  Status Replay(const EmbeddingPushRecord& push);

  // Every table partition's state.
  std::vector<EmbeddingPartState> Save() const;
  // Adds a saved partition (one not held yet). InvalidArgument, adding
  // nothing, when it contradicts this service (another row optimizer, a
  // rank out of range, sizes that disagree).
  Status Restore(const EmbeddingPartState& saved);
  // The workers of rank in `dead` died: rounds close without them.
  void SetDead(const std::set<int32_t>& dead, std::vector<Outgoing>* out);
  // Membership epoch `epoch` begins (as KeyTable::StartEpoch).
  void StartEpoch(uint32_t epoch, int32_t num_workers, std::vector<std::string> identities);

  EmbeddingServiceStats stats() const;
  // The stats of each table by id (its partitions summed).
  std::map<uint32_t, EmbeddingTableStats> TableStats() const;

 private:
  struct Table;
  struct HeldPull {
    wire::Route from;
    uint64_t round = 0;
    uint64_t seq = 0;
    std::vector<uint64_t> ids;
  };

  void Refuse(const wire::Route& from, const wire::Header& h, wire::ErrorCode code,
              const std::string& why, std::vector<Outgoing>* out);
  // The table `id` of width `dim`, created if new; null (answered) when it
  // cannot be.
  Table* TableFor(const wire::Route& from, const wire::Header& h, std::vector<Outgoing>* out);
  void Pull(Table& t, const wire::Route& from, const wire::Header& h, const wire::Message& msg,
            std::vector<Outgoing>* out);
  bool Push(Table& t, const wire::Route& from, const wire::Header& h, const wire::Message& msg,
            std::vector<Outgoing>* out);
  // A table partition for `table`, `partition`, `dim`, created if new;
  // null with `why` when it cannot be.
  Table* Find(uint32_t table, uint32_t partition, uint32_t dim, wire::ErrorCode* code,
              std::string* why);
  // What Push and Replay do with one part of a push: Taken (state
  // changed), Duplicate (taken before), or Refused (`code`, `why`).
  enum class Take { kTaken, kDuplicate, kRefused };
  // `ids` (n u64s) and `grads` (n x width f32s) need no alignment.
  Take TakePush(Table& t, int32_t rank, uint64_t round, uint32_t part, uint32_t parts, size_t n,
                const void* ids, const void* grads, bool replay, wire::ErrorCode* code,
                std::string* why);
  // Whether a pull of `round` may be answered now.
  bool Ready(const Table& t, uint64_t round) const;
  void Answer(Table& t, const wire::Route& to, uint64_t round, uint64_t seq,
              const std::vector<uint64_t>& ids, std::vector<Outgoing>* out);
  // Closes the sync rounds that every live worker pushed, in order, and
  // answers the pulls that were waiting for them.
  void Progress(Table& t, std::vector<Outgoing>* out);
  // The lowest round every live worker has pushed (ssp).
  uint64_t PushedByAll(const Table& t) const;
  int32_t LiveWorkers() const;

  const EmbeddingServiceOptions options_;
  MemoryBudget* const budget_;
  const wire::Sender self_;
  uint32_t epoch_ = 0;
  int32_t num_workers_;
  std::vector<std::string> worker_identities_;
  std::set<int32_t> dead_;
  // By (table, partition): a shard holds its own partition of a table and,
  // with replicas, the copy of another shard's.
  std::map<std::pair<uint32_t, uint32_t>, std::unique_ptr<Table>> tables_;
  uint64_t refused_ = 0;
  uint64_t held_pulls_ = 0;
  uint64_t rounds_ = 0;
  size_t round_bytes_ = 0;  // held by open rounds
  // An async or ssp push's ids and gradients, copied out of its frames
  // for Apply; kept between pushes.
  std::vector<uint64_t> scratch_ids_;
  std::vector<float> scratch_grads_;
};

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_EMBEDDING_SERVICE_H_
