#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/half_internal.h"
#include "gtest/gtest.h"

namespace ps::codecs {
namespace {

using internal::FloatToHalf;
using internal::HalfToFloat;

// Compile-time spot checks of the scalar conversions.
static_assert(FloatToHalf(1.0f) == 0x3c00);
static_assert(FloatToHalf(65504.0f) == 0x7bff);
static_assert(FloatToHalf(0x1p-24f) == 0x0001);
static_assert(HalfToFloat(0x3c00) == 1.0f);
static_assert(HalfToFloat(0x0001) == 0x1p-24f);

// The value of a half from its definition, independent of HalfToFloat's bit tricks.
double ReferenceValue(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

bool IsFiniteHalf(uint16_t h) { return (h & 0x7c00) != 0x7c00; }

struct Known {
  float value;
  uint16_t bits;
};

TEST(HalfConversionTest, EncodesKnownBitPatterns) {
  const Known cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.5f, 0x3800},
      {65504.0f, 0x7bff},
      {-65504.0f, 0xfbff},
      {0x1p-14f, 0x0400},
      {0x1p-24f, 0x0001},
      {-0x1p-24f, 0x8001},
      {1023 * 0x1p-24f, 0x03ff},
      {0.1f, 0x2e66},
      {1.0f / 3, 0x3555},
      {1024.0f, 0x6400},
      {0.099975586f, 0x2e66},
  };
  for (const Known& k : cases) {
    EXPECT_EQ(FloatToHalf(k.value), k.bits) << k.value;
    if (k.value != 0.1f && k.value != 1.0f / 3) {
      EXPECT_EQ(HalfToFloat(k.bits), k.value);
    }
  }
}

TEST(HalfConversionTest, RoundsTiesToEven) {
  const Known cases[] = {
      {1.0f + 0x1p-11f, 0x3c00},             // halfway 1 (even) / 1 + 2^-10 (odd)
      {1.0f + 3 * 0x1p-11f, 0x3c02},         // halfway odd / even: up
      {1.0f + 0x1p-11f + 0x1p-23f, 0x3c01},  // just above a tie: up
      {1.0f + 0x1p-11f - 0x1p-23f, 0x3c00},  // just below a tie: down
      {2049.0f, 0x6800},                     // spacing 2 above 2048
      {2051.0f, 0x6802},
      {0x1p-25f, 0x0000},      // half the smallest subnormal
      {3 * 0x1p-25f, 0x0002},  // subnormal ties
      {5 * 0x1p-25f, 0x0002},
      {-3 * 0x1p-25f, 0x8002},
      {0x1p-25f + 0x1p-40f, 0x0001},
      {0x1p-14f - 0x1p-26f, 0x0400},  // largest subnormal rounds up into normals
      {0x1p-14f - 0x1p-25f - 0x1p-26f, 0x03ff},
      {65488.0f, 0x7bfe},  // tie between 65472 (even) and 65504
  };
  for (const Known& k : cases) EXPECT_EQ(FloatToHalf(k.value), k.bits) << k.value;
}

TEST(HalfConversionTest, SaturatesInsteadOfOverflowingToInf) {
  for (float v : {65504.5f, 65519.0f, 65520.0f, 65536.0f, 1e6f, 3e38f, FLT_MAX}) {
    EXPECT_EQ(FloatToHalf(v), 0x7bff) << v;
    EXPECT_EQ(FloatToHalf(-v), 0xfbff) << v;
  }
}

TEST(HalfConversionTest, UnderflowsToSignedZero) {
  for (float v : {1e-10f, 0x1p-26f, FLT_MIN, FLT_TRUE_MIN, 0x1p-25f}) {
    EXPECT_EQ(FloatToHalf(v), 0x0000) << v;
    EXPECT_EQ(FloatToHalf(-v), 0x8000) << v;
  }
}

TEST(HalfConversionTest, DecodesEveryHalfToItsExactValue) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float f = HalfToFloat(half);
    if (!IsFiniteHalf(half)) {
      EXPECT_FALSE(std::isfinite(f)) << h;
      EXPECT_EQ(std::isnan(f), (half & 0x3ff) != 0) << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), ReferenceValue(half)) << h;
    ASSERT_EQ(std::signbit(f), (half & 0x8000) != 0) << h;
  }
}

