#include "compression/registry.h"

#include <memory>
#include <string>
#include <vector>

#include "compression/error_feedback.h"
#include "compression/none_compressor.h"
#include "gtest/gtest.h"

namespace gradsync::compression {
namespace {

CompressorRegistry::Factory NoneFactory() {
  return [] { return std::make_unique<NoneCompressor>(); };
}

const std::vector<std::string> kBuiltins = {
    "bf16", "fp16", "none",      "qsgd",         "randomk",
    "sign", "topk", "topk_fp16", "topk_sampled", "topk_sampled_fp16"};

TEST(CompressorRegistryTest, BuiltinsAreRegisteredUnderTheirNames) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  EXPECT_EQ(registry.Names(), kBuiltins);
  for (const std::string& name : kBuiltins) {
    StatusOr<std::unique_ptr<Compressor>> c = registry.Create(name);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->name(), name);
    const bool summable = name == "none" || name == "fp16" || name == "bf16" || name == "randomk";
    EXPECT_EQ((*c)->summable(), summable) << name;
  }
}

// Defaults: ratio 0.01, chunk 512, levels 127 (seen through WireBytes).
TEST(CompressorRegistryTest, DefaultsAndOptionsReachTheCompressors) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  struct Case {
    std::string spec;
    size_t n, bytes;
  };
  const Case cases[] = {
      {"topk", 1000, 10 * 8},
      {"topk:ratio=0.1", 1000, 100 * 8},
      {"topk_sampled_fp16:ratio=0.5", 10, 5 * 6},
      {"randomk", 1000, 10 * 4},
      {"randomk:ratio=0.25", 1000, 250 * 4},
      {"sign", 1024, 2 * 4 + 128},
      {"sign:chunk=8", 1024, 128 * 4 + 128},
      {"qsgd", 1024, 2 * 4 + 1024},
      {"qsgd:chunk=256,levels=15", 1024, 4 * 4 + 1024},
      {"fp16:ef=1", 10, 20},
      {"topk:ratio=0.01,warmup=100", 1000, 10 * 8},  // before any step: the ratio
  };
  for (const Case& c : cases) {
    StatusOr<std::unique_ptr<Compressor>> made = registry.Create(c.spec);
    ASSERT_TRUE(made.ok()) << c.spec << ": " << made.status();
    EXPECT_EQ((*made)->WireBytes(c.n), c.bytes) << c.spec;
  }
  // The warm-up reaches top-k through the error feedback too.
  auto warm = registry.Create("topk_sampled:ratio=0.01,ef=1,momentum=0.9,warmup=10");
  ASSERT_TRUE(warm.ok()) << warm.status();
  (*warm)->BeginStep(0);
  EXPECT_EQ((*warm)->WireBytes(1000), 250u * 8);
  (*warm)->BeginStep(10);
  EXPECT_EQ((*warm)->WireBytes(1000), 10u * 8);
  for (const char* bad : {"fp16:warmup=5", "randomk:warmup=5", "topk:warmup=-1", "topk:warmup=x"}) {
    EXPECT_FALSE(registry.Create(bad).ok()) << bad;
  }
}

TEST(CompressorRegistryTest, EfWrapsInErrorFeedback) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  StatusOr<std::unique_ptr<Compressor>> c = registry.Create("sign:ef=1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(dynamic_cast<ErrorFeedback*>(c->get()), nullptr);
  EXPECT_EQ((*c)->name(), "sign");
  StatusOr<std::unique_ptr<Compressor>> plain = registry.Create("sign:ef=0");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(dynamic_cast<ErrorFeedback*>(plain->get()), nullptr);
}

TEST(CompressorRegistryTest, MomentumGoesToTheErrorFeedback) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  for (const std::string spec : {"topk:ratio=0.01,ef=1,momentum=0.9", "randomk:momentum=0.5,ef=1",
                                 "topk_sampled_fp16:ef=1,momentum=0"}) {
    StatusOr<std::unique_ptr<Compressor>> c = registry.Create(spec);
    ASSERT_TRUE(c.ok()) << spec << ": " << c.status();
    auto* ef = dynamic_cast<ErrorFeedback*>(c->get());
    ASSERT_NE(ef, nullptr) << spec;
    EXPECT_EQ(ef->momentum(), static_cast<float>(ParseCompressorSpec(spec)->options.momentum));
  }
}

