#include "ps/ps_shard.h"

#include <algorithm>
#include <future>
#include <iterator>

#include "common/logging.h"
#include "common/placement.h"

namespace gradsync::server {

namespace {

StatusOr<PsMode> ParseMode(const std::string& name) {
  if (name == "sync") return PsMode::kSync;
  if (name == "async") return PsMode::kAsync;
  if (name == "ssp") return PsMode::kSsp;
  return InvalidArgumentError("ps_mode must be sync, async or ssp, got '" + name + "'");
}

}  // namespace

StatusOr<PsShardOptions> PsShardOptions::FromConfig(const Config& config) {
  PsShardOptions o;
  GS_ASSIGN_OR_RETURN(std::string mode, config.GetString("ps_mode", "sync"));
  GS_ASSIGN_OR_RETURN(o.rules.mode, ParseMode(mode));
  GS_ASSIGN_OR_RETURN(int64_t staleness, config.GetInt("staleness", 0));
  GS_ASSIGN_OR_RETURN(o.rules.staleness_lr, config.GetBool("staleness_lr", false));
  GS_ASSIGN_OR_RETURN(int64_t threads, config.GetInt("ps_threads", 2));
  GS_ASSIGN_OR_RETURN(o.checkpoint_dir, config.GetString("checkpoint_dir", ""));
  GS_ASSIGN_OR_RETURN(o.rules.compression, config.GetString("compression", ""));
  GS_ASSIGN_OR_RETURN(o.rules.compression_overrides, config.GetString("compression_overrides", ""));
  GS_ASSIGN_OR_RETURN(
      int64_t partition,
      config.GetInt("partition_bytes", static_cast<int64_t>(kDefaultPartitionBytes)));
  GS_ASSIGN_OR_RETURN(int64_t max_keys, config.GetInt("ps_max_keys", 65536));
  GS_ASSIGN_OR_RETURN(int64_t per_peer,
                      config.GetInt("ps_max_queued_bytes_per_peer",
                                    static_cast<int64_t>(o.max_queued_bytes_per_peer)));
  GS_ASSIGN_OR_RETURN(o.optimizer, OptimizerOptions::FromConfig(config));
  GS_ASSIGN_OR_RETURN(o.embeddings.table, EmbeddingOptions::FromConfig(config));
  GS_ASSIGN_OR_RETURN(
      int64_t embedding_bytes,
      config.GetInt("embedding_max_bytes", static_cast<int64_t>(o.embedding_max_bytes)));
  if (embedding_bytes < (int64_t{1} << 20)) {
    return InvalidArgumentError("embedding_max_bytes must be at least 1 MiB, got " +
                                std::to_string(embedding_bytes));
  }
  o.embedding_max_bytes = static_cast<size_t>(embedding_bytes);
  if (partition < 4 || partition > (int64_t{1} << 30)) {
    return InvalidArgumentError("partition_bytes must be in [4, 2^30], got " +
                                std::to_string(partition));
  }
  if (max_keys < 1 || max_keys > (int64_t{1} << 24)) {
    return InvalidArgumentError("ps_max_keys must be in [1, 2^24], got " +
                                std::to_string(max_keys));
  }
  if (per_peer < 1 || per_peer > static_cast<int64_t>(o.max_queued_bytes)) {
    return InvalidArgumentError("ps_max_queued_bytes_per_peer must be in [1, " +
                                std::to_string(o.max_queued_bytes) + "], got " +
                                std::to_string(per_peer));
  }
  o.max_queued_bytes_per_peer = static_cast<size_t>(per_peer);
  o.rules.max_elements = static_cast<uint64_t>(partition) / sizeof(float);
  o.rules.max_keys = static_cast<size_t>(max_keys);
  if (staleness < 0 || staleness > 1000000) {
    return InvalidArgumentError("staleness must be in [0, 1000000], got " +
                                std::to_string(staleness));
  }
  if (threads < 1 || threads > 64) {
    return InvalidArgumentError("ps_threads must be in [1, 64], got " + std::to_string(threads));
  }
  if (o.rules.mode != PsMode::kSync && o.optimizer.kind == OptimizerKind::kNone) {
    return InvalidArgumentError(std::string("ps_mode=") + PsModeName(o.rules.mode) +
                                " needs a server-side optimizer (optimizer=sgd|momentum|adam)");
  }
  o.rules.staleness = o.rules.mode == PsMode::kSsp ? static_cast<uint64_t>(staleness) : 0;
  o.embeddings.mode = o.rules.mode;
  o.embeddings.staleness = o.rules.staleness;
  o.threads = static_cast<int>(threads);
  return o;
}

size_t ThreadOfKey(const KeyTable::Key& key, size_t threads) {
  return PartitionKey(key.first, key.second) % threads;
}

size_t ThreadOfTable(uint32_t table, size_t threads) { return table % threads; }

PsShard::PsShard(wire::Transport* transport, const PsShardOptions& options, wire::Sender self)
    : transport_(transport),
      options_(options),
      self_(self),
      optimizer_(MakeOptimizer(options.optimizer)),
      policy_(
          wire::Policy::Accepting({wire::MsgType::Push, wire::MsgType::Pull,
                                   wire::MsgType::EmbeddingPull, wire::MsgType::EmbeddingPush})),
      codec_(options.rules.compression, options.rules.compression_overrides),
      embedding_budget_(options.embedding_max_bytes),
      num_workers_(options.rules.num_workers),
      worker_identities_(options.rules.worker_identities) {
  policy_.job_id = self.job_id;
  // No codec writes more than 8 bytes per element, and no push carries more
  // than a partition's elements (KeyTable checks the exact size).
  policy_.limits.max_payload_bytes = 8 * options.rules.max_elements + (64 << 10);
  counters_.metrics = options.metrics;
  if (options.metrics != nullptr) options.metrics->SetWorkers(options.rules.num_workers, 0);
}

StatusOr<std::unique_ptr<PsShard>> PsShard::Start(wire::Transport* transport,
                                                  const PsShardOptions& options,
                                                  wire::Sender self) {
  if (options.rules.num_workers < 1) return InvalidArgumentError("a shard needs workers");
  std::unique_ptr<PsShard> shard(new PsShard(transport, options, self));
  for (int i = 0; i < options.threads; ++i) {
    shard->key_threads_.push_back(std::make_unique<KeyThread>(
        i, options.rules, shard->optimizer_.get(), self, &shard->counters_, &shard->codec_,
        options.embeddings, &shard->embedding_budget_));
  }
  if (!options.checkpoint_dir.empty()) GS_RETURN_IF_ERROR(shard->Restore());
  for (auto& t : shard->key_threads_) {
    t->thread = std::thread([s = shard.get(), k = t.get()] { s->KeyLoop(k); });
  }
  shard->receiver_ = std::thread([s = shard.get()] { s->ReceiveLoop(); });
  return shard;
}

PsShard::~PsShard() { Shutdown(); }

void PsShard::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lock(bytes_mu_);  // a receiver waiting for room sees stop_
  }
  room_.notify_all();
  if (receiver_.joinable()) receiver_.join();
  std::lock_guard<std::mutex> checkpoint(checkpoint_mu_);  // lets one in progress finish
  for (auto& t : key_threads_) t->queue.Close();
  for (auto& t : key_threads_) {
    if (t->thread.joinable()) t->thread.join();
  }
  if (journal_) journal_->Shutdown();
}

