// The launcher with the real scheduler binary and small shell commands as
// workers: a clean run, a failing or killed worker, Ctrl-C, flag parsing.
#include "launcher/launcher.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "launcher/slurm.h"

namespace gradsync::launcher {
namespace {

std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return std::string(dir ? dir : ".") + "/gradsync/" + path;
}

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string TestName() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

// Starts gradsync_launch with `flags`, then "--", then `command`.
Subprocess Launch(std::vector<std::string> flags, const std::vector<std::string>& command) {
  std::vector<std::string> argv = {Runfile("launcher/gradsync_launch"),
                                   "--log_dir=" + TmpPath(TestName() + ".logs")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("--");
  argv.insert(argv.end(), command.begin(), command.end());
  auto p = Subprocess::Spawn(argv, {}, TmpPath(TestName() + ".out"));
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

// A worker that prints its pid and sleeps, except on rank `rank`, which runs
// `action` after a moment.
std::vector<std::string> SleeperExcept(int rank, const std::string& action) {
  return {"sh", "-c",
          "echo \"pid $$\"; if [ \"$GRADSYNC_RANK\" = " + std::to_string(rank) +
              " ]; then sleep 0.5; " + action + "; fi; exec sleep 60"};
}

// A gradsync_server that prints its pid ("pid P") and then becomes the real
// one, so that a test can see it gone.
std::string PidPrintingServer() {
  const std::string path = TmpPath(TestName() + ".server.sh");
  std::FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return "";
  std::fprintf(f, "#!/bin/sh\necho \"pid $$\"\nexec '%s' \"$@\"\n",
               Runfile("server/gradsync_server").c_str());
  std::fclose(f);
  EXPECT_EQ(chmod(path.c_str(), 0755), 0) << path;
  return path;
}

// The pids the processes printed ("[worker N] pid P", "[server N] pid P").
std::vector<pid_t> PrintedPids(const std::string& out) {
  std::vector<pid_t> pids;
  for (size_t at = out.find("] pid "); at != std::string::npos; at = out.find("] pid ", at + 1)) {
    pids.push_back(static_cast<pid_t>(std::atoi(out.c_str() + at + 6)));
  }
  return pids;
}

void ExpectGone(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    EXPECT_EQ(kill(pid, 0), -1) << "pid " << pid << " still exists";
    EXPECT_EQ(errno, ESRCH);
  }
}

TEST(LauncherTest, CleanRunExitsZeroAndGivesEveryWorkerItsEnvironment) {
  Subprocess p = Launch({"--workers=3", "--grace_ms=1000"},
                        {"sh", "-c",
                         "echo rank $GRADSYNC_RANK of $GRADSYNC_NUM_WORKERS, "
                         "$GRADSYNC_NUM_SERVERS servers, scheduler $GRADSYNC_SCHEDULER"});
  auto code = p.Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(code.has_value()) << p.Output();
  EXPECT_EQ(*code, 0) << p.Output();
  const std::string out = p.Output();
  for (int r = 0; r < 3; ++r) {
    const std::string line = "[worker " + std::to_string(r) + "] rank " + std::to_string(r) +
                             " of 3, 0 servers, scheduler 127.0.0.1:";
    EXPECT_NE(out.find(line), std::string::npos) << out;
  }
  EXPECT_NE(out.find("[scheduler] "), std::string::npos) << out;
  EXPECT_NE(out.find("all 3 workers exited with code 0"), std::string::npos) << out;
  EXPECT_NE(out.find("stopping scheduler"), std::string::npos) << out;
}

TEST(LauncherTest, FailingWorkerStopsEverythingAndIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  Subprocess p = Launch({"--workers=4", "--grace_ms=2000"}, SleeperExcept(2, "exit 3"));
  auto code = p.Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(code.has_value()) << p.Output();
  EXPECT_EQ(*code, 1) << p.Output();
  const std::string out = p.Output();
  EXPECT_NE(out.find("gradsync_launch: worker 2 exited with code 3"), std::string::npos) << out;
  EXPECT_NE(out.find("stopping scheduler, worker 0, worker 1, worker 3"), std::string::npos) << out;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  const auto pids = PrintedPids(out);
  EXPECT_EQ(pids.size(), 4u) << out;
  ExpectGone(pids);
}

TEST(LauncherTest, FailingWorkerAlsoStopsTheSchedulerAndTheServers) {
  Subprocess p = Launch(
      {"--workers=3", "--servers=2", "--grace_ms=2000", "--server_binary=" + PidPrintingServer()},
      SleeperExcept(1, "exit 7"));
  auto code = p.Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(code.has_value()) << p.Output();
  EXPECT_EQ(*code, 1) << p.Output();
  const std::string out = p.Output();
  EXPECT_NE(out.find("gradsync_launch: worker 1 exited with code 7"), std::string::npos) << out;
  EXPECT_NE(out.find("stopping scheduler, server 0, server 1, worker 0, worker 2"),
            std::string::npos)
      << out;
  for (const char* name :
       {"[scheduler] pid ", "[server 0] pid ", "[server 1] pid ", "[worker 1] pid "}) {
    EXPECT_NE(out.find(name), std::string::npos) << name << "\n" << out;
  }
  const auto pids = PrintedPids(out);
  EXPECT_EQ(pids.size(), 6u) << out;
  ExpectGone(pids);
}

TEST(LauncherTest, WorkerKilledBySignalIsNamed) {
  Subprocess p = Launch({"--workers=2", "--grace_ms=2000"}, SleeperExcept(1, "kill -9 $$"));
  auto code = p.Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(code.has_value()) << p.Output();
  EXPECT_EQ(*code, 1) << p.Output();
  EXPECT_NE(p.Output().find("gradsync_launch: worker 1 killed by signal 9"), std::string::npos)
      << p.Output();
  ExpectGone(PrintedPids(p.Output()));
}

// The pid "[worker R] pid P" printed.
pid_t WorkerPid(const std::string& out, int rank) {
  const std::string tag = "[worker " + std::to_string(rank) + "] pid ";
  const size_t at = out.find(tag);
  return at == std::string::npos ? -1
                                 : static_cast<pid_t>(std::atoi(out.c_str() + at + tag.size()));
}

TEST(LauncherTest, AnElasticJobGoesOnWithoutAKilledWorker) {
  Subprocess p = Launch(
      {"--workers=4", "--min_workers=2", "--grace_ms=5000", "--metrics_port=0"},
      {"sh", "-c", "echo \"pid $$\"; exec '" + Runfile("tests/elastic_worker") + "' --steps=400"});
  ASSERT_TRUE(p.WaitForOutput("[worker 2] reached step 100", Deadline::AfterMs(60000)))
      << p.Output();
  const pid_t victim = WorkerPid(p.Output(), 2);
  ASSERT_GT(victim, 0) << p.Output();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  auto code = p.Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(code.has_value()) << p.Output();
  EXPECT_EQ(*code, 0) << p.Output();
  const std::string out = p.Output();
  EXPECT_NE(out.find("worker 2 killed by signal 9 (Killed): the elastic job goes on with 3 "
                     "workers"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("3 of 4 workers exited with code 0 (1 lost)"), std::string::npos) << out;
  for (int r : {0, 1, 3}) {
    EXPECT_NE(out.find("[worker " + std::to_string(r) + "] final step 400 world 3 epoch 1"),
              std::string::npos)
        << out;
  }
}

// A worker that kills itself once is started again and rejoins: the job
// ends 0 with 4 workers.
TEST(LauncherTest, AFailedWorkerIsRestartedAndRejoinsTheElasticJob) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string once = std::string(tmp ? tmp : "/tmp") + "/died_once";
  Subprocess p = Launch(
      {"--workers=4", "--min_workers=3", "--restarts=1", "--grace_ms=5000", "--metrics_port=0"},
      {Runfile("tests/elastic_worker"), "--steps=400", "--die_at_step=100", "--die_rank=2",
       "--die_once=" + once});
  auto code = p.Wait(Deadline::AfterMs(120000));
  ASSERT_TRUE(code.has_value()) << p.Output();
  EXPECT_EQ(*code, 0) << p.Output();
  const std::string out = p.Output();
  EXPECT_NE(out.find("worker 2 killed by signal 9 (Killed): starting it again as worker 2 "
                     "(restart 1) (restart 1 of 1); it rejoins the running job"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("4 of 4 workers exited with code 0 (1 restarted)"), std::string::npos) << out;
  for (const std::string w : {"worker 0", "worker 1", "worker 3", "worker 2 (restart 1)"}) {
    EXPECT_NE(out.find("[" + w + "] final step 400 world 4 epoch 2"), std::string::npos) << out;
  }
}

TEST(LauncherTest, RestartsNeedAnElasticJob) {
  const char* argv[] = {"gradsync_launch", "--workers=2", "--restarts=1", "--", "true"};
  auto o = LaunchOptions::FromArgs(5, argv);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--restarts needs an elastic job"), std::string::npos)
      << o.status();
}

TEST(LauncherTest, InterruptStopsEverything) {
  Subprocess p = Launch({"--workers=3", "--grace_ms=2000"}, SleeperExcept(-1, "true"));
  ASSERT_TRUE(p.WaitForOutput("[worker 2] pid", Deadline::AfterMs(30000))) << p.Output();
  ASSERT_TRUE(p.WaitForOutput("[worker 0] pid", Deadline::AfterMs(30000))) << p.Output();
  ASSERT_TRUE(p.WaitForOutput("[worker 1] pid", Deadline::AfterMs(30000))) << p.Output();
  p.Signal(SIGINT);
  auto code = p.Wait(Deadline::AfterMs(30000));
  ASSERT_TRUE(code.has_value()) << p.Output();
  EXPECT_EQ(*code, 128 + SIGINT) << p.Output();
  EXPECT_NE(p.Output().find("stopped by signal 2"), std::string::npos) << p.Output();
  ExpectGone(PrintedPids(p.Output()));
}

// In process: the library with a server shard, its output in a file.
TEST(LauncherTest, ServersGetTheJobAndAreStoppedAfterTheWorkers) {
  LaunchOptions options;
  options.workers = 1;
  options.servers = 1;
  options.grace = Millis(1000);
  options.log_dir = TmpPath("servers.logs");
  options.server_binary = Runfile("server/gradsync_server");
  options.worker_command = {"sh", "-c", "sleep 1; echo done"};
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  Launcher launcher(options, out);
  std::atomic<int> stop{0};
  Status status = launcher.Run(stop);
  EXPECT_TRUE(status.ok()) << status;
  std::rewind(out);
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), out)) > 0;) {
    text.append(buffer, n);
  }
  std::fclose(out);
  EXPECT_NE(text.find("[worker 0] done"), std::string::npos) << text;
  EXPECT_NE(text.find("[server 0] "), std::string::npos) << text;
  EXPECT_NE(text.find("stopping scheduler, server 0"), std::string::npos) << text;
}

