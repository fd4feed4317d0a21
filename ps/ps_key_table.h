// KeyTable: the state and consistency rules of the parameter-server keys one
// shard thread owns. A key is (bucket, partition) (see common/placement.h).
// The table turns verified Push and Pull messages into Ack, Reply and Error
// messages; it does no I/O and takes no locks, so it is tested directly.
//
// Protocol (DataBody fields; header step and seq are echoed in answers, the
// header's epoch is the table's):
//   Push  round 0:   initial parameters (server-side optimizer only), taken
//                    from worker 0 only; base_version ignored.
//   Push  round r>0: a worker's gradient for round r, computed from the
//                    parameters of `base_version` (the key_version of the
//                    Reply it last got for this key): fp32, or compressed by the
//                    compressor its codec names (compression/wire_codec.h),
//                    which the table decompresses; the sum and the optimizer
//                    run in fp32 either way. Answered with an Ack (key_version
//                    = the key's version) once recorded; a push seen before is
//                    acknowledged again and not applied twice.
//   Pull  round 0:   answered with the initial parameters once worker 0
//                    pushed them.
//   Pull  round r:   answered with a Reply (payload: num_elements fp32,
//                    key_version: the version of those values) when the rules
//                    allow; held until then. A pull whose codec is "fp16" or
//                    "bf16" gets the values in that encoding (half the
//                    bytes; encoded once per result and codec).
//
// Rules:
//   sync: round r closes when every live worker pushed it; the gradients are
//         summed in rank order and divided by the number of contributors.
//         Without optimizer the Reply of round r is that average; with one,
//         the optimizer steps once and the Reply is the new parameters.
//         Pulls of round r wait for round r to close.
//   ssp:  rounds close as in sync and in round order; a pull of round r is
//         answered with the latest parameters once round r - s is closed, so
//         no worker runs more than s rounds ahead of the slowest live one
//         and every gradient is at most s versions stale when applied.
//         s = 0 gives the same bits as sync.
//   async: every push is applied at once (version + 1); a pull of round r is
//         answered with the latest parameters once the worker's push of
//         round r is applied. Staleness-aware lr divides lr by the staleness.
// Staleness of a push = key version when applied - the push's version.
//
// Keys: the job's plan on this shard is what worker 0 pushes. Every worker
// pushes the same keys (its buckets' partitions placed here), so worker 0's
// pushes name the plan's keys and fix their sizes, and with per-node
// identity no other member can push as worker 0. A key is created only by a
// push of worker 0 that is taken (the lowest live worker once worker 0 is
// declared dead; a message refused leaves no key behind), at most max_keys
// keys (ps_max_keys, the ceiling of a plan) of at most max_elements
// (partition_bytes) each. Any other message for a key that does not exist
// holds nothing and is answered Busy: another worker's push is counted in
// unplanned (it is ahead of worker 0, or outside the plan, and is sent
// again), a pull in early_pulls (a PS client pushes a key before it pulls
// it over the same connection, round 0 after worker 0's initial
// parameters). Neither counts in rejected: an honest worker meets them too.
//
// Membership epochs (elastic jobs, scheduler/membership.h): every message
// carries its epoch in its header's epoch. StartEpoch
// takes the next epoch's workers (re-ranked densely; a joiner last): rounds
// that did not close are dropped, with the pulls held for them (the workers
// redo them, numbered as before: round r is their step r), no worker is
// dead, and every closed round stays closed with its result kept, so a push
// of the new epoch for a round that closed before it is acknowledged and not
// applied again, and its pull answered with that result. A message of an
// earlier epoch is answered BadSequence, one of a later epoch Busy (the
// shard hears of an epoch before its workers, but on another connection);
// neither counts as rejected. async: each worker's rounds on a key go on
// from its first push of the epoch (counted as fresh: the parameters it
// computed from came from another worker), and round 0 of the epoch
// answers with the parameters as they are. ssp: the rounds between the last
// closed one and the epoch's first push (at most staleness + 1, their
// gradients gone with the epoch) are given up.
//
// Errors (answered with an Error naming the key, counted, state unchanged):
// sender not a worker of the job, or a message claiming a worker that does
// not come under that worker's identity (BadSender); a key placed on another shard
// (Mismatch); more elements than a partition holds, or a new key past
// max_keys (SizeMismatch / Oversized); dtype other than f32, a codec that is
// unknown, of another family than the message says, not the job's
// compressor (ps/job_codec.h), or (on a pull) not a reply encoding
// (WrongType); a size other than the key's, or compressed
// bytes of another size than the codec writes (SizeMismatch); compressed
// bytes that do not decode (Malformed); a round
// outside the plausible window, one already closed without the sender, or a
// gradient before the initial parameters
// (BadSequence); initial parameters from a worker other than 0 or to a shard
// without optimizer (BadSender / WrongType).
//
// Thread-safety: none; one thread owns a table.
#ifndef GRADSYNC_PS_PS_KEY_TABLE_H_
#define GRADSYNC_PS_PS_KEY_TABLE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/placement.h"
#include "common/status.h"
#include "common/time.h"
#include "compression/wire_codec.h"
#include "ps/job_codec.h"
#include "ps/optimizer.h"
#include "ps/ps_metrics.h"
#include "wire/message.h"
#include "wire/transport.h"

