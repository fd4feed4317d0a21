// A parameter-server shard stopped in the middle of a job and restarted with
// the same flags: real processes on loopback (a scheduler, two
// gradsync_server shards with checkpoints, three tests/ps_worker processes
// training with momentum on the shards, synchronous rounds). The restarted
// shard restores its checkpoint and journal, rejoins in its old place, the
// workers carry on, and the final parameters are those of a run in which
// nothing happened, bit for bit.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "ps/ps_checkpoint.h"
#include "tests/local_job.h"
#include "wire/curve.h"

namespace gradsync {
namespace {

constexpr int kWorkers = 3;
constexpr int kServers = 2;
constexpr int kSteps = 200;
constexpr int kStopAtStep = 70;

enum class Fault { kNone, kSigkill, kSigterm, kSigkillForGood };

struct JobResult {
  std::vector<std::string> params;   // per worker: "params H"
  std::vector<std::string> workers;  // their logs
  std::string restarted;             // the restarted shard's log
  std::string stopped;               // the stopped shard's log
  std::string scheduler;
  std::string checkpoint_dir;
  int stopped_exit = -1;
  bool finished_before_stop = false;
  size_t saved_keys = 0;  // in the stopped shard's checkpoint file
  uint64_t saved_min_closed = 0;
};

// A TCP port nobody listens on now.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof(a);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), n), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The text after "<key> " up to the end of its line.
std::string Field(const std::string& out, const std::string& key) {
  const size_t at = out.find(key + " ");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 1;
  return out.substr(begin, out.find('\n', begin) - begin);
}

class PsRestartTest : public ::testing::Test, public LocalJob {
 protected:
  // Reads the checkpoint the stopped shard left behind.
  static void ReadSaved(const std::string& log, int rank, const std::string& dir, JobResult* out) {
    const std::string job = Field(log, "joined job");
    ASSERT_FALSE(job.empty()) << log;
    const server::CheckpointExpect expect{std::strtoull(job.c_str(), nullptr, 10), rank,
                                          server::PsMode::kSync, server::OptimizerKind::kMomentum,
                                          kWorkers};
    auto saved = server::ReadCheckpoint(dir, expect);
    ASSERT_TRUE(saved.ok()) << saved.status();
    out->saved_keys = saved->keys.size();
    out->saved_min_closed = UINT64_MAX;
    for (const auto& [key, k] : saved->keys) {
      out->saved_min_closed = std::min(out->saved_min_closed, k.closed);
    }
  }

  std::vector<std::string> ServerArgv(int rank, int port, const std::string& dir) {
    return {Runfile("server/gradsync_server"),
            "--role=server",
            "--rank=" + std::to_string(rank),
            "--data_port=" + std::to_string(port),
            "--ps_mode=sync",
            "--optimizer=momentum",
            "--lr=0.05",
            "--momentum=0.9",
            "--checkpoint_dir=" + dir,
            "--checkpoint_interval_s=0.25",
            "--metrics_port=0"};
  }

  std::vector<std::string> WorkerArgv(int rank) {
    return {Runfile("tests/ps_worker"), "--rank=" + std::to_string(rank), "--path=ps",
            "--mode=train", "--optimizer=momentum", "--steps=" + std::to_string(kSteps),
            "--size_divisor=100", "--first_bucket_bytes=8192", "--bucket_bytes=16384",
            "--partition_bytes=4096", "--ps_resend_ms=200",
            // Rank r sleeps 8 r ms a step: the steps after kStopAtStep take
            // 2 s or more, so that a stop this test makes after it sees
            // step kStopAtStep (its thread perhaps held up on a loaded
            // machine) lands before the job's end.
            "--slow_ms=8"};
  }

