// Elastic jobs across real processes: a scheduler, ring or parameter-server
// workers (tests/elastic_worker) and shards on this machine; one worker is
// SIGKILLed in the middle of training.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/local_job.h"
#include "wire/curve.h"

namespace gradsync {
namespace {

using std::chrono::steady_clock;

// The parameter-server shards of a job, and the flags its workers take.
struct Shards {
  int count = 0;  // 0: the ring
  std::vector<std::string> flags;
  std::vector<std::string> worker_flags;
};

// Two shards that average (ps_mode=sync, optimizer=none); each of the
// workers' two buckets is one key, pushed in fp16.
Shards SyncShards() {
  return {2,
          {"--ps_mode=sync"},
          {"--path=ps", "--split=true", "--bucket_bytes=512", "--first_bucket_bytes=512",
           "--compression=fp16", "--compression_min_bytes=0"}};
}

// Two shards that step (ps_mode=sync, optimizer=sgd).
Shards SteppingShards() {
  return {2,
          {"--ps_mode=sync", "--optimizer=sgd", "--lr=0.2"},
          {"--path=ps", "--optimizer=sgd", "--server_optimizer=true", "--split=true",
           "--bucket_bytes=512", "--first_bucket_bytes=512"}};
}

class ElasticTest : public ::testing::Test, public LocalJob {
 protected:
  // Starts `workers` trainers of a job whose scheduler takes `flags`, and
  // `shards`. With `key_file`, the job runs CURVE: every node with its own
  // key. Worker r runs on host hosts_[r] when there is one.
  std::vector<Subprocess*> StartJob(int workers, std::vector<std::string> flags,
                                    const std::string& steps, const std::string& key_file = "",
                                    std::vector<std::string> worker_flags = {"--step_sleep_ms=5"},
                                    const Shards& shards = {}) {
    if (!key_file.empty()) flags.push_back("--key_file=" + key_file);
    StartScheduler(workers, shards.count, flags);
    SetJob(workers, shards.count);
    if (!key_file.empty()) env_["GRADSYNC_KEY_FILE"] = key_file;
    for (int s = 0; s < shards.count; ++s) {
      std::vector<std::string> argv = {Runfile("server/gradsync_server"), "--role=server"};
      argv.insert(argv.end(), shards.flags.begin(), shards.flags.end());
      shards_.push_back(&Start(argv, "server" + std::to_string(s)));
    }
    worker_flags.insert(worker_flags.end(), shards.worker_flags.begin(), shards.worker_flags.end());
    worker_flags_ = worker_flags;
    std::vector<Subprocess*> procs;
    for (int r = 0; r < workers; ++r) {
      std::vector<std::string> argv = {Runfile("tests/elastic_worker"),
                                       "--rank=" + std::to_string(r), "--steps=" + steps};
      if (r < static_cast<int>(hosts_.size())) argv.push_back("--host=" + hosts_[r]);
      argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
      procs.push_back(&Start(argv, "worker" + std::to_string(r)));
    }
    return procs;
  }

  // Each of `procs` exits 0 having printed `said` and `final` (a "final
  // step ... params " prefix), all with the same parameters.
  static void ExpectFinishAlike(const std::vector<Subprocess*>& procs, const std::string& said,
                                const std::string& final) {
    std::set<std::string> params;
    for (Subprocess* w : procs) {
      ASSERT_EQ(w->Wait(Deadline::AfterMs(60000)), 0) << w->Output();
      const std::string out = w->Output();
      EXPECT_NE(out.find(said), std::string::npos) << out;
      EXPECT_NE(out.find(final), std::string::npos) << out;
      params.insert(Params(out));
    }
    EXPECT_EQ(params.size(), 1u) << "the workers' parameters differ";
    EXPECT_FALSE(params.begin()->empty());
  }

  // A worker joining the running job (on `host`, if not empty), with the
  // flags the others took.
  Subprocess& StartJoiner(const std::string& steps, const std::string& host = "") {
    std::vector<std::string> argv = {Runfile("tests/elastic_worker"), "--steps=" + steps};
    if (!host.empty()) argv.push_back("--host=" + host);
    argv.insert(argv.end(), worker_flags_.begin(), worker_flags_.end());
    return Start(argv, "joiner");
  }