namespace gradsync::server {

enum class PsMode { kSync, kAsync, kSsp };
const char* PsModeName(PsMode mode);

struct PsRules {
  PsMode mode = PsMode::kSync;
  uint64_t staleness = 0;     // ssp: the bound s
  bool staleness_lr = false;  // async: lr / max(1, staleness)
  int32_t num_workers = 1;
  uint64_t async_window = 1024;  // async: rounds a push may run ahead
  uint64_t kept_results = 4;     // sync: closed rounds kept for late pulls
  // Placement: with num_shards > 0, a key that common/placement.h puts on
  // another shard than `shard` is refused.
  int32_t shard = 0;
  int32_t num_shards = 0;
  // Per-key and per-table bounds, checked before anything is allocated.
  uint64_t max_elements = kDefaultPartitionBytes / sizeof(float);  // partition_bytes / 4
  size_t max_keys = 65536;
  // By rank: the transport identity worker r's messages come under
  // (wire::PsClientIdentity of the identity it registered); a message
  // claiming worker r under another is refused. Empty, or "" for a rank:
  // not checked.
  std::vector<std::string> worker_identities;
  // The job's compressors (ps/job_codec.h): the compression setting (a spec
  // or name) and compression_overrides ("KEY=SPEC;..."); both empty: worker
  // 0's first compressed push of each bucket fixes the bucket's.
  std::string compression;
  std::string compression_overrides;

  // Whether `from` is the route of one of worker_identities: only those
  // peers get the job id on an Error (wire::AnswerAs). With no identity
  // given at all (not checked: any peer may speak as any worker) every
  // peer counts as one.
  bool IsJobWorker(const wire::Route& from) const;
};

// PsRules::IsJobWorker for the identities `worker_identities`.
bool IsJobWorker(const std::vector<std::string>& worker_identities, const wire::Route& from);

struct PsShardStats {
  uint64_t pushes_applied = 0;
  uint64_t duplicates = 0;     // pushes acknowledged again, not applied
  uint64_t early_pulls = 0;    // pulls of a key no push made, answered Busy
  uint64_t unplanned = 0;      // other workers' pushes of a key worker 0 did not push, Busy
  uint64_t other_epoch = 0;    // messages of another membership epoch (not in rejected)
  uint64_t rejected = 0;       // messages answered with an Error
  uint64_t rounds_closed = 0;  // sync/ssp
  uint64_t replies = 0;
  uint64_t max_staleness = 0;
  uint64_t staleness_sum = 0;  // over applied pushes
  // From the first to the last push of each closed round (sync/ssp): the
  // gradsync_server_straggler_wait_seconds observations, summed.
  double straggler_wait_s = 0;
};

// Counters shared by a shard's threads.
class ShardCounters {
 public:
  void Applied(uint64_t staleness);
  void Add(std::atomic<uint64_t>& counter) { counter.fetch_add(1, std::memory_order_relaxed); }
  void Duplicate();
  void EarlyPull();
  void Unplanned();
  void OtherEpoch();
  void Rejected(wire::ErrorCode code);
  // A round whose first push arrived at `first` and last at `last` was
  // closed now.
  void RoundClosed(SteadyTime first, SteadyTime last);
  PsShardStats Snapshot() const;

  // Where the counts are exported as well; null: nowhere. Set before the
  // shard serves.
  ShardMetrics* metrics = nullptr;

  std::atomic<uint64_t> duplicates{0}, early_pulls{0}, unplanned{0}, other_epoch{0}, rejected{0},
      rounds_closed{0}, replies{0};

