// The Communicator's sparse embedding rows (PullRows, PushRows): an
// EmbeddingClient (client/embedding_client.h) of the session's membership
// epoch, on a transport of its own to the shards.
#include <utility>

#include "client/communicator_impl.h"
#include "client/ps_transport.h"

namespace gradsync::client {

namespace {

EmbeddingClientStats& operator+=(EmbeddingClientStats& sum, const EmbeddingClientStats& s) {
  sum.pulled_rows += s.pulled_rows;
  sum.asked_rows += s.asked_rows;
  sum.pushed_rows += s.pushed_rows;
  sum.resent += s.resent;
  sum.rejected += s.rejected;
  return sum;
}

}  // namespace

StatusOr<EmbeddingClient*> Communicator::Impl::EmbeddingsLocked(Deadline deadline) {
  GS_RETURN_IF_ERROR(EnsureEpoch(deadline));
  if (embeddings_ != nullptr && embeddings_->epoch() == session_->epoch()) return embeddings_.get();
  if (embeddings_ != nullptr) {
    embedding_stats_ += embeddings_->stats();
    embeddings_.reset();
  }
  if (session_->num_servers() == 0) {
    return FailedPreconditionError(
        "embedding rows live on the parameter servers: the job has none (num_servers=0)");
  }
  GS_ASSIGN_OR_RETURN(std::unique_ptr<wire::Transport> transport,
                      MakeEmbeddingTransport(*session_, options_.sync.ps_links));
  EmbeddingPeers peers{session_->rank(), session_->num_workers(), session_->epoch(),
                       PsShardEndpoints(*session_),
                       wire::Sender{wire::Role::Worker, session_->rank(), session_->job_id()}};
  EmbeddingClientOptions options;
  options.resend_after = options_.sync.ps.resend_after;
  options.max_message_bytes = options_.sync.ps_links.partition_bytes;
  options.replicas = options_.embedding_replicas;
  options.rejected = &ps_rejected_;
  options.replication_lag = &metrics_.replication_lag();
  Session* session = session_.get();
  const bool replicated = options.replicas > 1;
  auto health = [session, replicated]() -> Status {
    GS_RETURN_IF_ERROR(session->job_status());
    GS_RETURN_IF_ERROR(session->MembershipStatus());
    // With copies, a dead shard is dropped (EmbeddingClient::DeadShards).
    return replicated ? Status() : session->PeerDeathStatus(wire::Role::Server);
  };
  auto dead_shards = [session]() {
    std::vector<int> dead;
    for (const wire::NodeInfo& n : session->dead_peers()) {
      if (n.role == wire::Role::Server) dead.push_back(n.rank);
    }
    return dead;
  };
  GS_ASSIGN_OR_RETURN(embeddings_,
                      EmbeddingClient::Create(std::move(transport), std::move(peers), options,
                                              std::move(health), std::move(dead_shards)));
  return embeddings_.get();
}

Status Communicator::Impl::PullRows(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n,
                                    uint64_t step, float* out, Deadline deadline) {
  const SteadyTime start = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(embedding_mu_);
  Status s = EmbeddingsLocked(deadline).status();
  if (s.ok()) s = Classify(embeddings_->Pull(table, dim, ids, n, step, out, deadline));
  RecordRows(SyncOp::kPullRows, start, s);
  return s;
}

Status Communicator::Impl::PushRows(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n,
                                    const float* grads, uint64_t step, Deadline deadline) {
  const SteadyTime start = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(embedding_mu_);
  Status s = EmbeddingsLocked(deadline).status();
  if (s.ok()) s = Classify(embeddings_->Push(table, dim, ids, n, grads, step, deadline));
  RecordRows(SyncOp::kPushRows, start, s);
  return s;
}

void Communicator::Impl::RecordRows(SyncOp op, SteadyTime start, const Status& s) {
  metrics_.Record(op, SyncPath::kPs,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                  s);
  const uint64_t resent =
      embedding_stats_.resent + (embeddings_ != nullptr ? embeddings_->stats().resent : 0);
  metrics_.Retried(resent - embedding_resent_seen_);
  embedding_resent_seen_ = resent;
}

EmbeddingClientStats Communicator::Impl::embedding_stats() const {
  std::lock_guard<std::mutex> lock(embedding_mu_);
  EmbeddingClientStats s = embedding_stats_;
  if (embeddings_ != nullptr) s += embeddings_->stats();
  return s;
}

Status Communicator::PullRows(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n,
                              uint64_t step, float* out, Deadline deadline) {
  return impl_->PullRows(table, dim, ids, n, step, out, deadline);
}

Status Communicator::PushRows(uint32_t table, uint32_t dim, const uint64_t* ids, size_t n,
                              const float* grads, uint64_t step, Deadline deadline) {
  return impl_->PushRows(table, dim, ids, n, grads, step, deadline);
}

}  // namespace gradsync::client
