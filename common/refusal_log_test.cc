#include "common/refusal_log.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

class StepClock : public Clock {
 public:
  SteadyTime Now() const override { return now; }
  SteadyTime now{};
};

TEST(RefusalLogTest, FirstFewThenOneLinePerIntervalCountingTheRest) {
  StepClock clock;
  RefusalLog log(&clock, 3, Millis(10000));
  uint64_t left_out = 99;
  int lines = 0;
  for (int i = 0; i < 1000; ++i) lines += log.Admit("peer-a", "malformed", &left_out);
  EXPECT_EQ(lines, 3);
  EXPECT_EQ(left_out, 0u);
  clock.now += Millis(9999);
  EXPECT_FALSE(log.Admit("peer-a", "malformed", &left_out));
  clock.now += Millis(1);
  ASSERT_TRUE(log.Admit("peer-a", "malformed", &left_out));
  EXPECT_EQ(left_out, 998u);
  EXPECT_FALSE(log.Admit("peer-a", "malformed", &left_out));
  // Another reason, or another peer, has its own budget.
  EXPECT_TRUE(log.Admit("peer-a", "wrong_job", &left_out));
  EXPECT_TRUE(log.Admit("peer-b", "malformed", &left_out));
}

TEST(RefusalLogTest, ManyPeersShareOneEntryPastTheLimit) {
  StepClock clock;
  RefusalLog log(&clock, 1, Millis(10000), 4);
  uint64_t left_out = 0;
  int lines = 0;
  for (int i = 0; i < 10000; ++i) lines += log.Admit("peer-" + std::to_string(i), "x", &left_out);
  EXPECT_EQ(lines, 5);  // four peers of their own, then one line for the rest
}

}  // namespace
// A failed send goes through the log's limit (per peer and status code); a
// cancelled one (shutdown) is not a failure to report.
TEST(RefusalLogTest, SendFailuresShareTheLimitAndCancellationsAreNotLogged) {
  StepClock clock;
  auto log = std::make_shared<RefusalLog>(&clock, 1, Millis(10000));
  auto failed = LogSendFailure(log, "peer-a", "reply");
  failed(CancelledError("transport is shut down"));
  failed(UnavailableError("peer-a is not connected"));
  uint64_t left_out = 0;
  EXPECT_FALSE(log->Admit("peer-a", StatusCodeName(StatusCode::kUnavailable), &left_out))
      << "the failure used the one line allowed";
  EXPECT_TRUE(log->Admit("peer-a", StatusCodeName(StatusCode::kCancelled), &left_out))
      << "the cancellation was not counted";
  failed(Status());  // success: nothing
  EXPECT_TRUE(log->Admit("peer-b", StatusCodeName(StatusCode::kUnavailable), &left_out));
}

}  // namespace gradsync
