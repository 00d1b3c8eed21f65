// bf16: rounding, saturation, exact decode, and the refusals of hostile payloads.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs {
namespace {

using internal::Bf16ToFloat;
using internal::FloatToBf16;
using ::ps::codecs::testing::MakeOk;
using ::testing::HasSubstr;

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Bf16Test, KnownValues) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0x0001), FromBits(0x00010000));  // a subnormal, kept exactly
}

TEST(Bf16Test, RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): to even.
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808000)), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 0x3f81 (odd) and 0x3f82 (even): up.
  EXPECT_EQ(FloatToBf16(FromBits(0x3f818000)), 0x3f82);
  // Just above and below the halfway point.
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808001)), 0x3f81);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f807fff)), 0x3f80);
}

TEST(Bf16Test, SaturatesInsteadOfOverflowingToInf) {
  EXPECT_EQ(FloatToBf16(FLT_MAX), 0x7f7f);
  EXPECT_EQ(FloatToBf16(-FLT_MAX), 0xff7f);
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f7fff)), 0x7f7f);  // rounds down anyway
}

TEST(Bf16Test, EveryFiniteBf16RoundTripsExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    if ((h & 0x7f80) == 0x7f80) continue;  // Inf and NaN
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(FloatToBf16(f), h) << std::hex << h;
  }
}

TEST(Bf16Test, EncodeDecodeWithinHalfAnUlp) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 1e-2f);
  std::vector<float> in(1000);
  for (float& v : in) v = g(rng);
  auto codec = MakeOk("bf16");
  std::string bytes;
  ASSERT_TRUE(codec->Encode(in, &bytes).ok());
  EXPECT_EQ(bytes.size(), codec->MaxEncodedBytes(in.size()));
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]), FormatByte(PayloadFormat::kBf16));
  std::vector<float> out(in.size());
  ASSERT_TRUE(codec->Decode(bytes, out).ok());
  for (size_t i = 0; i < in.size(); ++i) {
    // 8 significant bits, rounded to nearest: error at most half an ulp, 2^-8 relative.
    ASSERT_LE(std::abs(out[i] - in[i]), std::ldexp(std::abs(in[i]), -8)) << i;
  }
  // Little-endian on the wire: value 0 = bytes 1, 2.
  EXPECT_EQ(static_cast<unsigned char>(bytes[1]) | (static_cast<unsigned char>(bytes[2]) << 8),
            FloatToBf16(in[0]));
}

TEST(Bf16Test, RefusesNonFiniteOnEncodeAndDecode) {
  auto codec = MakeOk("bf16");
  std::string bytes;
  const std::vector<float> bad = {1.0f, std::numeric_limits<float>::infinity()};
  EXPECT_THAT(std::string(codec->Encode(bad, &bytes).message()),
              HasSubstr("bf16: cannot encode value 1: not finite"));
  for (uint16_t h : {uint16_t{0x7f80}, uint16_t{0xff80}, uint16_t{0x7fc0}, uint16_t{0x7f81}}) {
    std::string payload = {static_cast<char>(FormatByte(PayloadFormat::kBf16)), 0x00, 0x00, static_cast<char>(h & 0xff),
                           static_cast<char>(h >> 8)};
    std::vector<float> out(2);
    const absl::Status st = codec->Decode(payload, out);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(st.message()), HasSubstr("bf16: value 1 is not finite"));
  }
}

TEST(Bf16Test, RefusesBadFraming) {
  auto codec = MakeOk("bf16");
  std::vector<float> out(4);
  EXPECT_THAT(std::string(codec->Decode("", out).message()), HasSubstr("empty payload"));
  std::string fp16_payload(9, '\0');  // same size as bf16's
  fp16_payload[0] = static_cast<char>(FormatByte(PayloadFormat::kFp16));
  EXPECT_EQ(std::string(codec->Decode(fp16_payload, out).message()),
            "bf16: payload in the fp16 format (2), expected the bf16 format (3)");
  std::string short_payload(8, '\0');
  short_payload[0] = static_cast<char>(FormatByte(PayloadFormat::kBf16));
  EXPECT_THAT(std::string(codec->Decode(short_payload, out).message()),
              HasSubstr("payload is 8 bytes, expected 9"));
}

}  // namespace
}  // namespace ps::codecs
