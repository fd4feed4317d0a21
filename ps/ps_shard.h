// PsShard: the parameter-server shard a gradsync_server --role=server runs.
//
// The shard reads every message of its node's data transport (and of its
// TCP stream listener, where it has one): one thread a transport receives
// and verifies (wire/validate.h), and a small fixed pool of key
// threads owns the keys, each key always on the same thread, so messages of
// a key are handled in arrival order without locks. The consistency rules,
// the protocol and the errors are those of KeyTable (ps/ps_key_table.h).
// No thread ever waits for a worker: pulls that must wait are held and
// answered later, so one slow worker does not stall the others.
//
// A message that fails verification is answered with an Error naming the
// problem (never an Error to an Error), counted in stats().rejected, and the
// shard keeps serving.
//
// Durability (checkpoint_dir set): the shard keeps every push it takes in a
// journal (ps/ps_journal.h) and answers nothing that depends on a push
// before the push is on disk, so an Ack means the push survives a crash.
// Checkpoint() writes every key's state (ps/ps_checkpoint.h) and drops
// the journal before it. Start() first restores: it loads
// <checkpoint_dir>/shard-<rank>.ckpt if it is of this job, replays the
// journal after it, writes a fresh checkpoint and only then serves. A shard
// restarted this way stands where the old process stood when it last
// answered; held pulls are lost and the workers send them again. Replayed
// pushes count in stats() as they did in the first process. A checkpoint of
// another job is not loaded (warning) and is replaced; a damaged checkpoint
// or journal fails Start with the error naming it.
//
// Settings (flags or GRADSYNC_ variables, as every setting):
//   ps_mode=sync|async|ssp (sync), staleness=s (ssp; 0), staleness_lr
//   (async; false), ps_threads (2), optimizer=none|sgd|momentum|adam (none),
//   lr (0.01), momentum (0.9), beta1 (0.9), beta2 (0.999), eps (1e-8),
//   checkpoint_dir (empty: no checkpoints and no journal), partition_bytes
//   (4 MiB: the largest partition a push may carry; workers use the same
//   setting or a smaller one), ps_max_keys (65536 keys per shard thread),
//   ps_max_queued_bytes_per_peer (64 MiB: what one peer's messages may hold
//   of the bytes waiting for the key threads; past it they are answered
//   with Busy and counted, and the PS client sends them again),
//   compression and compression_overrides (the job's compressors, as the
//   workers' settings: a compressed push naming another is refused; each
//   bucket keeps one, ps/job_codec.h; unset: worker 0's first compressed
//   push of a bucket fixes the bucket's).
//   async and ssp need a server-side optimizer.
//
// Thread-safety: all methods are thread-safe.
#ifndef GRADSYNC_PS_PS_SHARD_H_
#define GRADSYNC_PS_PS_SHARD_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/blocking_queue.h"
#include "common/config.h"
#include "common/refusal_log.h"
#include "common/status.h"
#include "common/time.h"
#include "ps/embedding_service.h"
#include "ps/optimizer.h"
#include "ps/ps_checkpoint.h"
#include "ps/ps_journal.h"
#include "ps/ps_key_table.h"
#include "wire/transport.h"
#include "wire/validate.h"

namespace gradsync::server {

struct PsShardOptions {
  PsRules rules;  // rules.num_workers comes from the job, not the config
  OptimizerOptions optimizer;
  int threads = 2;
  Millis send_timeout{5000};
  std::string checkpoint_dir;                   // empty: no checkpoints, no journal
  size_t max_queued_bytes = size_t{256} << 20;  // received, waiting for the key threads
  // Of those, what one peer may hold: past it (and once it holds anything)
  // its messages are answered with Busy and not taken, so one peer that
  // floods the shard cannot hold back the others'. PS clients send again.
  size_t max_queued_bytes_per_peer = size_t{64} << 20;
  // Sparse embedding tables (ps/embedding_service.h): their settings, and
  // the bytes the rows of every table of the shard may take
  // (embedding_max_bytes).
  EmbeddingServiceOptions embeddings;
  size_t embedding_max_bytes = size_t{1} << 30;
  // Tests: runs on a key thread before each message it takes off its queue.
  std::function<void()> before_handle;
  ShardMetrics* metrics = nullptr;  // where to export; may be null; outlives the shard