void PsShard::WorkerDied(int32_t rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_ || !dead_.insert(rank).second) return;
    ++dead_epoch_;
    if (options_.metrics != nullptr) {
      options_.metrics->SetWorkers(num_workers_, static_cast<int>(dead_.size()));
    }
  }
  // Never waits (this is the heartbeat thread): a thread whose queue is full
  // takes the change before its next message anyway.
  for (auto& t : key_threads_) t->queue.Push(Work{}, Deadline::After(Millis(0))).IgnoreError();
}

void PsShard::StartEpoch(uint32_t epoch, int32_t num_workers, std::vector<std::string> identities) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_ || epoch <= epoch_) return;
    epoch_ = epoch;
    started_epoch_.store(epoch, std::memory_order_release);
    num_workers_ = num_workers;
    worker_identities_ = std::move(identities);
    dead_.clear();
    ++dead_epoch_;
    if (options_.metrics != nullptr) options_.metrics->SetWorkers(num_workers, 0);
  }
  GS_LOG(WARNING) << "membership epoch " << epoch << ": " << num_workers
                  << " workers; rounds that did not close are redone";
  for (auto& t : key_threads_) t->queue.Push(Work{}, Deadline::After(Millis(0))).IgnoreError();
}

void PsShard::CatchUpEpoch(KeyThread* t) {
  if (t->epoch_seen == started_epoch_.load(std::memory_order_acquire)) return;  // no lock
  uint32_t epoch = 0;
  int32_t workers = 0;
  std::vector<std::string> identities;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (t->epoch_seen == epoch_) return;
    epoch = t->epoch_seen = epoch_;
    workers = num_workers_;
    identities = worker_identities_;
  }
  t->embeddings.StartEpoch(epoch, workers, identities);
  t->table.StartEpoch(epoch, workers, std::move(identities));
}

