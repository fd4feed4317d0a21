// A trainer of an elastic job through the client SDK: logistic regression
// with momentum SGD on one data set that every rank generates from a seed,
// each step's global batch split among the workers of the current epoch.
// When a worker is lost, Synchronize fails with kMembershipChanged; the
// survivors agree on the step to resume at (Communicator::AgreeOnStep),
// take that rank's parameters and momentum (Broadcast), re-shard the batch
// for their new rank and size, and redo the step.
//
// With --server_optimizer (path=ps, the shards run optimizer=sgd) the shards
// step instead: the first synchronisation hands them the parameters (and
// every worker receives theirs), each later one a gradient, and the buffer
// receives the new parameters; after a change at step 0 the first one is
// handed the parameters again.
//
//   elastic_worker --scheduler=... --num_workers=4 [--steps=400]
//       [--step_sleep_ms=5] [--split --mark_gap_ms=N] [--server_optimizer]
//       [--die_at_step=N --die_rank=R --die_once=PATH]
//       [--depart_at_step=N --depart_rank=R] [--barrier_every=N]
//       [--depart_after_steps=N] [--min_epoch=E]
// With die_at_step, the worker started with rank R SIGKILLs itself after
// step N, once: only if it could create PATH (a restart finds it there).
// With depart_at_step, the worker started with rank R leaves the job after
// step N (Communicator::Depart) and exits 0. With barrier_every, every
// worker enters a Barrier after each N-th step it completed (not after a
// recovery; a joiner from its first completed step on) and prints "barrier
// after step S".
// With depart_after_steps, a worker that joined the running job leaves it
// after its N-th completed step. With min_epoch, the workers go on past
// --steps until they have re-formed in epoch E or later (all at the same
// step: they re-form together).
// Prints "reached step N" every 25 steps, "membership changed ..." on each
// change, and at the end "final step S world W epoch E params HEX" and the
// gradient bytes synchronised before and after compression; and "shared
// memory mapped: N" (the gradsync-* objects /proc/self/maps shows) and
// "descriptors N threads M" at step 25 and at the end.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/logging.h"
#include "gradsync/communicator.h"
#include "tests/test_worker.h"

extern char** environ;

