// The parameter-server path across real processes: a scheduler, gradsync_server
// shards and worker processes (tests/ps_worker) that use the Communicator with
// path=ps, on loopback.
#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/local_job.h"
#include "wire/curve.h"

namespace gradsync {
namespace {

struct JobOutput {
  std::vector<std::string> workers;
  std::vector<std::string> servers;
};

// The text after "<key> " on the first line that has it, up to the line's end.
std::string Field(const std::string& out, const std::string& key) {
  const size_t at = out.find(key + " ");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 1;
  return out.substr(begin, out.find_first_of(",\n", begin) - begin);
}

class PsTest : public ::testing::Test, public LocalJob {
 protected:
  // Runs a whole job and returns every process's output once all ended.
  // With `key_file`, every process runs CURVE with that job key.
  JobOutput Run(int workers, int servers, const std::vector<std::string>& server_flags,
                const std::vector<std::string>& worker_flags, const std::string& key_file = "") {
    StartScheduler(workers, servers, Tag(), key_file);
    SetJob(workers, servers);
    if (!key_file.empty()) env_["GRADSYNC_KEY_FILE"] = key_file;
    std::vector<Subprocess*> shard_procs, worker_procs;
    for (int s = 0; s < servers; ++s) {
      std::vector<std::string> argv = {Runfile("server/gradsync_server"), "--role=server"};
      argv.insert(argv.end(), server_flags.begin(), server_flags.end());
      if (static_cast<size_t>(s) < server_hosts_.size()) {
        argv.push_back("--host=" + server_hosts_[static_cast<size_t>(s)]);
      }
      shard_procs.push_back(&Start(argv, "server" + std::to_string(s) + "." + Tag()));
    }
    for (int r = 0; r < workers; ++r) {
      std::vector<std::string> argv = {Runfile("tests/ps_worker"), "--rank=" + std::to_string(r),
                                       "--bucket_bytes=2097152", "--partition_bytes=262144"};
      argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
      worker_procs.push_back(&Start(argv, "worker" + std::to_string(r) + "." + Tag()));
    }
    JobOutput out;
    for (Subprocess* w : worker_procs) {
      auto code = w->Wait(Deadline::AfterMs(120000));
      EXPECT_TRUE(code.has_value()) << "worker still running:\n" << w->Output();
      if (code) {
        EXPECT_EQ(*code, 0) << w->Output();
      }
      out.workers.push_back(w->Output());
    }
    scheduler_->Signal(SIGTERM);
    for (Subprocess* s : shard_procs) {
      auto code = s->Wait(Deadline::AfterMs(30000));
      EXPECT_TRUE(code.has_value()) << "server still running:\n" << s->Output();
      out.servers.push_back(s->Output());
    }
    scheduler_->Wait(Deadline::AfterMs(10000));
    ++runs_;
    return out;
  }

  std::string Tag() const { return "run" + std::to_string(runs_); }

  // These jobs check arithmetic, not how fast a death is seen (cluster_test
  // and elastic_test do): a worker held up for a second on a loaded machine
  // (ten thousand tensors into its first step) is not dead here.
  static constexpr int kMissedHere = 25;

  // As LocalJob::StartScheduler, with a log of its own for each run.
  void StartScheduler(int workers, int servers, const std::string& tag,
                      const std::string& key_file = "") {
    std::vector<std::string> argv = {Runfile("server/gradsync_server"),
                                     "--role=scheduler",
                                     "--port=0",
                                     "--num_workers=" + std::to_string(workers),
                                     "--num_servers=" + std::to_string(servers),
                                     "--heartbeat_ms=" + std::to_string(kHeartbeatMs),
                                     "--missed_heartbeats=" + std::to_string(kMissedHere)};
    if (!key_file.empty()) argv.push_back("--key_file=" + key_file);
    auto p = Subprocess::Spawn(argv, {}, TmpFile(Name("scheduler." + tag)));
    ASSERT_TRUE(p.ok()) << p.status();
    scheduler_ = std::make_unique<Subprocess>(std::move(*p));
    ASSERT_TRUE(scheduler_->WaitForOutput("listening on", Deadline::AfterMs(10000)));
    const std::string out = scheduler_->Output();
    const size_t at = out.find("listening on tcp://");
    ASSERT_NE(at, std::string::npos) << out;
    const size_t colon = out.find(':', at + std::strlen("listening on tcp://"));
    address_ = "127.0.0.1:" + std::to_string(std::atoi(out.c_str() + colon + 1));
  }

