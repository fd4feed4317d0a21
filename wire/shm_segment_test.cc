#include "wire/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "wire/shm_common.h"

namespace gradsync::wire {
namespace {

std::string Name(const char* what) {
  return "/gradsync-segtest-" + std::to_string(getpid()) + "-" + what;
}

TEST(ShmSegmentTest, AReaderSeesTheOwnersBytesReadOnly) {
  auto owner = ShmSegment::Create(Name("a"), 10000);
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  std::memcpy((*owner)->mutable_data() + 9000, "hello", 5);
  auto reader = ShmSegment::Open(Name("a"), 10000);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(std::memcmp((*reader)->data() + 9000, "hello", 5), 0);
  EXPECT_EQ((*reader)->mutable_data(), nullptr);
  EXPECT_EQ((*reader)->size(), 10000u);
  std::memcpy((*owner)->mutable_data(), "later", 5);
  EXPECT_EQ(std::memcmp((*reader)->data(), "later", 5), 0);
}

TEST(ShmSegmentTest, TheReaderTellsAnOwnerThatIsGone) {
  auto owner = ShmSegment::Create(Name("b"), 4096);
  ASSERT_TRUE(owner.ok());
  auto reader = ShmSegment::Open(Name("b"), 4096);
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE((*reader)->OwnerAlive());
  owner->reset();
  EXPECT_FALSE((*reader)->OwnerAlive());
}

TEST(ShmSegmentTest, UnlinkLeavesTheMappingsAndNoName) {
  auto owner = ShmSegment::Create(Name("c"), 4096);
  ASSERT_TRUE(owner.ok());
  auto reader = ShmSegment::Open(Name("c"), 4096);
  ASSERT_TRUE(reader.ok());
  (*owner)->Unlink();
  EXPECT_EQ(ShmSegment::Open(Name("c"), 4096).status().code(), StatusCode::kNotFound);
  (*owner)->mutable_data()[7] = 42;
  EXPECT_EQ((*reader)->data()[7], 42);
}

TEST(ShmSegmentTest, OpenRefusesWhatItDidNotAskFor) {
  EXPECT_EQ(ShmSegment::Open(Name("none"), 4096).status().code(), StatusCode::kNotFound);
  auto owner = ShmSegment::Create(Name("d"), 8192);
  ASSERT_TRUE(owner.ok());
  Status other_size = ShmSegment::Open(Name("d"), 4096).status();
  EXPECT_EQ(other_size.code(), StatusCode::kFailedPrecondition) << other_size.ToString();
  // An object under the name that its maker could not have made: mode 0644.
  const std::string loose = Name("e");
  int fd = shm_open(loose.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0644), 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  close(fd);
  Status refused = ShmSegment::Open(loose, 4096).status();
  shm_unlink(loose.c_str());
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("not this user's own segment"), std::string::npos)
      << refused.message();
}

TEST(ShmSegmentTest, AStaleObjectOfTheSameNameIsReplaced) {
  auto first = ShmSegment::Create(Name("f"), 4096);
  ASSERT_TRUE(first.ok());
  std::memcpy((*first)->mutable_data(), "old", 3);
  auto second = ShmSegment::Create(Name("f"), 4096);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  auto reader = ShmSegment::Open(Name("f"), 4096);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->data()[0], 0);
}

TEST(ShmSegmentTest, WhatADeadMakerLeftIsRemovedAndNothingElse) {
  const std::string prefix = "gradsync-segtest-" + std::to_string(getpid()) + "-stale";
  // A maker that dies with its object still named (no Unlink).
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto dead = ShmSegment::Create("/" + prefix + "-dead", 4096);
    _exit(dead.ok() ? 0 : 1);  // exits without the destructor: the name stays
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto live = ShmSegment::Create("/" + prefix + "-live", 4096);
  ASSERT_TRUE(live.ok());
  const std::string other = "/gradsync-segtest-" + std::to_string(getpid()) + "-other";
  auto kept = ShmSegment::Create(other, 4096);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(shm::RemoveStale(prefix, std::chrono::seconds(0)), 1);
  EXPECT_EQ(ShmSegment::Open("/" + prefix + "-dead", 4096).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(ShmSegment::Open("/" + prefix + "-live", 4096).ok());
  EXPECT_TRUE(ShmSegment::Open(other, 4096).ok());
  // Not yet old enough: nothing goes.
  EXPECT_EQ(shm::RemoveStale(prefix, std::chrono::seconds(3600)), 0);
}

}  // namespace
}  // namespace gradsync::wire
