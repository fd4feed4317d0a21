// fmnist_trainer: data-parallel training of an MLP (784-256-128-10) on
// Fashion-MNIST through the gradsync client SDK.
//
//   GRADSYNC_SCHEDULER=host:port GRADSYNC_NUM_WORKERS=4 GRADSYNC_RANK=r
//   fmnist_trainer [--epochs=3] [--batch=64] [--lr=0.05] [--momentum=0.9]
//                      [--seed=1] [--mode=allreduce-ring] [--data_dir=...]
//                      [--max_steps=0] [--eval_every_steps=0]
//                      [--target_accuracy=0.85] [--kill_rank=-1 --kill_step=-1]
//
// Every worker reads the whole data set and trains on its shard: each epoch
// all ranks draw the same permutation (seeded with seed + epoch) and rank r
// takes elements r, r + N, r + 2N, ... (the permutation is padded with its
// first elements so that every rank runs the same number of steps). Rank 0's
// initial parameters are broadcast. Each step runs forward and backward on
// `batch` local samples, hands every gradient to the Communicator as soon as
// the backward pass produced it (last layer first), waits in Synchronize for
// the average over all workers, and takes an SGD step with momentum. With a
// server-side optimizer (--optimizer=sgd|momentum|adam on the parameter-server
// path) the shards hold the parameters: Synchronize returns the new
// parameters, which replace the model's. --max_steps > 0 ends training after
// that many steps per worker, within an epoch if need be.
// --eval_every_steps=N > 0 evaluates the test accuracy every N steps (all
// ranks together, outside the training time) to find when training first
// reached --target_accuracy.
//
// Elastic jobs (gradsync_launch --min_workers, docs/design/failure_model.md):
// when a worker is lost or joins, the step in flight fails with
// kMembershipChanged; the workers of the new epoch agree on the step to go on
// from (Communicator::AgreeOnStep), take that rank's parameters, momentum and
// place in the epoch (Broadcast), deal the samples of the epoch not trained
// yet among their new ranks and redo the step. A worker that joined a running
// job does the same before its first step. --kill_rank=R --kill_step=S: the
// worker started as rank R SIGKILLs itself before step S (unless it joined a
// running job: a restart of it goes on), after printing {"killed_at": wall
// clock s}. Each worker of a job that changed prints, before the result line,
// {"elastic":true, rank, workers, membership_epoch, steps, joined,
// started_at, recoveries, recovered_at (wall clock of the first step completed
// after each change)}.
//
// Rank 0 shows progress on stderr (one line redrawn in place on a terminal,
// a few plain lines otherwise). At the end the ranks evaluate a slice of the
// 10k test images each and sum the counts; rank 0 prints one JSON line on
// stdout:
//   mode, test_accuracy, wall_s (training time, from the first step to the
//   last, evaluations left out), samples_per_s (training samples of all workers per second),
//   wire_bytes (payload bytes rank 0 sent during training, as its ring
//   counted them), compression_ratio (gradient bytes before / after
//   compression),
//   p50_ms / p99_ms (duration of Synchronize on rank 0), max_staleness (0),
//   workers, epochs, steps (per worker), first_loss / last_loss (the mean
//   training loss of all workers over the first and the last kLossWindow
//   steps, or over every step when there are fewer), time_to_target_s (the
//   training time until an evaluation every --eval_every_steps first reached
//   --target_accuracy; -1 when none did or evaluation was off) and
//   target_step (the step of that evaluation; -1 likewise).
// Exit status: 0 on success, 1 when training failed, 2 for bad flags.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/logging.h"
#include "examples/idx_reader.h"
#include "examples/mlp.h"
#include "gradsync/communicator.h"

extern char** environ;

