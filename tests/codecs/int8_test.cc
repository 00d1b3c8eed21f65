// int8: wire format, per-bucket scales, seeds, extreme magnitudes and refusals.
#include <cfloat>
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

TEST(Int8CodecTest, WireFormatOfIntegersIsExact) {
  // max|x| = 127, so the scale is 1 and integers need no rounding.
  auto codec = MakeOk("int8");
  EXPECT_EQ(codec->spec(), "int8(bucket=512)");
  const std::string bytes = EncodeOk(*codec, {127, -64, 0, 1, -127});
  EXPECT_EQ(Hex(bytes), "04 05 00 00 80 3f 7f c0 00 01 81");
  std::vector<float> out(5);
  ASSERT_TRUE(codec->Decode(bytes, out).ok());
  EXPECT_THAT(out, ElementsAre(127, -64, 0, 1, -127));
}

TEST(Int8CodecTest, EachBucketHasItsOwnScale) {
  // Bucket 0 is tiny, bucket 1 huge: with one scale bucket 0 would round to zero.
  auto codec = MakeOk("int8(bucket=4)");
  const std::vector<float> x = {1e-3f, -2e-3f, 3e-3f, 4e-3f, 1e3f, -2e3f, 3e3f, 4e3f, 5.0f};
  const std::string bytes = EncodeOk(*codec, x);
  ASSERT_EQ(bytes.size(), 1 + 1 + 4 * 3 + 9u);
  std::vector<float> out(x.size());
  ASSERT_TRUE(codec->Decode(bytes, out).ok());
  const float scales[] = {4e-3f / 127, 4e3f / 127, 5.0f / 127};
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_LE(std::fabs(out[i] - x[i]), scales[i / 4] * 1.0001f) << i;
  }
  EXPECT_NEAR(out[8], 5.0f, 1e-6f);  // the maximum of its bucket: q = 127
}

TEST(Int8CodecTest, SeedAndRoundChangeTheRoundingOnly) {
  const std::vector<float> x = Gaussian(1000, 5);
  auto a = MakeOk("int8", 1);
  auto b = MakeOk("int8", 2);
  EXPECT_EQ(EncodeOk(*a, x), EncodeOk(*MakeOk("int8", 1), x));
  EXPECT_NE(EncodeOk(*a, x), EncodeOk(*b, x));
  EXPECT_NE(EncodeOk(*a, x, 0), EncodeOk(*a, x, 1));
  EXPECT_EQ(EncodeOk(*a, x).size(), EncodeOk(*b, x).size());
}

TEST(Int8CodecTest, ExtremeMagnitudesStayFinite) {
  auto codec = MakeOk("int8");
  const std::vector<float> x = {FLT_MAX, -FLT_MAX, 1.0f, 0.0f};
  std::vector<float> out(x.size());
  ASSERT_TRUE(codec->Decode(EncodeOk(*codec, x), out).ok());
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(out[0], FLT_MAX, FLT_MAX * 1e-6);
  // Below 127 * FLT_MIN the bucket is sent as zeros with scale 0.
  const std::vector<float> tiny = {1e-37f, -3e-38f, 1e-45f};
  const std::string bytes = EncodeOk(*codec, tiny);
  EXPECT_EQ(Hex(bytes), "04 03 00 00 00 00 00 00 00");
}

TEST(Int8CodecTest, RefusesMinus128BadScalesAndSizes) {
  auto codec = MakeOk("int8(bucket=2)");
  const std::string bytes = EncodeOk(*codec, {1, -1, 2});  // scales at 2 and 6, values at 10
  std::string bad = bytes;
  bad[11] = static_cast<char>(0x80);
  EXPECT_EQ(DecodeError(*codec, bad, 3), "int8(bucket=2): value 1 is -128, outside [-127, 127]");
  bad = bytes;
  bad[9] = static_cast<char>(0xbf);  // scale 1: -(...)
  EXPECT_THAT(DecodeError(*codec, bad, 3), HasSubstr("scale 1 is negative"));
  bad = bytes;
  bad[5] = static_cast<char>(0x7f);
  bad[4] = static_cast<char>(0xc0);  // NaN
  EXPECT_THAT(DecodeError(*codec, bad, 3), HasSubstr("scale 0 is not finite"));
  bad = bytes;
  bad[5] = 0x7f;
  bad[4] = 0x00;  // 2^127 * (1 + ...): 127 times that overflows
  EXPECT_THAT(DecodeError(*codec, bad, 3), HasSubstr("decoded values would overflow"));
  EXPECT_EQ(DecodeError(*codec, bytes, 4), "int8(bucket=2): payload is for 3 values, the slice has 4");
  EXPECT_THAT(DecodeError(*codec, bytes.substr(0, 12), 3), HasSubstr("payload ends inside the values"));
}

TEST(Int8CodecTest, RefusesBadBucketArgument) {
  EXPECT_THAT(std::string(MakeCodec("int8(bucket=0)").status().message()), HasSubstr("bucket"));
  EXPECT_THAT(std::string(MakeCodec("int8(bucket=99999999)").status().message()), HasSubstr("bucket"));
  EXPECT_THAT(std::string(MakeCodec("int8+raw").status().message()), HasSubstr("whole codec"));
  EXPECT_EQ((*MakeCodec("int8(64)"))->spec(), "int8(bucket=64)");
}

}  // namespace
}  // namespace ps::codecs