  // Reads the settings listed above; InvalidArgument naming a bad one.
  static StatusOr<PsShardOptions> FromConfig(const Config& config);
};

// Checkpoints written by one shard, for its metrics.
struct CheckpointStats {
  uint64_t written = 0;
  uint64_t failed = 0;
  double last_duration_seconds = 0;      // of the last one, written or failed
  double duration_sum_seconds = 0;       // over the written ones
  double last_success_unix_seconds = 0;  // wall time; 0 until one is written
  uint64_t last_bytes = 0;
  uint64_t last_keys = 0;
};

// The key thread (of `threads`) that holds dense key `key`, and the one
// that holds every partition of embedding table `table`: messages go to
// it, and a checkpoint's state is loaded into it.
size_t ThreadOfKey(const KeyTable::Key& key, size_t threads);
size_t ThreadOfTable(uint32_t table, size_t threads);

class PsShard {
 public:
  // Restores from options.checkpoint_dir (if set) and starts serving on
  // `transport`, which must be listening, must outlive the shard, and is
  // read by the shard only. `self` names the shard in headers; its rank and
  // job id name the checkpoint.
  static StatusOr<std::unique_ptr<PsShard>> Start(wire::Transport* transport,
                                                  const PsShardOptions& options, wire::Sender self);
  ~PsShard();  // Shutdown()

  // The worker of rank `rank` was declared dead: rounds stop waiting for it.
  void WorkerDied(int32_t rank);
  // Membership epoch `epoch` of an elastic job begins: `num_workers`
  // workers, worker r's parameter-server client under identities[r]
  // (KeyTable::StartEpoch); earlier deaths are forgotten (the ranks are new).
  // Not journalled: a shard restarted from its checkpoint after a change
  // knows the first epoch's workers only.
  void StartEpoch(uint32_t epoch, int32_t num_workers, std::vector<std::string> identities);
  PsShardStats stats() const { return counters_.Snapshot(); }
  // The embedding tables' counters, summed over the key threads (taken on
  // them between messages). Cancelled after Shutdown.
  StatusOr<EmbeddingServiceStats> EmbeddingStats();
  // The rows' bytes of every embedding table (under embedding_max_bytes).
  size_t embedding_bytes() const { return embedding_budget_.used(); }
  // Writes a checkpoint of every key now and blocks until it is durable; the
  // key threads pause only to copy their keys. One at a time.
  // FailedPrecondition without checkpoint_dir, Cancelled after Shutdown.
  Status Checkpoint();
  CheckpointStats checkpoint_stats() const;
  // A copy of every key as a checkpoint would save it (no held pulls),
  // taken on the key threads between messages. Cancelled after Shutdown.
  StatusOr<std::map<KeyTable::Key, KeyState>> Keys();
  // OK unless the journal failed; then the shard answers nothing more.
  Status health() const;
  // Stops and joins the threads (after a checkpoint in progress); held pulls
  // are dropped. Idempotent.
  void Shutdown();

 private:
  struct KeyThread;
  struct Work {
    std::unique_ptr<wire::Incoming> in;  // null: a visit, or a wake-up after a death
    size_t bytes = 0;                    // of `in`, counted in queued_bytes_ and peer_bytes_
    std::function<void(const KeyThread&)> visit;  // runs on the key's thread
  };
  struct KeyThread {
    KeyThread(int i, const PsRules& rules, const Optimizer* optimizer, wire::Sender self,
              ShardCounters* counters, JobCodec* codec, const EmbeddingServiceOptions& embedding,
              MemoryBudget* budget)
        : index(i),
          table(rules, optimizer, self, counters, codec),
          embeddings(embedding, budget, self, rules.num_workers, rules.worker_identities),
          queue(4096) {}
    const int index;
    KeyTable table;
    EmbeddingService embeddings;  // the embedding tables whose id falls on this thread
    BlockingQueue<Work> queue;
    std::thread thread;
    uint64_t dead_seen = 0;   // the shard's dead_epoch_ this table has taken
    uint32_t epoch_seen = 0;  // the membership epoch this table is in
  };

