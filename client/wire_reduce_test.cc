#include "client/wire_reduce.h"

#include <cstring>
#include <vector>

#include "client/ring_test_util.h"
#include "common/half.h"
#include "gtest/gtest.h"

namespace gradsync::client {
namespace {

constexpr int kWorld = 3;
constexpr size_t kN = 1000;

// Rank r's values: r + i / 1000.
std::vector<float> Values(int r) {
  std::vector<float> v(kN);
  for (size_t i = 0; i < kN; ++i) v[i] = static_cast<float>(r) + static_cast<float>(i) / 1000.0f;
  return v;
}

// The values themselves, summed as f32 by the collective.
class PlainCode final : public BucketCodec {
 public:
  explicit PlainCode(float* data) : data_(data) {
    shape_ = {true, DType::kF32, kN, kN * sizeof(float)};
  }
  Status Encode(uint8_t* wire) override {
    std::memcpy(wire, data_, kN * sizeof(float));
    return Status();
  }
  Status Decode(const uint8_t* wire, float* out) override {
    std::memcpy(out, wire, kN * sizeof(float));
    return Status();
  }

 private:
  float* data_;
};

TEST(WireReduceTest, SummableCodeAveragesAndCountsWhatItSent) {
  Ring ring(kWorld);
  std::vector<std::vector<float>> data(kWorld);
  std::vector<WireTraffic> traffic(kWorld);
  auto statuses = ring.Run([&](int r) {
    data[r] = Values(r);
    HostReduceSpace space;
    bool in_wire = true;
    PlainCode code(data[r].data());
    Status s =
        ReduceWire(code, data[r].data(), kN, space, ring[r], Tag(1), Soon(), &traffic[r], &in_wire);
    EXPECT_FALSE(in_wire);
    return s;
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r].ToString();
    EXPECT_EQ(traffic[r].sent, kN * sizeof(float));
    EXPECT_EQ(traffic[r].received, kN * sizeof(float));
    EXPECT_FALSE(traffic[r].gathered);
    for (size_t i = 0; i < kN; i += 97) {
      const float want = (Values(0)[i] + Values(1)[i] + Values(2)[i]) / 3.0f;
      EXPECT_FLOAT_EQ(data[r][i], want) << "rank " << r << " element " << i;
    }
    EXPECT_EQ(std::memcmp(data[r].data(), data[0].data(), kN * sizeof(float)), 0)
        << "rank " << r << " differs from rank 0";
  }
}

// fp16 that divides as it encodes; only EncodeDivided may run.
class DividedHalves final : public BucketCodec {
 public:
  explicit DividedHalves(const float* values) : values_(values) {
    shape_ = {true, DType::kF16, kN, 2 * kN};
  }
  Status Encode(uint8_t*) override { return InternalError("EncodeDivided is the one to run"); }
  bool EncodesDivided() const override { return true; }
  Status EncodeDivided(uint8_t* wire, float divisor) override {
    for (size_t i = 0; i < kN; ++i) {
      const uint16_t h = FloatToHalf(values_[i] / divisor);
      std::memcpy(wire + 2 * i, &h, 2);
    }
    return Status();
  }
  Status Decode(const uint8_t*, float*) override { return InternalError("nothing to decode"); }

