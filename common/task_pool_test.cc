#include "common/task_pool.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

// Every task handed runs once, those still queued when the pool goes too,
// on as many threads as the pool has.
TEST(TaskPoolTest, RunsEveryTaskOnItsThreadsAndDrainsAtTheEnd) {
  std::atomic<int> ran{0};
  std::mutex mu;
  std::set<std::thread::id> ids;
  {
    TaskPool pool(3, "test-pool");
    EXPECT_EQ(pool.threads(), 3);
    // Three tasks that each wait until all three run: only three threads
    // side by side let them finish.
    std::condition_variable cv;
    int arrived = 0;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(pool.Run([&] {
        std::unique_lock<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
        ++arrived;
        cv.notify_all();
        cv.wait(lock, [&] { return arrived == 3; });
        ++ran;
      }));
    }
    for (int i = 0; i < 1000; ++i) ASSERT_TRUE(pool.Run([&] { ++ran; }));
  }
  EXPECT_EQ(ran.load(), 1003);
  EXPECT_EQ(ids.size(), 3u);
}

TEST(TaskPoolTest, APoolNeverUsedStartsNoThreadAndAtLeastOneIsKept) {
  TaskPool unused(4, "unused");
  TaskPool one(0, "one");
  EXPECT_EQ(one.threads(), 1);
  std::atomic<bool> ran{false};
  ASSERT_TRUE(one.Run([&] { ran = true; }));
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       !ran.load() && std::chrono::steady_clock::now() < until;) {
    std::this_thread::yield();
  }
  EXPECT_TRUE(ran.load());
}

// A thread bound to one core (as a cpuset binds a task) sees one; the
// process sees at least that.
TEST(UsableCoresTest, FollowsTheThreadsAffinity) {
  EXPECT_GE(UsableCores(), 1);
  int seen = 0;
  std::thread bound([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    cpu_set_t all;
    CPU_ZERO(&all);
    ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &all)) {
        CPU_SET(c, &one);
        break;
      }
    }
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    seen = UsableCores();
  });
  bound.join();
  EXPECT_EQ(seen, 1);
}

}  // namespace
}  // namespace gradsync
