// PsClient: the parameter-server path of the Communicator (path=ps): a
// bucket's push and pull (PushPull), which the PS backend
// (client/sync_backend.cc) calls for each bucket. It is no Collectives: the
// job's direct collectives, broadcasts and all-gathers go round the ring.
//
// PushPull(bucket) cuts the bucket into partitions of
// `partition_bytes` (common/placement.h), pushes each partition to its shard
// (payload frames point into the caller's buffer: zero-copy), pulls the
// round's result back and writes it into the buffer:
//   - optimizer=none (the shards aggregate only; ps_mode=sync): the buffer
//     receives the average of every live worker's gradient for the round,
//     exactly what the all-reduce path gives.
//   - a server-side optimizer (optimizer=sgd|momentum|adam): the buffer
//     receives the new parameters, not a gradient. The first PushPull of
//     each bucket initialises the shards: its buffer must hold the initial
//     parameters; worker 0 pushes them (round 0) and every worker receives
//     worker 0's values back (a broadcast). Every later PushPull of the
//     bucket pushes a gradient computed from the parameters it last received.
// Only f32 buckets travel to the shards.
//
// Compression (SetCompression): each partition of a gradient push is
// compressed on its own, by a compressor instance of its own (so with its own
// error-feedback residual), and the shard decompresses it and aggregates in
// fp32 (compression/wire_codec.h). Top-k shares its budget over the bucket:
// the partitions together keep the bucket's k largest magnitudes, not k / P
// each (except with a partition encoder, which keeps each partition's own). Initial parameters
// (round 0) travel uncompressed. A resent push resends the same bytes: it is compressed once. With
// reply_codec "fp16" or "bf16" the shards answer in that encoding (half the pull bytes; the values
// are rounded, the shards keep fp32).
//
// Membership epochs (elastic jobs): a client serves one epoch (PsPeers::epoch),
// whose number its messages carry in their header's epoch.
// In a later epoch than 0 nothing is pushed before ResumeAt names the step
// the job goes on from: bucket rounds continue from it (round r is step r),
// so a round the shards closed before the change is not applied again.
//
// Every push carries (worker, bucket, partition, round, seq) so the shard
// applies it once; a push or pull that is not answered within `resend_after`
// is sent again, the wait doubling up to 8 x resend_after. A shard that
// holds its share of this worker's messages already answers Busy: the
// message is sent again `resend_after` later, and the call goes on. Every received
// message is verified; a bad one is answered with an Error and counted.
//
// Errors: InvalidArgument (a dtype other than f32, a bucket whose size
// changed; nothing was sent), Aborted (a shard answered with an Error; the
// message is the shard's), DeadlineExceeded (naming the shards that did not
// answer), Unavailable (the health check failed). After an error every later
// call returns it again.
//
// Settings: partition_bytes (4 MiB), optimizer (none), ps_resend_ms (1000),
// ps_reply_compression (none | fp16 | bf16; none).
//
// Thread-safety: as Collectives, one operation at a time.
#ifndef GRADSYNC_CLIENT_PS_CLIENT_H_
#define GRADSYNC_CLIENT_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/collectives.h"
#include "common/config.h"
#include "common/status.h"
#include "common/time.h"
#include "compression/registry.h"
#include "compression/wire_codec.h"
#include "wire/message.h"
#include "wire/rejected_metrics.h"
#include "wire/transport.h"
#include "wire/validate.h"

namespace gradsync::client {

struct PsClientOptions {
  size_t partition_bytes = size_t{4} << 20;
  bool server_optimizer = false;  // optimizer != none
  Millis resend_after{1000};
  Millis poll_interval{20};                   // how often a waiting call runs `health`
  wire::RejectedMetrics* rejected = nullptr;  // refused messages by reason; may be null
  std::string reply_codec;                    // "", "fp16" or "bf16"
  // Connections to each shard (wire::Transport::ConnectLane): a bucket's
  // partitions for one shard take them in turn, a partition always the
  // same one (its pushes and pulls keep their order). The setting ps_lanes
  // (default 2).
  int lanes = 1;

  // Reads partition_bytes, optimizer, ps_resend_ms, ps_reply_compression
  // and ps_lanes.
  static StatusOr<PsClientOptions> FromConfig(const Config& config);
};

struct PsPeers {
  int rank = 0;
  int world_size = 1;
  uint32_t epoch = 0;                         // the membership epoch
  std::vector<std::string> server_endpoints;  // data endpoint of shard i at [i]
  wire::Sender sender;                        // this worker, as headers name it
};

struct PsClientStats {
  uint64_t pushes = 0;
  uint64_t pulls = 0;
  uint64_t resent = 0;    // pushes and pulls sent again after a timeout
  uint64_t rejected = 0;  // received messages refused, replies that do not decode included
  uint64_t stray = 0;     // answers to an earlier round, ignored
  uint64_t busy = 0;      // messages a shard did not take yet (Busy): sent again
};

class PsClient {
 public:
  using Health = std::function<Status()>;

