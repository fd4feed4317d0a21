// The C API over a real job: a scheduler process on loopback and workers as
// threads of this process, each with its own gs_comm.
#include "gradsync/c_api.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/half.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

extern "C" int gs_c_check_argument_errors(void);
extern "C" int gs_c_sum_floats(gs_comm* comm, float* data, size_t count, int expected_world);

namespace gradsync {
namespace {

using std::chrono::steady_clock;
using ::testing::HasSubstr;

constexpr int64_t kTimeoutMs = 30000;

std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return std::string(dir ? dir : ".") + "/gradsync/" + path;
}

std::string TmpFile(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// A tensor's elements in its dtype, converted from and to float.
std::vector<uint8_t> Encode(gs_dtype dtype, const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * (dtype == GS_F32 ? 4 : 2));
  if (dtype == GS_F32) std::memcpy(out.data(), values.data(), out.size());
  if (dtype == GS_F16) FloatToHalf(values.data(), out.data(), values.size());
  if (dtype == GS_BF16) FloatToBf16(values.data(), out.data(), values.size());
  return out;
}

std::vector<float> Decode(gs_dtype dtype, const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / (dtype == GS_F32 ? 4 : 2));
  if (dtype == GS_F32) std::memcpy(out.data(), bytes.data(), bytes.size());
  if (dtype == GS_F16) HalfToFloat(bytes.data(), out.data(), out.size());
  if (dtype == GS_BF16) Bf16ToFloat(bytes.data(), out.data(), out.size());
  return out;
}

// Integer values, so sums and averages over two ranks are exact in every
// dtype: rank r holds (2r + 1) * pattern, the average is 2 * pattern.
std::vector<float> Pattern(size_t n, int rank, int salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((2 * rank + 1) * ((i + salt) % 11 + 1));
  return v;
}

struct Completions {
  std::atomic<int> ok{0};
  std::atomic<int> failed{0};
};

void CountCompletion(int code, const char* message, void* user) {
  auto* c = static_cast<Completions*>(user);
  (code == GS_OK && message != nullptr && message[0] == '\0' ? c->ok : c->failed)++;
}

bool WaitForCount(const std::atomic<int>& count, int expected) {
  const auto until = steady_clock::now() + std::chrono::seconds(10);
  while (count.load() < expected && steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return count.load() == expected;
}

struct TensorSpec {
  const char* name;
  size_t count;
  gs_dtype dtype;
};

class CApiTest : public ::testing::Test {
 protected:
  // Starts a scheduler for `workers` workers on a free port.
  void StartScheduler(int workers) {
    std::vector<std::string> argv = {Runfile("server/gradsync_server"), "--role=scheduler",
                                     "--port=0", "--num_workers=" + std::to_string(workers)};
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    auto p = Subprocess::Spawn(argv, {}, TmpFile(test + ".scheduler.log"));
    ASSERT_TRUE(p.ok()) << p.status();
    scheduler_ = std::make_unique<Subprocess>(std::move(*p));
    ASSERT_TRUE(scheduler_->WaitForOutput("listening on", Deadline::AfterMs(10000)));
    const std::string out = scheduler_->Output();
    const size_t at = out.find("listening on tcp://");
    ASSERT_NE(at, std::string::npos) << out;
    const size_t colon = out.find(':', at + std::strlen("listening on tcp://"));
    address_ = "127.0.0.1:" + std::to_string(std::atoi(out.c_str() + colon + 1));
    workers_ = workers;
  }

  gs_comm* Create(int rank, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--scheduler=" + address_,
                                     "--num_workers=" + std::to_string(workers_),
                                     "--rank=" + std::to_string(rank)};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    gs_comm* comm = nullptr;
    const int code = gs_create(argv.data(), static_cast<int>(argv.size()), kTimeoutMs, &comm);
    EXPECT_EQ(code, GS_OK) << gs_last_error();
    return comm;
  }

  // Runs `body` on one thread per rank, each with its own gs_comm.
  void RunWorkers(const std::function<void(gs_comm*, int)>& body,
                  std::vector<std::string> extra = {}) {
    std::vector<std::thread> threads;
    for (int r = 0; r < workers_; ++r) {
      threads.emplace_back([&, r] {
        gs_comm* comm = Create(r, extra);
        if (comm == nullptr) return;
        body(comm, r);
        EXPECT_EQ(gs_destroy(comm), GS_OK);
      });
    }
    for (std::thread& t : threads) t.join();
  }

  void ExpectJobEndedCleanly() {
    EXPECT_EQ(scheduler_->Wait(Deadline::AfterMs(10000)), 0) << scheduler_->Output();
  }

  std::unique_ptr<Subprocess> scheduler_;
  std::string address_;
  int workers_ = 0;
};