  // Runs the whole job; with a fault, stops shard `victim` once worker 0 is
  // past step kStopAtStep and starts it again with the same flags (but not
  // kSigkillForGood).
  JobResult Run(const std::string& tag, Fault fault, int victim) {
    tag_ = tag;
    JobResult out;
    const bool restart = fault != Fault::kSigkillForGood;
    std::vector<std::string> flags = {restart ? "--server_grace_ms=60000"
                                              : "--server_grace_ms=1000"};
    if (!key_file_.empty()) flags.push_back("--key_file=" + key_file_);
    StartScheduler(kWorkers, kServers, flags);
    SetJob(kWorkers, kServers);
    if (!key_file_.empty()) env_["GRADSYNC_KEY_FILE"] = key_file_;
    out.checkpoint_dir =
        TmpFile(std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "." +
                tag + ".checkpoints");
    std::vector<std::vector<std::string>> server_argv;
    std::vector<Subprocess*> servers, workers;
    for (int s = 0; s < kServers; ++s) {
      server_argv.push_back(ServerArgv(s, FreePort(), out.checkpoint_dir));
      servers.push_back(&Start(server_argv[s], "server" + std::to_string(s)));
    }
    for (int r = 0; r < kWorkers; ++r) {
      workers.push_back(&Start(WorkerArgv(r), "worker" + std::to_string(r)));
    }
    if (fault != Fault::kNone) {
      Subprocess& shard = *servers[victim];
      const std::string step = "worker 0 step " + std::to_string(kStopAtStep);
      EXPECT_TRUE(workers[0]->WaitForOutput(step, Deadline::AfterMs(120000)))
          << workers[0]->Output();
      EXPECT_TRUE(shard.WaitForOutput("checkpoint written periodically", Deadline::AfterMs(30000)))
          << shard.Output();
      shard.Signal(fault == Fault::kSigterm ? SIGTERM : SIGKILL);
      auto code = shard.Wait(Deadline::AfterMs(30000));
      EXPECT_TRUE(code.has_value()) << shard.Output();
      out.stopped_exit = code.value_or(-1);
      out.stopped = shard.Output();
      out.finished_before_stop = workers[0]->Output().find("params") != std::string::npos;
      ReadSaved(shard.Output(), victim, out.checkpoint_dir, &out);
      if (fault != Fault::kSigterm) {
        // Past its heartbeats: the scheduler holds its place for the grace.
        EXPECT_TRUE(scheduler_->WaitForOutput("is silent: waiting up to", Deadline::AfterMs(30000)))
            << scheduler_->Output();
      }
      if (restart) {
        servers[victim] =
            &Start(server_argv[victim], "server" + std::to_string(victim) + ".restarted");
      }
    }
    for (int r = 0; r < kWorkers; ++r) {
      auto code = workers[r]->Wait(Deadline::AfterMs(240000));
      EXPECT_TRUE(code.has_value()) << "worker still running:\n" << workers[r]->Output();
      if (code) {
        EXPECT_EQ(*code, restart ? 0 : 3) << workers[r]->Output();
      }
      out.workers.push_back(workers[r]->Output());
      out.params.push_back(Field(workers[r]->Output(), "worker " + std::to_string(r) + " params"));
    }
    scheduler_->Signal(SIGTERM);
    for (int s = 0; s < kServers; ++s) {
      if (!restart && s == victim) continue;
      EXPECT_TRUE(servers[s]->Wait(Deadline::AfterMs(30000)).has_value()) << servers[s]->Output();
    }
    scheduler_->Wait(Deadline::AfterMs(10000));
    out.scheduler = scheduler_->Output();
    if (fault != Fault::kNone && restart) out.restarted = servers[victim]->Output();
    return out;
  }

  std::string key_file_;  // set: the job runs CURVE with it