  // The shards end with the job; every round closed once per key (each of
  // the workers' two buckets a key): `steps` per key, none closed again
  // when the survivors redo a step.
  void ExpectEveryRoundClosedOnce(int steps) {
    int closed = 0;
    for (Subprocess* s : shards_) {
      ASSERT_EQ(s->Wait(Deadline::AfterMs(20000)), 0) << s->Output();
      const std::string out = s->Output();
      const size_t at = out.find("rounds closed ");
      ASSERT_NE(at, std::string::npos) << out;
      closed += std::atoi(out.c_str() + at + std::strlen("rounds closed "));
      EXPECT_NE(out.find("membership epoch 1: "), std::string::npos) << out;
    }
    EXPECT_EQ(closed, 2 * steps) << "the shards closed a round twice, or missed one";
  }

  // fp16 pushes: after compression, half the gradient bytes (give or take
  // the pushes of the step the change failed, counted as sent: at most its
  // two 512-byte buckets).
  static void ExpectHalved(const std::string& output) {
    const size_t at = output.find("gradient bytes ");
    ASSERT_NE(at, std::string::npos) << output;
    unsigned long long raw = 0, wire = 0;
    ASSERT_EQ(std::sscanf(output.c_str() + at, "gradient bytes %llu, after compression %llu", &raw,
                          &wire),
              2)
        << output;
    EXPECT_GT(raw, 0u);
    EXPECT_GE(wire * 2, raw) << output;
    EXPECT_LE(wire * 2, raw + 2 * 1024) << output;
  }

  static std::string Params(const std::string& output) {
    const size_t at = output.find("final step ");
    if (at == std::string::npos) return "";
    const size_t p = output.find(" params ", at);
    return p == std::string::npos ? "" : output.substr(p + 8, 16);
  }

  // 4 workers, worker 2 SIGKILLed at step 100: the other 3 finish in epoch 1
  // with the same parameters.
  void KillOneOfFour(const std::string& key_file, const Shards& shards = {}) {
    auto workers = StartJob(4, {"--min_workers=2"}, "400", key_file, {"--step_sleep_ms=5"}, shards);
    ASSERT_TRUE(workers[2]->WaitForOutput("reached step 100", Deadline::AfterMs(60000)))
        << workers[2]->Output();
    const auto killed_at = steady_clock::now();
    workers[2]->Signal(SIGKILL);
    ASSERT_TRUE(workers[0]->WaitForOutput("resuming at step", Deadline::AfterMs(20000)))
        << workers[0]->Output();
    const auto recovered_ms =
        std::chrono::duration_cast<Millis>(steady_clock::now() - killed_at).count();
    const int limit_ms = kHeartbeatMs * kMissed;
    std::printf("survivors resumed %lld ms after SIGKILL (heartbeat deadline %d ms)\n",
                static_cast<long long>(recovered_ms), limit_ms);
    EXPECT_LE(recovered_ms, limit_ms + 3000);
    std::set<std::string> params;
    for (int r : {0, 1, 3}) {
      ASSERT_EQ(workers[r]->Wait(Deadline::AfterMs(60000)), 0) << workers[r]->Output();
      const std::string out = workers[r]->Output();
      EXPECT_NE(out.find("membership_changed: membership changed: worker rank 2 (identity "),
                std::string::npos)
          << out;
      EXPECT_NE(out.find("final step 400 world 3 epoch 1 params "), std::string::npos) << out;
      params.insert(Params(out));
      if (shards.count > 0 && shards.worker_flags.back() == "--compression_min_bytes=0") {
        ExpectHalved(out);  // the new epoch's client compresses too
      }
    }
    EXPECT_EQ(params.size(), 1u) << "the survivors' parameters differ";
    EXPECT_FALSE(params.begin()->empty());
    // Every worker left at the end: the job succeeded.
    EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(10000)), 0) << scheduler_->Output();
    EXPECT_NE(scheduler_->Output().find("epoch 1 starts with 3 workers"), std::string::npos);
    // On the scheduler's machine the exit is seen at once, not a heartbeat
    // deadline later.
    EXPECT_NE(scheduler_->Output().find(") left: its process (pid " +
                                        std::to_string(workers[2]->pid()) + ") exited"),
              std::string::npos)
        << scheduler_->Output();
    if (shards.count > 0) ExpectEveryRoundClosedOnce(400);
  }