TEST(HalfConversionTest, EveryFiniteHalfSurvivesTheRoundTrip) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto half = static_cast<uint16_t>(h);
    if (IsFiniteHalf(half)) {
      ASSERT_EQ(FloatToHalf(HalfToFloat(half)), half) << h;
    }
  }
}

// Checks FloatToHalf(x) against the definition: no finite half is nearer to x, and
// on a tie the chosen one has an even mantissa. Beyond 65504 it must saturate.
void ExpectNearest(float x) {
  const uint16_t h = FloatToHalf(x);
  ASSERT_TRUE(IsFiniteHalf(h)) << x;
  ASSERT_EQ(std::signbit(HalfToFloat(h)), std::signbit(x)) << x;
  const double ax = std::fabs(static_cast<double>(x));
  const uint16_t mag = h & 0x7fff;
  if (ax > 65504) {
    ASSERT_EQ(mag, 0x7bff) << x;
    return;
  }
  const double err = std::fabs(ax - ReferenceValue(mag));
  for (int step : {-1, 1}) {
    const int other = mag + step;
    if (other < 0 || other > 0x7bff) continue;
    const double other_err = std::fabs(ax - ReferenceValue(static_cast<uint16_t>(other)));
    ASSERT_LE(err, other_err) << x;
    if (err == other_err) {
      ASSERT_EQ(mag & 1, 0) << "tie not to even for " << x;
    }
  }
}

TEST(HalfConversionTest, PicksTheNearestHalfAcrossAllMagnitudes) {
  // A stride through every fp32 bit pattern, plus each half's neighbourhood.
  for (uint64_t b = 0; b <= 0xffffffffu; b += 4093) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(b));
    if (std::isfinite(x)) ExpectNearest(x);
  }
  for (uint32_t h = 0; h <= 0x7bff; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const float next = HalfToFloat(static_cast<uint16_t>(std::min<uint32_t>(h + 1, 0x7bff)));
    for (float x :
         {f, std::nextafter(f, 0.0f), std::nextafter(f, INFINITY), (f + next) / 2,
          std::nextafter((f + next) / 2, 0.0f), std::nextafter((f + next) / 2, INFINITY)}) {
      ExpectNearest(x);
      ExpectNearest(-x);
    }
  }
}

class Fp16CodecTest : public ::testing::Test {
 protected:
  void SetUp() override { codec_ = std::move(MakeCodec("fp16")).value(); }

  static std::string Payload(const std::vector<uint16_t>& halves) {
    std::string bytes(1, '\x02');
    for (uint16_t h : halves) {
      bytes.push_back(static_cast<char>(h & 0xff));
      bytes.push_back(static_cast<char>(h >> 8));
    }
    return bytes;
  }

  std::unique_ptr<Codec> codec_;
};

TEST_F(Fp16CodecTest, WritesVersionThenLittleEndianHalves) {
  std::string bytes;
  ASSERT_TRUE(codec_->Encode(std::vector<float>{1.0f, -2.0f, 65504.0f, 0x1p-24f}, &bytes).ok());
  EXPECT_EQ(bytes, Payload({0x3c00, 0xc000, 0x7bff, 0x0001}));
  EXPECT_EQ(bytes, std::string("\x02\x00\x3c\x00\xc0\xff\x7b\x01\x00", 9));
}

TEST_F(Fp16CodecTest, EncodeSaturatesOverflowingGradients) {
  std::string bytes;
  // Enough values to go through the vector path as well as the scalar tail.
  std::vector<float> values(19, 1e9f);
  for (size_t i = 0; i < values.size(); i += 2) values[i] = -values[i];
  ASSERT_TRUE(codec_->Encode(values, &bytes).ok());
  std::vector<float> decoded(values.size());
  ASSERT_TRUE(codec_->Decode(bytes, decoded).ok());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(decoded[i], i % 2 ? 65504.0f : -65504.0f);
}

TEST_F(Fp16CodecTest, RoundTripErrorIsWithinHalfAnUlp) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::vector<float> values;
  for (int e = -30; e <= 15; ++e) {
    for (int k = 0; k < 200; ++k) {
      const float v = std::ldexp(mantissa(rng), e);
      values.push_back(k % 2 ? v : -v);
    }
  }
  std::string bytes;
  ASSERT_TRUE(codec_->Encode(values, &bytes).ok());
  std::vector<float> decoded(values.size());
  ASSERT_TRUE(codec_->Decode(bytes, decoded).ok());
  for (size_t i = 0; i < values.size(); ++i) {
    const double x = values[i];
    const double err = std::fabs(decoded[i] - x);
    if (std::fabs(x) >= 0x1p-14) {
      ASSERT_LE(err, std::fabs(x) * 0x1p-11) << x;  // 11-bit significand
    } else {
      ASSERT_LE(err, 0x1p-25) << x;  // subnormal spacing 2^-24
    }
  }
}

