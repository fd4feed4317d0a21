#include "client/nccl_collectives.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <limits>
#include <optional>
#include <utility>

#include "wire/message.h"

namespace gradsync::client {
namespace {

constexpr size_t kStagingGranularity = size_t{1} << 20;
constexpr size_t kMaxListedRanks = 8;

Status CudaError(const std::string& call, cudaError_t err) {
  return InternalError(call + " failed: " + cudaGetErrorString(err));
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

const char* OpName(uint64_t op) {
  switch (static_cast<NcclOpKind>(op)) {
    case NcclOpKind::kAllReduce:
      return "AllReduce";
    case NcclOpKind::kAllGather:
      return "AllGather";
    case NcclOpKind::kBroadcast:
      return "Broadcast";
  }
  return "unknown";
}

std::string DTypeLabel(uint64_t dtype) {
  if (dtype < static_cast<uint64_t>(kNumDTypes)) {
    return DTypeName(static_cast<DType>(dtype));
  }
  return "dtype#" + std::to_string(dtype);
}

std::string Hex(uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(value));
  return buf;
}

struct Field {
  const char* name;
  uint64_t NcclCallRecord::*member;
};

constexpr Field kFields[] = {
    {"op", &NcclCallRecord::op},
    {"step", &NcclCallRecord::step},
    {"bucket", &NcclCallRecord::bucket},
    {"seq", &NcclCallRecord::seq},
    {"names_hash", &NcclCallRecord::names_hash},
    {"dtype", &NcclCallRecord::dtype},
    {"count", &NcclCallRecord::count},
    {"arg", &NcclCallRecord::arg},
};

std::string FieldValue(const Field& field, uint64_t value) {
  const std::string name = field.name;
  if (name == "op") return OpName(value);
  if (name == "dtype") return DTypeLabel(value);
  if (name == "names_hash") return Hex(value);
  return std::to_string(value);
}

// "step 6 vs 5, count 100 vs 4096": how `other` differs from `base`.
std::string FieldDiffs(const NcclCallRecord& other, const NcclCallRecord& base) {
  std::string out;
  for (const Field& field : kFields) {
    const uint64_t a = other.*field.member;
    const uint64_t b = base.*field.member;
    if (a == b) continue;
    if (!out.empty()) out += ", ";
    out += std::string(field.name) + " " + FieldValue(field, a) + " vs " + FieldValue(field, b);
  }
  return out.empty() ? "fingerprint only" : out;
}

Status SessionHealth(const Session& session) {
  const Status job = session.job_status();
  if (!job.ok()) return job.WithPrefix("the job ended");
  return session.PeerDeathStatus(wire::Role::Worker);
}

bool ReducibleByNccl(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

}  // namespace

uint64_t FingerprintOf(const NcclCallRecord& record) {
  uint64_t hash = 0x6772616473796e63ULL;
  for (const Field& field : kFields) hash = Mix(hash ^ record.*field.member);
  return hash;
}

NcclCallRecord MakeCallRecord(NcclOpKind op, const OpTag& tag, DType dtype, uint64_t count,
                              uint64_t arg) {
  NcclCallRecord record;
  record.op = static_cast<uint64_t>(op);
  record.step = tag.step;
  record.bucket = tag.bucket;
  record.seq = tag.seq;
  record.names_hash = tag.names_hash;
  record.dtype = static_cast<uint64_t>(dtype);
  record.count = count;
  record.arg = arg;
  record.fingerprint = FingerprintOf(record);
  return record;
}

std::string DescribeCall(const NcclCallRecord& r) {
  std::string out = std::string(OpName(r.op)) + " step=" + std::to_string(r.step) +
                    " bucket=" + std::to_string(r.bucket) + " seq=" + std::to_string(r.seq) +
                    " names_hash=" + Hex(r.names_hash) + " dtype=" + DTypeLabel(r.dtype) +
                    " count=" + std::to_string(r.count);
  if (static_cast<NcclOpKind>(r.op) == NcclOpKind::kAllReduce) {
    out += r.arg == static_cast<uint64_t>(ReduceOp::kAverage) ? " op=average" : " op=sum";
  } else if (static_cast<NcclOpKind>(r.op) == NcclOpKind::kBroadcast) {
    out += " root=" + std::to_string(r.arg);
  }
  return out;
}

Status CompareCallRecords(const std::vector<NcclCallRecord>& records, int rank) {
  std::string ranks;
  std::string diffs;
  size_t differing = 0;
  for (size_t r = 1; r < records.size(); ++r) {
    if (records[r].fingerprint == records[0].fingerprint) continue;
    if (++differing > kMaxListedRanks) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    diffs += (diffs.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
             FieldDiffs(records[r], records[0]);
  }
  if (differing == 0) return OkStatus();
  if (differing > kMaxListedRanks) {
    ranks += " and " + std::to_string(differing - kMaxListedRanks) + " more";
  }
  const bool several = differing > 1;
  std::string message = std::string("nccl: ranks disagree about the collective: ") +
                        (several ? "ranks " : "rank ") + ranks +
                        (several ? " differ" : " differs") + " from rank 0 (" + diffs + ")";
  if (rank >= 0 && static_cast<size_t>(rank) < records.size()) {
    message += "; this rank (" + std::to_string(rank) + ") called " + DescribeCall(records[rank]);
  }
  return AbortedError(message);
}

StatusOr<std::unique_ptr<NcclCollectives>> NcclCollectives::Create(
    std::unique_ptr<kernels::NcclComm> comm) {
  if (comm == nullptr) return InvalidArgumentError("NcclCollectives needs a communicator");
  GS_RETURN_IF_ERROR(comm->status());
  std::unique_ptr<NcclCollectives> out(new NcclCollectives(std::move(comm)));
  GS_RETURN_IF_ERROR(out->Begin());
  const size_t bytes = sizeof(NcclCallRecord) * static_cast<size_t>(out->world_size());
  const cudaError_t err = cudaMalloc(&out->records_, bytes);
  if (err != cudaSuccess) {
    out->records_ = nullptr;
    return CudaError("cudaMalloc of " + std::to_string(bytes) + " bytes for call records", err);
  }
  const cudaError_t host =
      cudaMallocHost(reinterpret_cast<void**>(&out->host_records_), bytes + sizeof(NcclCallRecord));
  if (host != cudaSuccess) {
    out->host_records_ = nullptr;
    return CudaError("cudaMallocHost of call records", host);
  }
  return StatusOr<std::unique_ptr<NcclCollectives>>(std::move(out));
}

StatusOr<std::unique_ptr<NcclCollectives>> NcclCollectives::Connect(
    const std::vector<uint8_t>& unique_id, int rank, int world_size, int device, Deadline deadline,
    kernels::NcclCommOptions options) {
  GS_ASSIGN_OR_RETURN(
      std::unique_ptr<kernels::NcclComm> comm,
      kernels::NcclComm::Create(unique_id, rank, world_size, device, deadline, std::move(options)));
  return Create(std::move(comm));
}

StatusOr<std::unique_ptr<NcclCollectives>> NcclCollectives::Join(Session* session, int device,
                                                                 Deadline deadline) {
  if (session == nullptr) return InvalidArgumentError("NcclCollectives::Join needs a session");
  std::optional<std::vector<uint8_t>> mine;
  if (session->rank() == 0) {
    GS_ASSIGN_OR_RETURN(std::vector<uint8_t> made, kernels::NcclComm::MakeUniqueId());
    mine = std::move(made);
  }
  GS_ASSIGN_OR_RETURN(std::vector<uint8_t> id, session->ShareNcclId(std::move(mine), deadline));
  kernels::NcclCommOptions options;
  options.health = [session] { return SessionHealth(*session); };
  return Connect(id, session->rank(), session->num_workers(), device, deadline, std::move(options));
}

NcclCollectives::NcclCollectives(std::unique_ptr<kernels::NcclComm> comm)
    : comm_(std::move(comm)) {}

NcclCollectives::~NcclCollectives() {
  (void)cudaSetDevice(comm_->device());
  (void)cudaFree(staging_);
  (void)cudaFree(records_);
  (void)cudaFreeHost(host_records_);
}

Status NcclCollectives::AllReduce(void* data, size_t count, DType dtype, ReduceOp op,
                                  const OpTag& tag, Deadline deadline) {
  return Record(CheckCall(DoAllReduce(data, count, dtype, op, tag, deadline), deadline));
}

Status NcclCollectives::AllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                                  Deadline deadline) {
  return Record(CheckCall(DoAllGather(in, bytes, out, tag, deadline), deadline));
}

Status NcclCollectives::Broadcast(void* data, size_t bytes, int root, const OpTag& tag,
                                  Deadline deadline) {
  return Record(CheckCall(DoBroadcast(data, bytes, root, tag, deadline), deadline));
}

Status NcclCollectives::DoAllReduce(void* data, size_t count, DType dtype, ReduceOp op,
                                    const OpTag& tag, Deadline deadline) {
  GS_RETURN_IF_ERROR(Begin());
  if (!ReducibleByNccl(dtype)) {
    return InvalidArgumentError(std::string("nccl AllReduce supports f32, f16 and bf16, not ") +
                                DTypeName(dtype));
  }
  if (count > std::numeric_limits<size_t>::max() / DTypeSize(dtype)) {
    return InvalidArgumentError("nccl AllReduce of " + std::to_string(count) +
                                " elements is too large");
  }
  if (data == nullptr && count > 0) return InvalidArgumentError("nccl AllReduce: null data");
  GS_RETURN_IF_ERROR(
      PostCall(MakeCallRecord(NcclOpKind::kAllReduce, tag, dtype, count, static_cast<uint64_t>(op)),
               deadline));
  if (count == 0) return OkStatus();
  const size_t bytes = count * DTypeSize(dtype);
  const kernels::NcclReduceOp nccl_op =
      op == ReduceOp::kAverage ? kernels::NcclReduceOp::kAverage : kernels::NcclReduceOp::kSum;
  if (OnDevice(data)) {
    return comm_->AllReduce(data, data, count, dtype, nccl_op, deadline);
  }
  GS_RETURN_IF_ERROR(Reserve(bytes));
  GS_RETURN_IF_ERROR(CopyIn(staging_, data, bytes));
  GS_RETURN_IF_ERROR(comm_->AllReduce(staging_, staging_, count, dtype, nccl_op, deadline));
  return CopyOut(data, staging_, bytes, deadline);
}

Status NcclCollectives::DoAllGather(const void* in, size_t bytes, void* out, const OpTag& tag,
                                    Deadline deadline) {
  GS_RETURN_IF_ERROR(Begin());
  const size_t world = static_cast<size_t>(world_size());
  if (bytes > std::numeric_limits<size_t>::max() / world) {
    return InvalidArgumentError("nccl AllGather of " + std::to_string(bytes) +
                                " bytes per rank is too large");
  }
  if (bytes > 0 && (in == nullptr || out == nullptr)) {
    return InvalidArgumentError("nccl AllGather: null buffer");
  }
  GS_RETURN_IF_ERROR(
      PostCall(MakeCallRecord(NcclOpKind::kAllGather, tag, DType::kU8, bytes, 0), deadline));
  if (bytes == 0) return OkStatus();
  if (OnDevice(in) && OnDevice(out)) return comm_->AllGather(in, out, bytes, deadline);
  GS_RETURN_IF_ERROR(Reserve(bytes * world));
  void* mine = static_cast<uint8_t*>(staging_) + static_cast<size_t>(rank()) * bytes;
  GS_RETURN_IF_ERROR(CopyIn(mine, in, bytes));
  GS_RETURN_IF_ERROR(comm_->AllGather(mine, staging_, bytes, deadline));
  return CopyOut(out, staging_, bytes * world, deadline);
}

Status NcclCollectives::DoBroadcast(void* data, size_t bytes, int root, const OpTag& tag,
                                    Deadline deadline) {
  GS_RETURN_IF_ERROR(Begin());
  if (root < 0 || root >= world_size()) {
    return InvalidArgumentError("nccl Broadcast: root " + std::to_string(root) +
                                " is not in a world of " + std::to_string(world_size()));
  }
  if (data == nullptr && bytes > 0) return InvalidArgumentError("nccl Broadcast: null data");
  GS_RETURN_IF_ERROR(PostCall(
      MakeCallRecord(NcclOpKind::kBroadcast, tag, DType::kU8, bytes, static_cast<uint64_t>(root)),
      deadline));
  if (bytes == 0) return OkStatus();
  if (OnDevice(data)) return comm_->Broadcast(data, data, bytes, root, deadline);
  GS_RETURN_IF_ERROR(Reserve(bytes));
  if (rank() == root) GS_RETURN_IF_ERROR(CopyIn(staging_, data, bytes));
  GS_RETURN_IF_ERROR(comm_->Broadcast(staging_, staging_, bytes, root, deadline));
  if (rank() == root) return OkStatus();
  return CopyOut(data, staging_, bytes, deadline);
}

Status NcclCollectives::PostCall(const NcclCallRecord& mine, Deadline deadline) {
  const size_t world = static_cast<size_t>(world_size());
  void* slot = static_cast<uint8_t*>(records_) + static_cast<size_t>(rank()) * sizeof(mine);
  host_records_[0] = mine;  // pinned: the copy is queued, not made now
  GS_RETURN_IF_ERROR(CopyIn(slot, &host_records_[0], sizeof(mine)));
  GS_RETURN_IF_ERROR(comm_->AllGather(slot, records_, sizeof(mine), deadline,
                                      /*wait=*/false));
  const cudaError_t err = cudaMemcpyAsync(&host_records_[1], records_, world * sizeof(mine),
                                          cudaMemcpyDeviceToHost, comm_->stream());
  if (err != cudaSuccess) return CudaError("cudaMemcpyAsync of the call records", err);
  records_posted_ = true;
  return OkStatus();
}

Status NcclCollectives::CheckCall(Status call, Deadline deadline) {
  if (!records_posted_) return call;
  records_posted_ = false;
  if (call.ok()) {
    // The call waited for its stream; a call that had nothing to do did not.
    GS_RETURN_IF_ERROR(comm_->Synchronize("the all-gather of the call records", deadline));
  } else if (cudaStreamQuery(comm_->stream()) != cudaSuccess) {
    cudaGetLastError();
    return call;  // the records did not come back: the call's error stands
  }
  const size_t world = static_cast<size_t>(world_size());
  Status compared = CompareCallRecords(
      std::vector<NcclCallRecord>(host_records_ + 1, host_records_ + 1 + world), rank());
  return compared.ok() ? call : compared;
}

bool NcclCollectives::OnDevice(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();  // not a pointer CUDA knows: host memory
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

Status NcclCollectives::Begin() {
  if (!error_.ok()) return error_;
  GS_RETURN_IF_ERROR(comm_->status());
  const cudaError_t err = cudaSetDevice(comm_->device());
  if (err != cudaSuccess) {
    return CudaError("cudaSetDevice(" + std::to_string(comm_->device()) + ")", err);
  }
  return OkStatus();
}

Status NcclCollectives::Reserve(size_t bytes) {
  if (bytes <= staging_bytes_) return OkStatus();
  const size_t rounded =
      (bytes + kStagingGranularity - 1) / kStagingGranularity * kStagingGranularity;
  if (staging_ != nullptr) {
    const cudaError_t err = cudaFree(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    if (err != cudaSuccess) return CudaError("cudaFree of the staging buffer", err);
  }
  const cudaError_t err = cudaMalloc(&staging_, rounded);
  if (err != cudaSuccess) {
    staging_ = nullptr;
    return CudaError("cudaMalloc of " + std::to_string(rounded) + " bytes for staging", err);
  }
  staging_bytes_ = rounded;
  return OkStatus();
}

Status NcclCollectives::CopyIn(void* device_dst, const void* host_src, size_t bytes) {
  const cudaError_t err =
      cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, comm_->stream());
  if (err != cudaSuccess) {
    return CudaError("cudaMemcpyAsync of " + std::to_string(bytes) + " bytes to the GPU", err);
  }
  return OkStatus();
}

Status NcclCollectives::CopyOut(void* host_dst, const void* device_src, size_t bytes,
                                Deadline deadline) {
  const std::string what = "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes to the host";
  const cudaError_t err =
      cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, comm_->stream());
  if (err != cudaSuccess) return CudaError(what, err);
  return comm_->Synchronize(what, deadline);
}

Status NcclCollectives::Record(Status status) {
  if (!status.ok() && error_.ok()) error_ = status;
  return error_.ok() ? status : error_;
}

}  // namespace gradsync::client