 private:
  std::atomic<uint64_t> applied_{0}, max_staleness_{0}, staleness_sum_{0};
  std::atomic<uint64_t> straggler_wait_ns_{0};
};

// Rounds of one worker on one key already taken: every round <= floor, plus
// `above`.
struct TakenRounds {
  uint64_t floor = 0;
  std::set<uint64_t> above;

  bool Contains(uint64_t round) const { return round <= floor || above.count(round) > 0; }
  void Add(uint64_t round);
};

struct Contribution {
  std::vector<float> grad;
  uint64_t version = 0;
  // For the round metrics; not saved (a restored one arrived at restore).
  SteadyTime arrived = std::chrono::steady_clock::now();
};

// A closed round's values, shared with the answers that carry them. The
// vector itself is never made const (only the pointer is), so that the key
// table may take its buffer back once no answer holds it (KeyTable::Retire).
struct Snapshot {
  std::shared_ptr<const std::vector<float>> values;
  uint64_t version = 0;
};
inline Snapshot MakeSnapshot(std::vector<float> values, uint64_t version) {
  return Snapshot{std::make_shared<std::vector<float>>(std::move(values)), version};
}

struct HeldPull {
  wire::Route to;
  int32_t worker = 0;
  uint64_t round = 0;
  uint64_t step = 0;
  uint64_t seq = 0;
  std::string codec;  // the Reply's encoding; empty: fp32
};

// A result already encoded for a Reply, kept with the values it encodes.
struct EncodedReply {
  std::shared_ptr<const std::vector<float>> source;
  wire::Payload payload;
};

// Everything a shard knows about one key, in one place so it can be saved.
struct KeyState {
  uint64_t num_elements = 0;  // 0 until the first push
  bool initialised = false;   // optimizer: parameters set by round 0
  std::vector<float> params;
  OptimizerSlots slots;
  uint64_t version = 0;                                      // updates applied
  uint64_t closed = 0;                                       // sync/ssp: rounds 1..closed applied
  std::map<uint64_t, std::map<int32_t, Contribution>> open;  // round -> worker
  std::map<uint64_t, Snapshot> results;                      // sync/ssp, by round
  Snapshot latest;                                           // async
  std::map<int32_t, TakenRounds> taken;                      // per worker
  std::vector<HeldPull> held;
  std::map<std::string, EncodedReply> encoded;  // by codec; not saved
};

struct Outgoing {
  wire::Route to;
  wire::Message message;
};

class KeyTable {
 public:
  using Key = std::pair<uint32_t, uint32_t>;  // (bucket, partition)

  // `optimizer` may be null (aggregate only) and must outlive the table.
  // `codec`, the job's compressor shared by a shard's tables, must outlive
  // the table; null: the table keeps one of its own, of rules.compression.
  KeyTable(const PsRules& rules, const Optimizer* optimizer, wire::Sender self,
           ShardCounters* counters, JobCodec* codec = nullptr);

  // `h` is the verified header of `msg`, a Push or a Pull. Returns true when
  // a push was taken (recorded or applied): the state changed, and a replay
  // of this push (Replay) with the values it carried changes it again the
  // same way. When `decoded` is not null and the push taken was compressed,
  // it receives the decompressed values.
  bool Handle(const wire::Route& from, const wire::Header& h, const wire::Message& msg,
              std::vector<Outgoing>* out, std::vector<float>* decoded = nullptr);
  // Workers declared dead no longer hold rounds back.
  void SetDead(const std::set<int32_t>& dead, std::vector<Outgoing>* out);
  // Membership epoch `epoch` begins with `num_workers` workers, worker r's
  // messages under identities[r] (as PsRules::worker_identities; empty: not
  // checked). See the protocol above.
  void StartEpoch(uint32_t epoch, int32_t num_workers, std::vector<std::string> identities);

  const std::map<Key, KeyState>& keys() const { return keys_; }
  const std::set<int32_t>& dead() const { return dead_; }

  // Saving and restoring (ps/ps_checkpoint.h, ps/ps_journal.h).
  // The keys without their held pulls.
  std::map<Key, KeyState> SaveKeys() const;
  // Replaces every key; only before the table serves anyone.
  void RestoreKeys(std::map<Key, KeyState> keys);
  // Takes a push again as Handle took it, answers dropped; a push the table
  // already holds is a duplicate and changes nothing. DataLoss when the
  // table refuses it (the saved state and the push disagree).
  Status Replay(const Key& key, int32_t worker, uint64_t round, uint64_t version,
                const std::vector<float>& values);

