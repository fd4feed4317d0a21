// PsShard: the parameter-server shard a gradsync_server --role=server runs.
//
// The shard reads every message of its node's data transport: one thread
// receives and verifies (wire/validate.h), and a small fixed pool of key
// threads owns the keys, each key always on the same thread, so messages of
// a key are handled in arrival order without locks. The consistency rules,
// the protocol and the errors are those of KeyTable (server/ps_key_table.h).
// No thread ever waits for a worker: pulls that must wait are held and
// answered later, so one slow worker does not stall the others.
//
// A message that fails verification is answered with an Error naming the
// problem (never an Error to an Error), counted in stats().rejected, and the
// shard keeps serving.
//
// Settings (flags or GRADSYNC_ variables, as every setting):
//   ps_mode=sync|async|ssp (sync), staleness=s (ssp; 0), staleness_lr
//   (async; false), ps_threads (2), optimizer=none|sgd|momentum|adam (none),
//   lr (0.01), momentum (0.9), beta1 (0.9), beta2 (0.999), eps (1e-8).
//   async and ssp need a server-side optimizer.
//
// Thread-safety: all methods are thread-safe.
#ifndef GRADSYNC_SERVER_PS_SHARD_H_
#define GRADSYNC_SERVER_PS_SHARD_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/blocking_queue.h"
#include "common/config.h"
#include "common/status.h"
#include "common/time.h"
#include "server/optimizer.h"
#include "server/ps_key_table.h"
#include "wire/transport.h"
#include "wire/validate.h"

namespace gradsync::server {

struct PsShardOptions {
  PsRules rules;  // rules.num_workers comes from the job, not the config
  OptimizerOptions optimizer;
  int threads = 2;
  Millis send_timeout{5000};

  // Reads the settings listed above; InvalidArgument naming a bad one.
  static StatusOr<PsShardOptions> FromConfig(const Config& config);
};

class PsShard {
 public:
  // Starts serving on `transport`, which must be listening, must outlive the
  // shard, and is read by the shard only. `self` names the shard in headers.
  static StatusOr<std::unique_ptr<PsShard>> Start(wire::Transport* transport,
                                                  const PsShardOptions& options,
                                                  wire::Sender self);
  ~PsShard();  // Shutdown()

  // The worker of rank `rank` was declared dead: rounds stop waiting for it.
  void WorkerDied(int32_t rank);
  PsShardStats stats() const { return counters_.Snapshot(); }
  // Stops and joins the threads; held pulls are dropped. Idempotent.
  void Shutdown();

 private:
  struct Work {
    std::unique_ptr<wire::Incoming> in;  // null: a membership change
    std::set<int32_t> dead;
  };
  struct KeyThread;

  PsShard(wire::Transport* transport, const PsShardOptions& options, wire::Sender self);
  void ReceiveLoop();
  void Dispatch(wire::Incoming in);
  void KeyLoop(KeyThread* t);
  void Send(const wire::Route& to, wire::Message msg);

  wire::Transport* const transport_;
  const PsShardOptions options_;
  const wire::Sender self_;
  std::unique_ptr<Optimizer> optimizer_;
  wire::Policy policy_;
  ShardCounters counters_;
  std::vector<std::unique_ptr<KeyThread>> key_threads_;
  std::thread receiver_;
  std::atomic<bool> stop_{false};

  std::mutex mu_;
  std::set<int32_t> dead_;  // guarded by mu_
  bool shut_down_ = false;  // guarded by mu_
};

}  // namespace gradsync::server

#endif  // GRADSYNC_SERVER_PS_SHARD_H_