// Runs a launcher whose scheduler (/bin/false) exits at once, with its logs
// in `log_dir`.
Status RunWithFailingScheduler(const std::string& log_dir) {
  LaunchOptions options;
  options.server_binary = "/bin/false";
  options.log_dir = log_dir;
  options.worker_command = {"true"};
  std::FILE* out = std::tmpfile();
  Launcher launcher(options, out);
  std::atomic<int> stop{0};
  Status status = launcher.Run(stop);
  std::fclose(out);
  return status;
}

TEST(LauncherTest, SchedulerThatDoesNotStartIsNamed) {
  Status status = RunWithFailingScheduler(TmpPath("false.logs"));
  EXPECT_EQ(status.code(), StatusCode::kAborted);
  EXPECT_EQ(status.message(), "scheduler exited with code 1 before listening");
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(LauncherTest, LogsAreTheOwnersOnly) {
  const std::string dir = TmpPath("private.logs");
  EXPECT_EQ(RunWithFailingScheduler(dir).code(), StatusCode::kAborted);
  EXPECT_EQ(ModeOf(dir), 0700u);
  EXPECT_EQ(ModeOf(dir + "/scheduler.log"), 0600u);
}

TEST(LauncherTest, LinksAreNotFollowedForLogs) {
  const std::string elsewhere = TmpPath("elsewhere.logs");
  ASSERT_EQ(mkdir(elsewhere.c_str(), 0700), 0);
  const std::string linked = TmpPath("linked.logs");
  ASSERT_EQ(symlink(elsewhere.c_str(), linked.c_str()), 0);
  Status status = RunWithFailingScheduler(linked);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("is a symbolic link"), std::string::npos) << status;

  const std::string dir = TmpPath("planted.logs");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string victim = TmpPath("victim.txt");
  std::FILE* f = std::fopen(victim.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("keep me\n", f);
  std::fclose(f);
  ASSERT_EQ(symlink(victim.c_str(), (dir + "/scheduler.log").c_str()), 0);
  status = RunWithFailingScheduler(dir);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status;
  struct stat st;
  ASSERT_EQ(stat(victim.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 8) << "the log was written through a planted link";
}

TEST(LauncherTest, ParsesFlagsAndTheCommand) {
  const char* argv[] = {"gradsync_launch", "--workers=4", "--servers=2", "--port=0", "--",
                        "trainer",         "--epochs=3"};
  auto options = LaunchOptions::FromArgs(7, argv);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->workers, 4);
  EXPECT_EQ(options->servers, 2);
  EXPECT_EQ(options->worker_command, (std::vector<std::string>{"trainer", "--epochs=3"}));

  const char* no_command[] = {"gradsync_launch", "--workers=4"};
  EXPECT_EQ(LaunchOptions::FromArgs(2, no_command).status().code(), StatusCode::kInvalidArgument);
  const char* typo[] = {"gradsync_launch", "--worker=4", "--", "true"};
  EXPECT_NE(LaunchOptions::FromArgs(4, typo).status().message().find("unknown flag --worker"),
            std::string::npos);
  const char* zero[] = {"gradsync_launch", "--workers=0", "--", "true"};
  EXPECT_FALSE(LaunchOptions::FromArgs(4, zero).ok());
  const char* more[] = {"gradsync_launch", "--workers=2", "--min_workers=3",
                        "--slurm=false",   "--",          "true"};
  EXPECT_NE(LaunchOptions::FromArgs(6, more).status().message().find("exceeds --workers=2"),
            std::string::npos);
  const char* slurm[] = {"gradsync_launch", "--min_workers=3", "--slurm=true", "--", "true"};
  auto in_slurm = LaunchOptions::FromArgs(5, slurm);
  ASSERT_TRUE(in_slurm.ok()) << in_slurm.status();
  EXPECT_EQ(in_slurm->min_workers, 3);  // the step's size sets the workers
}

TEST(LauncherTest, MissingWorkerCommandIsNotFound) {
  LaunchOptions options;
  options.server_binary = Runfile("server/gradsync_server");
  options.log_dir = TmpPath("missing.logs");
  options.worker_command = {"no-such-command-anywhere"};
  std::FILE* out = std::tmpfile();
  Launcher launcher(options, out);
  std::atomic<int> stop{0};
  Status status = launcher.Run(stop);
  std::fclose(out);
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_NE(status.message().find("no-such-command-anywhere"), std::string::npos) << status;
}

}  // namespace
// Slurm: task 0 is the scheduler on the first node, the next `servers`
// tasks are shards, the rest workers; addresses come from the node names.
TEST(SlurmTest, TasksBecomeSchedulerShardsAndWorkers) {
  auto address = [](const std::string& node) -> StatusOr<std::string> {
    return "10.0.0." + node.substr(4);  // "nodeN"
  };
  auto first = [](const std::string& list) -> StatusOr<std::string> {
    EXPECT_EQ(list, "node[1-5]");
    return std::string("node1");
  };
  auto plan = [&](int procid, const std::string& node) {
    return PlanSlurmTask({{"SLURM_PROCID", std::to_string(procid)},
                          {"SLURM_NTASKS", "5"},
                          {"SLURM_JOB_NODELIST", "node[1-5]"},
                          {"SLURMD_NODENAME", node}},
                         2, 29400, address, first);
  };
  auto scheduler = plan(0, "node1");
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  EXPECT_EQ(scheduler->role, SlurmTask::Role::kScheduler);
  EXPECT_EQ(scheduler->scheduler, "10.0.0.1:29400");
  EXPECT_EQ(scheduler->num_workers, 2);
  auto shard = plan(2, "node3");
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->role, SlurmTask::Role::kServer);
  EXPECT_EQ(shard->rank, 1);
  EXPECT_EQ(shard->host, "10.0.0.3");
  auto worker = plan(4, "node5");
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(worker->role, SlurmTask::Role::kWorker);
  EXPECT_EQ(worker->rank, 1);
  const SlurmExec e = SlurmExecFor(*worker, "/bin/server", {"trainer", "--x=1"}, "0");
  EXPECT_EQ(e.argv, (std::vector<std::string>{"trainer", "--x=1"}));
  EXPECT_EQ(e.env.at("GRADSYNC_SCHEDULER"), "10.0.0.1:29400");
  EXPECT_EQ(e.env.at("GRADSYNC_RANK"), "1");
  EXPECT_EQ(e.env.at("GRADSYNC_NUM_SERVERS"), "2");
  EXPECT_EQ(e.env.at("GRADSYNC_HOST"), "10.0.0.5");
  // An elastic step: the scheduler is told min_workers.
  SlurmTask elastic = *scheduler;
  elastic.min_workers = 1;
  const SlurmExec s = SlurmExecFor(elastic, "/bin/server", {"trainer"}, "");
  EXPECT_EQ(s.argv.back(), "--min_workers=1");
  EXPECT_EQ(SlurmExecFor(*scheduler, "/bin/server", {"trainer"}, "").argv.back(),
            "--num_servers=2");
  // Too few tasks for a scheduler, 2 shards and a worker.
  auto small = PlanSlurmTask({{"SLURM_PROCID", "0"},
                              {"SLURM_NTASKS", "3"},
                              {"SLURM_JOB_NODELIST", "node[1-5]"},
                              {"SLURMD_NODENAME", "node1"}},
                             2, 29400, address, first);
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
}

// A worker task with restarts runs its trainer as a child and starts it
// again after a failure: the second run finds the mark of the first.
TEST(SlurmTest, AWorkerTaskStartsAFailedTrainerAgain) {
  const std::string mark = ::testing::TempDir() + "/supervised_once";
  std::remove(mark.c_str());
  SlurmExec e;
  e.argv = {"/bin/sh", "-c", "if [ -e \"$MARK\" ]; then exit 0; fi; touch \"$MARK\"; kill -9 $$"};
  e.env = {{"MARK", mark}};
  std::atomic<int> stop{0};
  auto code = SuperviseWorker(e, "worker 2", 1, stop);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  // Without restarts the failure is the task's.
  std::remove(mark.c_str());
  code = SuperviseWorker(e, "worker 2", 0, stop);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 128 + 9);
}

}  // namespace gradsync::launcher
