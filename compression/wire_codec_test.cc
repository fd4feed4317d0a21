#include "compression/wire_codec.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "compression/test_util.h"
#include "compression/topk_compressor.h"
#include "compression/topk_select.h"
#include "compression/wire_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/validate.h"

namespace gradsync::compression {
namespace {

using ::testing::HasSubstr;
using wire::ErrorCode;

const wire::Sender kWorker{wire::Role::Worker, 2, 77};

// A Push with `fields` and `payloads`, as a receiver sees it after Validate.
struct Received {
  wire::Message msg;
  const wire::DataBody* body = nullptr;
};

Received Receive(wire::DataFields f, std::vector<wire::Payload> payloads) {
  Received r;
  r.msg = wire::MakeData(kWorker, wire::MsgType::Push, f, std::move(payloads), 5, 1);
  wire::Verdict v = wire::Validate(r.msg, wire::Policy::Accepting({wire::MsgType::Push}));
  EXPECT_TRUE(v.ok()) << v.detail;
  if (v.ok()) r.body = v.header->body_as_DataBody();
  return r;
}

const char* const kSpecs[] = {"fp16",
                              "bf16",
                              "topk:ratio=0.1",
                              "topk_fp16:ratio=0.2",
                              "topk_sampled:ratio=0.05",
                              "topk_sampled_fp16:ratio=0.05,ef=1",
                              "randomk:ratio=0.25",
                              "randomk:ratio=0.25,ef=1",
                              "sign:chunk=64",
                              "sign:ef=1",
                              "qsgd:chunk=128,levels=15",
                              "qsgd:ef=1"};

TEST(WireCodecTest, DecodeGivesWhatTheSendersCompressorDecompresses) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  PayloadDecoder decoder;
  for (const char* spec : kSpecs) {
    for (size_t n : {size_t{1}, size_t{513}, size_t{4097}}) {
      SCOPED_TRACE(std::string(spec) + " n=" + std::to_string(n));
      auto encoder = PayloadEncoder::Create(registry, spec);
      ASSERT_TRUE(encoder.ok()) << encoder.status().ToString();
      auto reference = registry.Create(spec);
      ASSERT_TRUE(reference.ok());
      const std::vector<float> g = testing_util::Gaussian(n, 1.0f, static_cast<uint32_t>(n));
      for (uint32_t partition : {0u, 3u}) {
        const CompressContext ctx = PartitionContext(99, 7, 4, partition);
        wire::DataFields f;
        f.num_elements = n;
        auto payload = (*encoder)->Encode(g.data(), n, ctx, &f);
        ASSERT_TRUE(payload.ok()) << payload.status().ToString();
        EXPECT_EQ(f.codec, spec);
        EXPECT_EQ(payload->size, (*encoder)->WireBytes(n));
        // The sender's own compressor, on the same input and context.
        std::vector<uint8_t> bytes((*reference)->WireBytes(n));
        ASSERT_TRUE((*reference)->Compress(g.data(), n, ctx, bytes.data(), bytes.size()).ok());
        ASSERT_EQ(std::memcmp(bytes.data(), payload->data, bytes.size()), 0);
        std::vector<float> want(n), got(n, -1.0f);
        ASSERT_TRUE((*reference)->Decompress(bytes.data(), bytes.size(), n, ctx, want.data()).ok());
        Received r = Receive(f, {*payload});
        ASSERT_NE(r.body, nullptr);
        ErrorCode code = ErrorCode::Unknown;
        Status s = decoder.Decode(*r.body, r.msg.payloads, ctx, got.data(), &code);
        ASSERT_TRUE(s.ok()) << s.ToString();
        EXPECT_EQ(std::memcmp(want.data(), got.data(), n * sizeof(float)), 0);
      }
    }
  }
}

TEST(WireCodecTest, PartitionsGetTheirOwnRandomCoordinates) {
  EXPECT_EQ(PartitionContext(1, 2, 3, 4).seed, PartitionContext(1, 2, 3, 4).seed);
  EXPECT_NE(PartitionContext(1, 2, 3, 4).seed, PartitionContext(1, 2, 3, 5).seed);
  EXPECT_NE(PartitionContext(1, 2, 3, 4).seed, PartitionContext(2, 2, 3, 4).seed);
  EXPECT_EQ(PartitionContext(1, 2, 3, 4).step, 2u);
  EXPECT_EQ(PartitionContext(1, 2, 3, 4).bucket_id, 3u);
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  auto c = registry.Create("randomk:ratio=0.1");
  ASSERT_TRUE(c.ok());
  const size_t n = 1000;
  const std::vector<float> ones(n, 1.0f);
  std::vector<std::vector<float>> kept;
  for (uint32_t p : {0u, 1u}) {
    std::vector<uint8_t> bytes((*c)->WireBytes(n));
    const CompressContext ctx = PartitionContext(5, 1, 0, p);
    ASSERT_TRUE((*c)->Compress(ones.data(), n, ctx, bytes.data(), bytes.size()).ok());
    kept.emplace_back(n);
    ASSERT_TRUE((*c)->Decompress(bytes.data(), bytes.size(), n, ctx, kept.back().data()).ok());
  }
  EXPECT_NE(kept[0], kept[1]);
}

TEST(WireCodecTest, UncompressedPayloadsAreCopiedAcrossFrames) {
  const std::vector<float> g = {1.5f, -2.0f, 3.25f, 8.0f, -0.5f};
  wire::DataFields f;
  f.num_elements = g.size();
  Received r = Receive(f, {wire::Payload::Copy(g.data(), 8), wire::Payload::Copy(&g[2], 12)});
  PayloadDecoder decoder;
  std::vector<float> got(g.size());
  ErrorCode code = ErrorCode::Unknown;
  ASSERT_TRUE(decoder.Decode(*r.body, r.msg.payloads, {}, got.data(), &code).ok());
  EXPECT_EQ(got, g);
}

TEST(WireCodecTest, CompressedPayloadsSplitAcrossFramesDecode) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  auto encoder = PayloadEncoder::Create(registry, "qsgd:chunk=64");
  ASSERT_TRUE(encoder.ok());
  const size_t n = 300;
  const std::vector<float> g = testing_util::Gaussian(n, 2.0f, 3);
  wire::DataFields f;
  f.num_elements = n;
  auto payload = (*encoder)->Encode(g.data(), n, {}, &f);
  ASSERT_TRUE(payload.ok());
  PayloadDecoder decoder;
  std::vector<float> whole(n), split(n);
  ErrorCode code;
  Received one = Receive(f, {*payload});
  ASSERT_TRUE(decoder.Decode(*one.body, one.msg.payloads, {}, whole.data(), &code).ok());
  Received two = Receive(f, {wire::Payload::Copy(payload->data, 11),
                             wire::Payload::Copy(payload->data + 11, payload->size - 11)});
  ASSERT_TRUE(decoder.Decode(*two.body, two.msg.payloads, {}, split.data(), &code).ok());
  EXPECT_EQ(whole, split);
}