namespace gradsync::examples {
namespace {

using client::Communicator;
using Clock = std::chrono::steady_clock;

// Mean and standard deviation of the Fashion-MNIST training pixels in [0, 1].
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;
constexpr int64_t kOpDeadlineMs = 300000;
constexpr size_t kLossWindow = 20;  // steps

struct Options {
  std::string data_dir;
  std::string mode;
  int64_t epochs = 0;
  int64_t batch = 0;
  double lr = 0;
  double momentum = 0;
  int64_t seed = 0;
  int64_t max_steps = 0;         // per worker; 0: no limit
  int64_t eval_every_steps = 0;  // 0: evaluate only at the end
  double target_accuracy = 0;
  bool server_optimizer = false;  // the PS shards hold the parameters
  int64_t kill_rank = -1;         // the rank (at the start) that SIGKILLs itself
  int64_t kill_step = -1;         // before this step
};

StatusOr<Options> ReadOptions(const Config& config) {
  Options o;
  GS_ASSIGN_OR_RETURN(o.data_dir, config.GetString("data_dir", kFashionMnistDir));
  GS_ASSIGN_OR_RETURN(o.mode, config.GetString("mode", "allreduce-ring"));
  GS_ASSIGN_OR_RETURN(o.epochs, config.GetInt("epochs", 3));
  GS_ASSIGN_OR_RETURN(o.batch, config.GetInt("batch", 64));
  GS_ASSIGN_OR_RETURN(o.lr, config.GetDouble("lr", 0.05));
  GS_ASSIGN_OR_RETURN(o.momentum, config.GetDouble("momentum", 0.9));
  GS_ASSIGN_OR_RETURN(o.seed, config.GetInt("seed", 1));
  GS_ASSIGN_OR_RETURN(o.max_steps, config.GetInt("max_steps", 0));
  GS_ASSIGN_OR_RETURN(o.eval_every_steps, config.GetInt("eval_every_steps", 0));
  GS_ASSIGN_OR_RETURN(o.target_accuracy, config.GetDouble("target_accuracy", 0.85));
  GS_ASSIGN_OR_RETURN(o.kill_rank, config.GetInt("kill_rank", -1));
  GS_ASSIGN_OR_RETURN(o.kill_step, config.GetInt("kill_step", -1));
  GS_ASSIGN_OR_RETURN(std::string optimizer, config.GetString("optimizer", "none"));
  o.server_optimizer = optimizer != "none";
  if (o.epochs < 1 || o.batch < 1 || o.lr <= 0 || o.momentum < 0 || o.momentum >= 1 ||
      o.max_steps < 0 || o.eval_every_steps < 0 || o.target_accuracy <= 0 ||
      o.target_accuracy > 1) {
    return InvalidArgumentError(
        "need --epochs >= 1, --batch >= 1, --lr > 0, 0 <= --momentum < 1, "
        "--max_steps >= 0, --eval_every_steps >= 0, 0 < --target_accuracy <= 1");
  }
  for (char c : o.mode) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return InvalidArgumentError("--mode may hold letters, digits and -_. only");
    }
  }
  return o;
}

// This rank's sample indices for one epoch (DistributedSampler semantics),
// of the epoch's permutation without its first `consumed` samples (trained
// before a membership change).
std::vector<size_t> ShardOfEpoch(size_t n, int rank, int world, uint64_t seed, int64_t epoch,
                                 size_t consumed) {
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1;
  for (size_t i = n; i > 1; --i) {  // Fisher-Yates with a splitmix64 stream
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    std::swap(perm[i - 1], perm[(z ^ (z >> 31)) % i]);
  }
  perm.erase(perm.begin(), perm.begin() + static_cast<std::ptrdiff_t>(std::min(consumed, n)));
  if (perm.empty()) return {};
  const size_t per_rank = (n + world - 1) / world;
  for (size_t i = 0; perm.size() < per_rank * world; ++i) {
    perm.push_back(perm[i]);
  }
  std::vector<size_t> shard;
  for (size_t i = rank; i < perm.size(); i += world) shard.push_back(perm[i]);
  return shard;
}