std::vector<int32_t> RegisterAll(gs_comm* comm, const std::vector<TensorSpec>& specs) {
  std::vector<int32_t> ids;
  for (const TensorSpec& s : specs) {
    int32_t id = -1;
    EXPECT_EQ(gs_register_tensor(comm, s.name, s.count, s.dtype, &id), GS_OK) << gs_last_error();
    ids.push_back(id);
  }
  return ids;
}

// One step: every tensor marked ready in reverse order, odd ones with a
// callback, even ones with a handle; checks the averages.
void RunStep(gs_comm* comm, const std::vector<TensorSpec>& specs, const std::vector<int32_t>& ids,
             int rank, int step, Completions* completions) {
  std::vector<std::vector<uint8_t>> data(specs.size());
  std::vector<gs_handle*> handles(specs.size(), nullptr);
  for (size_t i = specs.size(); i-- > 0;) {
    data[i] = Encode(specs[i].dtype, Pattern(specs[i].count, rank, step));
    const bool odd = i % 2 == 1;
    ASSERT_EQ(gs_mark_ready(comm, ids[i], data[i].data(), odd ? CountCompletion : nullptr,
                            completions, odd ? nullptr : &handles[i]),
              GS_OK)
        << gs_last_error();
  }
  ASSERT_EQ(gs_synchronize(comm, kTimeoutMs), GS_OK) << gs_last_error();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (handles[i] != nullptr) {
      EXPECT_EQ(gs_handle_wait(handles[i], 0), GS_OK) << gs_last_error();
      int done = 0;
      EXPECT_EQ(gs_handle_done(handles[i], &done), GS_OK);
      EXPECT_EQ(done, 1);
      EXPECT_EQ(gs_handle_free(handles[i]), GS_OK);
    }
    const std::vector<float> got = Decode(specs[i].dtype, data[i]);
    const std::vector<float> want = Pattern(specs[i].count, 0, step);
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k], 2 * want[k]) << specs[i].name << "[" << k << "] step " << step;
    }
  }
}

TEST_F(CApiTest, SynchronizesMixedDtypesToTheAverage) {
  StartScheduler(2);
  const std::vector<TensorSpec> specs = {{"embed", 5000, GS_BF16}, {"fc1.w", 3000, GS_F32},
                                         {"fc1.b", 1, GS_F32},     {"fc2.w", 777, GS_F16},
                                         {"fc2.b", 10, GS_F16},    {"out", 100, GS_F32}};
  constexpr int kSteps = 3;
  RunWorkers(
      [&](gs_comm* comm, int rank) {
        int r = -1;
        ASSERT_EQ(gs_rank(comm, &r), GS_OK);
        EXPECT_EQ(r, rank);
        const std::vector<int32_t> ids = RegisterAll(comm, specs);
        Completions completions;
        for (int step = 0; step < kSteps; ++step) {
          RunStep(comm, specs, ids, rank, step, &completions);
        }
        EXPECT_TRUE(WaitForCount(completions.ok, kSteps * 3)) << completions.ok.load();
        EXPECT_EQ(completions.failed.load(), 0);
        gs_stats stats;
        ASSERT_EQ(gs_get_stats(comm, &stats), GS_OK);
        EXPECT_EQ(stats.steps, static_cast<uint64_t>(kSteps));
        EXPECT_GE(stats.buckets_reduced, static_cast<uint64_t>(kSteps * 3));
      },
      {"--first_bucket_bytes=2048", "--bucket_bytes=8192"});
  ExpectJobEndedCleanly();
}