// Decode failures: what the code and the message say.
void ExpectRefused(wire::DataFields f, std::vector<wire::Payload> payloads, ErrorCode want,
                   const std::string& says) {
  Received r = Receive(f, std::move(payloads));
  ASSERT_NE(r.body, nullptr);
  PayloadDecoder decoder;
  std::vector<float> out(f.num_elements);
  ErrorCode code = ErrorCode::Unknown;
  Status s = decoder.Decode(*r.body, r.msg.payloads, {}, out.data(), &code);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(code, want) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(says));
}

TEST(WireCodecTest, BadPayloadsAreRefusedNamingWhatIsWrong) {
  std::vector<uint8_t> bytes(400, 0);
  auto frame = [&](size_t size) { return wire::Payload::Copy(bytes.data(), size); };
  wire::DataFields f;
  f.num_elements = 100;
  f.dtype = wire::DType::F16;
  ExpectRefused(f, {frame(200)}, ErrorCode::WrongType, "F16");
  f.dtype = wire::DType::F32;
  f.codec = "zip";
  ExpectRefused(f, {frame(200)}, ErrorCode::WrongType, "compressor \"zip\" has no wire encoding");
  f.codec = "fp16:ratio=0.5";
  ExpectRefused(f, {frame(200)}, ErrorCode::WrongType, "takes no option");
  f.codec = "fp16";
  ExpectRefused(f, {frame(198)}, ErrorCode::SizeMismatch,
                "holds 198 bytes, \"fp16\" writes 200 for 100 elements");
  f.codec = "topk:ratio=0.5";
  ExpectRefused(f, {frame(399)}, ErrorCode::SizeMismatch, "writes 400");
  // 50 int32 indices then 50 values: index 4096 is out of range.
  const int32_t far = 4096;
  std::memcpy(bytes.data() + 8, &far, sizeof(far));
  ExpectRefused(f, {frame(400)}, ErrorCode::Malformed, "does not decode as \"topk:ratio=0.5\"");
  f.codec = "topk:ratio=7";
  ExpectRefused(f, {frame(400)}, ErrorCode::WrongType, "ratio");
}