  // Every worker printed the same `key` value; returns it.
  static std::string Agreed(const JobOutput& out, const std::string& key) {
    const std::string first = Field(out.workers.at(0), "worker 0 " + key);
    EXPECT_FALSE(first.empty()) << out.workers[0];
    for (size_t r = 0; r < out.workers.size(); ++r) {
      EXPECT_EQ(Field(out.workers[r], "worker " + std::to_string(r) + " " + key), first)
          << out.workers[r];
    }
    return first;
  }

  // The largest staleness any shard applied.
  static long MaxStaleness(const JobOutput& out) {
    long most = -1;
    for (const std::string& s : out.servers) {
      const std::string v = Field(s, "max staleness");
      EXPECT_FALSE(v.empty()) << s;
      most = std::max(most, std::atol(v.c_str()));
    }
    return most;
  }

  int runs_ = 0;
  // Shard s runs on host address server_hosts_[s] where given (a second
  // loopback address is another host to the plan).
  std::vector<std::string> server_hosts_;
};

TEST_F(PsTest, SyncGivesTheAllReduceAverageForOneToFourWorkersAndShards) {
  const std::pair<int, int> jobs[] = {{1, 1}, {2, 4}, {3, 2}, {4, 3}};
  for (auto [workers, servers] : jobs) {
    SCOPED_TRACE(std::to_string(workers) + " workers, " + std::to_string(servers) + " shards");
    JobOutput ring = Run(workers, 0, {}, {"--path=allreduce", "--steps=3"});
    JobOutput ps = Run(workers, servers, {"--ps_mode=sync"}, {"--path=ps", "--steps=3"});
    EXPECT_NE(ps.workers[0].find("backend ps"), std::string::npos) << ps.workers[0];
    EXPECT_EQ(Agreed(ps, "checksum"), Agreed(ring, "checksum"));
    EXPECT_EQ(MaxStaleness(ps), 0);
  }
}

TEST_F(PsTest, SspWithZeroStalenessIsSyncBitForBit) {
  const std::vector<std::string> opt = {"--optimizer=momentum", "--lr=0.1", "--momentum=0.9"};
  std::vector<std::string> sync_flags = opt, ssp_flags = opt;
  sync_flags.push_back("--ps_mode=sync");
  ssp_flags.insert(ssp_flags.end(), {"--ps_mode=ssp", "--staleness=0"});
  const std::vector<std::string> worker = {"--path=ps", "--mode=train", "--steps=6",
                                           "--optimizer=momentum", "--slow_ms=10"};
  JobOutput sync = Run(3, 2, sync_flags, worker);
  JobOutput ssp = Run(3, 2, ssp_flags, worker);
  EXPECT_EQ(Agreed(sync, "params"), Agreed(ssp, "params"));
  EXPECT_EQ(MaxStaleness(ssp), 0);
}

// Three connections from each worker to each shard (ps_lanes=3, over TCP:
// no shared memory), with CURVE and without: the same parameters, bit for
// bit, as one connection.
TEST_F(PsTest, SyncInThreeLanesIsSyncBitForBit) {
  const std::string key_file = TmpFile("ps_lanes.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  const std::vector<std::string> shard = {"--ps_mode=sync", "--optimizer=momentum", "--lr=0.1"};
  std::vector<std::string> worker = {"--path=ps", "--mode=train", "--steps=6",
                                     "--optimizer=momentum", "--ps_shm=false"};
  JobOutput one = Run(3, 2, shard, worker);
  worker.push_back("--ps_lanes=3");
  JobOutput lanes = Run(3, 2, shard, worker);
  JobOutput curve = Run(3, 2, shard, worker, key_file);
  EXPECT_EQ(Agreed(lanes, "params"), Agreed(one, "params"));
  EXPECT_EQ(Agreed(curve, "params"), Agreed(one, "params"));
  EXPECT_NE(curve.workers[0].find("CURVE on every link"), std::string::npos) << curve.workers[0];
  for (const std::string& s : curve.servers) {
    EXPECT_EQ(s.find("refused"), std::string::npos) << s;
  }
}

// Shard 1 on another host (a second loopback address) is reached over TCP
// streams, shard 0 on the workers' host through shared memory beside them;
// with CURVE the streams are sealed. The same parameters, bit for bit, as
// with both shards on the workers' host (shared memory only).
TEST_F(PsTest, AShardOfAnotherHostTakesTcpStreamsBitForBit) {
  const std::string key_file = TmpFile("ps_streams.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  const std::vector<std::string> shard = {"--ps_mode=sync", "--optimizer=momentum", "--lr=0.1"};
  const std::vector<std::string> worker = {"--path=ps", "--mode=train", "--steps=6",
                                           "--optimizer=momentum", "--ps_lanes=2"};
  JobOutput local = Run(3, 2, shard, worker);
  server_hosts_ = {"127.0.0.1", "127.0.0.2"};
  JobOutput tcp = Run(3, 2, shard, worker);
  JobOutput sealed = Run(3, 2, shard, worker, key_file);
  server_hosts_.clear();
  const std::string params = Agreed(local, "params");
  EXPECT_EQ(Agreed(tcp, "params"), params);
  EXPECT_EQ(Agreed(sealed, "params"), params);
  EXPECT_NE(tcp.servers[1].find("workers of other hosts reach this shard over TCP streams at port"),
            std::string::npos)
      << tcp.servers[1];
  EXPECT_NE(sealed.servers[1].find("over sealed TCP streams at port"), std::string::npos)
      << sealed.servers[1];
  for (const JobOutput* job : {&tcp, &sealed}) {
    for (const std::string& w : job->workers) {
      EXPECT_NE(w.find("shards on this host uses shared memory, with the others TCP streams"),
                std::string::npos)
          << w;
    }
    for (const std::string& s : job->servers) {
      EXPECT_EQ(s.find("refused"), std::string::npos) << s;
    }
  }
}

TEST_F(PsTest, SspStalenessNeverExceedsTheBound) {
  const std::vector<std::string> worker = {"--path=ps", "--mode=train", "--steps=8",
                                           "--optimizer=sgd", "--slow_ms=40"};
  JobOutput ssp =
      Run(3, 2, {"--ps_mode=ssp", "--staleness=2", "--optimizer=sgd", "--lr=0.1"}, worker);
  const long seen = MaxStaleness(ssp);
  EXPECT_GE(seen, 0);
  EXPECT_LE(seen, 2);
}

TEST_F(PsTest, AsyncAppliesEveryPushAndRecordsItsStaleness) {
  const std::vector<std::string> worker = {"--path=ps", "--mode=train", "--steps=6",
                                           "--optimizer=adam", "--slow_ms=40"};
  JobOutput async = Run(3, 2, {"--ps_mode=async", "--optimizer=adam", "--lr=0.01"}, worker);
  EXPECT_GT(MaxStaleness(async), 0);
  for (const std::string& s : async.servers) {
    EXPECT_NE(s.find("ps_mode=async"), std::string::npos) << s;
    EXPECT_NE(s.find("rejected 0"), std::string::npos) << s;
  }
}

// 10,000 tensors of 100-byte names: their layout check (which crosses the
// ring on every path) is far over a header's limit, so it goes in pieces.
// Every path ends with the exact average: the ring over shared memory and
// over ZeroMQ, and the parameter server, synchronous and asynchronous.
TEST_F(PsTest, ALargeModelOfTenThousandLongNamesTrainsOnEveryPath) {
  const std::vector<std::string> model = {"--tensors=10000", "--name_bytes=100", "--steps=2"};
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), model.begin(), model.end());
    return flags;
  };
  JobOutput shm = Run(3, 0, {}, with({"--path=allreduce"}));
  JobOutput zmq = Run(3, 0, {}, with({"--path=allreduce", "--ring_shm=false"}));
  JobOutput sync = Run(3, 2, {"--ps_mode=sync"}, with({"--path=ps"}));
  EXPECT_NE(shm.workers[0].find("use shared memory"), std::string::npos) << shm.workers[0];
  EXPECT_EQ(zmq.workers[0].find("use shared memory"), std::string::npos) << zmq.workers[0];
  const std::string checksum = Agreed(shm, "checksum");
  EXPECT_EQ(Agreed(zmq, "checksum"), checksum);
  EXPECT_EQ(Agreed(sync, "checksum"), checksum);
  // Asynchronous: every worker gets worker 0's initial parameters back
  // (checked by the worker) and trains on.
  JobOutput async = Run(3, 2, {"--ps_mode=async", "--optimizer=sgd", "--lr=0.1"},
                        with({"--path=ps", "--mode=train", "--optimizer=sgd"}));
  for (size_t r = 0; r < async.workers.size(); ++r) {
    EXPECT_NE(async.workers[r].find("worker " + std::to_string(r) + " step 2"), std::string::npos)
        << async.workers[r];
  }
}

TEST_F(PsTest, AShardRefusesAsyncWithoutOptimizer) {
  StartScheduler(1, 1, "refuse");
  SetJob(1, 1);
  Subprocess& s =
      Start({Runfile("server/gradsync_server"), "--role=server", "--ps_mode=async"}, "server");
  auto code = s.Wait(Deadline::AfterMs(10000));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2);
  EXPECT_NE(s.Output().find("needs a server-side optimizer"), std::string::npos) << s.Output();
}

}  // namespace
}  // namespace gradsync
