#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "gtest/gtest.h"

namespace ps::codecs {
namespace {

class Fp32CodecTest : public ::testing::Test {
 protected:
  void SetUp() override { codec_ = std::move(MakeCodec("fp32")).value(); }

  // A valid payload for values, built by hand rather than by the codec.
  static std::string Payload(const std::vector<uint32_t>& bits) {
    std::string bytes(1, '\x01');
    for (uint32_t b : bits) {
      for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<char>((b >> (8 * k)) & 0xffu));
    }
    return bytes;
  }

  std::unique_ptr<Codec> codec_;
};

TEST_F(Fp32CodecTest, WritesVersionThenLittleEndianFloats) {
  std::string bytes;
  ASSERT_TRUE(codec_->Encode(std::vector<float>{1.0f, -2.5f}, &bytes).ok());
  EXPECT_EQ(bytes, std::string("\x01\x00\x00\x80\x3f\x00\x00\x20\xc0", 9));
  EXPECT_EQ(bytes, Payload({0x3f800000u, 0xc0200000u}));
}

TEST_F(Fp32CodecTest, RoundTripIsBitExactForEveryFiniteValue) {
  std::vector<float> values = {0.0f,         -0.0f,         FLT_MIN, -FLT_MIN, FLT_MAX,  -FLT_MAX,
                               FLT_TRUE_MIN, -FLT_TRUE_MIN, 1e-40f,  0.1f,     3.14159f, -1e30f};
  std::mt19937 rng(7);
  while (values.size() < 10000) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isfinite(f)) values.push_back(f);
  }
  std::string bytes;
  ASSERT_TRUE(codec_->Encode(values, &bytes).ok());
  std::vector<float> decoded(values.size());
  ASSERT_TRUE(codec_->Decode(bytes, decoded).ok());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(decoded[i]), std::bit_cast<uint32_t>(values[i])) << i;
  }
}

// Into a used output as long as the payload (the worker's recycled strings), values are
// copied and checked in one pass: every value arrives, and the first non-finite one is
// refused by index wherever it lies (first block, a later one, the tail; 5,000 values
// are four blocks of 1,024 and a tail), with the output kept.
TEST_F(Fp32CodecTest, EncodeIntoAUsedOutputNamesTheFirstNonFiniteValue) {
  std::vector<float> values(5000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 7.0f;
  std::string used(1 + 4 * values.size(), 'x');
  ASSERT_TRUE(codec_->Encode(values, &used).ok());
  std::string want;
  ASSERT_TRUE(MakeCodec("fp32").value()->Encode(values, &want).ok());
  ASSERT_EQ(used, want);
  for (size_t at : {size_t{0}, size_t{1023}, size_t{1024}, size_t{3000}, size_t{4095},
                    size_t{4096}, size_t{4999}}) {
    std::vector<float> bad = values;
    bad[at] = INFINITY;
    if (at + 7 < bad.size()) bad[at + 7] = std::nanf("");  // only the first is named
    std::string out = want;
    const absl::Status s = codec_->Encode(bad, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), "fp32: cannot encode value " + std::to_string(at) + ": not finite (inf)");
    EXPECT_EQ(out, want);
  }
}

TEST_F(Fp32CodecTest, DecodeRefusesNonFiniteValuesNamingTheFirst) {
  struct Case {
    uint32_t bits;
    const char* printed;
  };
  for (const Case& c :
       {Case{0x7fc00000u, "nan"}, Case{0x7f800001u, "nan"}, Case{0xffc00000u, "nan"},
        Case{0x7f800000u, "inf"}, Case{0xff800000u, "-inf"}}) {
    const std::string bytes = Payload({0x3f800000u, c.bits, 0x7f800000u});
    std::vector<float> out(3);
    const absl::Status s = codec_->Decode(bytes, out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    // The sign of a NaN is not printed consistently across libcs; match the rest.
    EXPECT_TRUE(s.message() == std::string("fp32: value 1 is not finite (") + c.printed + ")" ||
                s.message() == std::string("fp32: value 1 is not finite (-") + c.printed + ")")
        << s.message();
  }
}

TEST_F(Fp32CodecTest, DecodesSubnormalsAndSignedZero) {
  const std::string bytes = Payload({0x00000001u, 0x80000000u, 0x807fffffu});
  std::vector<float> out(3);
  ASSERT_TRUE(codec_->Decode(bytes, out).ok());
  EXPECT_EQ(std::bit_cast<uint32_t>(out[0]), 0x00000001u);
  EXPECT_EQ(std::bit_cast<uint32_t>(out[1]), 0x80000000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(out[2]), 0x807fffffu);
}

}  // namespace
}  // namespace ps::codecs
