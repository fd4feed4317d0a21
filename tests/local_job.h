// A job on this machine for multi-process tests: a real scheduler process on
// a free port and any number of node processes, each logging to a file in
// the test's temporary directory.
#ifndef GRADSYNC_TESTS_LOCAL_JOB_H_
#define GRADSYNC_TESTS_LOCAL_JOB_H_

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"

namespace gradsync {

// A file of this test's runfiles ("server/gradsync_server").
inline std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return std::string(dir ? dir : ".") + "/gradsync/" + path;
}

inline std::string TmpFile(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

class LocalJob {
 public:
  // `tag` tells apart the logs of several jobs in one test.
  explicit LocalJob(std::string tag = "") : tag_(std::move(tag)) {}

  static constexpr int kHeartbeatMs = 200;
  static constexpr int kMissed = 5;

  // Starts a scheduler on a free port and returns "127.0.0.1:port".
  std::string StartScheduler(int workers, int servers, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {Runfile("server/gradsync_server"),
                                     "--role=scheduler",
                                     "--port=0",
                                     "--num_workers=" + std::to_string(workers),
                                     "--num_servers=" + std::to_string(servers),
                                     "--heartbeat_ms=" + std::to_string(kHeartbeatMs),
                                     "--missed_heartbeats=" + std::to_string(kMissed)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = Subprocess::Spawn(argv, {}, TmpFile(Name("scheduler")));
    EXPECT_TRUE(p.ok()) << p.status();
    scheduler_ = std::make_unique<Subprocess>(std::move(*p));
    EXPECT_TRUE(scheduler_->WaitForOutput("listening on", Deadline::AfterMs(10000)));
    // "listening on tcp://0.0.0.0:PORT for ..."
    const std::string out = scheduler_->Output();
    const size_t at = out.find("listening on tcp://");
    EXPECT_NE(at, std::string::npos) << out;
    const size_t colon = out.find(':', at + std::strlen("listening on tcp://"));
    address_ = "127.0.0.1:" + std::to_string(std::atoi(out.c_str() + colon + 1));
    return address_;
  }

  // Sets the environment every later node starts with.
  void SetJob(int workers, int servers) {
    env_ = {{"GRADSYNC_SCHEDULER", address_},
            {"GRADSYNC_NUM_WORKERS", std::to_string(workers)},
            {"GRADSYNC_NUM_SERVERS", std::to_string(servers)},
            {"GRADSYNC_HEARTBEAT_MS", std::to_string(kHeartbeatMs)}};
  }

  Subprocess& Start(const std::vector<std::string>& argv, const std::string& name) {
    auto p = Subprocess::Spawn(argv, env_, TmpFile(Name(name)));
    EXPECT_TRUE(p.ok()) << p.status();
    nodes_.push_back(std::make_unique<Subprocess>(std::move(*p)));
    return *nodes_.back();
  }

  // "<test name>[.<tag>].<what>.log"
  std::string Name(const std::string& what) const {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
           (tag_.empty() ? "" : "." + tag_) + "." + what + ".log";
  }

 protected:
  std::unique_ptr<Subprocess> scheduler_;
  std::vector<std::unique_ptr<Subprocess>> nodes_;
  std::map<std::string, std::string> env_;
  std::string address_;
  std::string tag_;
};

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_LOCAL_JOB_H_
