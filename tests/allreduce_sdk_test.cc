// The client SDK on the all-reduce path across real processes: a scheduler
// and 4 worker processes (tests/sdk_worker) on loopback, with bucketing over
// tensors of mixed sizes and dtypes; ranks that disagree; a worker that is
// killed; a worker that stops contributing.
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/local_job.h"
#include "wire/bulk_cipher.h"
#include "wire/curve.h"

namespace gradsync {
namespace {

using std::chrono::steady_clock;

class AllReduceSdkTest : public ::testing::Test, public LocalJob {
 protected:
  // With `key_file`, the job runs CURVE and its ring goes over TCP. With
  // `per_host` = k, worker r gives 127.0.0.(r / k + 1) as its host address:
  // to the job, k workers share each host.
  // `odd_extra` goes to the odd ranks only, after `extra`.
  std::vector<Subprocess*> StartWorkers(int n, std::vector<std::string> extra,
                                        const std::string& key_file = "", int per_host = 0,
                                        std::vector<std::string> odd_extra = {}) {
    StartScheduler(n, 0,
                   key_file.empty() ? std::vector<std::string>{}
                                    : std::vector<std::string>{"--key_file=" + key_file});
    SetJob(n, 0);
    if (!key_file.empty()) {
      env_["GRADSYNC_KEY_FILE"] = key_file;
      env_["GRADSYNC_RING_SHM"] = "false";
    }
    std::vector<Subprocess*> workers;
    for (int r = 0; r < n; ++r) {
      // No /metrics: the fixed ports (9410 + rank) would collide with the
      // workers of other tests running beside this one.
      std::vector<std::string> argv = {Runfile("tests/sdk_worker"), "--rank=" + std::to_string(r),
                                       "--bucket_bytes=2097152", "--metrics_base_port=0"};
      argv.insert(argv.end(), extra.begin(), extra.end());
      if (r % 2 == 1) argv.insert(argv.end(), odd_extra.begin(), odd_extra.end());
      if (per_host > 0) argv.push_back("--host=127.0.0." + std::to_string(r / per_host + 1));
      workers.push_back(&Start(argv, "worker" + std::to_string(r)));
    }
    return workers;
  }

  // Every worker of a mode=train job passed its exact checks.
  static void ExpectTrained(const std::vector<Subprocess*>& workers) {
    for (size_t r = 0; r < workers.size(); ++r) {
      auto code = workers[r]->Wait(Deadline::AfterMs(120000));
      ASSERT_TRUE(code.has_value()) << "worker " << r << " still running:\n"
                                    << workers[r]->Output();
      EXPECT_EQ(*code, 0) << workers[r]->Output();
      EXPECT_NE(workers[r]->Output().find("backend ring"), std::string::npos);
      EXPECT_NE(workers[r]->Output().find("finished step 3"), std::string::npos);
      EXPECT_NE(workers[r]->Output().find("broadcast ok"), std::string::npos);
      EXPECT_NE(workers[r]->Output().find("accumulation ok"), std::string::npos)
          << workers[r]->Output();
    }
  }

  // Two workers on each of two host addresses: ring neighbours on one host
  // exchange through shared memory, the links between the hosts are TCP
  // streams (`sealing`: "plain", or "sealed" under CURVE). The same exact
  // results.
  static void ExpectSharedMemoryBesideStreams(const std::vector<Subprocess*>& workers,
                                              const std::string& sealing) {
    ExpectTrained(workers);
    EXPECT_NE(workers[0]->Output().find("ring over TCP streams, " + sealing), std::string::npos)
        << workers[0]->Output();
    for (Subprocess* w : workers) {
      EXPECT_NE(
          w->Output().find("ring lane 0: neighbours on this host use shared memory, the others "
                           "TCP streams (1 peer(s))"),
          std::string::npos)
          << w->Output();
    }
  }

