// The main job end to end, in short: for every mode of tools/demo.sh (its
// MODES table, read from the script itself), gradsync_launch starts a
// scheduler, kServers parameter-server shards where the mode uses them and
// kWorkers examples/fmnist_trainer workers that train on the real
// Fashion-MNIST data for kSteps steps each. Every mode must exit 0 and learn,
// every mode must end near ring all-reduce, and the synchronous parameter
// server, which applies the same averaged gradients as the ring, must end
// very near it.
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/local_job.h"

namespace gradsync {
namespace {

constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";
constexpr const char* kDataFiles[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                      "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
constexpr char kReference[] = "allreduce-ring";
constexpr char kSyncPs[] = "ps-sync";

constexpr int kWorkers = 4;
constexpr int kServers = 2;
// Steps per worker: 2.6 epochs of 235 steps (4 workers, batch 64); the
// demo's 3 epochs are the upper bound.
constexpr int kSteps = 600;
constexpr int kEpochs = 3;
constexpr int64_t kJobTimeoutMs = 120000;  // a job takes 10 to 30 s

// Learning, for every mode. The mean training loss of the first 20 steps is
// 1.2 to 1.5 in the synchronous modes and 2 to 4.5 in the asynchronous ones
// (stale updates make it rise first); that of the last 20 steps is 0.30 to
// 0.45, a quarter of the first or less. The test accuracy ends at 0.82 to
// 0.87; a mode that diverges ends at 0.10 (NaN losses fail as well), one
// whose learning rate is a hundred times too small near 0.75.
constexpr double kMaxLossRatio = 0.5;  // last / first
constexpr double kMinAccuracy = 0.78;

// Agreement with ring all-reduce (test accuracy 0.864, last loss 0.301). The
// synchronous modes are deterministic and end within 0.3 points of accuracy
// (top-k with error feedback 0.3 points and 0.04 in the last loss behind).
// The asynchronous ones vary from run to run with the timing (fifteen runs,
// some with two jobs sharing the two cores): async 0.829 to 0.849, SSP
// (s = 2) 0.822 to 0.845, up to 4.2 points of accuracy and 0.15 in the last
// loss behind the ring, with a spread of about 0.6 points and 0.02. The
// bounds stay about five such spreads beyond the worst run seen and still
// fail a mode that learns markedly slower than the ring.
constexpr double kAccuracyTolerance = 0.07;
constexpr double kLossTolerance = 0.25;

// ps-sync against the ring: both apply the same average of the same
// gradients and differ only in the order of the float additions, so their
// trajectories agree to the four printed decimals for the first 200 steps
// (fp16 compression is already 3e-4 off in the first window); afterwards
// rounding makes them drift apart, to 0.15 points of accuracy and 0.0005 in
// the last loss at 600 steps, the same in every run.
constexpr double kSyncFirstLossTolerance = 2e-4;
constexpr double kSyncLastLossTolerance = 0.02;
constexpr double kSyncAccuracyTolerance = 0.01;

// One entry of the demo's table.
struct Mode {
  std::string name;
  bool uses_servers = false;
  std::map<std::string, std::string> env;
  std::vector<std::string> flags;
};

struct JobRun {
  std::optional<int> exit_code;  // none: stopped at the timeout
  std::string output;            // the launcher's
  std::string result;            // worker 0's JSON line
  double seconds = 0;
};

std::vector<std::string> Words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

std::string Trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t") + 1 - begin);
}

// One MODES entry: "name|uses servers (0 or 1)|environment|trainer flags",
// words separated by spaces, nothing the shell would expand.
std::optional<Mode> ParseMode(const std::string& line, std::string* error) {
  if (line.size() < 2 || line.front() != '"' || line.back() != '"' ||
      line.find_first_of("'\\$`*?", 1) != std::string::npos ||
      line.find('"', 1) != line.size() - 1) {
    *error = "cannot read the MODES entry " + line;
    return std::nullopt;
  }
  std::vector<std::string> parts;
  std::istringstream in(line.substr(1, line.size() - 2));
  for (std::string part; std::getline(in, part, '|');) parts.push_back(part);
  if (parts.size() == 3) parts.emplace_back();
  if (parts.size() != 4 || parts[0].empty() || (parts[1] != "0" && parts[1] != "1")) {
    *error = "a MODES entry needs name|0 or 1|environment|flags: " + line;
    return std::nullopt;
  }
  Mode mode{parts[0], parts[1] == "1", {}, Words(parts[3])};
  for (const std::string& assignment : Words(parts[2])) {
    const size_t eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0) {
      *error = "not NAME=value in the environment of " + line;
      return std::nullopt;
    }
    mode.env[assignment.substr(0, eq)] = assignment.substr(eq + 1);
  }
  return mode;
}

// The entries between the lines "MODES=(" and ")" of tools/demo.sh.
std::vector<Mode> ReadModes(const std::string& path, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read " + path;
    return {};
  }
  std::vector<Mode> modes;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    line = Trim(line);
    if (!inside) {
      inside = line == "MODES=(";
      continue;
    }
    if (line == ")") return modes;
    if (line.empty() || line[0] == '#') continue;
    auto mode = ParseMode(line, error);
    if (!mode) return {};
    modes.push_back(*mode);
  }
  *error = "no MODES=( ... ) table in " + path;
  return {};
}

