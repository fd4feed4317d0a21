#include "common/status.h"

#include <memory>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  GS_ASSIGN_OR_RETURN(int h, Half(x));
  GS_ASSIGN_OR_RETURN(*out, Half(h));
  return OkStatus();
}

TEST(StatusTest, OkAndErrorsCarryCodeAndMessage) {
  EXPECT_TRUE(OkStatus().ok());
  Status s = DeadlineExceededError("scheduler at tcp://h:1 did not answer");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.ToString(), "deadline_exceeded: scheduler at tcp://h:1 did not answer");
  EXPECT_EQ(s.WithPrefix("join").message(), "join: scheduler at tcp://h:1 did not answer");
  EXPECT_TRUE(OkStatus().WithPrefix("x").ok());
}

TEST(StatusTest, AssignOrReturnPropagatesTheFirstError) {
  int out = -1;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
}

TEST(StatusTest, StatusOrHoldsMoveOnlyValues) {
  StatusOr<std::unique_ptr<int>> v(std::make_unique<int>(7));
  ASSERT_TRUE(v.ok());
  std::unique_ptr<int> p = std::move(v).value();
  EXPECT_EQ(*p, 7);
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  StatusOr<int> v = NotFoundError("nothing");
  EXPECT_DEATH((void)v.value(), "not_found: nothing");
}

}  // namespace
}  // namespace gradsync