  // Four workers, `per_host` to a host address, with ring_algorithm=
  // halving_doubling (CURVE with `key_file`) train with the exact checks,
  // their ring's streams `sealing` ("plain" or "sealed"). Returns them.
  std::vector<Subprocess*> ExpectHalvingTrained(const std::string& key_file,
                                                const std::string& sealing, int per_host = 1) {
    auto workers = StartWorkers(
        4, {"--mode=train", "--steps=4", "--ring_algorithm=halving_doubling"}, key_file, per_host);
    ExpectTrained(workers);
    const std::string out = workers[0]->Output();
    EXPECT_NE(out.find("all-reduces by halving and doubling over 2 pairs"), std::string::npos)
        << out;
    EXPECT_NE(out.find("ring over TCP streams, " + sealing), std::string::npos) << out;
    return workers;
  }

  // Worker 3 of a mode=stall job (victim 3) is killed once it stops
  // contributing: the others all fail naming it within 3 s.
  static void ExpectKilledWorkerNamed(const std::vector<Subprocess*>& workers) {
    ASSERT_TRUE(workers[3]->WaitForOutput("stops contributing", Deadline::AfterMs(60000)))
        << workers[3]->Output();
    workers[3]->Signal(SIGKILL);
    const auto killed = steady_clock::now();
    for (int r = 0; r < 3; ++r) {
      auto code = workers[r]->Wait(Deadline::AfterMs(20000));
      ASSERT_TRUE(code.has_value()) << "worker " << r << " hangs:\n" << workers[r]->Output();
      EXPECT_EQ(*code, 3) << workers[r]->Output();
      EXPECT_NE(workers[r]->Output().find("worker 3 died"), std::string::npos)
          << workers[r]->Output();
    }
    // Declared dead after heartbeat_ms x missed_heartbeats (1 s), then seen
    // by the waiting ranks at their next poll.
    EXPECT_LT(std::chrono::duration<double>(steady_clock::now() - killed).count(), 3.0);
  }