TEST_F(CApiTest, NoSyncAccumulatesMicroStepsLocally) {
  StartScheduler(2);
  const std::vector<TensorSpec> specs = {{"w", 1000, GS_F32}, {"b", 64, GS_BF16}};
  RunWorkers([&](gs_comm* comm, int rank) {
    const std::vector<int32_t> ids = RegisterAll(comm, specs);
    EXPECT_EQ(gs_no_sync_end(comm), GS_FAILED_PRECONDITION);
    EXPECT_THAT(gs_last_error(), HasSubstr("gs_no_sync_begin was not called"));
    // Micro-step 1, local: 1x the pattern.
    ASSERT_EQ(gs_no_sync_begin(comm), GS_OK);
    EXPECT_EQ(gs_no_sync_begin(comm), GS_FAILED_PRECONDITION);
    EXPECT_THAT(gs_last_error(), HasSubstr("already inside a no-sync scope"));
    std::vector<std::vector<uint8_t>> first, second;
    for (size_t i = 0; i < specs.size(); ++i) {
      first.push_back(Encode(specs[i].dtype, Pattern(specs[i].count, rank, 0)));
      gs_handle* h = nullptr;
      ASSERT_EQ(gs_mark_ready(comm, ids[i], first[i].data(), nullptr, nullptr, &h), GS_OK)
          << gs_last_error();
      EXPECT_EQ(gs_handle_wait(h, 0), GS_OK) << "a no-sync mark-ready completes at once";
      gs_handle_free(h);
    }
    ASSERT_EQ(gs_synchronize(comm, kTimeoutMs), GS_OK) << gs_last_error();
    ASSERT_EQ(gs_no_sync_end(comm), GS_OK);
    // Micro-step 2 synchronises: 1x + 2x the pattern, averaged: 6x pattern(0).
    for (size_t i = 0; i < specs.size(); ++i) {
      std::vector<float> twice = Pattern(specs[i].count, rank, 0);
      for (float& v : twice) v *= 2;
      second.push_back(Encode(specs[i].dtype, twice));
      ASSERT_EQ(gs_mark_ready(comm, ids[i], second[i].data(), nullptr, nullptr, nullptr), GS_OK)
          << gs_last_error();
    }
    ASSERT_EQ(gs_synchronize(comm, kTimeoutMs), GS_OK) << gs_last_error();
    for (size_t i = 0; i < specs.size(); ++i) {
      const std::vector<float> got = Decode(specs[i].dtype, second[i]);
      const std::vector<float> base = Pattern(specs[i].count, 0, 0);
      for (size_t k = 0; k < got.size(); ++k) {
        ASSERT_EQ(got[k], 6 * base[k]) << specs[i].name << "[" << k << "]";
      }
    }
    gs_stats stats;
    ASSERT_EQ(gs_get_stats(comm, &stats), GS_OK);
    EXPECT_EQ(stats.steps, 1u);
  });
  ExpectJobEndedCleanly();
}

