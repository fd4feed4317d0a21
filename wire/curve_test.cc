// The job's security settings and key file, and the endpoint a node binds:
// loopback is judged by the address a host resolves to, and a node binds
// exactly that address.
#include "wire/curve.h"

#include "common/config.h"
#include "gtest/gtest.h"
#include "wire/transport.h"

namespace gradsync::wire {
namespace {

TEST(CurveLoopbackTest, NamesOfLoopbackRunWithoutCurve) {
  const Config config = Config::FromMap({});
  for (const char* host : {"localhost", "127.0.0.1", "127.3.4.5", "::1"}) {
    auto security = SecurityFromConfig(config, host);
    ASSERT_TRUE(security.ok()) << host << ": " << security.status();
    EXPECT_FALSE(security->has_value()) << host;
  }
}

TEST(CurveLoopbackTest, ANameSpelledLikeLoopbackNeedsCurve) {
  const Config config = Config::FromMap({});
  for (const char* host : {"127.0.0.1.invalid", "localhost.invalid", "0.0.0.0"}) {
    auto security = SecurityFromConfig(config, host);
    ASSERT_FALSE(security.ok()) << host << " started without CURVE";
    EXPECT_NE(security.status().message().find("key_file"), std::string::npos)
        << security.status();
  }
}

TEST(ListenEndpointTest, BindsTheResolvedNumericAddress) {
  EXPECT_EQ(*ListenEndpoint("localhost", 5000), "tcp://127.0.0.1:5000");
  EXPECT_EQ(*ListenEndpoint("127.0.0.7", 0), "tcp://127.0.0.7:0");
  auto unknown = ListenEndpoint("127.0.0.1.invalid", 5000);
  ASSERT_FALSE(unknown.ok()) << *unknown;
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace gradsync::wire