TEST(WireCodecTest, ManyDistinctCodecsStillDecode) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  PayloadDecoder decoder;
  const size_t n = 256;
  const std::vector<float> g = testing_util::Gaussian(n, 1.0f, 8);
  for (size_t i = 1; i <= 2 * PayloadDecoder::kMaxCodecs + 3; ++i) {
    const std::string spec = "topk:ratio=" + std::to_string(static_cast<double>(i) / 100);
    auto encoder = PayloadEncoder::Create(registry, spec);
    ASSERT_TRUE(encoder.ok()) << spec;
    wire::DataFields f;
    f.num_elements = n;
    auto payload = (*encoder)->Encode(g.data(), n, {}, &f);
    ASSERT_TRUE(payload.ok());
    Received r = Receive(f, {*payload});
    std::vector<float> out(n);
    ErrorCode code;
    ASSERT_TRUE(decoder.Decode(*r.body, r.msg.payloads, {}, out.data(), &code).ok()) << spec;
  }
}

TEST(WireCodecTest, EncoderRefusesWhatHasNoWireFamily) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  EXPECT_FALSE(PayloadEncoder::Create(registry, "none").ok());
  EXPECT_FALSE(PayloadEncoder::Create(registry, "zip").ok());
  EXPECT_FALSE(PayloadEncoder::Create(registry, "topk:ratio=0").ok());
  for (const std::string& name : registry.Names()) {
    EXPECT_EQ(WireCompressionOf(name).ok(), name != "none") << name;
  }
}

std::vector<uint32_t> Keys(const std::vector<float>& x) {
  std::vector<uint32_t> keys;
  for (float v : x) keys.push_back(MagnitudeKey(v));
  return keys;
}

TEST(WireCodecTest, SharedKeepCountsFollowTheBucketsLargestMagnitudes) {
  // Partition 0 holds the 3 largest of 8; k = ceil(0.25 * 12) = 3.
  const std::vector<float> x = {9, -8, 7, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f};
  EXPECT_EQ(SharedKeepCounts(Keys(x), {4, 8}, 0.25), (std::vector<size_t>{3, 1}));
  // Spread over both: 9 and -8 in the first, 7 in the second.
  const std::vector<float> y = {9, 0.1f, -8, 0.2f, 7, 0.3f, 0.4f, 0.5f};
  EXPECT_EQ(SharedKeepCounts(Keys(y), {4, 4}, 0.3), (std::vector<size_t>{2, 1}));
  // Ties with the k-th are all kept.
  EXPECT_EQ(SharedKeepCounts(Keys({1, 1, 1, 1}), {2, 2}, 0.25), (std::vector<size_t>{2, 2}));
  // Fewer nonzeros than k: each partition keeps its own share.
  EXPECT_EQ(SharedKeepCounts(Keys({0, 0, 0, 5, 0, 0, 0, 0}), {4, 4}, 0.5),
            (std::vector<size_t>{2, 2}));
}

// Two partitions encoded with the bucket's threshold as `at_least` put the
// same bytes on the wire as without it, with and without error feedback
// (whose residual then moves alike), over several steps.
TEST(WireCodecTest, EncodeKeepingAtTheSharedThresholdSendsTheSameBytes) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  const size_t sizes[] = {3000, 5000};
  for (const std::string spec : {"topk:ratio=0.01", "topk_fp16:ratio=0.02,ef=1"}) {
    SCOPED_TRACE(spec);
    std::vector<std::unique_ptr<PayloadEncoder>> hinted, plain;
    for (int p = 0; p < 2; ++p) {
      hinted.push_back(std::move(PayloadEncoder::Create(registry, spec)).value());
      plain.push_back(std::move(PayloadEncoder::Create(registry, spec)).value());
    }
    for (uint64_t step = 0; step < 3; ++step) {
      const std::vector<float> g = testing_util::Laplace(8000, 1.0f, 11 + step);
      std::vector<uint32_t> keys(g.size());
      size_t at = 0;
      for (int p = 0; p < 2; ++p) {
        const CompressContext ctx = PartitionContext(5, step, 2, p);
        hinted[p]->MagnitudeKeys(g.data() + at, sizes[p], ctx, keys.data() + at);
        at += sizes[p];
      }
      uint32_t threshold = 0;
      const std::vector<size_t> keep =
          SharedKeepCounts(keys, {sizes[0], sizes[1]}, 0.01, &threshold);
      ASSERT_NE(threshold, 0u);
      at = 0;
      for (int p = 0; p < 2; ++p) {
        const CompressContext ctx = PartitionContext(5, step, 2, p);
        wire::DataFields a, b;
        auto with = hinted[p]->EncodeKeeping(g.data() + at, sizes[p], keep[p], ctx, &a, threshold);
        auto without = plain[p]->EncodeKeeping(g.data() + at, sizes[p], keep[p], ctx, &b);
        ASSERT_TRUE(with.ok() && without.ok());
        ASSERT_EQ(a.codec, b.codec);
        ASSERT_EQ(with->size, without->size);
        EXPECT_EQ(std::memcmp(with->data, without->data, with->size), 0) << step << " " << p;
        at += sizes[p];
      }
    }
  }
}