TEST_F(Fp16CodecTest, DecodesSubnormalsAndSignedZero) {
  std::vector<float> out(4);
  ASSERT_TRUE(codec_->Decode(Payload({0x0001, 0x83ff, 0x8000, 0x0400}), out).ok());
  EXPECT_EQ(out[0], 0x1p-24f);
  EXPECT_EQ(out[1], -1023 * 0x1p-24f);
  EXPECT_EQ(std::bit_cast<uint32_t>(out[2]), 0x80000000u);
  EXPECT_EQ(out[3], 0x1p-14f);
}

TEST_F(Fp16CodecTest, DecodeRefusesInfAndNanNamingTheFirst) {
  for (uint16_t bad : {0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xffff}) {
    // Put the bad value at index 9 so the vector path sees it, with a later one too.
    std::vector<uint16_t> halves(20, 0x3c00);
    halves[9] = bad;
    halves[15] = 0x7c00;
    std::vector<float> out(halves.size());
    const absl::Status s = codec_->Decode(Payload(halves), out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    char hex[8];
    std::snprintf(hex, sizeof(hex), "%04x", bad);
    EXPECT_EQ(s.message(), std::string("fp16: value 9 is not finite (bits 0x") + hex + ")");
  }
}

// The F16C path must give the same bytes and floats as the portable one.
class F16cTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!internal::HaveF16c()) GTEST_SKIP() << "this CPU has no F16C; only the portable path runs";
  }
};

TEST_F(F16cTest, DecodesEveryFiniteHalfLikeThePortablePath) {
  std::vector<unsigned char> in;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    in.push_back(static_cast<unsigned char>(h & 0xff));
    in.push_back(static_cast<unsigned char>(h >> 8));
  }
  // Odd count: the scalar tail runs too.
  std::vector<float> portable(0x10000 - 3), f16c(0x10000 - 3);
  internal::HalvesToFloatsPortable(in.data(), portable);
  internal::HalvesToFloatsF16c(in.data(), f16c);
  for (size_t i = 0; i < portable.size(); ++i) {
    if (std::isfinite(portable[i])) {
      ASSERT_EQ(std::bit_cast<uint32_t>(f16c[i]), std::bit_cast<uint32_t>(portable[i])) << i;
    } else {
      ASSERT_EQ(std::isnan(f16c[i]), std::isnan(portable[i])) << i;
      ASSERT_FALSE(std::isfinite(f16c[i])) << i;
    }
  }
}

TEST_F(F16cTest, EncodesLikeThePortablePath) {
  std::vector<float> values;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 997) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(b));
    if (std::isfinite(x)) values.push_back(x);
  }
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (!std::isfinite(f)) continue;
    const float next = HalfToFloat(static_cast<uint16_t>(h + 1 <= 0xffff ? h + 1 : h));
    values.insert(values.end(),
                  {f, std::nextafter(f, 0.0f), std::nextafter(f, INFINITY), (f + next) / 2,
                   std::nextafter((f + next) / 2, 0.0f), std::nextafter((f + next) / 2, INFINITY)});
  }
  values.insert(values.end(), {65519.996f, 65520.0f, FLT_MAX, -FLT_MAX, FLT_TRUE_MIN});
  values.push_back(1.0f);  // an odd count, so the tail path is compared too
  std::vector<float> finite;
  for (float v : values) {
    if (std::isfinite(v)) finite.push_back(v);
  }
  std::vector<unsigned char> portable(2 * finite.size()), f16c(2 * finite.size());
  internal::FloatsToHalvesPortable(finite, portable.data());
  internal::FloatsToHalvesF16c(finite, f16c.data());
  for (size_t i = 0; i < finite.size(); ++i) {
    ASSERT_EQ(internal::Load16(f16c.data(), i), internal::Load16(portable.data(), i))
        << "value " << finite[i];
  }
}

}  // namespace
}  // namespace ps::codecs
