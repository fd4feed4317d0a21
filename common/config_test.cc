#include "common/config.h"

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(ConfigTest, FlagsWinOverEnvironment) {
  const char* argv[] = {"prog", "--num_workers=4", "--role=worker", "--verbose", "pos"};
  const char* env[] = {"GRADSYNC_NUM_WORKERS=8", "GRADSYNC_SCHEDULER=h:1", "PATH=/bin", nullptr};
  auto config = Config::FromArgs(5, argv, env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config->GetInt("num_workers", 1), 4);
  EXPECT_EQ(*config->GetString("role", ""), "worker");
  EXPECT_EQ(*config->GetString("scheduler", ""), "h:1");
  EXPECT_TRUE(*config->GetBool("verbose", false));
  EXPECT_EQ(*config->GetInt("num_servers", 3), 3);
  ASSERT_EQ(config->positional().size(), 1u);
  EXPECT_EQ(config->positional()[0], "pos");
  EXPECT_TRUE(config->UnknownFlags().empty());
}

TEST(ConfigTest, BadValuesNameTheirSource) {
  const char* argv[] = {"prog", "--num_workers=four"};
  const char* env[] = {"GRADSYNC_RANK=x1", nullptr};
  auto config = Config::FromArgs(2, argv, env);
  ASSERT_TRUE(config.ok());
  auto workers = config->GetInt("num_workers", 1);
  ASSERT_FALSE(workers.ok());
  EXPECT_EQ(workers.status().message(), "--num_workers='four' is not an integer");
  auto rank = config->GetInt("rank", -1);
  ASSERT_FALSE(rank.ok());
  EXPECT_EQ(rank.status().message(), "GRADSYNC_RANK='x1' is not an integer");
  EXPECT_FALSE(config->GetBool("num_workers", false).ok());
  EXPECT_FALSE(config->GetDouble("num_workers", 0).ok());
}

TEST(ConfigTest, UnaskedFlagsAreReported) {
  const char* argv[] = {"prog", "--num_worker=4", "--role=server"};
  auto config = Config::FromArgs(3, argv, nullptr);
  ASSERT_TRUE(config.ok());
  (void)config->GetString("role", "");
  EXPECT_EQ(config->UnknownFlags(), std::vector<std::string>{"--num_worker"});
}

TEST(ConfigTest, CheckKnownFlagsNamesEveryUnknownOne) {
  Config config = Config::FromMap({{"num_worker", "2"}, {"rank", "1"}, {"roel", "x"}});
  EXPECT_FALSE(config.CheckKnownFlags().ok());
  (void)config.GetInt("rank", -1);
  Status s = config.CheckKnownFlags();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "unknown flag --num_worker, --roel");
  EXPECT_EQ(config.CheckKnownFlags("setting").message(), "unknown setting --num_worker, --roel");
  (void)config.GetInt("num_worker", 0);
  (void)config.GetString("roel", "");
  EXPECT_TRUE(config.CheckKnownFlags().ok());
}

TEST(ConfigTest, EnvNameIsUpperCasedWithPrefix) {
  EXPECT_EQ(Config::EnvName("num_workers"), "GRADSYNC_NUM_WORKERS");
  EXPECT_EQ(Config::EnvName("metrics-port"), "GRADSYNC_METRICS_PORT");
}

}  // namespace
}  // namespace gradsync