TEST(WireCodecTest, EncodeKeepingStatesItsRatioAndDecodesAsThatCodec) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  PayloadDecoder decoder;
  const size_t n = 1000;
  const std::vector<float> g = testing_util::Gaussian(n, 1.0f, 5);
  for (const std::string spec :
       {"topk:ratio=0.01", "topk_fp16:ratio=0.01,ef=1", "topk_sampled:ratio=0.01,ef=0"}) {
    SCOPED_TRACE(spec);
    auto encoder = PayloadEncoder::Create(registry, spec);
    ASSERT_TRUE(encoder.ok());
    ASSERT_TRUE((*encoder)->shared_budget_ratio().has_value());
    EXPECT_EQ(*(*encoder)->shared_budget_ratio(), 0.01);
    const CompressContext ctx = PartitionContext(99, 7, 4, 0);
    for (size_t keep : {size_t{1}, size_t{37}, size_t{999}, n}) {
      SCOPED_TRACE(keep);
      wire::DataFields f;
      f.num_elements = n;
      auto payload = (*encoder)->EncodeKeeping(g.data(), n, keep, ctx, &f);
      ASSERT_TRUE(payload.ok()) << payload.status().ToString();
      auto stated = ParseCompressorSpec(f.codec);
      ASSERT_TRUE(stated.ok()) << f.codec;
      EXPECT_EQ(KeepCount(stated->options.ratio, n), keep) << f.codec;
      // Only the ratio differs from the spec.
      EXPECT_EQ(f.codec.substr(0, f.codec.find(':')), spec.substr(0, spec.find(':')));
      EXPECT_EQ(f.codec.find(",ef=") == std::string::npos, spec.find(",ef=") == std::string::npos);
      std::vector<float> got(n);
      Received r = Receive(f, {*payload});
      ASSERT_NE(r.body, nullptr);
      ErrorCode code = ErrorCode::Unknown;
      ASSERT_TRUE(decoder.Decode(*r.body, r.msg.payloads, ctx, got.data(), &code).ok());
      size_t nonzero = 0;
      for (float v : got) nonzero += v != 0.0f;
      EXPECT_EQ(nonzero, keep);
    }
    // Encode goes back to the spec's own ratio.
    wire::DataFields f;
    auto payload = (*encoder)->Encode(g.data(), n, ctx, &f);
    ASSERT_TRUE(payload.ok());
    EXPECT_EQ(f.codec, spec);
    EXPECT_EQ(payload->size, (*encoder)->WireBytes(n));
    EXPECT_FALSE((*encoder)->EncodeKeeping(g.data(), n, 0, ctx, &f).ok());
    EXPECT_FALSE((*encoder)->EncodeKeeping(g.data(), n, n + 1, ctx, &f).ok());
  }
  auto fp16 = PayloadEncoder::Create(registry, "fp16");
  ASSERT_TRUE(fp16.ok());
  EXPECT_FALSE((*fp16)->shared_budget_ratio().has_value());
  wire::DataFields f;
  EXPECT_FALSE((*fp16)->EncodeKeeping(g.data(), n, 10, CompressContext{}, &f).ok());
}