// Normalised pixels and labels of the images indices[0, count).
void Gather(const LabelledImages& set, const size_t* indices, size_t count,
            std::vector<float>* inputs, std::vector<uint8_t>* labels) {
  const size_t pixels = set.images.rows * set.images.cols;
  inputs->resize(count * pixels);
  labels->resize(count);
  for (size_t j = 0; j < count; ++j) {
    const uint8_t* image = set.images.pixels.data() + indices[j] * pixels;
    for (size_t p = 0; p < pixels; ++p) {
      (*inputs)[j * pixels + p] = (image[p] / 255.0f - kPixelMean) / kPixelStd;
    }
    (*labels)[j] = set.labels[indices[j]];
  }
}

// Rank 0's progress display on stderr.
class Progress {
 public:
  Progress(bool enabled, int64_t epochs)
      : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0), epochs_(epochs) {}

  void Update(int64_t epoch, size_t step, size_t steps, double loss, double samples_per_s) {
    if (!enabled_) return;
    const auto now = Clock::now();
    const bool last = step == steps;
    const int quarter = static_cast<int>(4 * step / steps);
    if (tty_ && !last && now - drawn_ < std::chrono::milliseconds(100)) return;
    if (!tty_ && !last && quarter == quarter_) return;
    drawn_ = now;
    quarter_ = last ? 0 : quarter;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * step / steps);
    std::fprintf(stderr, "%sepoch %lld/%lld [%s%s] %3d%% loss %.4f %.0f samples/s%s",
                 tty_ ? "\r" : "", static_cast<long long>(epoch + 1),
                 static_cast<long long>(epochs_), std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), static_cast<int>(100 * step / steps),
                 loss, samples_per_s, tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  bool tty_;
  int64_t epochs_;
  Clock::time_point drawn_;
  int quarter_ = 0;  // of the epoch, last printed (plain lines)
};

struct RunStats {
  double wall_s = 0;
  uint64_t samples = 0;  // all workers
  size_t steps = 0;      // per worker
  std::vector<double> sync_ms;
  uint64_t raw_bytes = 0;   // gradient bytes synchronised, before compression
  uint64_t wire_bytes = 0;  // the same after compression
  uint64_t sent_bytes = 0;  // payload bytes this rank sent
  // This rank's training loss, one per step.
  std::vector<float> losses;
  // The mean over all ranks of the first and of the last kLossWindow losses.
  double first_loss = 0;
  double last_loss = 0;
  // When an evaluation first reached the target accuracy (-1: none did).
  double time_to_target_s = -1;
  int64_t target_step = -1;
};

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

StatusOr<double> Evaluate(const Mlp& model, const LabelledImages& test, Communicator* comm);

class Trainer {
 public:
  // `test`: evaluated every options.eval_every_steps steps.
  Trainer(Options options, Communicator* comm, const LabelledImages* train,
          const LabelledImages* test)
      : options_(std::move(options)),
        comm_(comm),
        train_(train),
        test_(test),
        model_({784, 256, 128, 10}, static_cast<uint64_t>(options_.seed)),
        sgd_(model_, static_cast<float>(options_.lr), static_cast<float>(options_.momentum)),
        progress_(comm->rank() == 0, options_.epochs),
        first_rank_(comm->rank()),
        joined_(comm->epoch() > 0) {}

  Mlp& model() { return model_; }

  // Registers the gradients and starts every rank from rank 0's parameters
  // (a worker that joined a running job: from the state the members agree
  // on).
  Status Setup() {
    for (size_t t = 0; t < model_.num_tensors(); ++t) {
      GS_ASSIGN_OR_RETURN(
          client::TensorId id,
          comm_->RegisterTensor(model_.tensor_name(t), model_.tensor_size(t), DType::kF32));
      ids_.push_back(id);
    }
    if (joined_) return Recover(MembershipChangedError("joined the running job"));
    Status s = StartFromRankZero();
    return s.code() == StatusCode::kMembershipChanged ? Recover(s) : s;
  }