TEST(CompressorRegistryTest, BadSpecsAreInvalidArgumentsNamingTheProblem) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  const std::pair<std::string, std::string> cases[] = {
      {"fp16:ratio=0.1", "takes no option \"ratio\""},
      {"sign:levels=3", "takes no option \"levels\""},
      {"qsgd:rank=2", "takes no option \"rank\""},
      {"topk:rank=x", "bad value \"x\""},
      {"topk:ratio=2", "ratio must be in (0, 1]"},
      {"topk:ratio=0", "ratio must be in (0, 1]"},
      {"topk:ratio=abc", "bad value \"abc\""},
      {"topk:ratio=", "bad value"},
      {"qsgd:levels=128", "levels must be in [1, 127]"},
      {"qsgd:chunk=12", "multiple of 8"},
      {"sign:chunk=-8", "bad value"},
      {"topk:speed=1", "unknown option \"speed\""},
      {"topk:ratio", "not key=value"},
      {"topk:ratio=0.1,ratio=0.2", "given twice"},
      {"topk:ef=2", "bad value"},
      {"topk:momentum=0.9", "needs ef=1"},
      {"topk:ef=1,momentum=1", "momentum must be in [0, 1)"},
      {"randomk:ef=1,momentum=-0.1", "momentum must be in [0, 1)"},
      {"topk:ef=1,momentum=nan", "momentum must be in [0, 1)"},
      {"qsgd:ef=1,momentum=0.9", "takes no option \"momentum\""},
      {"fp16:ef=1,momentum=0.9", "takes no option \"momentum\""},
      {":ratio=0.1", "no compressor name"},
  };
  for (const auto& [spec, why] : cases) {
    StatusOr<std::unique_ptr<Compressor>> c = registry.Create(spec);
    ASSERT_FALSE(c.ok()) << spec;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(c.status().message().find(why), std::string::npos) << spec << ": " << c.status();
  }
}

TEST(CompressorRegistryTest, ParseCompressorSpecReportsKeysInOrder) {
  StatusOr<CompressorSpec> s = ParseCompressorSpec("qsgd:levels=7,ef=1,chunk=64");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "qsgd");
  EXPECT_EQ(s->options.levels, 7);
  EXPECT_EQ(s->options.chunk, 64u);
  EXPECT_TRUE(s->options.error_feedback);
  EXPECT_EQ(s->options.ratio, 0.01);
  EXPECT_EQ(s->keys, (std::vector<std::string>{"levels", "ef", "chunk"}));
  EXPECT_EQ(s->values, (std::vector<std::string>{"7", "1", "64"}));
}

TEST(CompressorRegistryTest, NamesWithSpecCharactersAreRejected) {
  CompressorRegistry registry;
  EXPECT_EQ(registry.Register("a:b", NoneFactory()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register("a=b", NoneFactory()).code(), StatusCode::kInvalidArgument);
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
  EXPECT_EQ(registry.Names(), kBuiltins);
}

TEST(CompressorRegistryTest, EmptyNameAndNullFactoryAreRejected) {
  CompressorRegistry registry;
  EXPECT_EQ(registry.Register("", NoneFactory()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register("y", nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.Names().empty());
}

TEST(CompressorRegistryTest, UnknownNameErrorListsKnownNames) {
  CompressorRegistry registry;
  ASSERT_TRUE(registry.Register("none", NoneFactory()).ok());
  ASSERT_TRUE(registry.Register("fake", NoneFactory()).ok());
  StatusOr<std::unique_ptr<Compressor>> c = registry.Create("topk:ratio=0.1");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.status().message(), "unknown compressor \"topk\"; known: [fake, none]");
}

TEST(CompressorRegistryTest, PowerSgdIsNamedButNotCreatedHere) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  StatusOr<std::unique_ptr<Compressor>> c = registry.Create("powersgd:rank=2");
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("all-reduce path"), std::string::npos);
  StatusOr<CompressorSpec> spec = ParseCompressorSpec("powersgd:rank=8,ef=1");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->options.rank, 8);
  EXPECT_EQ(ParseCompressorSpec("powersgd").value().options.rank, 4);
}

TEST(CompressorRegistryTest, NullFromFactoryIsAnInternalError) {
  CompressorRegistry registry;
  ASSERT_TRUE(registry.Register("broken", [] { return std::unique_ptr<Compressor>(); }).ok());
  EXPECT_EQ(registry.Create("broken").status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace gradsync::compression