 private:
  const float* values_;
};

TEST(WireReduceTest, DividedEncodingLeavesTheAverageInTheWire) {
  Ring ring(kWorld);
  std::vector<std::vector<float>> data(kWorld);
  std::vector<std::vector<uint16_t>> result(kWorld, std::vector<uint16_t>(kN));
  auto statuses = ring.Run([&](int r) {
    data[r] = Values(r);
    float* values = data[r].data();
    DividedHalves code(values);
    HostReduceSpace space;
    bool in_wire = false;
    WireTraffic traffic;
    GS_RETURN_IF_ERROR(
        ReduceWire(code, values, kN, space, ring[r], Tag(1), Soon(), &traffic, &in_wire));
    EXPECT_TRUE(in_wire);
    GS_ASSIGN_OR_RETURN(uint8_t * wire, space.Buffer(ReduceSpace::Slot::kWire, 2 * kN));
    std::memcpy(result[r].data(), wire, 2 * kN);
    return Status();
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r].ToString();
    EXPECT_EQ(data[r], Values(r)) << "the bucket itself is left as it was";
    EXPECT_EQ(result[r], result[0]);
    for (size_t i = 0; i < kN; i += 97) {
      const float want = (Values(0)[i] + Values(1)[i] + Values(2)[i]) / 3.0f;
      EXPECT_NEAR(HalfToFloat(result[r][i]), want, 0.01f) << "element " << i;
    }
  }
}

// Three bytes a rank, unaligned in the gathered buffer: each rank's own
// byte, a marker and its rank; a rank's bytes whose marker is not 0x5a are
// refused by Check.
class TinyCode final : public BucketCodec {
 public:
  TinyCode(int rank, uint8_t marker, std::vector<int>* decoded_ranks)
      : rank_(rank), marker_(marker), decoded_ranks_(decoded_ranks) {
    shape_ = {false, DType::kU8, 0, 3};
  }
  Status Encode(uint8_t* wire) override {
    wire[0] = static_cast<uint8_t>(10 + rank_);
    wire[1] = marker_;
    wire[2] = static_cast<uint8_t>(rank_);
    return Status();
  }
  Status Check(const uint8_t* wire, int r) const override {
    if (wire[1] != 0x5a) return InvalidArgumentError("bytes of rank " + std::to_string(r));
    return Status();
  }
  Status Decode(const uint8_t* wire, float* out) override {
    decoded_ranks_->push_back(wire[2]);
    for (size_t i = 0; i < kN; ++i) out[i] = static_cast<float>(wire[0]);
    return Status();
  }

 private:
  const int rank_;
  const uint8_t marker_;
  std::vector<int>* decoded_ranks_;
};

TEST(WireReduceTest, GatheredCodeDecodesEveryRankInRankOrder) {
  Ring ring(kWorld);
  std::vector<std::vector<float>> data(kWorld, std::vector<float>(kN));
  std::vector<std::vector<int>> decoded(kWorld);
  std::vector<WireTraffic> traffic(kWorld);
  auto statuses = ring.Run([&](int r) {
    HostReduceSpace space;
    bool in_wire = false;
    TinyCode code(r, 0x5a, &decoded[r]);
    return ReduceWire(code, data[r].data(), kN, space, ring[r], Tag(1), Soon(), &traffic[r],
                      &in_wire);
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r].ToString();
    EXPECT_EQ(decoded[r], (std::vector<int>{0, 1, 2}));
    EXPECT_FLOAT_EQ(data[r][0], (10.0f + 11.0f + 12.0f) / 3.0f);
    EXPECT_EQ(traffic[r].sent, 3u);
    EXPECT_EQ(traffic[r].received, 6u);
    EXPECT_TRUE(traffic[r].gathered);
  }
}

TEST(WireReduceTest, EveryRankRefusesBadBytesBeforeDecodingAny) {
  Ring ring(kWorld);
  std::vector<std::vector<float>> data(kWorld, std::vector<float>(kN, 7.0f));
  std::vector<std::vector<int>> decoded(kWorld);
  auto statuses = ring.Run([&](int r) {
    HostReduceSpace space;
    bool in_wire = false;
    WireTraffic traffic;
    TinyCode code(r, r == 1 ? 0x00 : 0x5a, &decoded[r]);
    return ReduceWire(code, data[r].data(), kN, space, ring[r], Tag(1), Soon(), &traffic, &in_wire);
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(statuses[r].code(), StatusCode::kInvalidArgument) << statuses[r].ToString();
    EXPECT_NE(statuses[r].message().find("rank 1"), std::string::npos) << statuses[r].ToString();
    EXPECT_TRUE(decoded[r].empty()) << "rank " << r << " decoded before checking";
    EXPECT_EQ(data[r][0], 7.0f);
  }
}

}  // namespace
}  // namespace gradsync::client
