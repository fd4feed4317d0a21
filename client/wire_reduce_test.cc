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
WireCode PlainCode(float* data) {
  WireCode code;
  code.summable = true;
  code.dtype = DType::kF32;
  code.elems = kN;
  code.wire_bytes = kN * sizeof(float);
  code.encode = [data](uint8_t* wire) {
    std::memcpy(wire, data, kN * sizeof(float));
    return Status();
  };
  code.decode = [](const uint8_t* wire, float* out) {
    std::memcpy(out, wire, kN * sizeof(float));
    return Status();
  };
  return code;
}

TEST(WireReduceTest, SummableCodeAveragesAndCountsWhatItSent) {
  Ring ring(kWorld);
  std::vector<std::vector<float>> data(kWorld);
  std::vector<WireTraffic> traffic(kWorld);
  auto statuses = ring.Run([&](int r) {
    data[r] = Values(r);
    HostReduceSpace space;
    bool in_wire = true;
    Status s = ReduceWire(PlainCode(data[r].data()), data[r].data(), kN, space, ring[r], Tag(1),
                          Soon(), &traffic[r], &in_wire);
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

TEST(WireReduceTest, DividedEncodingLeavesTheAverageInTheWire) {
  Ring ring(kWorld);
  std::vector<std::vector<float>> data(kWorld);
  std::vector<std::vector<uint16_t>> result(kWorld, std::vector<uint16_t>(kN));
  auto statuses = ring.Run([&](int r) {
    data[r] = Values(r);
    float* values = data[r].data();
    WireCode code;
    code.summable = true;
    code.dtype = DType::kF16;
    code.elems = kN;
    code.wire_bytes = 2 * kN;
    code.encode = [](uint8_t*) { return InternalError("encode_divided is the one to run"); };
    code.encode_divided = [values](uint8_t* wire, float divisor) {
      for (size_t i = 0; i < kN; ++i) {
        const uint16_t h = FloatToHalf(values[i] / divisor);
        std::memcpy(wire + 2 * i, &h, 2);
      }
      return Status();
    };
    code.decode = [](const uint8_t*, float*) { return InternalError("nothing to decode"); };
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
// refused by `check`.
WireCode TinyCode(int rank, uint8_t marker, std::vector<int>* decoded_ranks) {
  WireCode code;
  code.wire_bytes = 3;
  code.encode = [rank, marker](uint8_t* wire) {
    wire[0] = static_cast<uint8_t>(10 + rank);
    wire[1] = marker;
    wire[2] = static_cast<uint8_t>(rank);
    return Status();
  };
  code.check = [](const uint8_t* wire, int r) {
    if (wire[1] != 0x5a) return InvalidArgumentError("bytes of rank " + std::to_string(r));
    return Status();
  };
  code.decode = [decoded_ranks](const uint8_t* wire, float* out) {
    decoded_ranks->push_back(wire[2]);
    for (size_t i = 0; i < kN; ++i) out[i] = static_cast<float>(wire[0]);
    return Status();
  };
  return code;
}

TEST(WireReduceTest, GatheredCodeDecodesEveryRankInRankOrder) {
  Ring ring(kWorld);
  std::vector<std::vector<float>> data(kWorld, std::vector<float>(kN));
  std::vector<std::vector<int>> decoded(kWorld);
  std::vector<WireTraffic> traffic(kWorld);
  auto statuses = ring.Run([&](int r) {
    HostReduceSpace space;
    bool in_wire = false;
    return ReduceWire(TinyCode(r, 0x5a, &decoded[r]), data[r].data(), kN, space, ring[r], Tag(1),
                      Soon(), &traffic[r], &in_wire);
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
    WireCode code = TinyCode(r, r == 1 ? 0x00 : 0x5a, &decoded[r]);
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