  // 4 workers, worker 1 SIGKILLed at step 100; once the survivors resumed,
  // a new worker process joins: all 4 finish in epoch 2 with the same
  // parameters, the joiner (on `joiner_host`, if not empty) ranked last.
  // Every 50 steps they all enter a barrier, the joiner as the others.
  // Returns the outputs of worker 0, the two other survivors and the
  // joiner.
  std::vector<std::string> KillOneOfFourAndJoin(const std::string& key_file,
                                                const Shards& shards = {},
                                                const std::string& joiner_host = "") {
    auto workers = StartJob(4, {"--min_workers=2"}, "400", key_file,
                            {"--step_sleep_ms=5", "--barrier_every=50"}, shards);
    if (!workers[1]->WaitForOutput("reached step 100", Deadline::AfterMs(60000))) {
      ADD_FAILURE() << workers[1]->Output();
      return {};
    }
    workers[1]->Signal(SIGKILL);
    if (!workers[0]->WaitForOutput("resuming at step", Deadline::AfterMs(20000))) {
      ADD_FAILURE() << workers[0]->Output() << "\n--- worker 2:\n"
                    << workers[2]->Output() << "\n--- worker 3:\n"
                    << workers[3]->Output() << "\n--- scheduler:\n"
                    << scheduler_->Output();
      return {};
    }
    Subprocess& joiner = StartJoiner("400", joiner_host);
    std::set<std::string> params;
    std::vector<std::string> outputs;
    for (Subprocess* w : {workers[0], workers[2], workers[3], &joiner}) {
      EXPECT_EQ(w->Wait(Deadline::AfterMs(90000)), 0) << w->Output();
      const std::string out = w->Output();
      outputs.push_back(out);
      EXPECT_NE(out.find("final step 400 world 4 epoch 2 params "), std::string::npos) << out;
      EXPECT_NE(out.find("barrier after step 400"), std::string::npos) << out;
      params.insert(Params(out));
    }
    for (Subprocess* w : {workers[0], workers[2], workers[3]}) {
      EXPECT_NE(w->Output().find("membership_changed: membership changed: worker worker-"),
                std::string::npos)
          << w->Output();
      EXPECT_NE(w->Output().find(" joined (pid " + std::to_string(joiner.pid())), std::string::npos)
          << w->Output();
    }
    EXPECT_NE(joiner.Output().find("as rank 3 of 4 (epoch 2)"), std::string::npos)
        << joiner.Output();
    EXPECT_EQ(params.size(), 1u) << "the workers' parameters differ";
    EXPECT_FALSE(params.begin()->empty());
    EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(10000)), 0) << scheduler_->Output();
    EXPECT_NE(scheduler_->Output().find("epoch 2 starts with 4 workers: membership changed: "
                                        "worker worker-"),
              std::string::npos)
        << scheduler_->Output();
    if (shards.count > 0) ExpectEveryRoundClosedOnce(400);
    return outputs;
  }

  // 4 workers, worker 2 SIGKILLed at step 50: the 3 others finish 300
  // steps in epoch 1; the shards took the epoch and end cleanly.
  void SurvivorsFinish(const Shards& shards) {
    auto workers = StartJob(4, {"--min_workers=2"}, "300", "", {"--step_sleep_ms=5"}, shards);
    ASSERT_TRUE(workers[2]->WaitForOutput("reached step 50", Deadline::AfterMs(60000)))
        << workers[2]->Output();
    workers[2]->Signal(SIGKILL);
    for (int r : {0, 1, 3}) {
      ASSERT_EQ(workers[r]->Wait(Deadline::AfterMs(60000)), 0) << workers[r]->Output();
      EXPECT_NE(workers[r]->Output().find("final step 300 world 3 epoch 1 params "),
                std::string::npos)
          << workers[r]->Output();
    }
    EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(10000)), 0) << scheduler_->Output();
    for (Subprocess* s : shards_) {
      ASSERT_EQ(s->Wait(Deadline::AfterMs(20000)), 0) << s->Output();
      EXPECT_NE(s->Output().find("membership epoch 1: "), std::string::npos) << s->Output();
    }
  }

  // A worker joins and departs, `cycles` times over, while two workers
  // train (the joiners on `joiner_host`, if not empty): every epoch's ring
  // gives back its shared memory (segments, links) once the next one
  // formed, and the connections to departed workers are closed, so the
  // two end with no more of either than at step 25. With `base`, that many
  // workers train instead of two; `rank0` (if not null) gets rank 0's
  // output.
  void JoinAndDepart(int cycles, const std::string& joiner_host, const Shards& shards = {},
                     int base = 2, std::string* rank0 = nullptr) {
    const int epochs = 2 * cycles;  // a join and a departure each
    const std::string n = std::to_string(base);
    auto workers = StartJob(
        base, {"--min_workers=" + n, "--max_workers=" + std::to_string(base + 1)}, "50", "",
        {"--step_sleep_ms=5", "--depart_after_steps=10", "--min_epoch=" + std::to_string(epochs)},
        shards);
    for (Subprocess* w : workers) {
      ASSERT_TRUE(w->WaitForOutput("shared memory mapped: ", Deadline::AfterMs(60000)))
          << w->Output();
    }
    for (int k = 0; k < cycles; ++k) {
      Subprocess& joiner = StartJoiner("1000000", joiner_host);
      ASSERT_EQ(joiner.Wait(Deadline::AfterMs(90000)), 0) << joiner.Output();
      EXPECT_NE(joiner.Output().find("departing after step"), std::string::npos) << joiner.Output();
    }
    std::set<std::string> params;
    for (size_t i = 0; i < workers.size(); ++i) {
      Subprocess* w = workers[i];
      // Whether it shares its host with another of the job (all do on one).
      const bool shares = hosts_.empty() || std::count(hosts_.begin(), hosts_.end(), hosts_[i]) > 1;
      ASSERT_EQ(w->Wait(Deadline::AfterMs(90000)), 0) << w->Output();
      const std::string out = w->Output();
      EXPECT_NE(out.find(" world " + n + " epoch " + std::to_string(epochs) + " params "),
                std::string::npos)
          << out;
      params.insert(Params(out));
      const std::string said = "shared memory mapped: ";
      const size_t first = out.find(said), last = out.rfind(said);
      ASSERT_NE(first, last) << out;
      const int at_start = std::atoi(out.c_str() + first + said.size());
      const int at_end = std::atoi(out.c_str() + last + said.size());
      if (shares) {
        EXPECT_GT(at_start, 0) << out;
      }
      EXPECT_LE(at_end, at_start) << "mapped at step 25: " << at_start << ", at the end: " << at_end
                                  << " after " << epochs << " epochs\n"
                                  << out;
      // Nor a connection to a departed worker: at most one descriptor
      // more (the last joiner's inbound connection, which may not be
      // closed yet) and one thread (a parameter-server worker starts one
      // at its first change: 14 then 15, after 3 cycles as after 6).
      const std::string counts = "descriptors ";
      int fds_start = 0, fds_end = 0, threads_start = 0, threads_end = 0;
      ASSERT_EQ(std::sscanf(out.c_str() + out.find(counts), "descriptors %d threads %d", &fds_start,
                            &threads_start),
                2)
          << out;
      ASSERT_EQ(std::sscanf(out.c_str() + out.rfind(counts), "descriptors %d threads %d", &fds_end,
                            &threads_end),
                2)
          << out;
      EXPECT_LE(fds_end, fds_start + 1) << out;
      EXPECT_LE(threads_end, threads_start + 1) << out;
    }
    EXPECT_EQ(params.size(), 1u) << "the workers' parameters differ";
    EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(10000)), 0) << scheduler_->Output();
    if (rank0 != nullptr) *rank0 = workers[0]->Output();
  }

  // How often `line` occurs in `out`.
  static size_t Occurrences(const std::string& out, const std::string& line) {
    size_t n = 0;
    for (size_t at = out.find(line); at != std::string::npos; at = out.find(line, at + 1)) ++n;
    return n;
  }

  std::vector<Subprocess*> shards_;
  std::vector<std::string> worker_flags_;
  std::vector<std::string> hosts_;  // worker r on hosts_[r], when set
};