  // The JSON line of a worker of a job whose membership changed (or that
  // was to lose a worker).
  void PrintElastic(double started_at) const {
    if (recovered_at_.empty() && !joined_ && options_.kill_rank < 0) return;
    std::printf("{\"elastic\":true,\"rank\":%d,\"workers\":%d,\"membership_epoch\":%u,",
                comm_->rank(), comm_->world_size(), comm_->epoch());
    std::printf("\"steps\":%zu,\"joined\":%s,\"started_at\":%.3f,\"recoveries\":%d,", stats_.steps,
                joined_ ? "true" : "false", started_at, recoveries_);
    std::printf("\"recovered_at\":[");
    for (size_t i = 0; i < recovered_at_.size(); ++i) {
      std::printf("%s%.3f", i ? "," : "", recovered_at_[i]);
    }
    std::printf("]}\n");
    std::fflush(stdout);
  }

  StatusOr<RunStats> Train() {
    const auto start = Clock::now();
    const client::CommunicatorStats before = comm_->stats();
    while (epoch_ < options_.epochs && !StepLimitReached()) {
      GS_ASSIGN_OR_RETURN(bool finished, RunEpoch(start));
      if (finished) {
        ++epoch_;
        consumed_ = 0;
      }
    }
    stats_.wall_s = Elapsed(start);
    const client::CommunicatorStats after = comm_->stats();
    stats_.raw_bytes = after.bytes_reduced - before.bytes_reduced;
    stats_.wire_bytes = after.wire_bytes - before.wire_bytes;
    stats_.sent_bytes = after.sent_bytes - before.sent_bytes;
    return stats_;
  }

 private:
  Status StartFromRankZero() {
    if (options_.server_optimizer) return HandParametersToShards();
    for (size_t t = 0; t < model_.num_tensors(); ++t) {
      GS_RETURN_IF_ERROR(comm_->Broadcast(model_.param(t), model_.tensor_size(t), DType::kF32, 0,
                                          Deadline::AfterMs(kOpDeadlineMs)));
    }
    return OkStatus();
  }

  Status HandParametersToShards() {
    // The first synchronisation hands the shards rank 0's parameters and
    // gives every rank the same values back.
    for (size_t t = 0; t < model_.num_tensors(); ++t) {
      GS_RETURN_IF_ERROR(comm_->MarkReady(ids_[t], model_.param(t)).status());
    }
    return comm_->Synchronize(Deadline::AfterMs(kOpDeadlineMs));
  }

  // After a membership change (`why`): the workers of the new epoch take
  // the state of the rank that completed the most steps; again while the
  // membership keeps changing.
  Status Recover(Status why) {
    for (;;) {
      GS_LOG(WARNING) << why.ToString() << "; now rank " << comm_->rank() << " of "
                      << comm_->world_size() << " (epoch " << comm_->epoch() << ")";
      Status s = TakeAgreedState();
      if (s.code() != StatusCode::kMembershipChanged) {
        ++recoveries_;
        recovering_ = true;
        return s;
      }
      why = s;
    }
  }

  Status TakeAgreedState() {
    const Deadline deadline = Deadline::AfterMs(kOpDeadlineMs);
    GS_ASSIGN_OR_RETURN(Communicator::ResumePoint at, comm_->AgreeOnStep(stats_.steps, deadline));
    for (size_t t = 0; t < model_.num_tensors(); ++t) {
      GS_RETURN_IF_ERROR(
          comm_->Broadcast(model_.param(t), model_.tensor_size(t), DType::kF32, at.root, deadline));
      if (!options_.server_optimizer) {
        GS_RETURN_IF_ERROR(comm_->Broadcast(sgd_.velocity(t), model_.tensor_size(t), DType::kF32,
                                            at.root, deadline));
      }
    }
    uint64_t place[3] = {stats_.steps, static_cast<uint64_t>(epoch_), consumed_};
    GS_RETURN_IF_ERROR(comm_->Broadcast(place, sizeof(place), DType::kU8, at.root, deadline));
    stats_.steps = place[0];
    epoch_ = static_cast<int64_t>(place[1]);
    consumed_ = place[2];
    GS_LOG(WARNING) << "resuming at step " << stats_.steps << " (epoch " << epoch_ + 1 << ", "
                    << consumed_ << " samples trained) from rank " << at.root << " as rank "
                    << comm_->rank() << " of " << comm_->world_size();
    // The shards' first round of an epoch takes a gradient, unless the job
    // goes on from step 0: then the parameters, as at the start.
    if (options_.server_optimizer && stats_.steps == 0) return HandParametersToShards();
    return OkStatus();
  }

