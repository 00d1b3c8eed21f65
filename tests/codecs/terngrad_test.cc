// terngrad: wire format, alphabet, refusals.
#include <cmath>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::Gaussian;
using ::ps::codecs::testing::Hex;
using ::ps::codecs::testing::DecodeError;
using ::ps::codecs::testing::EncodeOk;
using ::ps::codecs::testing::MakeOk;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TerngradCodecTest, WireFormatWhenEveryValueIsAtTheScale) {
  // |x| = max|x| keeps a value with probability 1, so the codes are deterministic.
  auto codec = MakeOk("terngrad");
  EXPECT_EQ(codec->spec(), "terngrad(bucket=512)");
  const std::string bytes = EncodeOk(*codec, {2, -2, 0, 2, -2});
  // version, numel 5, scale 2, codes 1 2 0 1 | 2 (+3 padding codes).
  EXPECT_EQ(Hex(bytes), "06 05 00 00 00 40 49 02");
  std::vector<float> out(5);
  ASSERT_TRUE(codec->Decode(bytes, out).ok());
  EXPECT_THAT(out, ElementsAre(2, -2, 0, 2, -2));
}

TEST(TerngradCodecTest, DecodesToZeroOrPlusMinusTheBucketScale) {
  auto codec = MakeOk("terngrad(bucket=100)");
  std::vector<float> x = Gaussian(1001, 8);
  const std::string bytes = EncodeOk(*codec, x);
  std::vector<float> out(x.size());
  ASSERT_TRUE(codec->Decode(bytes, out).ok());
  for (size_t b = 0; b * 100 < x.size(); ++b) {
    float max = 0;
    for (size_t i = b * 100; i < std::min(x.size(), b * 100 + 100); ++i) max = std::max(max, std::fabs(x[i]));
    for (size_t i = b * 100; i < std::min(x.size(), b * 100 + 100); ++i) {
      ASSERT_TRUE(out[i] == 0 || out[i] == max || out[i] == -max) << i;
      if (out[i] != 0) {
        ASSERT_EQ(std::signbit(out[i]), std::signbit(x[i])) << i;
      }
    }
  }
}

TEST(TerngradCodecTest, RefusesCode3PaddingAndBadScale) {
  auto codec = MakeOk("terngrad");
  const std::string bytes = EncodeOk(*codec, {2, -2, 0, 2, -2});
  std::string bad = bytes;
  bad[6] = static_cast<char>(0x4d);  // value 1: code 3
  EXPECT_EQ(DecodeError(*codec, bad, 5),
            "terngrad(bucket=512): value 1 has code 3 (codes are 0, 1 = +scale, 2 = -scale)");
  bad = bytes;
  bad[7] = 0x12;  // a padding code
  EXPECT_EQ(DecodeError(*codec, bad, 5),
            "terngrad(bucket=512): padding codes after the last value are not zero");
  bad = bytes;
  bad[5] = static_cast<char>(0xc0);  // scale -2
  EXPECT_THAT(DecodeError(*codec, bad, 5), HasSubstr("scale 0 is negative"));
  EXPECT_THAT(DecodeError(*codec, bytes + "x", 5), HasSubstr("1 trailing bytes after the codes"));
  EXPECT_THAT(DecodeError(*codec, bytes, 6), HasSubstr("payload is for 5 values, the slice has 6"));
}

TEST(TerngradCodecTest, RatioIsNearSixteenWithDefaultBuckets) {
  auto codec = MakeOk("terngrad");
  const std::string bytes = EncodeOk(*codec, Gaussian(1 << 16, 1));
  // 2 bits per value plus 32 bits per 512 values.
  EXPECT_EQ(bytes.size(), 1 + 3 + 4 * 128 + (1u << 14));
}

}  // namespace
}  // namespace ps::codecs