namespace gradsync {
namespace {

constexpr int kDim = 256;
constexpr int kSamples = 4800;    // whole global batches
constexpr int kGlobalBatch = 48;  // divides evenly among 1, 2, 3 or 4 workers
constexpr float kRate = 0.2f;
constexpr float kMomentum = 0.9f;

uint64_t Fnv(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct State {
  std::vector<float> w = std::vector<float>(kDim, 0.0f);
  std::vector<float> m = std::vector<float>(kDim, 0.0f);  // momentum
  uint64_t step = 0;                                      // steps completed
  bool server_optimizer = false;
  bool from_shards = false;  // server_optimizer: the shards' parameters were taken
};

// After a membership change: every survivor takes the state of the rank
// that completed the most steps.
Status Recover(client::Communicator& c, State* state) {
  const Deadline deadline = Deadline::AfterMs(60000);
  GS_ASSIGN_OR_RETURN(client::Communicator::ResumePoint at, c.AgreeOnStep(state->step, deadline));
  GS_RETURN_IF_ERROR(c.Broadcast(state->w.data(), kDim, DType::kF32, at.root, deadline));
  GS_RETURN_IF_ERROR(c.Broadcast(state->m.data(), kDim, DType::kF32, at.root, deadline));
  std::printf("resuming at step %llu from rank %d as rank %d of %d (epoch %u)\n",
              static_cast<unsigned long long>(at.step), at.root, c.rank(), c.world_size(),
              c.epoch());
  std::fflush(stdout);
  state->step = at.step;
  state->from_shards = at.step > 0;  // the shards' first round of the epoch is a gradient's
  return Status();
}

// The weights as one tensor, or (--split) as two halves in buckets of
// their own, marked ready last half first (DDP's bucket order) with
// --mark_gap_ms between them, as a backward pass that produces them apart.
struct Tensors {
  std::vector<client::TensorId> ids;  // the halves: second, then first
  int64_t gap_ms = 0;
};

// Hands `g` over tensor by tensor and waits for its synchronisation.
Status Sync(client::Communicator& c, const Tensors& tensors, std::vector<float>* g) {
  const size_t part = g->size() / tensors.ids.size();
  for (size_t i = 0; i < tensors.ids.size(); ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(tensors.gap_ms));
    const size_t at = (tensors.ids.size() - 1 - i) * part;
    GS_ASSIGN_OR_RETURN(client::SyncHandle h, c.MarkReady(tensors.ids[i], g->data() + at));
    (void)h;
  }
  return c.Synchronize(Deadline::AfterMs(60000));
}

// One step on this rank's share of the global batch.
Status Step(client::Communicator& c, const Tensors& tensors, const LogregData& data, State* state,
            std::vector<float>* g) {
  if (state->server_optimizer && !state->from_shards) {
    *g = state->w;  // the first round: the parameters in, the shards' out
    GS_RETURN_IF_ERROR(Sync(c, tensors, g));
    state->w = *g;
    state->from_shards = true;
  }
  const int share = kGlobalBatch / c.world_size();
  const int begin = static_cast<int>((state->step * kGlobalBatch) % kSamples) + c.rank() * share;
  std::fill(g->begin(), g->end(), 0.0f);
  LogregLossAndGradient(data, state->w, begin, begin + share, g);
  GS_RETURN_IF_ERROR(Sync(c, tensors, g));
  if (state->server_optimizer) {
    state->w = *g;  // the new parameters
    ++state->step;
    return Status();
  }
  for (int j = 0; j < kDim; ++j) {
    state->m[j] = kMomentum * state->m[j] + (*g)[j];
    state->w[j] -= kRate * state->m[j];
  }
  ++state->step;
  return Status();
}

// Whether this process is the one to die after `step` (die_at_step).
bool DiesAt(const Config& config, uint64_t step) {
  auto number = [&](const char* name, int64_t def) {
    StatusOr<int64_t> v = config.GetInt(name, def);
    return v.ok() ? *v : def;
  };
  const int64_t at = number("die_at_step", -1);
  if (at < 0 || step != static_cast<uint64_t>(at)) return false;
  if (number("rank", -1) != number("die_rank", 0)) return false;
  StatusOr<std::string> path = config.GetString("die_once", "");
  const std::string once = path.ok() ? *path : "";
  const int fd = once.empty() ? -1 : open(once.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// Mappings of gradsync's shared-memory objects (links, segments) in this
// process, unlinked ones included.
int SharedMemoryMapped() {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return -1;
  int n = 0;
  char line[4096];
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    if (std::strstr(line, "/dev/shm/gradsync-") != nullptr) ++n;
  }
  std::fclose(maps);
  return n;
}

// This process's open file descriptors and threads.
int Entries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n - 2;  // . and ..
}

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// After a membership change: when the first step completed (and for a
// joiner, how long after its start).
void PrintFirstStep(const client::Communicator& c, bool joiner,
                    std::chrono::steady_clock::time_point started) {
  std::printf("first step after the change at wall_ms %lld (epoch %u)\n",
              static_cast<long long>(WallMs()), c.epoch());
  if (joiner) {
    std::printf("joined: first completed step %.3f s after start\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  const auto started = std::chrono::steady_clock::now();
  auto config = Config::FromArgs(argc, argv, environ);
  if (!config.ok()) return 2;
  const uint64_t steps = static_cast<uint64_t>(config->GetInt("steps", 400).value());
  const int64_t sleep_ms = config->GetInt("step_sleep_ms", 5).value();
  std::unique_ptr<client::Communicator> comm = JoinAsWorker(*config);
  if (comm == nullptr) return 3;
  client::Communicator& c = *comm;
  Tensors tensors;
  tensors.gap_ms = config->GetInt("mark_gap_ms", 0).value();
  if (config->GetBool("split", false).value()) {
    auto first = c.RegisterTensor("elastic.weight.first", kDim / 2, DType::kF32);
    auto second = c.RegisterTensor("elastic.weight.second", kDim / 2, DType::kF32);
    if (!first.ok() || !second.ok()) return 3;
    tensors.ids = {*second, *first};
  } else {
    auto id = c.RegisterTensor("elastic.weight", kDim, DType::kF32);
    if (!id.ok()) return 3;
    tensors.ids = {*id};
  }
  const LogregData data = MakeLogregData(kDim, kSamples, 99);  // one set, shared
  State state;
  state.server_optimizer = config->GetBool("server_optimizer", false).value();
  std::vector<float> g(kDim);
  // A worker that joined a running job takes the state as a survivor does.
  const bool joiner = c.epoch() > 0;
  const int64_t depart_at = config->GetInt("depart_at_step", -1).value();
  const int64_t barrier_every = config->GetInt("barrier_every", 0).value();
  const bool departs =
      !joiner && config->GetInt("rank", -1).value() == config->GetInt("depart_rank", -2).value();
  const int64_t depart_after = joiner ? config->GetInt("depart_after_steps", -1).value() : -1;
  const int64_t min_epoch = config->GetInt("min_epoch", 0).value();
  int64_t formed = c.epoch();  // the epoch of the last re-form
  int64_t completed = 0;       // steps this worker completed
  Status joined = joiner ? MembershipChangedError("joined the running job") : Status();
  bool changed = false, first_since_join = joiner;
  while (state.step < steps || formed < min_epoch) {
    Status s = joined.ok() ? Step(c, tensors, data, &state, &g) : joined;
    // The barrier follows a step this worker completed, never a recovery:
    // every worker of the epoch then enters the same ones.
    const bool stepped = s.ok();
    if (stepped) ++completed;
    if (s.ok() && changed) {
      PrintFirstStep(c, first_since_join, started);
      first_since_join = false;
    }
    changed = !joined.ok() || s.code() == StatusCode::kMembershipChanged;
    joined = Status();
    while (s.code() == StatusCode::kMembershipChanged) {
      std::printf("%s; now rank %d of %d\n", s.ToString().c_str(), c.rank(), c.world_size());
      std::fflush(stdout);
      s = Recover(c, &state);
      if (s.ok()) formed = c.epoch();
    }
    if (!s.ok()) {
      std::printf("error: %s\n", s.ToString().c_str());
      return 3;
    }
    if (stepped && barrier_every > 0 && static_cast<int64_t>(state.step) % barrier_every == 0) {
      s = c.Barrier(Deadline::AfterMs(60000));
      while (s.code() == StatusCode::kMembershipChanged) {
        std::printf("%s (in a barrier); now rank %d of %d\n", s.ToString().c_str(), c.rank(),
                    c.world_size());
        std::fflush(stdout);
        s = Recover(c, &state);
        if (s.ok()) formed = c.epoch();
        changed = true;
      }
      if (!s.ok()) {
        std::printf("error: barrier after step %llu: %s\n",
                    static_cast<unsigned long long>(state.step), s.ToString().c_str());
        return 3;
      }
      std::printf("barrier after step %llu\n", static_cast<unsigned long long>(state.step));
    }
    if ((departs && static_cast<int64_t>(state.step) == depart_at) ||
        (stepped && completed == depart_after)) {
      std::printf("departing after step %llu\n", static_cast<unsigned long long>(state.step));
      std::fflush(stdout);
      c.Depart("scaled down");
      return 0;
    }
    if (DiesAt(*config, state.step)) {
      std::printf("dying after step %llu at wall_ms %lld\n",
                  static_cast<unsigned long long>(state.step), static_cast<long long>(WallMs()));
      std::fflush(stdout);
      raise(SIGKILL);
    }
    if (state.step % 25 == 0) {
      std::printf("reached step %llu\n", static_cast<unsigned long long>(state.step));
      if (state.step == 25) {
        std::printf("shared memory mapped: %d\n", SharedMemoryMapped());
        std::printf("descriptors %d threads %d\n", Entries("/proc/self/fd"),
                    Entries("/proc/self/task"));
      }
      std::fflush(stdout);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
  std::printf("final step %llu world %d epoch %u params %016llx\n",
              static_cast<unsigned long long>(state.step), c.world_size(), c.epoch(),
              static_cast<unsigned long long>(Fnv(state.w)));
  const client::CommunicatorStats stats = c.stats();
  std::printf("gradient bytes %llu, after compression %llu\n",
              static_cast<unsigned long long>(stats.bytes_reduced),
              static_cast<unsigned long long>(stats.wire_bytes));
  std::printf("shared memory mapped: %d\n", SharedMemoryMapped());
  std::printf("descriptors %d threads %d\n", Entries("/proc/self/fd"), Entries("/proc/self/task"));
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