  // Every worker of `run` ended with the parameters of every worker of `clean`.
  static void ExpectSameParams(const JobResult& clean, const JobResult& run) {
    ASSERT_EQ(clean.params.size(), static_cast<size_t>(kWorkers));
    EXPECT_FALSE(clean.params[0].empty());
    for (int r = 0; r < kWorkers; ++r) {
      EXPECT_EQ(clean.params[r], clean.params[0]) << "worker " << r;
      EXPECT_EQ(run.params.at(r), clean.params[0]) << "worker " << r;
    }
  }
};

TEST_F(PsRestartTest, AShardKilledMidRunResumesFromItsCheckpointAndEndsBitEqual) {
  const JobResult clean = Run("clean", Fault::kNone, 0);
  const JobResult killed = Run("killed", Fault::kSigkill, 1);
  EXPECT_EQ(killed.stopped_exit, 128 + SIGKILL);
  EXPECT_FALSE(killed.finished_before_stop) << "the shard was killed after the job ended";
  EXPECT_GT(killed.saved_keys, 0u);
  EXPECT_GT(killed.saved_min_closed, 0u) << "no periodic checkpoint before the kill";
  ExpectSameParams(clean, killed);
  EXPECT_NE(killed.restarted.find("restored checkpoint: "), std::string::npos) << killed.restarted;
  EXPECT_NE(killed.restarted.find("journal records"), std::string::npos) << killed.restarted;
  EXPECT_NE(killed.scheduler.find("server 1 rejoined the job"), std::string::npos)
      << killed.scheduler;
  EXPECT_NE(killed.scheduler.find("server 1 (pid"), std::string::npos) << killed.scheduler;
  EXPECT_EQ(killed.scheduler.find("is dead"), std::string::npos) << killed.scheduler;
  // Workers and shards shared memory (one host); every worker found the
  // killed shard's link without a reader and reached its successor over the
  // network.
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_NE(killed.workers[r].find("on this host uses shared memory"), std::string::npos)
        << killed.workers[r];
    EXPECT_NE(killed.workers[r].find("is gone (closed or died); sending through the network"),
              std::string::npos)
        << killed.workers[r];
  }
}

// With CURVE the restarted shard proves it is the same shard with the node
// key it kept beside its checkpoint (both shards share the directory).
TEST_F(PsRestartTest, WithCurveTheRestartedShardKeepsItsPlaceByItsNodeKey) {
  key_file_ = TmpFile("job.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file_, *wire::GenerateCurveKey()).ok());
  const JobResult clean = Run("clean", Fault::kNone, 0);
  const JobResult killed = Run("killed", Fault::kSigkill, 1);
  ExpectSameParams(clean, killed);
  EXPECT_NE(killed.scheduler.find("server 1 rejoined the job"), std::string::npos)
      << killed.scheduler;
  EXPECT_EQ(killed.scheduler.find("wrong_key"), std::string::npos) << killed.scheduler;
}

TEST_F(PsRestartTest, SigtermWritesACheckpointTheRestartedShardResumesFrom) {
  const JobResult clean = Run("clean", Fault::kNone, 0);
  const JobResult stopped = Run("stopped", Fault::kSigterm, 0);
  EXPECT_EQ(stopped.stopped_exit, 0) << stopped.stopped;
  EXPECT_FALSE(stopped.finished_before_stop);
  EXPECT_NE(stopped.stopped.find("checkpoint written on exit (signal)"), std::string::npos)
      << stopped.stopped;
  // Worker 0 had every round up to kStopAtStep answered: the shard saved them.
  EXPECT_GT(stopped.saved_keys, 0u);
  EXPECT_GE(stopped.saved_min_closed, static_cast<uint64_t>(kStopAtStep));
  ExpectSameParams(clean, stopped);
  EXPECT_NE(stopped.restarted.find("restored checkpoint: "), std::string::npos)
      << stopped.restarted;
  EXPECT_NE(stopped.scheduler.find("server 0 rejoined the job"), std::string::npos)
      << stopped.scheduler;
}

TEST_F(PsRestartTest, AShardThatDoesNotComeBackFailsTheJobNamingIt) {
  const JobResult lost = Run("lost", Fault::kSigkillForGood, 1);
  EXPECT_EQ(lost.stopped_exit, 128 + SIGKILL);
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_NE(lost.workers[r].find("server 1 died (declared dead by the scheduler: no message for"),
              std::string::npos)
        << lost.workers[r];
    EXPECT_EQ(lost.workers[r].find("params"), std::string::npos) << lost.workers[r];
  }
  EXPECT_NE(lost.scheduler.find("server 1 dead: no message for"), std::string::npos)
      << lost.scheduler;
  EXPECT_NE(lost.scheduler.find("did not rejoin within the grace of 1.00 s"), std::string::npos)
      << lost.scheduler;
}

}  // namespace
}  // namespace gradsync