TEST_F(CApiTest, BroadcastFromRankZeroAllGatherAndAllReduceFromC) {
  StartScheduler(3);
  RunWorkers([&](gs_comm* comm, int rank) {
    std::vector<float> params(4099, -1.0f);
    if (rank == 0) {
      for (size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i);
    }
    ASSERT_EQ(gs_broadcast(comm, params.data(), params.size(), GS_F32, 0, kTimeoutMs), GS_OK)
        << gs_last_error();
    for (size_t i = 0; i < params.size(); ++i) ASSERT_EQ(params[i], static_cast<float>(i));

    std::vector<uint8_t> half = Encode(GS_F16, std::vector<float>(33, rank == 0 ? 7.0f : 0.0f));
    ASSERT_EQ(gs_broadcast(comm, half.data(), 33, GS_F16, 0, kTimeoutMs), GS_OK);
    EXPECT_EQ(Decode(GS_F16, half), std::vector<float>(33, 7.0f));

    const int32_t mine = 100 + rank;
    int32_t all[3] = {0, 0, 0};
    ASSERT_EQ(gs_allgather(comm, &mine, sizeof(mine), all, kTimeoutMs), GS_OK) << gs_last_error();
    EXPECT_EQ(all[0], 100);
    EXPECT_EQ(all[1], 101);
    EXPECT_EQ(all[2], 102);

    std::vector<float> sums(10, static_cast<float>(rank + 1));
    EXPECT_EQ(gs_c_sum_floats(comm, sums.data(), sums.size(), 3), 0) << gs_last_error();
    EXPECT_EQ(sums, std::vector<float>(10, 6.0f));
    EXPECT_EQ(gs_barrier(comm, kTimeoutMs), GS_OK) << gs_last_error();

    // The resume point of an elastic job: the most steps, its lowest rank.
    uint32_t epoch = 7;
    ASSERT_EQ(gs_epoch(comm, &epoch), GS_OK) << gs_last_error();
    EXPECT_EQ(epoch, 0u);
    uint64_t step = 0;
    int root = -1;
    ASSERT_EQ(gs_agree_step(comm, rank == 0 ? 5 : 6, kTimeoutMs, &step, &root), GS_OK)
        << gs_last_error();
    EXPECT_EQ(step, 6u);
    EXPECT_EQ(root, 1);
  });
  ExpectJobEndedCleanly();
  EXPECT_STREQ(gs_code_name(GS_MEMBERSHIP_CHANGED), "membership_changed");
}

TEST_F(CApiTest, ArgumentErrorsReturnTheCodeAndNameTheProblem) {
  EXPECT_EQ(gs_c_check_argument_errors(), 0) << "line of the failed check in c_api_test_c.c";
  StartScheduler(1);
  gs_comm* comm = Create(0);
  ASSERT_NE(comm, nullptr);
  int32_t id = -1;
  float data[4] = {1, 2, 3, 4};

  EXPECT_EQ(gs_synchronize(nullptr, 0), GS_INVALID_ARGUMENT);
  EXPECT_STREQ(gs_last_error(), "gs_synchronize: comm is NULL");
  EXPECT_EQ(gs_register_tensor(comm, "w", 4, 7, &id), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("dtype is 7"));
  EXPECT_EQ(gs_register_tensor(comm, nullptr, 4, GS_F32, &id), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("name is NULL"));
  ASSERT_EQ(gs_register_tensor(comm, "w", 4, GS_F32, &id), GS_OK) << gs_last_error();
  EXPECT_STREQ(gs_last_error(), "");

  EXPECT_EQ(gs_mark_ready(comm, 42, data, nullptr, nullptr, nullptr), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("tensor id 42 is not registered"));
  EXPECT_EQ(gs_mark_ready(comm, id, nullptr, nullptr, nullptr, nullptr), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("data is NULL"));
  gs_handle* handle = nullptr;
  ASSERT_EQ(gs_mark_ready(comm, id, data, nullptr, nullptr, &handle), GS_OK) << gs_last_error();
  EXPECT_EQ(gs_mark_ready(comm, id, data, nullptr, nullptr, nullptr), GS_FAILED_PRECONDITION);
  EXPECT_THAT(gs_last_error(), HasSubstr("'w' was already marked ready"));
  EXPECT_EQ(gs_handle_wait(handle, GS_NO_TIMEOUT), GS_OK) << gs_last_error();
  EXPECT_EQ(gs_handle_free(handle), GS_OK);
  ASSERT_EQ(gs_synchronize(comm, GS_NO_TIMEOUT), GS_OK) << gs_last_error();

  EXPECT_EQ(gs_allreduce(comm, data, 4, GS_F32, 5, 1000), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("op is 5"));
  EXPECT_EQ(gs_broadcast(comm, data, 4, GS_F32, 1, 1000), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("root is 1, not a rank in [0, 1)"));
  EXPECT_EQ(gs_handle_wait(nullptr, 0), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("handle is NULL"));

  ASSERT_EQ(gs_shutdown(comm), GS_OK);
  EXPECT_EQ(gs_synchronize(comm, 1000), GS_CANCELLED);
  EXPECT_THAT(gs_last_error(), HasSubstr("shut down"));
  EXPECT_EQ(gs_destroy(comm), GS_OK);
}

