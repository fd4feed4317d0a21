// PsShard: restoring from and writing checkpoints, and the journal between
// them (see ps_shard.h).
#include <algorithm>
#include <future>

#include "common/logging.h"
#include "ps/ps_shard.h"

namespace gradsync::server {
namespace {

std::string Describe(const ShardState& st) {
  uint64_t closed = 0, version = 0, rows = 0;
  for (const auto& [key, k] : st.keys) {
    closed = std::max(closed, k.closed);
    version = std::max(version, k.version);
  }
  for (const auto& e : st.embeddings) rows += e.rows.ids.size();
  std::string out = std::to_string(st.keys.size()) + " keys, rounds closed up to " +
                    std::to_string(closed) + ", versions up to " + std::to_string(version);
  if (!st.embeddings.empty()) {
    out += ", " + std::to_string(st.embeddings.size()) + " embedding table partitions of " +
           std::to_string(rows) + " rows";
  }
  return out;
}

}  // namespace

Status PsShard::Restore() {
  const SteadyTime began = std::chrono::steady_clock::now();
  const std::string& dir = options_.checkpoint_dir;
  const std::string path = CheckpointPath(dir, self_.rank);
  GS_RETURN_IF_ERROR(MakeDirectory(dir));
  const CheckpointExpect expect{self_.job_id, self_.rank, options_.rules.mode,
                                options_.optimizer.kind, options_.rules.num_workers};
  StatusOr<ShardState> saved = ReadCheckpoint(dir, expect);
  std::string restored;
  if (saved.ok()) {
    const uint64_t start = saved->journal_start;
    restored = Describe(*saved) + " from " + path;
    GS_RETURN_IF_ERROR(Load(std::move(*saved)));
    GS_ASSIGN_OR_RETURN(JournalReplay replay,
                        ReplayJournal(dir, self_.rank, self_.job_id, start,
                                      [this](const JournalRecord& r) { return ApplyRecord(r); }));
    restored += "; replayed " + std::to_string(replay.records) + " journal records from segments " +
                std::to_string(replay.first_segment) + ".." + std::to_string(replay.last_segment) +
                (replay.torn_tail ? " (a torn last record ignored)" : "");
  } else if (saved.status().code() == StatusCode::kNotFound) {
    GS_LOG(INFO) << "no checkpoint at " << path << ": starting empty";
  } else if (saved.status().code() == StatusCode::kFailedPrecondition) {
    GS_LOG(WARNING) << saved.status().message() << ": not loaded, starting empty";
  } else {
    return saved.status();
  }
  // A journal of its own and a checkpoint of what was restored, on disk
  // before the first answer; then the older segments can go.
  GS_ASSIGN_OR_RETURN(std::vector<uint64_t> segments, ListJournalSegments(dir, self_.rank));
  const uint64_t next = segments.empty() ? 0 : segments.back() + 1;
  GS_ASSIGN_OR_RETURN(journal_, Journal::Open(dir, self_.rank, self_.job_id, next,
                                              [this](const wire::Route& to, wire::Message m) {
                                                Send(to, std::move(m));
                                              }));
  GS_ASSIGN_OR_RETURN(ShardState state, TakeSnapshot(next));
  GS_RETURN_IF_ERROR(Finish(Save(state), began));
  if (!restored.empty()) {
    GS_LOG(INFO) << "restored checkpoint: " << restored << "; now " << Describe(state);
  }
  return OkStatus();
}

Status PsShard::Load(ShardState saved) {
  const size_t n = key_threads_.size();
  for (const EmbeddingPartState& e : saved.embeddings) {
    Status s = key_threads_[ThreadOfTable(e.table, n)]->embeddings.Restore(e);
    if (!s.ok()) {
      return InvalidArgumentError(
          "checkpoint " + CheckpointPath(options_.checkpoint_dir, self_.rank) + ": " + s.message());
    }
  }
  std::vector<std::map<KeyTable::Key, KeyState>> parts(n);
  for (auto& [key, k] : saved.keys) parts[ThreadOfKey(key, n)].emplace(key, std::move(k));
  std::set<int32_t> all_dead;
  for (const auto& d : saved.dead) all_dead.insert(d.begin(), d.end());
  std::vector<Outgoing> none;  // nobody waits yet
  for (size_t i = 0; i < n; ++i) {
    KeyTable& table = key_threads_[i]->table;
    table.RestoreKeys(std::move(parts[i]));
    const std::set<int32_t>& dead = saved.dead.size() == n ? saved.dead[i] : all_dead;
    table.SetDead(dead, &none);
    key_threads_[i]->embeddings.SetDead(dead, &none);
  }
  std::lock_guard<std::mutex> lock(mu_);
  dead_ = all_dead;
  return OkStatus();
}

// A dead record applies to the keys of the thread that wrote it; with
// another number of threads now, to every key.
Status PsShard::ApplyRecord(const JournalRecord& r) {
  const size_t n = key_threads_.size();
  if (r.kind == JournalRecord::Kind::kPush) {
    const KeyTable::Key key{r.bucket, r.partition};
    return key_threads_[ThreadOfKey(key, n)]->table.Replay(key, r.worker, r.round, r.version,
                                                           r.values);
  }
  if (r.kind == JournalRecord::Kind::kEmbeddingPush) {
    const EmbeddingPushRecord push{r.table,      r.partition,    r.dim,   r.worker,
                                   r.round,      r.part,         r.parts, r.ids.size(),
                                   r.ids.data(), r.values.data()};
    return key_threads_[ThreadOfTable(r.table, n)]->embeddings.Replay(push);
  }
  for (int32_t w : r.dead) {
    if (w < 0 || w >= options_.rules.num_workers) {
      return DataLossError("the journal declares worker " + std::to_string(w) +
                           " dead, the job has " + std::to_string(options_.rules.num_workers));
    }
  }
  std::vector<Outgoing> none;
  for (size_t i = 0; i < n; ++i) {
    if (r.threads == n && r.thread != i) continue;
    KeyTable& table = key_threads_[i]->table;
    std::set<int32_t> dead = table.dead();
    dead.insert(r.dead.begin(), r.dead.end());
    table.SetDead(dead, &none);
    key_threads_[i]->embeddings.SetDead(dead, &none);
  }
  std::lock_guard<std::mutex> lock(mu_);
  dead_.insert(r.dead.begin(), r.dead.end());
  return OkStatus();
}

ShardState PsShard::StateHeader(uint64_t journal_start) const {
  ShardState st;
  st.job_id = self_.job_id;
  st.rank = self_.rank;
  st.mode = options_.rules.mode;
  st.optimizer = options_.optimizer.kind;
  st.num_workers = options_.rules.num_workers;
  st.journal_start = journal_start;
  st.dead.resize(key_threads_.size());
  return st;
}

// Each key thread copies its keys between two messages; before the threads
// run, the tables are read directly.
StatusOr<ShardState> PsShard::TakeSnapshot(uint64_t journal_start) {
  ShardState st = StateHeader(journal_start);
  struct Copy {
    std::map<KeyTable::Key, KeyState> keys;
    std::set<int32_t> dead;
    std::vector<EmbeddingPartState> embeddings;
  };
  std::vector<std::future<Copy>> copies;
  for (auto& t : key_threads_) {
    auto promise = std::make_shared<std::promise<Copy>>();
    copies.push_back(promise->get_future());
    auto visit = [promise](const KeyThread& thread) {
      promise->set_value(
          Copy{thread.table.SaveKeys(), thread.table.dead(), thread.embeddings.Save()});
    };
    if (!t->thread.joinable()) {  // Restore, before Start runs the threads
      visit(*t);
      continue;
    }
    Work work;
    work.visit = std::move(visit);
    if (!t->queue.Push(std::move(work), Deadline::Infinite()).ok()) {
      return CancelledError("the shard is shut down");
    }
  }
  for (size_t i = 0; i < copies.size(); ++i) {
    Copy c = copies[i].get();
    st.dead[i] = std::move(c.dead);
    st.keys.merge(c.keys);
    for (auto& e : c.embeddings) st.embeddings.push_back(std::move(e));
  }
  return st;
}

StatusOr<std::map<KeyTable::Key, KeyState>> PsShard::Keys() {
  GS_ASSIGN_OR_RETURN(ShardState st, TakeSnapshot(0));
  return std::move(st.keys);
}

Status PsShard::Save(const ShardState& state) {
  GS_ASSIGN_OR_RETURN(uint64_t bytes, WriteCheckpoint(options_.checkpoint_dir, state));
  GS_RETURN_IF_ERROR(journal_->DropBefore(state.journal_start));
  std::lock_guard<std::mutex> lock(stats_mu_);
  checkpoint_stats_.last_bytes = bytes;
  checkpoint_stats_.last_keys = state.keys.size();
  return OkStatus();
}

Status PsShard::Checkpoint() {
  if (!journal_) return FailedPreconditionError("checkpoints are off (no checkpoint_dir)");
  std::lock_guard<std::mutex> lock(checkpoint_mu_);
  const SteadyTime began = std::chrono::steady_clock::now();
  // The snapshot follows the rotation, so it holds every push of the older
  // segments; pushes of the new segment it may hold too are duplicates on
  // replay.
  Status s = [&]() -> Status {
    GS_ASSIGN_OR_RETURN(uint64_t segment, journal_->Rotate());
    GS_ASSIGN_OR_RETURN(ShardState state, TakeSnapshot(segment));
    return Save(state);
  }();
  return Finish(std::move(s), began);
}

Status PsShard::Finish(Status s, SteadyTime began) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::lock_guard<std::mutex> lock(stats_mu_);
  checkpoint_stats_.last_duration_seconds = seconds;
  if (s.ok()) {
    checkpoint_stats_.written++;
    checkpoint_stats_.duration_sum_seconds += seconds;
    checkpoint_stats_.last_success_unix_seconds = WallSeconds();
    if (options_.metrics != nullptr) {
      options_.metrics->checkpoint_duration->Observe(seconds);
      options_.metrics->last_checkpoint->Set(checkpoint_stats_.last_success_unix_seconds);
    }
  } else {
    checkpoint_stats_.failed++;
  }
  return s;
}

CheckpointStats PsShard::checkpoint_stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return checkpoint_stats_;
}

Status PsShard::health() const { return journal_ ? journal_->health() : OkStatus(); }

}  // namespace gradsync::server
