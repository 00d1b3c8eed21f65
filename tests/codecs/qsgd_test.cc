// qsgd: wire format, level bound, refusals of hostile level streams.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
  internal::PutU8(&b, FormatByte(PayloadFormat::kQsgd));
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
  EXPECT_EQ(Hex(bytes), "05 03 00 00 a0 40 35");
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
  EXPECT_THAT(std::string(MakeCodec("qsgd(s=65537)").status().message()),
              HasSubstr("s must lie in"));
  EXPECT_EQ((*MakeCodec("qsgd(8, 256)"))->spec(), "qsgd(s=8, bucket=256)");
}

// The s a qsgd(level=cat) payload carries: the varint after version, numel and norms.
uint64_t ChosenLevels(const std::string& payload, size_t numel, size_t bucket) {
  size_t at = 1 + internal::VarintSize(numel) + 4 * ((numel + bucket - 1) / bucket);
  uint64_t v = 0;
  for (int shift = 0; at < payload.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(payload[at++]);
    v |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) break;
  }
  return v;
}

// qsgd(level=cat): CAT's objective for unbiased compressors, 1 / (b(s) (fixed + bytes)),
// with b(s) = 1 + min(k / s^2, sqrt(k) / s). The s chosen from expected sizes scores
// within a few percent of the best candidate by the real payloads of the fixed-s codec;
// a huge fixed cost makes bytes irrelevant (the largest s, least variance); the payload
// decodes with the spec the push names and its error is within the variance bound.
TEST(QsgdCatTest, ChoosesAnSWithinAFewPercentOfTheBruteForceBest) {
  const size_t n = 20000, bucket = 512;
  std::vector<float> heavy = Gaussian(n, 4);
  for (size_t i = 0; i < n; i += 50) heavy[i] *= 20.0f;
  std::vector<uint64_t> chosen;
  for (const std::vector<float>& x : {Gaussian(n, 3), heavy}) {
    for (double fixed : {0.0, 3000.0, 30000.0, 1e9}) {
      auto cat = MakeOk("qsgd(s=1024, bucket=512, level=cat)");
      EncodeContext ctx;
      ctx.fixed_cost_bytes = fixed;
      std::string payload;
      ASSERT_TRUE(cat->Encode(x, ctx, &payload).ok());
      const uint64_t s = ChosenLevels(payload, n, bucket);
      chosen.push_back(s);
      double best = 0, score_of_s = 0;
      for (uint64_t c = 1; c <= 1024; c *= 2) {
        auto fixed_s = MakeOk(absl::StrCat("qsgd(s=", c, ", bucket=512)"));
        const double bytes = static_cast<double>(EncodeOk(*fixed_s, x).size() +
                                                 internal::VarintSize(c));
        const double k = bucket;
        const double variance = 1 + std::min(k / double(c * c), std::sqrt(k) / double(c));
        const double score = 1 / (variance * (fixed + bytes));
        best = std::max(best, score);
        if (c == s) score_of_s = score;
      }
      ASSERT_GT(score_of_s, 0) << "s = " << s << " is not a candidate";
      EXPECT_GE(score_of_s, 0.97 * best) << "fixed " << fixed << ", s = " << s;
      if (fixed == 1e9) {
        EXPECT_EQ(s, 1024u);
      }
      std::vector<float> d(n);
      auto shard = MakeOk(cat->spec());
      ASSERT_TRUE(shard->Decode(payload, d).ok());
      double err = 0, energy = 0;
      for (size_t i = 0; i < n; ++i) {
        err += (double{x[i]} - d[i]) * (double{x[i]} - d[i]);
        energy += double{x[i]} * x[i];
      }
      const double k = bucket;
      EXPECT_LE(err / energy, 1.5 * std::min(k / double(s * s), std::sqrt(k) / double(s)));
    }
  }
  // Without a fixed cost fewer levels pay (the variance factor falls as 1 / s^2 once
  // s^2 > k, the bits grow as log s); with a huge one the most.
  EXPECT_LT(chosen[0], chosen[3]);
  EXPECT_LT(chosen[0], 1024u);
}

TEST(QsgdCatTest, SpecsRefusalsAndTheLevelsOnTheWire) {
  auto spec = [](std::string_view s) {
    auto codec = MakeCodec(s);
    return codec.ok() ? std::string((*codec)->spec()) : std::string(codec.status().message());
  };
  EXPECT_EQ(spec("qsgd(s=16, level=cat)"),
            "qsgd(s=16, bucket=512, level=cat, min=1, overhead=16384)");
  EXPECT_EQ(spec("qsgd(s=16, level=fixed)"), "qsgd(s=16, bucket=512)");
  EXPECT_THAT(spec("qsgd(s=16, min=2)"), HasSubstr("min and overhead are arguments of level=cat"));
  EXPECT_THAT(
      spec("qsgd(s=4, level=cat, min=8)"),
      HasSubstr("level=cat needs min <= s (the most levels a payload uses), got min=8 and s=4"));
  // A payload's s must lie in [min, s]; its levels are bounded by it.
  auto codec = MakeOk("qsgd(s=8, bucket=512, level=cat, min=2)");
  const std::string prefix = "qsgd(s=8, bucket=512, level=cat, min=2, overhead=16384): ";
  auto with_levels = [](uint64_t s, std::vector<int> bits) {
    std::string b;
    internal::PutU8(&b, FormatByte(PayloadFormat::kQsgd));
    internal::PutVarint(&b, 1);
    internal::PutF32(&b, 1.0f);
    internal::PutVarint(&b, s);
    internal::BitWriter w(&b);
    for (int bit : bits) w.Put(static_cast<uint64_t>(bit), 1);
    w.Finish();
    return b;
  };
  EXPECT_EQ(DecodeError(*codec, with_levels(1, {1}), 1), prefix + "s = 1 is outside [2, 8]");
  EXPECT_EQ(DecodeError(*codec, with_levels(9, {1}), 1), prefix + "s = 9 is outside [2, 8]");
  // s = 5: level 6 (code 7, read as 0 0 1 1 1) is above it; s = 2 allows no code with
  // two leading zeros at all.
  EXPECT_EQ(DecodeError(*codec, with_levels(5, {0, 0, 1, 1, 1, 0}), 1),
            prefix + "value 0 has level 6, above s = 5");
  EXPECT_EQ(DecodeError(*codec, with_levels(2, {0, 0, 1, 0, 0, 0}), 1),
            prefix + "level code too long at value 0");
  // s = 4: level 2 (code 3 = 011, read as 0 then 11), positive: 1.0 * 2 / 4.
  std::vector<float> out(1);
  ASSERT_TRUE(codec->Decode(with_levels(4, {0, 1, 1, 0}), out).ok());
  EXPECT_EQ(out[0], 0.5f);
}

}  // namespace
}  // namespace ps::codecs
