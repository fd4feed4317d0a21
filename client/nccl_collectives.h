// NcclCollectives: the Collectives of collectives.h over NCCL (one GPU per
// rank). Only built with --config=cuda; code that must also build without
// CUDA goes through MakeNcclCollectives in nccl_factory.h.
//
// Device buffers (CUDA device or managed memory) are reduced, gathered or
// broadcast by NCCL in place, with no copy. Host buffers are copied into a
// device staging buffer (grown as needed, never shrunk) on the
// communicator's stream, reduced or gathered there, and copied back. A call
// returns once the result is in the caller's buffer.
//
// Before every operation the ranks all-gather a record of what they are
// about to do (operation, OpTag, dtype, count, reduce op or root, and a 64-bit
// fingerprint of those) and compare the fingerprints. When a rank's differs
// from rank 0's, every rank fails the call with Aborted naming the differing
// ranks, the fields in which they differ, and this rank's own call; since all
// ranks see the same gathered records, they all fail together and no payload
// is exchanged.
//
// Errors, thread-safety and buffer rules are those of Collectives; calls on a
// rank that never arrives fail by the deadline (DeadlineExceeded naming the
// NCCL operation), and a peer the job reports dead fails the wait at once
// (Unavailable) when built from a Session. After any error every later call
// returns the first error again.
#ifndef GRADSYNC_CLIENT_NCCL_COLLECTIVES_H_
#define GRADSYNC_CLIENT_NCCL_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/collectives.h"
#include "client/nccl_comm.h"
#include "client/session.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/time.h"

namespace gradsync::client {

enum class NcclOpKind : uint64_t { kAllReduce = 1, kAllGather = 2, kBroadcast = 3 };

// What one rank is about to do; all-gathered before every operation. Plain
// 64-bit fields so that the record is the same bytes on every rank.
struct NcclCallRecord {
  uint64_t fingerprint = 0;  // FingerprintOf(the fields below)
  uint64_t op = 0;           // NcclOpKind
  uint64_t step = 0;
  uint64_t bucket = 0;
  uint64_t seq = 0;
  uint64_t names_hash = 0;
  uint64_t dtype = 0;  // DType; u8 for AllGather and Broadcast
  uint64_t count = 0;  // elements (AllReduce) or bytes (AllGather, Broadcast)
  uint64_t arg = 0;    // ReduceOp for AllReduce, root for Broadcast, 0 otherwise
};

// The record of a call, fingerprint filled in.
NcclCallRecord MakeCallRecord(NcclOpKind op, const OpTag& tag, DType dtype, uint64_t count,
                              uint64_t arg);
// A 64-bit hash of every field but the fingerprint.
uint64_t FingerprintOf(const NcclCallRecord& record);
// "AllReduce step=5 bucket=2 seq=7 names_hash=0x1f dtype=f32 count=4096
// op=sum".
std::string DescribeCall(const NcclCallRecord& record);
// OK when every record's fingerprint equals records[0]'s; otherwise Aborted
// naming the ranks that differ from rank 0 and how, and the call of
// records[rank] (this rank).
Status CompareCallRecords(const std::vector<NcclCallRecord>& records, int rank);

class NcclCollectives : public Collectives {
 public:
  // Wraps a communicator that has already been created.
  static StatusOr<std::unique_ptr<NcclCollectives>> Create(std::unique_ptr<kernels::NcclComm> comm);
  // Joins the NCCL communicator named by `unique_id` (from
  // kernels::NcclComm::MakeUniqueId on one rank) as `rank` of `world_size`,
  // on CUDA device `device`. For tests and callers without a Session.
  static StatusOr<std::unique_ptr<NcclCollectives>> Connect(const std::vector<uint8_t>& unique_id,
                                                            int rank, int world_size, int device,
                                                            Deadline deadline,
                                                            kernels::NcclCommOptions options = {});
  // Rank 0 of the session makes the unique id, Session::ShareNcclId hands it
  // to every worker, and each joins with its session rank on `device`.
  // Waits are cut short when the session reports the job failed or a worker
  // died. `session` must outlive the result.
  static StatusOr<std::unique_ptr<NcclCollectives>> Join(Session* session, int device,
                                                         Deadline deadline);
  ~NcclCollectives() override;

  const char* name() const override { return "nccl"; }
  bool takes_device_memory() const override { return true; }
  int rank() const override { return comm_->rank(); }
  int world_size() const override { return comm_->world_size(); }

  Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
                   Deadline deadline) override;
  Status AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                   Deadline deadline) override;
  Status Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                   Deadline deadline) override;

  // Bytes of device staging memory held now.
  size_t staging_bytes() const { return staging_bytes_; }

 private:
  explicit NcclCollectives(std::unique_ptr<kernels::NcclComm> comm);

  Status DoAllReduce(void* data, size_t count, DType dtype, ReduceOp op, const OpTag& tag,
                     Deadline deadline);
  Status DoAllGather(const void* in, size_t bytes, void* out, const OpTag& tag, Deadline deadline);
  Status DoBroadcast(void* data, size_t bytes, int root, const OpTag& tag, Deadline deadline);
  // True for CUDA device or managed memory.
  static bool OnDevice(const void* p);
  // Queues the all-gather of `mine` and the copy of every rank's record to
  // the host, ahead of the call on the same stream; nothing waits for it.
  Status PostCall(const NcclCallRecord& mine, Deadline deadline);
  // After the call (whose outcome is `call`): compares the records, which
  // the call's own wait brought back, and returns the mismatch, which
  // explains whatever the call did, or else `call`.
  Status CheckCall(Status call, Deadline deadline);
  // Selects the comm's device for this thread; fails on a recorded error.
  Status Begin();
  Status Reserve(size_t bytes);
  Status CopyIn(void* device_dst, const void* host_src, size_t bytes);
  // Copies device memory back to the host and waits for the copy.
  Status CopyOut(void* host_dst, const void* device_src, size_t bytes, Deadline deadline);
  // Keeps the first error; returns it for every later call.
  Status Record(Status status);

  std::unique_ptr<kernels::NcclComm> comm_;
  void* staging_ = nullptr;  // device memory, staging_bytes_ long
  size_t staging_bytes_ = 0;
  void* records_ = nullptr;                 // device memory for world_size() NcclCallRecords
  NcclCallRecord* host_records_ = nullptr;  // pinned: this rank's, then every rank's
  bool records_posted_ = false;
  Status error_;
};

}  // namespace gradsync::client

#endif  // GRADSYNC_CLIENT_NCCL_COLLECTIVES_H_