TEST_F(CApiTest, UnknownSettingIsRefusedByName) {
  StartScheduler(1);
  std::string scheduler = "--scheduler=" + address_;
  const char* args[] = {scheduler.c_str(), "--num_workers=1", "--bukcet_bytes=1024"};
  gs_comm* comm = nullptr;
  EXPECT_EQ(gs_create(args, 3, kTimeoutMs, &comm), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("unknown setting --bukcet_bytes"));
  EXPECT_EQ(comm, nullptr);
}

TEST_F(CApiTest, UnreachableSchedulerFailsWithinTheTimeoutNamingTheAddress) {
  const char* args[] = {"--scheduler=127.0.0.1:1", "--num_workers=2"};
  gs_comm* comm = nullptr;
  const auto start = steady_clock::now();
  const int code = gs_create(args, 2, 1500, &comm);
  const auto took = std::chrono::duration_cast<Millis>(steady_clock::now() - start);
  EXPECT_TRUE(code == GS_UNAVAILABLE || code == GS_DEADLINE_EXCEEDED) << gs_code_name(code);
  EXPECT_THAT(gs_last_error(), HasSubstr("127.0.0.1:1"));
  EXPECT_EQ(comm, nullptr);
  EXPECT_LT(took.count(), 3000);
}

// A direct collective racing gs_shutdown on another thread ends (Cancelled,
// or the peer's failure), never waits forever: a job queued for the engine
// after it stopped used to leave its caller blocked for good. Every rank
// all-reduces in a loop while rank 0 shuts down mid-loop; repeated, since
// the window is narrow.
TEST_F(CApiTest, DirectCollectivesRacingShutdownAlwaysReturn) {
  for (int round = 0; round < 4; ++round) {
    // Each round's scheduler logs afresh (StartScheduler reads its port there).
    std::remove(TmpFile("DirectCollectivesRacingShutdownAlwaysReturn.scheduler.log").c_str());
    StartScheduler(2);
    RunWorkers(
        [&](gs_comm* comm, int rank) {
          std::atomic<int> last{GS_OK};
          std::atomic<bool> returned{false};
          std::thread loop([&] {
            std::vector<float> v(64, 1.0f);
            int code = GS_OK;
            while (code == GS_OK) {
              code = gs_allreduce(comm, v.data(), v.size(), GS_F32, GS_SUM, 5000);
            }
            last = code;
            returned = true;
          });
          if (rank == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(150 + 37 * round));
            EXPECT_EQ(gs_shutdown(comm), GS_OK);
          }
          // The loop must end well within the collective's timeout.
          const auto start = std::chrono::steady_clock::now();
          while (!returned && std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
          ASSERT_TRUE(returned) << "rank " << rank << " round " << round
                                << ": gs_allreduce still blocked 20 s after the shutdown";
          loop.join();
          EXPECT_NE(last.load(), GS_OK);
          if (rank == 0) {
            // Cancelled, or Unavailable for the one in flight as the
            // transport went away.
            EXPECT_TRUE(last.load() == GS_CANCELLED || last.load() == GS_UNAVAILABLE)
                << gs_code_name(last.load());
          }
        },
        {"--op_timeout_ms=5000"});
    scheduler_->Wait(Deadline::AfterMs(10000));
  }
}

}  // namespace
}  // namespace gradsync
