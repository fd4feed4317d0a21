#include "scheduler/process_watch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "wire/shm_link.h"

namespace gradsync::server {
namespace {

// A child that sleeps until killed.
pid_t SleepingChild() {
  const pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

// Exited() until it names something, for at most 10 s.
std::vector<std::string> WaitForExit(ProcessWatch& watch) {
  for (int i = 0; i < 1000; ++i) {
    std::vector<std::string> exited = watch.Exited();
    if (!exited.empty()) return exited;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {};
}

TEST(ProcessWatchTest, AKilledProcessOfThisMachineIsSeenToExit) {
  ProcessWatch watch;
  const pid_t child = SleepingChild();
  ASSERT_GT(child, 0);
  if (!watch.Watch("worker-a", static_cast<uint32_t>(child), wire::BootId(),
                   wire::PidNamespace())) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    GTEST_SKIP() << "this kernel has no pidfd_open";
  }
  EXPECT_TRUE(watch.Exited().empty());  // alive
  kill(child, SIGKILL);
  EXPECT_EQ(WaitForExit(watch), std::vector<std::string>{"worker-a"});
  EXPECT_EQ(watch.size(), 0u);  // no longer watched
  EXPECT_TRUE(watch.Exited().empty());
  waitpid(child, nullptr, 0);
}

TEST(ProcessWatchTest, OnlyTheNodesOwnProcessCounts) {
  ProcessWatch watch;
  const pid_t a = SleepingChild(), b = SleepingChild();
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  const bool watched =
      watch.Watch("a", static_cast<uint32_t>(a), wire::BootId(), wire::PidNamespace()) &&
      watch.Watch("b", static_cast<uint32_t>(b), wire::BootId(), wire::PidNamespace());
  kill(b, SIGKILL);
  if (watched) {
    EXPECT_EQ(WaitForExit(watch), std::vector<std::string>{"b"});
  }
  EXPECT_TRUE(watch.Exited().empty());
  kill(a, SIGKILL);
  waitpid(a, nullptr, 0);
  waitpid(b, nullptr, 0);
  if (!watched) GTEST_SKIP() << "this kernel has no pidfd_open";
}

TEST(ProcessWatchTest, AnotherMachineOrNamespaceIsNotWatched) {
  ProcessWatch watch;
  const auto self = static_cast<uint32_t>(getpid());
  EXPECT_FALSE(watch.Watch("x", self, "another-boot-id", wire::PidNamespace()));
  EXPECT_FALSE(watch.Watch("x", self, wire::BootId(), "pid:[1]"));
  EXPECT_FALSE(watch.Watch("x", self, "", ""));
  EXPECT_FALSE(watch.Watch("x", 0, wire::BootId(), wire::PidNamespace()));
  EXPECT_EQ(watch.size(), 0u);
}

}  // namespace
}  // namespace gradsync::server