  // Training time since `start`, the evaluations left out.
  double Elapsed(Clock::time_point start) const {
    return std::chrono::duration<double>(Clock::now() - start).count() - eval_s_;
  }

  // Every eval_every_steps steps, until the target is reached: the test
  // accuracy, and the training time when it first reaches the target.
  Status MaybeEvaluate(Clock::time_point start) {
    if (options_.eval_every_steps == 0 || stats_.target_step >= 0 ||
        stats_.steps % static_cast<size_t>(options_.eval_every_steps) != 0) {
      return OkStatus();
    }
    const double trained_s = Elapsed(start);
    const auto eval_start = Clock::now();
    GS_ASSIGN_OR_RETURN(double accuracy, Evaluate(model_, *test_, comm_));
    eval_s_ += std::chrono::duration<double>(Clock::now() - eval_start).count();
    if (accuracy >= options_.target_accuracy) {
      stats_.time_to_target_s = trained_s;
      stats_.target_step = static_cast<int64_t>(stats_.steps);
    }
    return OkStatus();
  }

  bool StepLimitReached() const {
    return options_.max_steps > 0 && stats_.steps >= static_cast<size_t>(options_.max_steps);
  }

  // The rest of epoch_ from consumed_; false when a membership change cut
  // it short (the state is the agreed one: deal the rest again).
  StatusOr<bool> RunEpoch(Clock::time_point start) {
    const int64_t epoch = epoch_;
    const size_t world = static_cast<size_t>(comm_->world_size());
    const std::vector<size_t> shard =
        ShardOfEpoch(train_->labels.size(), comm_->rank(), comm_->world_size(),
                     static_cast<uint64_t>(options_.seed), epoch, consumed_);
    const size_t batch = static_cast<size_t>(options_.batch);
    size_t steps = (shard.size() + batch - 1) / batch;
    if (options_.max_steps > 0) {
      steps = std::min(steps, static_cast<size_t>(options_.max_steps) - stats_.steps);
    }
    double loss_sum = 0;
    for (size_t s = 0; s < steps; ++s) {
      const size_t count = std::min(batch, shard.size() - s * batch);
      Gather(*train_, shard.data() + s * batch, count, &inputs_, &labels_);
      MaybeDie();
      StatusOr<float> loss = Step(count);
      Status done = loss.status();
      if (done.ok()) {
        loss_sum += *loss;
        stats_.samples += count * world;
        consumed_ = std::min(consumed_ + count * world, train_->labels.size());
        if (recovering_) recovered_at_.push_back(WallSeconds());
        recovering_ = false;
        done = MaybeEvaluate(start);
      }
      if (done.code() == StatusCode::kMembershipChanged) {
        GS_RETURN_IF_ERROR(Recover(done));
        return false;
      }
      GS_RETURN_IF_ERROR(done);
      const double elapsed = Elapsed(start);
      progress_.Update(epoch, s + 1, steps, loss_sum / static_cast<double>(s + 1),
                       static_cast<double>(stats_.samples) / elapsed);
    }
    return true;
  }