std::string MissingData() {
  std::string missing;
  for (const char* file : kDataFiles) {
    struct stat st;
    const std::string path = std::string(kDataDir) + "/" + file;
    if (stat(path.c_str(), &st) != 0) missing += " " + path;
  }
  if (missing.empty()) return "";
  return "the Fashion-MNIST data set is missing (" + missing.substr(1) +
         "): install Debian's dataset-fashion-mnist";
}

// The number after "key": in a one-line JSON object.
std::optional<double> Number(const std::string& json, const std::string& key) {
  const std::string quoted = "\"" + key + "\":";
  const size_t at = json.find(quoted);
  if (at == std::string::npos) return std::nullopt;
  const char* begin = json.c_str() + at + quoted.size();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return value;
}

// The last line "[worker 0] {...}" of the launcher's output, without the
// prefix.
std::string ResultLine(const std::string& output) {
  const std::string prefix = "[worker 0] {";
  const size_t at = output.rfind(prefix);
  if (at == std::string::npos) return "";
  const size_t begin = at + prefix.size() - 1;
  return output.substr(begin, output.find('\n', begin) - begin);
}

std::string Tail(const std::string& text, size_t n = 4000) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

JobRun RunMode(const Mode& mode) {
  std::vector<std::string> argv = {Runfile("launcher/gradsync_launch"),
                                   "--workers=" + std::to_string(kWorkers),
                                   "--servers=" + std::to_string(mode.uses_servers ? kServers : 0),
                                   "--port=0",
                                   "--server_binary=" + Runfile("server/gradsync_server"),
                                   "--log_dir=" + TmpFile(mode.name + ".logs"),
                                   "--",
                                   Runfile("examples/fmnist_trainer"),
                                   "--mode=" + mode.name,
                                   "--epochs=" + std::to_string(kEpochs),
                                   "--max_steps=" + std::to_string(kSteps),
                                   std::string("--data_dir=") + kDataDir};
  argv.insert(argv.end(), mode.flags.begin(), mode.flags.end());
  std::map<std::string, std::string> env = mode.env;
  env.emplace("GRADSYNC_METRICS_PORT", "0");
  env.emplace("GRADSYNC_METRICS_BASE_PORT", "0");

  JobRun run;
  const auto start = std::chrono::steady_clock::now();
  auto launcher = Subprocess::Spawn(argv, env, TmpFile(mode.name + ".out"));
  if (!launcher.ok()) {
    run.output = "cannot start gradsync_launch: " + launcher.status().ToString();
    return run;
  }
  run.exit_code = launcher->Wait(Deadline::AfterMs(kJobTimeoutMs));
  if (!run.exit_code) {
    launcher->Signal(SIGTERM);  // the launcher stops its processes
    launcher->Wait(Deadline::AfterMs(30000));
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.output = launcher->Output();
  run.result = ResultLine(run.output);
  return run;
}

class DemoE2eTest : public ::testing::Test {
 protected:
  // Runs every mode once for all the tests of the suite.
  static void SetUpTestSuite() {
    error_ = new std::string(MissingData());
    modes_ = new std::vector<Mode>;
    runs_ = new std::map<std::string, JobRun>;
    if (!error_->empty()) return;
    *modes_ = ReadModes(Runfile("tools/demo.sh"), error_);
    for (const Mode& mode : *modes_) (*runs_)[mode.name] = RunMode(mode);
    std::printf("%-18s %5s %9s %10s %10s %9s\n", "mode", "exit", "test_acc", "first_loss",
                "last_loss", "seconds");
    for (const Mode& mode : *modes_) {
      const JobRun& run = (*runs_)[mode.name];
      std::printf("%-18s %5d %9.4f %10.4f %10.4f %9.1f\n", mode.name.c_str(),
                  run.exit_code.value_or(-1), Number(run.result, "test_accuracy").value_or(NAN),
                  Number(run.result, "first_loss").value_or(NAN),
                  Number(run.result, "last_loss").value_or(NAN), run.seconds);
    }
    std::fflush(stdout);
  }

  static void TearDownTestSuite() {
    delete runs_;
    delete modes_;
    delete error_;
  }

  // Whether mode `name` ran, exited 0 and reported its results.
  static ::testing::AssertionResult Finished(const std::string& name) {
    if (!runs_->count(name)) {
      return ::testing::AssertionFailure() << "tools/demo.sh has no mode " << name;
    }
    const JobRun& run = runs_->at(name);
    if (!run.exit_code) {
      return ::testing::AssertionFailure()
             << name << " did not end within " << kJobTimeoutMs / 1000 << " s\n"
             << Tail(run.output);
    }
    if (*run.exit_code != 0 || run.result.empty()) {
      return ::testing::AssertionFailure()
             << name << " exited with code " << *run.exit_code
             << (run.result.empty() ? " and no result line" : "") << "\n"
             << Tail(run.output);
    }
    return ::testing::AssertionSuccess();
  }

  // A number from the result line of mode `name`; NaN when it is missing.
  static double Get(const std::string& name, const std::string& key) {
    return Number(runs_->at(name).result, key).value_or(NAN);
  }

  static std::string* error_;
  static std::vector<Mode>* modes_;
  static std::map<std::string, JobRun>* runs_;
};

std::string* DemoE2eTest::error_ = nullptr;
std::vector<Mode>* DemoE2eTest::modes_ = nullptr;
std::map<std::string, JobRun>* DemoE2eTest::runs_ = nullptr;

TEST_F(DemoE2eTest, EveryModeExitsZeroAndLearns) {
  ASSERT_TRUE(error_->empty()) << *error_;
  ASSERT_FALSE(modes_->empty());
  for (const Mode& mode : *modes_) {
    SCOPED_TRACE(mode.name);
    const ::testing::AssertionResult finished = Finished(mode.name);
    EXPECT_TRUE(finished);
    if (!finished) continue;
    const std::string& result = runs_->at(mode.name).result;
    EXPECT_EQ(Get(mode.name, "steps"), kSteps) << result;
    EXPECT_EQ(Get(mode.name, "workers"), kWorkers) << result;
    EXPECT_LT(Get(mode.name, "last_loss"), kMaxLossRatio * Get(mode.name, "first_loss")) << result;
    EXPECT_GT(Get(mode.name, "test_accuracy"), kMinAccuracy) << result;
  }
}

TEST_F(DemoE2eTest, EveryModeEndsNearRingAllReduce) {
  ASSERT_TRUE(error_->empty()) << *error_;
  ASSERT_TRUE(Finished(kReference));
  const double accuracy = Get(kReference, "test_accuracy");
  const double loss = Get(kReference, "last_loss");
  for (const Mode& mode : *modes_) {
    if (mode.name == kReference) continue;
    SCOPED_TRACE(mode.name);
    const ::testing::AssertionResult finished = Finished(mode.name);
    EXPECT_TRUE(finished);
    if (!finished) continue;
    EXPECT_NEAR(Get(mode.name, "test_accuracy"), accuracy, kAccuracyTolerance)
        << runs_->at(mode.name).result;
    EXPECT_NEAR(Get(mode.name, "last_loss"), loss, kLossTolerance) << runs_->at(mode.name).result;
  }
}

TEST_F(DemoE2eTest, SyncParameterServerMatchesRingAllReduce) {
  ASSERT_TRUE(error_->empty()) << *error_;
  ASSERT_TRUE(Finished(kReference));
  ASSERT_TRUE(Finished(kSyncPs));
  const std::string context = runs_->at(kReference).result + "\n" + runs_->at(kSyncPs).result;
  EXPECT_NEAR(Get(kSyncPs, "first_loss"), Get(kReference, "first_loss"), kSyncFirstLossTolerance)
      << context;
  EXPECT_NEAR(Get(kSyncPs, "last_loss"), Get(kReference, "last_loss"), kSyncLastLossTolerance)
      << context;
  EXPECT_NEAR(Get(kSyncPs, "test_accuracy"), Get(kReference, "test_accuracy"),
              kSyncAccuracyTolerance)
      << context;
}

}  // namespace
}  // namespace gradsync