  PsShard(wire::Transport* transport, const PsShardOptions& options, wire::Sender self);
  Status Restore();
  Status Load(ShardState saved);
  Status ApplyRecord(const JournalRecord& record);
  ShardState StateHeader(uint64_t journal_start) const;
  StatusOr<ShardState> TakeSnapshot(uint64_t journal_start);
  Status Save(const ShardState& state);
  // Records a checkpoint's outcome in checkpoint_stats_; returns `s`.
  Status Finish(Status s, SteadyTime began);
  void ReceiveLoop();
  void Dispatch(wire::Incoming in);
  void KeyLoop(KeyThread* t);
  // Takes `bytes` from `peer` (the identity of its inbound route; a peer's
  // lanes share one share) into the key threads' queues, waiting for room;
  // false (nothing taken) when that peer holds its share already.
  bool Admit(const std::string& peer, size_t bytes);
  // A message of `bytes` from `peer` left the key threads' queues.
  void Dequeued(const std::string& peer, size_t bytes);
  // Gives `t`'s table the dead workers it has not taken yet (journalled).
  void CatchUpDeaths(KeyThread* t);
  // Gives `t`'s table the membership epoch it is not in yet.
  void CatchUpEpoch(KeyThread* t);
  void Emit(std::optional<JournalRecord> record, std::vector<Outgoing> out);
  void Send(const wire::Route& to, wire::Message msg);
  // This shard as the sender of an answer to `to`: with the job id only
  // for the job's workers.
  wire::Sender AnswerAs(const wire::Route& to) const;

  wire::Transport* const transport_;
  const PsShardOptions options_;
  const wire::Sender self_;
  std::unique_ptr<Optimizer> optimizer_;
  wire::Policy policy_;
  ShardCounters counters_;
  JobCodec codec_;                 // the job's compressor, shared by the key tables
  MemoryBudget embedding_budget_;  // every embedding table's rows
  std::vector<std::unique_ptr<KeyThread>> key_threads_;
  std::thread receiver_;
  std::atomic<bool> stop_{false};
  // Replies that could not be sent, logged a few per peer and reason.
  std::shared_ptr<RefusalLog> reply_failures_ = std::make_shared<RefusalLog>();
  std::atomic<int64_t> queued_{0};  // messages in the key threads' queues
  std::mutex bytes_mu_;
  std::condition_variable room_;
  size_t queued_bytes_ = 0;  // their bytes; guarded by bytes_mu_
  // Of those, per peer with any queued (by route identity: the shard is
  // only listened to); guarded by bytes_mu_.
  std::map<std::string, size_t> peer_bytes_;

  std::unique_ptr<Journal> journal_;  // null without checkpoint_dir

  mutable std::mutex mu_;
  std::set<int32_t> dead_;  // guarded by mu_
  // Changes of dead_ since start: written under mu_, read without it by the
  // key threads' check before every message.
  std::atomic<uint64_t> dead_epoch_{0};
  bool shut_down_ = false;  // guarded by mu_
  // The membership epoch, its number of workers and their identities
  // (PsRules::worker_identities); guarded by mu_.
  uint32_t epoch_ = 0;
  std::atomic<uint32_t> started_epoch_{0};  // epoch_, read without mu_
  int32_t num_workers_ = 0;
  std::vector<std::string> worker_identities_;

  std::mutex checkpoint_mu_;  // held by the checkpoint being written
  mutable std::mutex stats_mu_;
  CheckpointStats checkpoint_stats_;  // guarded by stats_mu_
};

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_PS_SHARD_H_