TEST_F(ElasticTest, SurvivorsOfAKilledRingWorkerFinishAndAgreeBitForBit) { KillOneOfFour(""); }

// The loss is declared while the survivors are in their backward pass: the
// bucket of the second half is in flight (and fails with the change), the
// first half is marked ready 2.5 s later. That MarkReady must report the
// change rather than re-form silently: the trainer would otherwise go on in
// the new epoch without its recovery, the second half's mark dropped
// ("tensors never marked ready").
// A worker that leaves on purpose (Communicator::Depart) is removed at once:
// the others go on in the next epoch, told why.
TEST_F(ElasticTest, AWorkerThatDepartsIsRemovedAndTheOthersGoOn) {
  auto workers = StartJob(4, {"--min_workers=2"}, "400", "",
                          {"--step_sleep_ms=5", "--depart_at_step=100", "--depart_rank=1"});
  ASSERT_EQ(workers[1]->Wait(Deadline::AfterMs(60000)), 0) << workers[1]->Output();
  EXPECT_NE(workers[1]->Output().find("departing after step 100"), std::string::npos);
  ExpectFinishAlike({workers[0], workers[2], workers[3]}, ") left: it left the job (scaled down)",
                    "final step 400 world 3 epoch 1 params ");
  EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(10000)), 0) << scheduler_->Output();
}