wire::Sender PsShard::AnswerAs(const wire::Route& to) const {
  std::lock_guard<std::mutex> lock(mu_);
  return wire::AnswerAs(self_, IsJobWorker(worker_identities_, to));
}

void PsShard::CatchUpDeaths(KeyThread* t) {
  if (t->dead_seen == dead_epoch_.load(std::memory_order_acquire)) return;  // no lock
  std::set<int32_t> dead;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (t->dead_seen == dead_epoch_.load()) return;
    t->dead_seen = dead_epoch_.load();
    dead = dead_;
  }
  std::vector<Outgoing> out;
  t->table.SetDead(dead, &out);
  t->embeddings.SetDead(dead, &out);
  JournalRecord record;
  record.kind = JournalRecord::Kind::kDead;
  record.thread = static_cast<uint32_t>(t->index);
  record.threads = static_cast<uint32_t>(key_threads_.size());
  record.dead = std::move(dead);
  Emit(std::move(record), std::move(out));
}

void PsShard::ReceiveLoop() {
  while (!stop_.load()) {
    auto in = transport_->Receive(Deadline::AfterMs(100));
    if (!in.ok()) {
      if (in.status().code() == StatusCode::kDeadlineExceeded) continue;
      if (in.status().code() == StatusCode::kDataLoss) {
        // A same-host link or a TCP stream whose framing broke (or whose
        // sealed message did not open): the transport logged it and gave
        // the link or connection up; there is no header to answer.
        counters_.Rejected(wire::ErrorCode::Malformed);
        continue;
      }
      if (!stop_.load()) GS_LOG(WARNING) << "shard stops receiving: " << in.status();
      return;
    }
    Dispatch(std::move(*in));
  }
}

void PsShard::Dispatch(wire::Incoming in) {
  wire::Verdict v = wire::Validate(in.message, policy_);
  if (!v.ok()) {
    counters_.Rejected(v.code);
    if (v.ShouldAnswer()) {
      const wire::MsgType type = v.type_known ? v.type : wire::MsgType::Error;
      Send(in.from, wire::MakeError(AnswerAs(in.from), v.code, v.detail, type));
    }
    return;
  }
  // Messages waiting for the key threads are bounded in bytes, in all and
  // per peer: past the first bound the receiver waits and the transport
  // pushes back on the senders; past the second the peer is told to send
  // again later, so that it cannot hold the others back.
  const size_t bytes = in.message.header.size() + in.message.PayloadBytes();
  if (!Admit(in.from.identity, bytes)) {
    counters_.Rejected(wire::ErrorCode::Busy);
    Send(in.from,
         wire::MakeError(AnswerAs(in.from), wire::ErrorCode::Busy,
                         "more than " + std::to_string(options_.max_queued_bytes_per_peer) +
                             " bytes of this peer's messages wait already; send it "
                             "again later",
                         v.type, v.header->seq()));
    return;
  }
  // A key, and an embedding table, is always on the same thread.
  const wire::DataBody* d = v.header->body_as_DataBody();
  const size_t n = key_threads_.size();
  KeyThread& t =
      *key_threads_[d != nullptr ? ThreadOfKey({d->bucket(), d->partition()}, n)
                                 : ThreadOfTable(v.header->body_as_EmbeddingBody()->table(), n)];
  // A full queue pushes back on the transport; the key threads keep
  // draining it until Shutdown closes it.
  if (ShardMetrics* m = options_.metrics) {
    if (d != nullptr) (v.type == wire::MsgType::Push ? m->pushes : m->pulls)->Increment();
    m->queue_depth->Set(static_cast<double>(queued_.fetch_add(1) + 1));
  }
  Work work;
  work.in = std::make_unique<wire::Incoming>(std::move(in));
  work.bytes = bytes;
  t.queue.Push(std::move(work), Deadline::Infinite()).IgnoreError();
}

StatusOr<EmbeddingServiceStats> PsShard::EmbeddingStats() {
  std::vector<std::future<EmbeddingServiceStats>> parts;
  for (auto& t : key_threads_) {
    auto promise = std::make_shared<std::promise<EmbeddingServiceStats>>();
    parts.push_back(promise->get_future());
    Work work;
    work.visit = [promise](const KeyThread& thread) {
      promise->set_value(thread.embeddings.stats());
    };
    if (!t->queue.Push(std::move(work), Deadline::Infinite()).ok()) {
      return CancelledError("the shard is shut down");
    }
  }
  EmbeddingServiceStats sum;
  for (auto& part : parts) {
    sum += part.get();
  }
  return sum;
}