  // --kill_rank / --kill_step: SIGKILLs this process before the step.
  void MaybeDie() const {
    if (joined_ || first_rank_ != options_.kill_rank ||
        static_cast<int64_t>(stats_.steps) != options_.kill_step) {
      return;
    }
    std::printf("{\"killed_at\":%.3f}\n", WallSeconds());
    std::fflush(stdout);
    raise(SIGKILL);
  }

  StatusOr<float> Step(size_t count) {
    const float loss = model_.Forward(inputs_.data(), labels_.data(), static_cast<int>(count));
    Status marked;
    model_.Backward([&](size_t t) {
      if (!marked.ok()) return;
      auto handle = comm_->MarkReady(ids_[t], model_.grad(t));
      if (!handle.ok()) marked = handle.status();
    });
    GS_RETURN_IF_ERROR(marked);
    const auto sync_start = Clock::now();
    GS_RETURN_IF_ERROR(comm_->Synchronize(Deadline::AfterMs(kOpDeadlineMs)));
    stats_.sync_ms.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - sync_start).count());
    if (options_.server_optimizer) {
      // The shards applied the update: the buffers hold the new parameters.
      for (size_t t = 0; t < model_.num_tensors(); ++t) {
        std::memcpy(model_.param(t), model_.grad(t), model_.tensor_size(t) * sizeof(float));
      }
    } else {
      sgd_.Step(&model_);
    }
    ++stats_.steps;
    stats_.losses.push_back(loss);
    return loss;
  }

  Options options_;
  Communicator* comm_;
  const LabelledImages* train_;
  const LabelledImages* test_;
  double eval_s_ = 0;  // spent evaluating during training
  Mlp model_;
  SgdMomentum sgd_;
  Progress progress_;
  std::vector<client::TensorId> ids_;
  std::vector<float> inputs_;
  std::vector<uint8_t> labels_;
  RunStats stats_;
  const int first_rank_;  // the rank this worker started with
  const bool joined_;     // it joined a running job
  int64_t epoch_ = 0;     // of training; with consumed_, where training is
  size_t consumed_ = 0;   // samples of epoch_'s permutation trained
  int recoveries_ = 0;
  bool recovering_ = false;  // recovered; no step completed since
  std::vector<double> recovered_at_;
};

// Test accuracy over all ranks: each evaluates a contiguous slice.
StatusOr<double> Evaluate(const Mlp& model, const LabelledImages& test, Communicator* comm) {
  const size_t n = test.labels.size(), world = static_cast<size_t>(comm->world_size());
  const size_t rank = static_cast<size_t>(comm->rank());
  std::vector<size_t> mine(n * (rank + 1) / world - n * rank / world);
  std::iota(mine.begin(), mine.end(), n * rank / world);
  float counts[2] = {0, static_cast<float>(mine.size())};
  constexpr size_t kChunk = 1000;
  std::vector<float> inputs;
  std::vector<uint8_t> labels;
  for (size_t at = 0; at < mine.size(); at += kChunk) {
    const size_t count = std::min(kChunk, mine.size() - at);
    Gather(test, mine.data() + at, count, &inputs, &labels);
    counts[0] += static_cast<float>(
        model.CountCorrect(inputs.data(), labels.data(), static_cast<int>(count)));
  }
  GS_RETURN_IF_ERROR(comm->AllReduce(counts, 2, DType::kF32, client::ReduceOp::kSum,
                                     Deadline::AfterMs(kOpDeadlineMs)));
  return counts[1] > 0 ? counts[0] / counts[1] : 0.0;
}

// Sets the mean training loss of all ranks over the first and the last
// kLossWindow steps (every rank ran the same number of steps).
Status AverageLossWindows(Communicator* comm, RunStats* run) {
  const std::vector<float>& losses = run->losses;
  const size_t window = std::min(kLossWindow, losses.size());
  float sums[2] = {0, 0};
  for (size_t i = 0; i < window; ++i) {
    sums[0] += losses[i];
    sums[1] += losses[losses.size() - window + i];
  }
  GS_RETURN_IF_ERROR(comm->AllReduce(sums, 2, DType::kF32, client::ReduceOp::kSum,
                                     Deadline::AfterMs(kOpDeadlineMs)));
  const double count = static_cast<double>(window * comm->world_size());
  run->first_loss = count > 0 ? sums[0] / count : 0;
  run->last_loss = count > 0 ? sums[1] / count : 0;
  return OkStatus();
}