  // Connects `transport` (this client's own, read by nobody else) to every
  // shard. `health` may be null.
  static StatusOr<std::unique_ptr<PsClient>> Create(std::unique_ptr<wire::Transport> transport,
                                                    const PsPeers& peers,
                                                    const PsClientOptions& options, Health health);
  ~PsClient();  // shuts the transport down

  const char* name() const { return "ps"; }
  int rank() const { return peers_.rank; }
  int world_size() const { return peers_.world_size; }

  // Bucket `tag.bucket`'s round: pushes `data` (count f32: a gradient, or
  // the initial parameters in the first round with a server-side optimizer)
  // and writes the round's result from the shards into it (above).
  // InvalidArgument for a dtype other than f32 or a bucket whose size
  // changed.
  Status PushPull(void* data, size_t count, DType dtype, const OpTag& tag, Deadline deadline);

  PsClientStats stats() const;

  // In an epoch later than 0: every worker of the epoch goes on from step
  // `completed` (Communicator::AgreeOnStep): each bucket's first round is
  // completed + 1 (round 0, the shards' initial parameters, when completed
  // is 0 and the shards step), from the parameters of version `completed`.
  // Before the first PushPull of the epoch; ignored in epoch 0.
  void ResumeAt(uint64_t completed);
  // Shuts the transport down (its same-host links too); later calls fail.
  void Close();

  // Compresses the gradient pushes of `bucket` with `spec` (see
  // compression/registry.h; "none": uncompressed). Before the bucket's
  // first PushPull. InvalidArgument for a spec the shards cannot decode.
  Status SetCompression(uint32_t bucket, const std::string& spec);

  // Compresses partition `partition` of bucket `bucket` (its `count`
  // elements from element `offset` of the bucket) with the bucket's spec and
  // context `ctx` into one payload, the bytes the host encoder would make.
  using PartitionEncoder =
      std::function<StatusOr<wire::Payload>(uint32_t bucket, uint32_t partition, size_t offset,
                                            size_t count, const compression::CompressContext& ctx)>;
  // Compressed pushes are made by `encoder` (the CUDA gradients' device
  // compression) instead of on the host, except those of a top-k bucket of
  // several partitions (its budget is shared over the bucket: chosen here,
  // so that both make the same selection). Before the first PushPull.
  void SetPartitionEncoder(PartitionEncoder encoder) { partition_encoder_ = std::move(encoder); }
  // Whether the next PushPull of `bucket` (of `count` elements) reads the
  // caller's buffer to push: uncompressed, the round that initialises the
  // shards, or a top-k whose budget is shared over several partitions
  // (chosen on the whole bucket, here, not by the partition encoder).
  // Otherwise every push comes from the partition encoder and the buffer
  // only receives the result.
  bool PushesRaw(uint32_t bucket, size_t count) const;

  // The payload bytes the last PushPull pushed and received.
  struct Traffic {
    size_t sent = 0;
    size_t received = 0;
  };
  Traffic last_traffic() const { return last_traffic_; }

 private:
  struct BucketState {
    size_t count = 0;
    uint64_t next_round = 0;
    std::vector<uint64_t> versions;  // per partition: of the last Reply
    std::string spec = "none";
    // Per partition; empty: uncompressed.
    std::vector<std::unique_ptr<compression::PayloadEncoder>> encoders;
    std::vector<uint32_t> keys;  // scratch of a top-k budget shared over partitions
    bool shared_budget = false;  // the spec's top-k shares its budget over partitions
  };
  class Exchange;  // one PushPull in flight (ps_client.cc)

  PsClient(std::unique_ptr<wire::Transport> transport, const PsPeers& peers,
           const PsClientOptions& options, Health health);
  // The round of a bucket's first PushPull in this client.
  uint64_t FirstRound() const;
  // A received message refused: counted, and exported by reason.
  void CountRejected(wire::ErrorCode code);

  std::unique_ptr<wire::Transport> transport_;
  const PsPeers peers_;
  const PsClientOptions options_;
  const Health health_;
  wire::Policy policy_;
  std::vector<std::vector<wire::ConnId>> conns_;  // per shard, per lane
  std::map<uint32_t, BucketState> buckets_;
  compression::CompressorRegistry registry_;
  compression::PayloadDecoder decoder_;
  size_t reply_elem_bytes_ = 4;  // of a reply element in reply_codec
  Traffic last_traffic_;
  PartitionEncoder partition_encoder_;
  uint64_t seq_ = 0;
  std::optional<uint64_t> resume_at_;  // ResumeAt's step
  Status broken_;
  std::atomic<uint64_t> pushes_{0}, pulls_{0}, resent_{0}, rejected_{0}, stray_{0}, busy_{0};
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_PS_CLIENT_H_
