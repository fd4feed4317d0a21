// Collectives: the all-reduce path's backends (the CPU ring over ZeroMQ in
// ring.h, NCCL in nccl_collectives.h) behind one interface, so the
// Communicator does not care which one runs.
//
// Every rank of the job calls the same operations in the same order with the
// same OpTag, dtype and size. A backend checks this: when ranks disagree,
// every rank fails with an error naming the ranks and what differs, instead
// of hanging; when a rank stops taking part, the others fail by the deadline
// naming it.
//
// Errors: Aborted (ranks disagree, or a peer gave up), DeadlineExceeded (a
// rank stopped contributing; the message names it), Unavailable (a peer
// died), InvalidArgument (a bad call; nothing was sent). After any error the
// backend is broken: every later call returns the first error again.
//
// Thread-safety: one operation at a time; the Communicator's comm engine
// thread is the only caller. Buffers are host memory and must stay untouched
// until the call returns.
#ifndef GRADSYNC_CLIENT_COLLECTIVES_H_
#define GRADSYNC_CLIENT_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "common/time.h"
#include "gradsync/reduce_op.h"

namespace gradsync::client {

// Identifies one collective operation. Each field takes part in the
// fingerprint that ranks compare.
struct OpTag {
  uint64_t step = 0;        // training step
  uint32_t bucket = 0;      // bucket id
  uint64_t seq = 0;         // collectives issued so far on this communicator
  uint64_t names_hash = 0;  // hash of the names of the tensors in the bucket
  uint32_t epoch = 0;       // membership epoch (set by the backend that runs it)
};

class Collectives {
 public:
  virtual ~Collectives() = default;

  // "ring", "nccl": the value of the path label on metrics.
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Whether the data of its calls is best handed over as device memory
  // (NCCL: device memory is reduced in place, host memory staged through
  // the GPU); false: host memory.
  virtual bool takes_device_memory() const { return false; }

  // In place: data[0, count) becomes the sum (or average) over all ranks.
  // fp16 and bf16 are added in fp32 and rounded back once per addition.
  virtual Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
                           Deadline deadline) = 0;
  // Every rank contributes `bytes` bytes; out[r * bytes, (r + 1) * bytes)
  // receives rank r's. `out` holds world_size() * bytes and may not overlap
  // `in`.
  virtual Status AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                           Deadline deadline) = 0;
  // data[0, bytes) of rank `root` is copied to every rank's data.
  virtual Status Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                           Deadline deadline) = 0;
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_COLLECTIVES_H_