TEST_F(ElasticTest, AChangeDuringBackwardIsReportedByTheNextMarkReady) {
  auto workers = StartJob(3, {"--min_workers=2"}, "5", "",
                          {"--step_sleep_ms=5", "--split=true", "--mark_gap_ms=2500",
                           "--bucket_bytes=512", "--first_bucket_bytes=512", "--die_at_step=2",
                           "--die_rank=2", "--die_once=" + TmpFile("die_once")});
  std::set<std::string> params;
  for (int r : {0, 1}) {
    ASSERT_EQ(workers[r]->Wait(Deadline::AfterMs(90000)), 0) << workers[r]->Output();
    const std::string out = workers[r]->Output();
    EXPECT_NE(out.find("membership_changed: membership changed: worker rank 2 (identity "),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("resuming at step 2 from rank 0"), std::string::npos) << out;
    EXPECT_NE(out.find("final step 5 world 2 epoch 1 params "), std::string::npos) << out;
    params.insert(Params(out));
  }
  EXPECT_EQ(params.size(), 1u) << "the survivors' parameters differ";
}

// The shards average: the survivors redo the step that did not close,
// numbered as before, and no key closes a round twice.
TEST_F(ElasticTest, SurvivorsOfAKilledParameterServerWorkerFinishAndAgreeBitForBit) {
  KillOneOfFour("", SyncShards());
}

// The shards step (sgd): every worker ends with the shards' parameters.
TEST_F(ElasticTest, WhenTheShardsStepTheSurvivorsGoOnFromTheShardsParameters) {
  KillOneOfFour("", SteppingShards());
}