void PrintResult(const Options& o, const RunStats& run, double accuracy, Communicator* comm) {
  const int n = comm->world_size();
  const double wire = static_cast<double>(run.sent_bytes);
  const double ratio =
      run.wire_bytes > 0 ? static_cast<double>(run.raw_bytes) / static_cast<double>(run.wire_bytes)
                         : 1.0;
  std::printf("{\"mode\":\"%s\",\"test_accuracy\":%.4f,\"wall_s\":%.3f,", o.mode.c_str(), accuracy,
              run.wall_s);
  std::printf("\"samples_per_s\":%.1f,\"wire_bytes\":%.0f,",
              static_cast<double>(run.samples) / run.wall_s, wire);
  std::printf("\"compression_ratio\":%.2f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,", ratio,
              Percentile(run.sync_ms, 0.50), Percentile(run.sync_ms, 0.99));
  std::printf("\"max_staleness\":0,\"workers\":%d,\"epochs\":%lld,", n,
              static_cast<long long>(o.epochs));
  std::printf("\"steps\":%zu,\"first_loss\":%.4f,\"last_loss\":%.4f,", run.steps, run.first_loss,
              run.last_loss);
  std::printf("\"time_to_target_s\":%.3f,\"target_step\":%lld}\n", run.time_to_target_s,
              static_cast<long long>(run.target_step));
  std::fflush(stdout);
}

int Fail(const std::string& what, const Status& s, int code) {
  std::fprintf(stderr, "fmnist_trainer: %s: %s\n", what.c_str(), s.ToString().c_str());
  return code;
}

int Run(const Config& config, const Options& options, double started_at) {
  auto train = ReadFashionMnist(options.data_dir, /*train=*/true);
  if (!train.ok()) return Fail("reading the training set", train.status(), 1);
  auto test = ReadFashionMnist(options.data_dir, /*train=*/false);
  if (!test.ok()) return Fail("reading the test set", test.status(), 1);
  auto comm = Communicator::Create(config, Deadline::AfterMs(kOpDeadlineMs));
  if (!comm.ok()) return Fail("joining the job", comm.status(), 1);
  if (Status known = config.CheckKnownFlags(); !known.ok()) return Fail("flags", known, 2);
  Trainer trainer(options, comm->get(), &*train, &*test);
  Status setup = trainer.Setup();
  if (!setup.ok()) return Fail("setting up", setup, 1);
  auto run = trainer.Train();
  if (!run.ok()) return Fail("training", run.status(), 1);
  auto accuracy = Evaluate(trainer.model(), *test, comm->get());
  if (!accuracy.ok()) return Fail("evaluating", accuracy.status(), 1);
  Status losses = AverageLossWindows(comm->get(), &*run);
  if (!losses.ok()) return Fail("averaging the losses", losses, 1);
  trainer.PrintElastic(started_at);
  if ((*comm)->rank() == 0) PrintResult(options, *run, *accuracy, comm->get());
  (*comm)->Shutdown();
  return 0;
}

int Main(int argc, char** argv) {
  const double started_at = WallSeconds();
  SetLogTag("worker");
  auto config = Config::FromArgs(argc, argv, environ);
  if (!config.ok()) return Fail("flags", config.status(), 2);
  auto options = ReadOptions(*config);
  if (!options.ok()) return Fail("flags", options.status(), 2);
  return Run(*config, *options, started_at);
}

}  // namespace
}  // namespace gradsync::examples

int main(int argc, char** argv) { return gradsync::examples::Main(argc, argv); }
