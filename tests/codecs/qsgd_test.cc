// qsgd: wire format, level bound, refusals of hostile level streams.
#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "codecs/wire_internal.h"
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

// A qsgd payload for the given norms and raw level-stream bits (LSB first).
std::string Payload(size_t numel, std::vector<float> norms, std::vector<int> bits) {
  std::string b;
  internal::PutU8(&b, kFormatVersion);
  internal::PutVarint(&b, numel);
  for (float v : norms) internal::PutF32(&b, v);
  internal::BitWriter w(&b);
  for (int bit : bits) w.Put(static_cast<uint64_t>(bit), 1);
  w.Finish();
  return b;
}

TEST(QsgdCodecTest, WireFormatWhenTheOnlyValueIsTheNorm) {
  auto codec = MakeOk("qsgd(s=1, bucket=512)");
  EXPECT_EQ(codec->spec(), "qsgd(s=1, bucket=512)");
  // norm 5; levels 0, 1, 0: gamma(1) = 1, gamma(2) = 010 then sign 1, gamma(1) = 1.
  const std::string bytes = EncodeOk(*codec, {0, -5, 0});
  EXPECT_EQ(Hex(bytes), "01 03 00 00 a0 40 35");
  std::vector<float> out(3);
  ASSERT_TRUE(codec->Decode(bytes, out).ok());
  EXPECT_THAT(out, ElementsAre(0, -5, 0));
}

TEST(QsgdCodecTest, DecodedMagnitudesAreMultiplesOfNormOverS) {
  auto codec = MakeOk("qsgd(s=4, bucket=64)");
  const std::vector<float> x = Gaussian(300, 2);
  std::vector<float> out(x.size());
  ASSERT_TRUE(codec->Decode(EncodeOk(*codec, x), out).ok());
  for (size_t b = 0; b * 64 < x.size(); ++b) {
    double sq = 0;
    for (size_t i = b * 64; i < std::min(x.size(), b * 64 + 64); ++i) sq += double{x[i]} * x[i];
    const double norm = static_cast<float>(std::sqrt(sq));
    for (size_t i = b * 64; i < std::min(x.size(), b * 64 + 64); ++i) {
      const double level = std::fabs(out[i]) / norm * 4;
      EXPECT_NEAR(level, std::round(level), 1e-5) << i;
      // Stochastic rounding picks one of the two neighbouring levels.
      EXPECT_LE(std::fabs(std::fabs(out[i]) - std::fabs(x[i])), norm / 4 * 1.0001) << i;
      if (out[i] != 0) {
        EXPECT_EQ(std::signbit(out[i]), std::signbit(x[i])) << i;
      }
    }
  }
}

TEST(QsgdCodecTest, HugeValuesKeepAFiniteNorm) {
  auto codec = MakeOk("qsgd");
  const std::vector<float> x = {FLT_MAX, FLT_MAX, -FLT_MAX};
  std::vector<float> out(3);
  ASSERT_TRUE(codec->Decode(EncodeOk(*codec, x), out).ok());
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(out[0], FLT_MAX);  // the norm is clamped to FLT_MAX and the level to s
}

TEST(QsgdCodecTest, RefusesHostileLevelStreams) {
  auto codec = MakeOk("qsgd(s=2, bucket=512)");
  const std::string spec = "qsgd(s=2, bucket=512): ";
  // s = 4 allows codes of up to two leading zeros (s + 1 = 5 = 101b); 110b is level 5.
  EXPECT_EQ(DecodeError(*MakeOk("qsgd(s=4, bucket=512)"), Payload(1, {1.0f}, {0, 0, 1, 1, 0}), 1),
            "qsgd(s=4, bucket=512): value 0 has level 5, above s = 4");
  // Two zeros: longer than any code up to s + 1 = 3 (one zero) allows.
  EXPECT_EQ(DecodeError(*codec, Payload(1, {1.0f}, {0, 0, 0, 0, 0, 0, 0, 0}), 1),
            spec + "level code too long at value 0");
  // Seven level-0 values, then a code cut by the end of the payload.
  EXPECT_EQ(DecodeError(*codec, Payload(8, {1.0f}, {1, 1, 1, 1, 1, 1, 1, 0}), 8),
            spec + "payload ends inside the level of value 7");
  // Five level-0 values, then level 1 (010) whose sign bit would be past the end.
  EXPECT_EQ(DecodeError(*codec, Payload(6, {1.0f}, {1, 1, 1, 1, 1, 0, 1, 0}), 6),
            spec + "payload ends inside the sign of value 5");
  EXPECT_EQ(DecodeError(*codec, Payload(1, {0.0f}, {0, 1, 0, 0}), 1),
            spec + "value 0 has level 1 in a bucket of norm 0");
  EXPECT_EQ(DecodeError(*codec, Payload(1, {1.0f}, {1, 0, 1}), 1),
            spec + "padding bits after the last level are not zero");
  EXPECT_EQ(DecodeError(*codec, Payload(1, {1.0f}, {1, 0, 0, 0, 0, 0, 0, 0, 0}), 1),
            spec + "1 trailing bytes after the levels");
  EXPECT_THAT(DecodeError(*codec, Payload(1, {-1.0f}, {1}), 1), HasSubstr("norm 0 is negative"));
  std::vector<float> out(1);
  EXPECT_TRUE(codec->Decode(Payload(1, {1.0f}, {0, 1, 1, 1}), out).ok());  // level 2, negative
  EXPECT_EQ(out[0], -1.0f);
}

TEST(QsgdCodecTest, RefusesBadArguments) {
  EXPECT_THAT(std::string(MakeCodec("qsgd(s=0)").status().message()), HasSubstr("s must lie in"));
  EXPECT_THAT(std::string(MakeCodec("qsgd(s=65537)").status().message()), HasSubstr("s must lie in"));
  EXPECT_EQ((*MakeCodec("qsgd(8, 256)"))->spec(), "qsgd(s=8, bucket=256)");
}

}  // namespace
}  // namespace ps::codecs