  // The "error after N ms" a worker printed, or -1.
  static long ErrorAfterMs(const std::string& out) {
    const size_t at = out.find("error after ");
    if (at == std::string::npos) return -1;
    return std::atol(out.c_str() + at + std::strlen("error after "));
  }
};

TEST_F(AllReduceSdkTest, FourWorkersBucketedMixedDtypesExactAverageBroadcastAndAccumulation) {
  ExpectTrained(StartWorkers(4, {"--mode=train", "--steps=4"}));
}

// The same steps under CURVE (every node with its own key, the ring over
// TCP rather than shared memory: sealed TCP streams) give every rank the
// same exact averages, broadcast and accumulation: CURVE changes how the
// bytes travel, never which bytes arrive. The odd ranks seal with OpenSSL
// (bulk_cipher=openssl), the even ones with the library `auto` picks
// (intel-ipsec-mb where this CPU has AES-NI): each reads the other's
// sealed streams.
TEST_F(AllReduceSdkTest, UnderCurveTheSameExactResultsWithEitherCipherLibrary) {
  const std::string key_file = TmpFile("sdk_curve.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  auto workers =
      StartWorkers(4, {"--mode=train", "--steps=4"}, key_file, 0, {"--bulk_cipher=openssl"});
  ExpectTrained(workers);
  const std::string best =
      "sealed with AES-256-GCM by " + wire::BulkCipherEngineName(wire::BulkCipherEngine::kBest);
  for (size_t r = 0; r < workers.size(); ++r) {
    const std::string out = workers[r]->Output();
    EXPECT_NE(out.find("CURVE on every link"), std::string::npos) << out;
    EXPECT_EQ(out.find("use shared memory"), std::string::npos) << out;
    EXPECT_NE(out.find(r % 2 == 1 ? "sealed with AES-256-GCM by OpenSSL" : best), std::string::npos)
        << out;
  }
  EXPECT_NE(workers[0]->Output().find("ring over TCP streams, sealed"), std::string::npos)
      << workers[0]->Output();
}

// A value bulk_cipher does not know stops the worker before it joins,
// naming the setting.
TEST_F(AllReduceSdkTest, AnUnknownCipherLibraryIsRefusedByName) {
  const std::string key_file = TmpFile("sdk_cipher_bad.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  auto workers = StartWorkers(1, {"--mode=train", "--steps=1", "--bulk_cipher=aes-ni"}, key_file);
  auto code = workers[0]->Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(code.has_value()) << workers[0]->Output();
  EXPECT_NE(*code, 0);
  EXPECT_NE(workers[0]->Output().find("bulk_cipher must be auto or openssl, got 'aes-ni'"),
            std::string::npos)
      << workers[0]->Output();
}

// The same under CURVE with the ring in three lanes (client/ring_lanes.h):
// the 4 MB bucket goes over all three, each lane a sealed TCP stream of its
// own, and every rank gets the same exact results. The
// workers give their host by name: lanes are announced under it, as data
// ports are.
TEST_F(AllReduceSdkTest, UnderCurveInThreeLanesTheSameExactResults) {
  const std::string key_file = TmpFile("sdk_lanes.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  auto workers = StartWorkers(
      4, {"--mode=train", "--steps=4", "--ring_lanes=3", "--host=localhost"}, key_file);
  ExpectTrained(workers);
  EXPECT_NE(workers[0]->Output().find("ring of 3 lanes"), std::string::npos)
      << workers[0]->Output();
  EXPECT_NE(workers[0]->Output().find("ring over TCP streams"), std::string::npos)
      << workers[0]->Output();
}

// ring_lanes=auto: the ring opens 4 lanes, times an all-reduce over lane 0
// and over all of them, and every rank uses the count rank 0 chose (which
// this machine's loopback decides); the results are exact either way.
TEST_F(AllReduceSdkTest, WithAutoLanesTheRingChoosesACountAndTheResultsAreExact) {
  auto workers = StartWorkers(4, {"--mode=train", "--steps=4", "--ring_lanes=auto",
                                  "--ring_shm=false", "--host=localhost"});
  ExpectTrained(workers);
  const std::string& out = workers[0]->Output();
  const size_t at = out.find("ring_lanes=auto: a 4 MiB all-reduce took ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  EXPECT_TRUE(line.find("using 1 lane") != std::string::npos ||
              line.find("using 4 lanes") != std::string::npos)
      << line;
}

// Workers started with different ring settings all fail at the start,
// naming a worker that differs and both settings: worker 0 runs
// --ring_lanes=1 (its setting reads `mine`), worker 1 `other_flag` (read
// `other`).
void ExpectRingSettingsRefused(LocalJob& job, const std::string& other_flag,
                               const std::string& mine, const std::string& other) {
  job.StartScheduler(2, 0);
  job.SetJob(2, 0);
  std::vector<Subprocess*> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(&job.Start(
        {Runfile("tests/sdk_worker"), "--rank=" + std::to_string(r), "--mode=train", "--steps=2",
         "--metrics_base_port=0", "--ring_shm=false", r == 0 ? "--ring_lanes=1" : other_flag},
        "worker" + std::to_string(r)));
  }
  for (int r = 0; r < 2; ++r) {
    Subprocess* w = workers[static_cast<size_t>(r)];
    auto code = w->Wait(Deadline::AfterMs(60000));
    ASSERT_TRUE(code.has_value()) << w->Output();
    EXPECT_NE(*code, 0) << w->Output();
    EXPECT_NE(w->Output().find("runs " + (r == 0 ? other : mine)), std::string::npos)
        << w->Output();
    EXPECT_NE(w->Output().find("every worker needs the same"), std::string::npos) << w->Output();
  }
}

void ExpectLaneSettingsRefused(LocalJob& job, const std::string& other) {
  ExpectRingSettingsRefused(job, "--ring_lanes=" + other, "ring_lanes=1, ring_algorithm=auto",
                            "ring_lanes=" + other + ", ring_algorithm=auto");
}

TEST_F(AllReduceSdkTest, WorkersOfDifferentLaneCountsAllFailNamingTheCounts) {
  ExpectLaneSettingsRefused(*this, "2");
}

// Without shared memory and without CURVE the ring's lanes are TCP streams
// (wire/tcp_stream_transport.h): two lanes each, the same exact results.
TEST_F(AllReduceSdkTest, OverTcpStreamsInTwoLanesTheSameExactResults) {
  auto workers = StartWorkers(
      4, {"--mode=train", "--steps=4", "--ring_shm=false", "--ring_lanes=2", "--host=localhost"});
  ExpectTrained(workers);
  EXPECT_NE(workers[0]->Output().find("ring over TCP streams, plain"), std::string::npos)
      << workers[0]->Output();
}

// A worker per host address without CURVE: the links are timed through
// the data ports, then the ring runs over TCP streams in the measured
// order.
TEST_F(AllReduceSdkTest, WorkersOnFourHostsWithoutCurveRunOverTcpStreams) {
  auto workers = StartWorkers(4, {"--mode=train", "--steps=24"}, "", /*per_host=*/1);
  ExpectTrained(workers);
  const std::string out = workers[0]->Output();
  EXPECT_NE(out.find("over 4 hosts"), std::string::npos) << out;
  EXPECT_NE(out.find("ring over TCP streams"), std::string::npos) << out;
  // ring_algorithm=auto: the small all-reduces by recursive doubling; each
  // size of bucket tried both ways for its first 18 all-reduces (a step
  // each), then the way measured faster on every worker.
  EXPECT_NE(out.find("collectives: buckets round the ring; 4 workers on 4 hosts; ring of 1 lane "
                     "in measured host order, shared memory between neighbours on a host; small "
                     "all-reduces by recursive doubling over 2 pairs, larger ones round the ring "
                     "or by halving and doubling as each size measures faster"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ring_algorithm=auto: all-reduces of 2097152 to 4194303 bytes go "),
            std::string::npos)
      << out;
}

// ring_algorithm=halving_doubling on four host addresses: the buckets
// (2 MiB, past the ring's small_bytes) are all-reduced by halving and
// doubling over a TCP stream with each level's partner
// (client/halving_doubling.h); the same exact results, plain and under
// CURVE (each pair's stream sealed under the partners' node keys).
TEST_F(AllReduceSdkTest, ByHalvingAndDoublingTheSameExactResults) {
  ExpectHalvingTrained("", "plain");
}

TEST_F(AllReduceSdkTest, UnderCurveByHalvingAndDoublingTheSameExactResults) {
  const std::string key_file = TmpFile("sdk_halving.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  ExpectHalvingTrained(key_file, "sealed");
}

// Two workers on each of two host addresses: the partners of level 0 share
// a host and exchange through shared memory, those of level 1 over TCP
// streams; the same exact results.
TEST_F(AllReduceSdkTest, ByHalvingAndDoublingPartnersOnOneHostShareMemory) {
  for (Subprocess* w : ExpectHalvingTrained("", "plain", /*per_host=*/2)) {
    EXPECT_NE(w->Output().find("pair of level 0: its partner on this host uses shared memory "
                               "(1 peer(s))"),
              std::string::npos)
        << w->Output();
    EXPECT_EQ(w->Output().find("pair of level 1:"), std::string::npos) << w->Output();
  }
}

TEST_F(AllReduceSdkTest, WorkersOfDifferentRingAlgorithmsAllFailNamingBoth) {
  ExpectRingSettingsRefused(*this, "--ring_algorithm=halving_doubling",
                            "ring_lanes=1, ring_algorithm=auto",
                            "ring_lanes=1, ring_algorithm=halving_doubling");
}

// A worker killed mid-job under halving and doubling: its partners and
// everyone else name it as on the ring, within the same time.
TEST_F(AllReduceSdkTest, ByHalvingAndDoublingAKilledWorkerIsNamedByTheOthers) {
  auto workers = StartWorkers(4,
                              {"--mode=stall", "--victim=3", "--victim_step=2", "--steps=5",
                               "--op_timeout_ms=30000", "--ring_algorithm=halving_doubling"},
                              "", /*per_host=*/1);
  ExpectKilledWorkerNamed(workers);
  EXPECT_NE(workers[0]->Output().find("by halving and doubling"), std::string::npos)
      << workers[0]->Output();
}

// Two workers on each of two host addresses, in two lanes, each with
// shared-memory links of its own beside its TCP stream.
TEST_F(AllReduceSdkTest, TwoWorkersAHostUseSharedMemoryBesideTcpStreams) {
  ExpectSharedMemoryBesideStreams(
      StartWorkers(4, {"--mode=train", "--steps=4", "--ring_lanes=2"}, "", /*per_host=*/2),
      "plain");
}

// The same under CURVE: the streams between the hosts are sealed.
TEST_F(AllReduceSdkTest, UnderCurveTwoWorkersAHostUseSharedMemoryBesideSealedStreams) {
  const std::string key_file = TmpFile("sdk_mixed.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  ExpectSharedMemoryBesideStreams(
      StartWorkers(4, {"--mode=train", "--steps=4", "--ring_shm=true"}, key_file, /*per_host=*/2),
      "sealed");
}

TEST_F(AllReduceSdkTest, AutoLanesBesideACountAllFailNamingBoth) {
  ExpectLaneSettingsRefused(*this, "auto");
}

// Four workers on four host addresses (loopback), under CURVE: each host's
// first worker times its links to the others through the data ports'
// echoes, the times go round the ring, the order is chosen and logged, and
// the ring trains with the exact checks.
TEST_F(AllReduceSdkTest, WorkersOnFourHostsTimeTheirLinksAndTrainExactly) {
  const std::string key_file = TmpFile("sdk_order.key");
  ASSERT_TRUE(wire::WriteKeyFile(key_file, *wire::GenerateCurveKey()).ok());
  auto workers = StartWorkers(4, {"--mode=train", "--steps=4"}, key_file, /*per_host=*/1);
  ExpectTrained(workers);
  const std::string out = workers[0]->Output();
  EXPECT_NE(out.find("over 4 hosts"), std::string::npos) << out;
  for (Subprocess* w : workers) {
    EXPECT_EQ(w->Output().find("cannot time the link"), std::string::npos) << w->Output();
  }
}

TEST_F(AllReduceSdkTest, RanksThatDisagreeAllFailWithinASecondNamingTheTensor) {
  auto workers = StartWorkers(4, {"--mode=mismatch", "--victim=2", "--steps=2"});
  for (int r = 0; r < 4; ++r) {
    auto code = workers[r]->Wait(Deadline::AfterMs(60000));
    ASSERT_TRUE(code.has_value()) << "worker " << r << " hangs:\n" << workers[r]->Output();
    const std::string out = workers[r]->Output();
    EXPECT_EQ(*code, 3) << out;
    // Ranks 2 (whose left is 1) and 3 (whose left is 2) both see it.
    EXPECT_NE(out.find("tensor layouts differ between rank"), std::string::npos) << out;
    EXPECT_NE(out.find("tensor #2: "), std::string::npos) << out;
    EXPECT_NE(out.find("rank 2 has 'fc1.bias' (1002 x f32)"), std::string::npos) << out;
    const long ms = ErrorAfterMs(out);
    EXPECT_GE(ms, 0) << out;
    EXPECT_LT(ms, 1000) << out;
  }
}

TEST_F(AllReduceSdkTest, AKilledWorkerIsNamedByTheOthers) {
  ExpectKilledWorkerNamed(StartWorkers(
      4, {"--mode=stall", "--victim=3", "--victim_step=2", "--steps=5", "--op_timeout_ms=30000"}));
}

TEST_F(AllReduceSdkTest, AWorkerThatStopsContributingIsNamedByTheDeadline) {
  auto workers = StartWorkers(
      3, {"--mode=stall", "--victim=1", "--victim_step=1", "--steps=3", "--op_timeout_ms=2000"});
  for (int r : {0, 2}) {
    auto code = workers[r]->Wait(Deadline::AfterMs(30000));
    ASSERT_TRUE(code.has_value()) << "worker " << r << " hangs:\n" << workers[r]->Output();
    const std::string out = workers[r]->Output();
    EXPECT_EQ(*code, 3) << out;
    EXPECT_NE(out.find("rank 1 stopped contributing"), std::string::npos) << out;
    const long ms = ErrorAfterMs(out);
    EXPECT_GE(ms, 1900) << out;
    EXPECT_LT(ms, 3000) << out;
  }
  workers[1]->Signal(SIGKILL);
}

// A direct all-reduce that fails while the sends into its buffer are still
// queued (the right neighbour has stopped): once the call has returned, the
// caller's buffer is the caller's, and nothing reads it again, over ZeroMQ
// (one ring, or three lanes) or over the same-host shared-memory link.
// Workers 1 and 3 start at once with a 1 s deadline and fail (0 and 2 wait
// for the go file), then end: having failed, they leave as departing, and
// the scheduler takes them for dead at once, naming the failure (a worker
// whose failure its neighbours did not hear of through the ring would
// otherwise be waited for until their deadline); 0 and 2 then fail.
TEST_F(AllReduceSdkTest, AWorkerThatEndsOnItsFailureIsNamedAtOnce) {
  const std::string go = TmpFile("sdk_go");
  auto workers =
      StartWorkers(4, {"--mode=direct", "--steps=3", "--go_file=" + go, "--op_timeout_ms=60000"},
                   "", 0, {"--go_file=", "--op_timeout_ms=1000"});
  for (int r : {1, 3}) {
    auto code = workers[r]->Wait(Deadline::AfterMs(30000));
    ASSERT_TRUE(code.has_value()) << "worker " << r << " still running:\n" << workers[r]->Output();
    EXPECT_EQ(*code, 3) << workers[r]->Output();
  }
  // The scheduler took the leaver for dead, naming why (and tells 0 and 2).
  ASSERT_TRUE(scheduler_->WaitForOutput("is dead: it left the job (its communicator failed: ",
                                        Deadline::AfterMs(10000)))
      << scheduler_->Output();
  { std::ofstream(go) << "go\n"; }
  // Their operation fails as the leaver's did (its deadline), naming it and
  // its reason.
  const std::regex as_the_leaver(
      R"(took \d+ ms: deadline_exceeded: .*worker [13] died \(declared dead by the scheduler: )"
      R"(it left the job \(its communicator failed: deadline_exceeded: )");
  for (int r : {0, 2}) {
    auto code = workers[r]->Wait(Deadline::AfterMs(20000));
    ASSERT_TRUE(code.has_value()) << "worker " << r << " waits for its deadline:\n"
                                  << workers[r]->Output();
    EXPECT_EQ(*code, 3) << workers[r]->Output();
    EXPECT_TRUE(std::regex_search(workers[r]->Output(), as_the_leaver)) << workers[r]->Output();
  }
}

TEST_F(AllReduceSdkTest, AFailedDirectCallNeverReadsTheCallersBufferAfterReturning) {
  for (const std::string way : {"zmq", "shm", "lanes"}) {
    SCOPED_TRACE(way);
    tag_ = way;  // a log of its own for each job
    const bool shm = way == "shm";
    // In three lanes, the 64 MiB all-reduce is cut over all three.
    auto workers = StartWorkers(
        3, {"--mode=protect", "--victim=2", std::string("--ring_shm=") + (shm ? "true" : "false"),
            std::string("--ring_lanes=") + (way == "lanes" ? "3" : "1")});
    ASSERT_TRUE(workers[2]->WaitForOutput("stops itself", Deadline::AfterMs(60000)))
        << workers[2]->Output();
    for (int r : {0, 1}) {
      ASSERT_TRUE(workers[r]->WaitForOutput("buffer protected", Deadline::AfterMs(60000)))
          << workers[r]->Output();
    }
    workers[2]->Signal(SIGCONT);  // it reads again: what was queued to it goes out
    for (int r : {0, 1}) {
      auto code = workers[r]->Wait(Deadline::AfterMs(30000));
      ASSERT_TRUE(code.has_value()) << "worker " << r << " hangs:\n" << workers[r]->Output();
      EXPECT_EQ(*code, 0) << workers[r]->Output();
      EXPECT_NE(workers[r]->Output().find("lived on"), std::string::npos) << workers[r]->Output();
    }
    nodes_.clear();  // the victim is killed
  }
}

}  // namespace
}  // namespace gradsync
