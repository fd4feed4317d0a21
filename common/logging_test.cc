#include "common/logging.h"

#include <string>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

std::string Logged(LogSeverity min) {
  SetMinLogSeverity(min);
  testing::internal::CaptureStderr();
  GS_LOG(INFO) << "joined as worker 3";
  GS_LOG(WARNING) << "a peer is slow";
  GS_LOG(ERROR) << "a peer died";
  std::string out = testing::internal::GetCapturedStderr();
  SetMinLogSeverity(LogSeverity::kInfo);
  return out;
}

TEST(LoggingTest, EveryLineByDefault) {
  const std::string out = Logged(LogSeverity::kInfo);
  EXPECT_NE(out.find("I "), std::string::npos) << out;
  EXPECT_NE(out.find("] joined as worker 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("] a peer is slow\n"), std::string::npos) << out;
  EXPECT_NE(out.find("a peer died\n"), std::string::npos) << out;
}

TEST(LoggingTest, LinesBelowTheMinimumAreDropped) {
  const std::string out = Logged(LogSeverity::kWarning);
  EXPECT_EQ(out.find("joined as worker 3"), std::string::npos) << out;
  EXPECT_NE(out.find("W "), std::string::npos) << out;
  EXPECT_NE(out.find("] a peer is slow\n"), std::string::npos) << out;
  EXPECT_NE(out.find("a peer died\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace gradsync
