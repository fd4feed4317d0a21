#include "compression/registry.h"

#include <memory>
#include <string>
#include <vector>

#include "compression/none_compressor.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace compression {
namespace {

CompressorRegistry::Factory NoneFactory() {
  return [] { return std::make_unique<NoneCompressor>(); };
}

TEST(CompressorRegistryTest, BuiltinsIncludeNone) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  EXPECT_EQ(registry.Names(), std::vector<std::string>{"none"});
  StatusOr<std::unique_ptr<Compressor>> c = registry.Create("none");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->name(), "none");
  EXPECT_TRUE((*c)->summable());
}

TEST(CompressorRegistryTest, CreateReturnsAFreshInstanceEachTime) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  StatusOr<std::unique_ptr<Compressor>> a = registry.Create("none");
  StatusOr<std::unique_ptr<Compressor>> b = registry.Create("none");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->get(), b->get());
}

TEST(CompressorRegistryTest, DuplicateNameIsRejected) {
  CompressorRegistry registry;
  ASSERT_TRUE(registry.Register("x", NoneFactory()).ok());
  Status s = registry.Register("x", NoneFactory());
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("\"x\""), std::string::npos) << s;
  EXPECT_EQ(registry.Names(), std::vector<std::string>{"x"});
}

TEST(CompressorRegistryTest, RegisterBuiltinsTwiceIsHarmless) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  RegisterBuiltins(&registry);
  EXPECT_EQ(registry.Names(), std::vector<std::string>{"none"});
}

TEST(CompressorRegistryTest, EmptyNameAndNullFactoryAreRejected) {
  CompressorRegistry registry;
  EXPECT_EQ(registry.Register("", NoneFactory()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register("y", nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.Names().empty());
}

TEST(CompressorRegistryTest, UnknownNameErrorListsKnownNames) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  ASSERT_TRUE(registry.Register("fake", NoneFactory()).ok());
  StatusOr<std::unique_ptr<Compressor>> c = registry.Create("topk");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.status().message(),
            "unknown compressor \"topk\"; known: [fake, none]");
}

TEST(CompressorRegistryTest, NullFromFactoryIsAnInternalError) {
  CompressorRegistry registry;
  ASSERT_TRUE(
      registry.Register("broken", [] { return std::unique_ptr<Compressor>(); })
          .ok());
  EXPECT_EQ(registry.Create("broken").status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace compression
}  // namespace gradsync