// During top-k's warm-up the encoder states the step's ratio (without the
// warm-up), the shared budget follows it, and a receiver decodes it.
TEST(WireCodecTest, WarmupStepsStateTheirRatio) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  PayloadDecoder decoder;
  const size_t n = 1000;
  const std::vector<float> g = testing_util::Gaussian(n, 1.0f, 5);
  const std::string spec = "topk:ratio=0.01,ef=1,momentum=0.9,warmup=8";
  auto encoder = PayloadEncoder::Create(registry, spec);
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  for (uint64_t step : {0, 4, 8, 9}) {
    SCOPED_TRACE(step);
    (*encoder)->BeginStep(step);
    const double ratio = TopKCompressor::WarmupRatio(0.01, 8, step);
    EXPECT_EQ(*(*encoder)->shared_budget_ratio(), ratio);
    const CompressContext ctx = PartitionContext(99, step, 4, 0);
    wire::DataFields f;
    f.num_elements = n;
    auto payload = (*encoder)->Encode(g.data(), n, ctx, &f);
    ASSERT_TRUE(payload.ok()) << payload.status();
    EXPECT_EQ(payload->size, KeepCount(ratio, n) * 8);
    if (step >= 8) {
      EXPECT_EQ(f.codec, spec);
    } else {
      EXPECT_EQ(f.codec.find("warmup"), std::string::npos) << f.codec;
      auto stated = ParseCompressorSpec(f.codec);
      ASSERT_TRUE(stated.ok()) << f.codec;
      EXPECT_EQ(stated->options.ratio, ratio);
      EXPECT_EQ(stated->options.momentum, 0.9);
    }
    // EncodeKeeping goes back to the step's ratio, not the spec's.
    ASSERT_TRUE((*encoder)->EncodeKeeping(g.data(), n, 3, ctx, &f).ok());
    EXPECT_EQ(*(*encoder)->shared_budget_ratio(), ratio);
    wire::DataFields again;
    again.num_elements = n;
    auto second = (*encoder)->Encode(g.data(), n, ctx, &again);
    ASSERT_TRUE(second.ok());
    std::vector<float> got(n);
    Received r = Receive(again, {*second});
    ASSERT_NE(r.body, nullptr);
    ErrorCode code = ErrorCode::Unknown;
    ASSERT_TRUE(decoder.Decode(*r.body, r.msg.payloads, ctx, got.data(), &code).ok());
    EXPECT_EQ(static_cast<size_t>(
                  std::count_if(got.begin(), got.end(), [](float v) { return v != 0.0f; })),
              KeepCount(ratio, n));
  }
}

TEST(WireCodecTest, MagnitudeKeysIncludeTheErrorFeedbackResidual) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  auto encoder = PayloadEncoder::Create(registry, "topk:ratio=0.25,ef=1");
  ASSERT_TRUE(encoder.ok());
  const CompressContext ctx = PartitionContext(1, 0, 0, 0);
  const std::vector<float> first = {4, 3, 2, 1};
  std::vector<uint32_t> keys(4);
  (*encoder)->MagnitudeKeys(first.data(), 4, ctx, keys.data());
  EXPECT_EQ(keys, Keys(first));  // no residual yet
  wire::DataFields f;
  ASSERT_TRUE((*encoder)->Encode(first.data(), 4, ctx, &f).ok());  // keeps 4; 3, 2, 1 stay
  const std::vector<float> second = {1, 1, 1, 1};
  (*encoder)->MagnitudeKeys(second.data(), 4, ctx, keys.data());
  EXPECT_EQ(keys, Keys({1, 4, 3, 2}));
}

TEST(WireCodecTest, WithMomentumKeysAndCodecFollowTheVelocity) {
  CompressorRegistry registry;
  RegisterBuiltins(&registry);
  auto encoder = PayloadEncoder::Create(registry, "topk:ratio=0.25,ef=1,momentum=0.5");
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  const CompressContext ctx = PartitionContext(1, 0, 0, 0);
  const std::vector<float> first = {4, 3, 2, 1};
  wire::DataFields f;
  ASSERT_TRUE((*encoder)->EncodeKeeping(first.data(), 4, 1, ctx, &f).ok());
  EXPECT_EQ(f.codec, "topk:ratio=0.125,ef=1,momentum=0.5");
  // u = {0 (sent, masked), 3, 2, 1}, e = {0, 3, 2, 1}: the next step selects
  // from 0.5 u + g + e.
  const std::vector<float> second = {1, 1, 1, 1};
  std::vector<uint32_t> keys(4);
  (*encoder)->MagnitudeKeys(second.data(), 4, ctx, keys.data());
  EXPECT_EQ(keys, Keys({1, 5.5f, 4, 2.5f}));
}

}  // namespace
}  // namespace gradsync::compression
