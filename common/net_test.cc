#include "common/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(NetTest, LoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackAddress("127.255.3.4"));
  EXPECT_TRUE(IsLoopbackAddress("::1"));
  EXPECT_TRUE(IsLoopbackAddress("::ffff:127.0.0.2"));
  EXPECT_FALSE(IsLoopbackAddress("128.0.0.1"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackAddress("::"));
  EXPECT_FALSE(IsLoopbackAddress("::ffff:10.0.0.1"));
  EXPECT_FALSE(IsLoopbackAddress("localhost")) << "a name is not an address";
  EXPECT_FALSE(IsLoopbackAddress("127.foo"));
}

TEST(NetTest, ANameThatAlsoResolvesElsewhereIsNotLoopback) {
  EXPECT_TRUE(AllLoopback({"127.0.0.1", "::1"}));
  EXPECT_FALSE(AllLoopback({"127.0.0.1", "192.0.2.7"}));
  EXPECT_FALSE(AllLoopback({"::1", "2001:db8::1"}));
  EXPECT_FALSE(AllLoopback({}));
}

TEST(NetTest, LoopbackIsDecidedFromTheResolvedAddress) {
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.0.0.9"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  // Spelled like loopback, but a name (that does not resolve here).
  EXPECT_FALSE(IsLoopbackHost("127.0.0.1.invalid"));
  EXPECT_FALSE(IsLoopbackHost("localhost.invalid"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost(""));
}

TEST(NetTest, BindAddressIsTheResolvedNumericAddress) {
  EXPECT_EQ(*BindAddress("localhost"), "127.0.0.1");
  EXPECT_EQ(*BindAddress("127.0.0.5"), "127.0.0.5");
  EXPECT_EQ(*BindAddress("::1"), "::1");
  auto none = BindAddress("127.0.0.1.invalid");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("127.0.0.1.invalid"), std::string::npos);
}

TEST(NetTest, ASocketAddressReadsAsItsNumericAddressMappedIPv4AsIPv4) {
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  inet_pton(AF_INET, "10.1.2.3", &v4.sin_addr);
  EXPECT_EQ(NumericAddress(reinterpret_cast<const sockaddr*>(&v4)), "10.1.2.3");
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "::ffff:127.0.0.2", &v6.sin6_addr);
  EXPECT_EQ(NumericAddress(reinterpret_cast<const sockaddr*>(&v6)), "127.0.0.2");
  inet_pton(AF_INET6, "fd00::2", &v6.sin6_addr);
  EXPECT_EQ(NumericAddress(reinterpret_cast<const sockaddr*>(&v6)), "fd00::2");
  sockaddr other{};
  other.sa_family = AF_UNIX;
  EXPECT_EQ(NumericAddress(&other), "");
}

TEST(NetTest, ResolveListsEachAddressOnce) {
  auto addresses = ResolveHost("localhost");
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  ASSERT_FALSE(addresses->empty());
  for (size_t i = 0; i < addresses->size(); ++i) {
    for (size_t j = i + 1; j < addresses->size(); ++j) EXPECT_NE((*addresses)[i], (*addresses)[j]);
  }
}

}  // namespace
}  // namespace gradsync
