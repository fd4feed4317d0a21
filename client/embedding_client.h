// EmbeddingClient: a worker's side of the sparse embedding tables on the
// parameter-server shards (ps/embedding_service.h,
// docs/design/embeddings.md).
//
// Row `id` of every table lives in partition ShardOf(id, num_shards) (a
// hash of the id, so that consecutive ids spread), held by shard p and,
// with replicas = 2, copied on shard p + 1 (mod the shards).
//
// Replicas: a push goes to every live holder of its partition and is done
// once each acknowledged; a pull reads from the first live holder. A shard
// the job declares dead (dead_shards) is dropped at once: its pushes are
// done with the other holder's acknowledgement, its pulls are sent to the
// other holder; a partition with no live holder fails the call (Unavailable,
// naming its servers). Every holder takes every push, so each holds every
// acknowledged push, and their sync rounds sum in one order: the copies
// agree bit for bit. Pull de-duplicates the ids it is
// given, asks each shard for its unique ids only and scatters the rows back
// in the order asked; Push sums the gradient rows of each unique id and
// sends one row each. A push goes to every shard, empty where none of its
// ids falls, so that each shard's sync rounds close; a pull asks every live
// holder, for no rows where it reads none there, so that it returns only
// once each holder it will push to took the rounds before it (sync) or
// within the staleness (ssp): a worker whose ids miss a shard is paced by
// it as the others are. Messages stay within
// max_message_bytes: a shard's share is cut into parts (a push says how
// many, so that the shard closes the worker's round after the last).
//
// Every request is answered: rows (pull), an ack (push), or an Error. One
// that is not answered within resend_after is sent again (the shard applies
// a push once per round and part); Busy is sent again after resend_after.
//
// Errors: InvalidArgument (dim 0, or a row larger than a message; nothing
// sent), Aborted (a shard's Error, its message), DeadlineExceeded (naming the
// shards that did not answer), the health check's failure. After an Aborted
// or a transport failure every later call returns it again.
//
// Thread-safety: one call at a time.
#ifndef GRADSYNC_CLIENT_EMBEDDING_CLIENT_H_
#define GRADSYNC_CLIENT_EMBEDDING_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/id_dedup.h"
#include "common/status.h"
#include "common/time.h"
#include "prometheus/histogram.h"
#include "wire/message.h"
#include "wire/rejected_metrics.h"
#include "wire/transport.h"

namespace gradsync::client {

struct EmbeddingPeers {
  int rank = 0;
  int num_workers = 1;
  uint32_t epoch = 0;
  std::vector<std::string> shards;  // by rank, where each listens
  wire::Sender sender;
};

struct EmbeddingClientOptions {
  Millis resend_after{1000};
  // The largest payload of one message (the shards' partition_bytes).
  size_t max_message_bytes = size_t{4} << 20;
  // Holders of each partition: 1, or 2 (at most the shards).
  int replicas = 1;
  wire::RejectedMetrics* rejected = nullptr;  // refused answers by reason; may be null
  // With replicas: each replicated push message's replication lag, from
  // the first holder's acknowledgement to the last's; may be null.
  prometheus::Histogram* replication_lag = nullptr;
};

struct EmbeddingClientStats {
  uint64_t pulled_rows = 0;  // unique rows pulled
  uint64_t asked_rows = 0;   // rows asked for, duplicates included
  uint64_t pushed_rows = 0;  // unique gradient rows pushed
  uint64_t resent = 0;       // requests sent again
  uint64_t rejected = 0;     // answers refused: failed verification, or not the request's kind
};

class EmbeddingClient {
 public:
  using Health = std::function<Status()>;
  // The shards (by rank) the job declared dead.
  using DeadShards = std::function<std::vector<int>()>;

  // Connects `transport` (its own, not listening) to every shard.
  static StatusOr<std::unique_ptr<EmbeddingClient>> Create(
      std::unique_ptr<wire::Transport> transport, EmbeddingPeers peers,
      EmbeddingClientOptions options, Health health, DeadShards dead_shards);
  ~EmbeddingClient();

  // The shard of row `id` among `num_shards`.
  static int ShardOf(uint64_t id, int num_shards);

  // out[i * dim, (i + 1) * dim) = the row of ids[i] of `table` (width `dim`)
  // as of `round` (sync: after every push of the rounds before it).
  Status Pull(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n, uint64_t round,
              float* out, Deadline deadline);
  // Pushes the gradient rows grads[i * dim, (i + 1) * dim) of ids[i] for
  // `round`; returns once every shard acknowledged.
  Status Push(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n, const float* grads,
              uint64_t round, Deadline deadline);

  EmbeddingClientStats stats() const { return stats_; }
  uint32_t epoch() const { return peers_.epoch; }
  void Close();

 private:
  struct Request {
    int shard = 0;
    uint32_t partition = 0;
    wire::Message message;  // kept to send again
    uint64_t seq = 0;
    uint64_t ids = 0;   // a pull's: rows expected
    uint32_t part = 0;  // a push's part of its partition
    bool done = false;
    bool answered = false;  // done by an answer (not dropped with a dead shard)
    wire::Message answer;
    SteadyTime sent;
    SteadyTime answered_at;
    bool busy = false;
  };

  EmbeddingClient(std::unique_ptr<wire::Transport> transport, EmbeddingPeers peers,
                  EmbeddingClientOptions options, Health health, DeadShards dead_shards)
      : transport_(std::move(transport)),
        peers_(std::move(peers)),
        options_(options),
        health_(std::move(health)),
        dead_shards_(std::move(dead_shards)) {}
  // Holder k (0: the partition's own shard) of `partition`.
  int Holder(uint32_t partition, int k) const;
  // The first live holder of `partition` at or after holder k; -1 if none.
  int LiveHolder(uint32_t partition, int k, const std::vector<bool>& dead) const;
  // Counts an answer refused for `code`.
  void Rejected(wire::ErrorCode code);
  // Whether each shard is dead now.
  std::vector<bool> Dead() const;
  // Unavailable naming `partition`'s holders.
  Status Lost(uint32_t partition) const;
  // Drops requests to shards that died: a push is done (another holder
  // takes it), a pull goes to the next live holder. Returns how many
  // requests ended; an error when a partition has no live holder left.
  StatusOr<size_t> DropDead(std::vector<Request>& requests);
  // Sends every request and waits for all their answers.
  Status Exchange(std::vector<Request>& requests, Deadline deadline);
  void SendOne(Request& r);
  // Observes the replication lag of each part pushed to more than one
  // holder that answered.
  void RecordReplicationLag(const std::vector<Request>& requests) const;
  // The ids of one message at most, for rows of `dim`.
  size_t IdsPerMessage(uint32_t dim, bool rows) const;

  std::unique_ptr<wire::Transport> transport_;
  const EmbeddingPeers peers_;
  const EmbeddingClientOptions options_;
  const Health health_;
  const DeadShards dead_shards_;
  std::vector<wire::ConnId> conns_;  // by shard
  IdDedup dedup_;                    // Pull's and Push's scratch
  uint64_t next_seq_ = 1;
  Status failed_;
  EmbeddingClientStats stats_;
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_EMBEDDING_CLIENT_H_
