#include "common/task_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>

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

}  // namespace
}  // namespace gradsync