 private:
  struct Request;  // one decoded Push or Pull
  // Whether `r` may touch the table: every check that needs no key state
  // beyond the key's size, done before anything is allocated; refuses it
  // otherwise.
  bool Admit(const Request& r, wire::Role role, const wire::DataBody& d, const wire::Message& msg,
             std::vector<Outgoing>* out);
  // Whether `r` is of the table's membership epoch; answers it otherwise.
  bool OfThisEpoch(const Request& r, std::vector<Outgoing>* out);
  // The rules of a Pull that need no key state; refuses it otherwise.
  bool AdmitPull(const Request& r, std::vector<Outgoing>* out);
  // The worker whose pushes make the plan's keys: the lowest live one.
  int32_t PlanAuthor() const;
  // Whether `r` is for a key of the plan (one that exists, or a push by
  // PlanAuthor); answers Busy and counts it otherwise.
  bool Planned(const Request& r, std::vector<Outgoing>* out);
  // Handles an admitted `r` (its header `h`, body `d`, message `msg`).
  void Take(const Request& r, const wire::Header& h, const wire::DataBody& d,
            const wire::Message& msg, std::vector<Outgoing>* out, std::vector<float>* decoded);
  // Erases `key` if nothing of it is kept (a message refused after Admit).
  void DropIfEmpty(const Key& key);
  void OnPush(const Request& r, std::vector<float> values, std::vector<Outgoing>* out);
  void OnInit(const Request& r, std::vector<float> values, std::vector<Outgoing>* out);
  void OnPull(const Request& r, std::vector<Outgoing>* out);
  // ssp, the epoch's first push of `key` (of round `round`): gives up the
  // rounds before it; false when it is further ahead than the rules allow.
  bool ResumeRounds(const Key& key, uint64_t round, KeyState& k);
  void PushRound(const Request& r, std::vector<float> values, std::vector<Outgoing>* out);
  // `first_of_epoch`: the worker's first push of the key in a later epoch.
  void PushAsync(const Request& r, std::vector<float> values, bool first_of_epoch,
                 std::vector<Outgoing>* out);
  // The payload of a Reply of `snap` in `codec` (empty: fp32).
  wire::Payload ReplyPayload(KeyState& k, const Snapshot& snap, const std::string& codec);
  void TryClose(KeyState& k);
  void Close(KeyState& k, uint64_t round);
  void AnswerHeld(const Key& key, KeyState& k, std::vector<Outgoing>* out);
  // The answer to `pull` if the rules allow one now.
  bool Answer(const Key& key, KeyState& k, const HeldPull& pull, std::vector<Outgoing>* out);
  bool Live(int32_t worker) const { return dead_.count(worker) == 0; }
  void Ack(const Request& r, const KeyState& k, std::vector<Outgoing>* out);
  void Reject(const Request& r, wire::ErrorCode code, const std::string& why,
              std::vector<Outgoing>* out);
  // An Error of `code` to `r`'s sender, not counted.
  void ErrorTo(const Request& r, wire::ErrorCode code, const std::string& why,
               std::vector<Outgoing>* out);
  // A buffer of `n` floats for a push to be decoded into (every element is
  // written by the decoder): a gradient already consumed, if one of that
  // size is kept, so that pushes neither allocate nor zero-fill.
  std::vector<float> TakeBuffer(size_t n);
  // Keeps a consumed gradient's buffer for TakeBuffer, up to kSpareBytes.
  void Recycle(std::vector<float> buffer);
  // A snapshot of `values` (copied into a kept buffer).
  Snapshot CopySnapshot(const std::vector<float>& values, uint64_t version);
  // Lets go of `snap`, keeping its buffer when no answer holds it any more.
  void Retire(Snapshot snap);

  PsRules rules_;  // num_workers and worker_identities change with the epoch
  uint32_t epoch_ = 0;
  std::set<Key> resumed_;  // ssp: keys pushed in this epoch
  const Optimizer* const optimizer_;
  bool took_ = false;  // the message being handled was a push taken
  const wire::Sender self_;
  ShardCounters* const counters_;
  std::set<int32_t> dead_;
  std::map<Key, KeyState> keys_;
  std::unique_ptr<JobCodec> own_codec_;  // when none was handed in
  JobCodec* const codec_;
  compression::PayloadDecoder decoder_;
  compression::CompressorRegistry reply_codecs_;
  std::map<std::string, std::unique_ptr<compression::Compressor>> reply_encoders_;
  static constexpr size_t kSpareBytes = size_t{32} << 20;
  std::vector<std::vector<float>> spare_;
  size_t spare_bytes_ = 0;
};

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_PS_KEY_TABLE_H_
