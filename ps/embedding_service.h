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

EmbeddingTableStats& operator+=(EmbeddingTableStats& sum, const EmbeddingTableStats& s);
EmbeddingServiceStats& operator+=(EmbeddingServiceStats& sum, const EmbeddingServiceStats& s);

class EmbeddingService {
 public:
  EmbeddingService(const EmbeddingServiceOptions& options, MemoryBudget* budget, wire::Sender self,
                   int32_t num_workers, std::vector<std::string> worker_identities);
  ~EmbeddingService();

  // Handles a verified EmbeddingPull or EmbeddingPush from `from`; answers
  // go into `out`.
  void Handle(const wire::Route& from, const wire::Header& h, const wire::Message& msg,
              std::vector<Outgoing>* out);
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
  void Push(Table& t, const wire::Route& from, const wire::Header& h, const wire::Message& msg,
            std::vector<Outgoing>* out);
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
};

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_EMBEDDING_SERVICE_H_