bool PsShard::Admit(const std::string& route, size_t bytes) {
  // A peer's lanes share its bytes.
  const std::string peer = wire::LaneBase(route);
  std::unique_lock<std::mutex> lock(bytes_mu_);
  auto held = peer_bytes_.find(peer);
  if (held != peer_bytes_.end() && held->second + bytes > options_.max_queued_bytes_per_peer) {
    return false;
  }
  room_.wait(lock, [&] {
    return stop_.load() || queued_bytes_ == 0 || queued_bytes_ + bytes <= options_.max_queued_bytes;
  });
  queued_bytes_ += bytes;
  peer_bytes_[peer] += bytes;
  return true;
}

void PsShard::Dequeued(const std::string& peer, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(bytes_mu_);
    queued_bytes_ -= bytes;
    auto held = peer_bytes_.find(wire::LaneBase(peer));
    if (held != peer_bytes_.end() && (held->second -= bytes) == 0) peer_bytes_.erase(held);
  }
  room_.notify_all();
}

void PsShard::KeyLoop(KeyThread* t) {
  for (;;) {
    auto work = t->queue.Pop(Deadline::Infinite());
    if (!work.ok()) return;
    CatchUpEpoch(t);  // before the deaths: those of a new epoch name its ranks
    CatchUpDeaths(t);
    if (work->visit) {
      work->visit(*t);
      continue;
    }
    if (work->in == nullptr) continue;  // a wake-up for CatchUpDeaths
    if (options_.before_handle) options_.before_handle();
    Dequeued(work->in->from.identity, work->bytes);
    std::vector<Outgoing> out;
    std::optional<JournalRecord> record;
    if (options_.metrics != nullptr) {
      options_.metrics->queue_depth->Set(static_cast<double>(queued_.fetch_sub(1) - 1));
    }
    {
      wire::Incoming& in = *work->in;
      const wire::Header& h = *in.message.header_view();
      if (h.body_type() == wire::Body::EmbeddingBody) {
        if (t->embeddings.Handle(in.from, h, in.message, &out) && journal_) {
          const wire::EmbeddingBody& e = *h.body_as_EmbeddingBody();
          record = JournalRecord{};
          record->kind = JournalRecord::Kind::kEmbeddingPush;
          record->table = e.table();
          record->partition = e.partition();
          record->dim = e.dim();
          record->worker = h.sender_rank();
          record->round = e.round();
          record->part = e.part();
          record->parts = e.parts();
          record->num_elements = e.num_ids();
          record->payloads = std::move(in.message.payloads);  // the ids, then the rows
        }
        Emit(std::move(record), std::move(out));
        continue;
      }
      // The journal keeps what the table took: the fp32 values, so a
      // compressed push is journalled decompressed.
      std::vector<float> decoded;
      if (t->table.Handle(in.from, h, in.message, &out, journal_ ? &decoded : nullptr)) {
        const wire::DataBody& d = *h.body_as_DataBody();
        record = JournalRecord{};
        record->bucket = d.bucket();
        record->partition = d.partition();
        record->worker = h.sender_rank();
        record->round = d.round();
        record->version = d.base_version();
        record->num_elements = d.num_elements();
        if (decoded.empty()) {
          record->payloads = std::move(in.message.payloads);
        } else {
          auto values = std::make_shared<std::vector<float>>(std::move(decoded));
          record->payloads.push_back(
              wire::Payload::Borrow(values->data(), values->size() * sizeof(float), values));
        }
      }
    }
    Emit(std::move(record), std::move(out));
  }
}

// With a journal, answers wait until the push they depend on is on disk.
void PsShard::Emit(std::optional<JournalRecord> record, std::vector<Outgoing> out) {
  if (journal_) {
    journal_->Append(std::move(record), std::move(out));
    return;
  }
  for (Outgoing& o : out) Send(o.to, std::move(o.message));
}

// Posted: a peer that does not read holds back only its own replies, never
// the key thread that answers everyone else.
void PsShard::Send(const wire::Route& to, wire::Message msg) {
  transport_->Post(to, std::move(msg), Deadline::After(options_.send_timeout),
                   LogSendFailure(reply_failures_, to.ToString(), "shard reply"));
}

}  // namespace gradsync::server