// The joiner takes the live state and pushes to the shards from its first
// step; with CURVE, its parameter-server client's key is the joiner's own.
TEST_F(ElasticTest, ANewWorkerJoinsTheParameterServerJobAndEndsWithTheSameParameters) {
  const std::string key_file = TmpFile("ps_join.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  KillOneOfFourAndJoin(key_file, SteppingShards());
}

// Asynchronous and SSP shards go on too; their workers' parameters differ
// by design, so only the ends are checked.
TEST_F(ElasticTest, AsynchronousShardsGoOnAfterALoss) {
  SurvivorsFinish({2,
                   {"--ps_mode=async", "--optimizer=sgd", "--lr=0.2"},
                   {"--path=ps", "--optimizer=sgd", "--server_optimizer=true"}});
}

TEST_F(ElasticTest, SspShardsGoOnAfterALoss) {
  SurvivorsFinish({2,
                   {"--ps_mode=ssp", "--staleness=2", "--optimizer=sgd", "--lr=0.2"},
                   {"--path=ps", "--optimizer=sgd", "--server_optimizer=true"}});
}

TEST_F(ElasticTest, ANewWorkerJoinsTheRunningRingAndEndsWithTheSameParameters) {
  KillOneOfFourAndJoin("");
}

// Workers on four hosts (127.0.0.1-4): each epoch with four hosts times
// its links for the ring order, a worker that joined included, and the
// barriers of every epoch line up.
TEST_F(ElasticTest, OnFourHostsEveryEpochTimesItsLinksAJoinerIncluded) {
  hosts_ = {"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"};
  const std::vector<std::string> outputs = KillOneOfFourAndJoin("", {}, "127.0.0.2");
  ASSERT_EQ(outputs.size(), 4u);
  // Rank 0 logs the order it took in epoch 0 and again in epoch 2 (epoch 1
  // has three hosts: rank order without timing).
  EXPECT_EQ(Occurrences(outputs[0], " over 4 hosts"), 2u) << outputs[0];
  for (const std::string& o : outputs) {
    EXPECT_EQ(o.find("cannot time the link"), std::string::npos) << o;
  }
}

// Two workers a host (127.0.0.1 and 127.0.0.2): every epoch's ring runs
// its links between the hosts over TCP streams and those within a host
// over shared memory, the joiner's included. Worker 0 shares a host with its
// right neighbour in epoch 0 (worker 1) and epoch 2 (the joiner), not in
// epoch 1.
TEST_F(ElasticTest, TwoWorkersAHostReformSharedMemoryBesideTcpStreamsEveryEpoch) {
  hosts_ = {"127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"};
  const std::vector<std::string> outputs = KillOneOfFourAndJoin("", {}, "127.0.0.1");
  ASSERT_EQ(outputs.size(), 4u);
  EXPECT_EQ(Occurrences(outputs[0], "ring over TCP streams, plain"), 3u) << outputs[0];
  EXPECT_EQ(Occurrences(outputs[0], "use shared memory, the others TCP streams (1 peer(s))"), 2u)
      << outputs[0];
}

// The ring in two lanes (each lane a transport of its own, over TCP), under
// CURVE: every epoch makes its lanes again, the survivors' and then the
// joiner's (whose lane endpoints its neighbours bind to its node key), and
// all four end with the same parameters.
TEST_F(ElasticTest, WithCurveAndTwoLanesEveryEpochMakesItsLanesTheJoinersIncluded) {
  const std::string key_file = TmpFile("lanes.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  const std::vector<std::string> outputs =
      KillOneOfFourAndJoin(key_file, Shards{0, {}, {"--ring_lanes=2", "--ring_shm=false"}});
  ASSERT_FALSE(outputs.empty());
  // Rank 0 (worker 0 in every epoch) logs its lanes once per epoch: 0, 1, 2.
  EXPECT_EQ(Occurrences(outputs[0], "ring of 2 lanes"), 3u) << outputs[0];
}

// ring_lanes=auto: every epoch (the survivors', then the joiner's) opens
// its lanes, times them and chooses again; all four end alike.
TEST_F(ElasticTest, WithAutoLanesEveryEpochChoosesItsLanesAgain) {
  const std::vector<std::string> outputs =
      KillOneOfFourAndJoin("", Shards{0, {}, {"--ring_lanes=auto", "--ring_shm=false"}});
  ASSERT_FALSE(outputs.empty());
  EXPECT_EQ(Occurrences(outputs[0], "ring_lanes=auto: a 4 MiB all-reduce took "), 3u) << outputs[0];
}

// The joiner's own node key gets into every member's plan: its ring
// neighbours admit it.
TEST_F(ElasticTest, WithCurveAJoinersNodeKeyIsAdmittedByItsNeighbours) {
  const std::string key_file = TmpFile("join.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  KillOneOfFourAndJoin(key_file);
}

// One host: each epoch's segments and links over ZeroMQ's lane (before:
// 4 mappings at step 25, 31 at the end; one descriptor more a cycle).
TEST_F(ElasticTest, WorkersThatJoinAndDepartLeaveNoSharedMemoryBehind) { JoinAndDepart(3, ""); }

// The parameter server: each epoch's client (its links to the shards,
// its compressors) goes with its ring.
TEST_F(ElasticTest, ParameterServerWorkersThatJoinAndDepartLeaveNothingBehind) {
  JoinAndDepart(3, "", SyncShards());
}

// The two on one host, the joiners on another: the epochs with a joiner
// run TCP streams whose lanes carry the two's link.
TEST_F(ElasticTest, JoinersOnAnotherHostLeaveNoStreamLinksBehind) {
  hosts_ = {"127.0.0.1", "127.0.0.1"};
  JoinAndDepart(2, "127.0.0.2");
}

// Three workers on two hosts and a joiner at a time: each epoch of four
// all-reduces by recursive doubling (ring_algorithm=auto) over connections
// of its own, which go with the epoch.
TEST_F(ElasticTest, RecursiveDoublingEpochsOfJoinersLeaveNoConnectionsBehind) {
  hosts_ = {"127.0.0.1", "127.0.0.1", "127.0.0.2"};
  std::string out;
  JoinAndDepart(2, "127.0.0.2", {}, 3, &out);
  EXPECT_EQ(Occurrences(out, "by recursive doubling over 2 pairs"), 2u) << out;
}

// At max_workers a new worker is refused with the reason; the job goes on.
TEST_F(ElasticTest, AJoinerPastMaxWorkersIsRefusedClearly) {
  // Long enough to outlast the joiner's wait for a worker to be lost.
  auto workers = StartJob(2, {"--min_workers=1", "--max_workers=2"}, "1500");
  ASSERT_TRUE(workers[0]->WaitForOutput("reached step 50", Deadline::AfterMs(60000)))
      << workers[0]->Output();
  Subprocess& joiner = Start({Runfile("tests/elastic_worker"), "--steps=300"}, "joiner");
  EXPECT_EQ(joiner.Wait(Deadline::AfterMs(30000)), 3) << joiner.Output();
  EXPECT_NE(joiner.Output().find("refused this node: the running job already has 2 workers, "
                                 "its max_workers 2"),
            std::string::npos)
      << joiner.Output();
  for (Subprocess* w : workers) {
    ASSERT_EQ(w->Wait(Deadline::AfterMs(60000)), 0) << w->Output();
    EXPECT_NE(w->Output().find("final step 1500 world 2 epoch 0"), std::string::npos);
  }
}

// The re-formed ring's new neighbours reach each other over their own node
// keys (the scheduler's peer list bound them at the start).
TEST_F(ElasticTest, WithCurveTheSurvivorsReformTheRingOverTheirOwnKeys) {
  const std::string key_file = TmpFile("job.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  KillOneOfFour(key_file);
}

// Rank 0 first (the rank every epoch's re-ranking starts from), then
// another: two epochs.
TEST_F(ElasticTest, TwoLossesOneAfterTheOtherIncludingRankZero) {
  auto workers = StartJob(4, {"--min_workers=2"}, "600");
  ASSERT_TRUE(workers[0]->WaitForOutput("reached step 100", Deadline::AfterMs(60000)))
      << workers[0]->Output();
  workers[0]->Signal(SIGKILL);
  ASSERT_TRUE(workers[3]->WaitForOutput("reached step 300", Deadline::AfterMs(60000)))
      << workers[3]->Output();
  workers[3]->Signal(SIGKILL);
  ExpectFinishAlike({workers[1], workers[2]}, "worker rank 0 (identity ",
                    "final step 600 world 2 epoch 2 params ");
}

TEST_F(ElasticTest, AStoppedWorkerThatWakesUpAfterItsRemovalIsRefusedAndToldWhy) {
  auto workers = StartJob(3, {"--min_workers=2"}, "300");
  ASSERT_TRUE(workers[2]->WaitForOutput("reached step 50", Deadline::AfterMs(60000)))
      << workers[2]->Output();
  workers[2]->Signal(SIGSTOP);
  ASSERT_TRUE(workers[0]->WaitForOutput("resuming at step", Deadline::AfterMs(20000)))
      << workers[0]->Output();
  workers[2]->Signal(SIGCONT);
  EXPECT_EQ(workers[2]->Wait(Deadline::AfterMs(30000)), 3) << workers[2]->Output();
  EXPECT_NE(workers[2]->Output().find("this worker was removed from the job: epoch 0 ended "
                                      "without it: no message for"),
            std::string::npos)
      << workers[2]->Output();
  std::set<std::string> params;
  for (int r : {0, 1}) {
    ASSERT_EQ(workers[r]->Wait(Deadline::AfterMs(60000)), 0) << workers[r]->Output();
    EXPECT_NE(workers[r]->Output().find("final step 300 world 2 epoch 1"), std::string::npos);
    params.insert(Params(workers[r]->Output()));
  }
  EXPECT_EQ(params.size(), 1u) << "the survivors' parameters differ";
}

TEST_F(ElasticTest, BelowMinWorkersTheJobFailsClearlyAfterItsDeadline) {
  auto workers = StartJob(3, {"--min_workers=2", "--elastic_timeout_ms=1500"}, "100000");
  for (int r : {1, 2}) {
    ASSERT_TRUE(workers[r]->WaitForOutput("reached step 50", Deadline::AfterMs(60000)))
        << workers[r]->Output();
  }
  workers[1]->Signal(SIGKILL);
  workers[2]->Signal(SIGKILL);
  EXPECT_EQ(workers[0]->Wait(Deadline::AfterMs(30000)), 3) << workers[0]->Output();
  EXPECT_NE(workers[0]->Output().find("only 1 workers remain, below min_workers 2, and none "
                                      "joined within elastic_timeout_ms"),
            std::string::npos)
      << workers[0]->Output();
  EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(10000)), 1) << scheduler_->Output();
  EXPECT_NE(scheduler_->Output().find("below min_workers 2"), std::string::npos);
}

// Below min_workers the survivor waits; a joiner brings the job back to
// min_workers and both finish with the same parameters.
TEST_F(ElasticTest, BelowMinWorkersTheSurvivorWaitsForAJoinerAndGoesOn) {
  auto workers = StartJob(3, {"--min_workers=2"}, "600");
  ASSERT_TRUE(workers[2]->WaitForOutput("reached step 100", Deadline::AfterMs(60000)))
      << workers[2]->Output();
  workers[1]->Signal(SIGKILL);
  workers[2]->Signal(SIGKILL);
  ASSERT_TRUE(scheduler_->WaitForOutput("workers, below min_workers 2: waiting up to",
                                        Deadline::AfterMs(20000)))
      << scheduler_->Output();
  ASSERT_TRUE(workers[0]->WaitForOutput("now worker 0 of 1", Deadline::AfterMs(20000)))
      << workers[0]->Output();
  // Held in the epoch barrier: it does not go on alone (it would within
  // milliseconds).
  EXPECT_FALSE(workers[0]->WaitForOutput(" of 1 (epoch", Deadline::AfterMs(1500)))
      << workers[0]->Output();
  Subprocess& joiner = Start({Runfile("tests/elastic_worker"), "--steps=600"}, "joiner");
  std::set<std::string> params;
  for (Subprocess* w : {workers[0], &joiner}) {
    ASSERT_EQ(w->Wait(Deadline::AfterMs(90000)), 0) << w->Output();
    EXPECT_NE(w->Output().find("final step 600 world 2 epoch 3 params "), std::string::npos)
        << w->Output();
    params.insert(Params(w->Output()));
  }
  // It never trained alone, below min_workers.
  EXPECT_EQ(workers[0]->Output().find(" of 1 (epoch"), std::string::npos) << workers[0]->Output();
  EXPECT_NE(workers[0]->Output().find("as rank 0 of 2 (epoch 3)"), std::string::npos)
      << workers[0]->Output();
  EXPECT_EQ(params.size(), 1u) << "the workers' parameters differ";
  EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(10000)), 0) << scheduler_->Output();
}

TEST_F(ElasticTest, WithoutMinWorkersTheJobStopsAsBefore) {
  auto workers = StartJob(3, {}, "100000");
  ASSERT_TRUE(workers[1]->WaitForOutput("reached step 50", Deadline::AfterMs(60000)))
      << workers[1]->Output();
  workers[1]->Signal(SIGKILL);
  for (int r : {0, 2}) {
    EXPECT_EQ(workers[r]->Wait(Deadline::AfterMs(30000)), 3) << workers[r]->Output();
    EXPECT_NE(workers[r]->Output().find("worker 1 died"), std::string::npos)
        << workers[r]->Output();
    EXPECT_EQ(workers[r]->Output().find("membership"), std::string::npos);
  }
}

}  // namespace
}  // namespace gradsync
