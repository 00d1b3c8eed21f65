// Behaviour every codec shares: the factory, the framing (version byte, exact
// sizes), MaxEncodedBytes, and the decode errors that need no knowledge of the body.
#include "codecs/codec.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::MakeOk;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Values every codec represents exactly: multiples of 1/8 in [-16, 16].
std::vector<float> ExactValues(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    // Numerators of at most 8 significant bits: exact in fp32, fp16 and bf16.
    v[i] = static_cast<float>(static_cast<int>(i * 37 % 257) - 128) / 8;
  return v;
}

TEST(MakeCodecTest, MakesEveryListedCodecWithItsSpec) {
  for (const std::string& name : CodecNames()) {
    auto codec = MakeCodec(name);
    ASSERT_TRUE(codec.ok()) << codec.status();
    // The canonical spec writes every argument out: "3lc" -> "3lc(s=1)".
    EXPECT_TRUE((*codec)->spec().starts_with(name)) << (*codec)->spec();
    auto again = MakeCodec((*codec)->spec());
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ((*again)->spec(), (*codec)->spec());
  }
}

TEST(MakeCodecTest, ListsNamesInStableOrder) {
  EXPECT_THAT(CodecNames(), ElementsAre("fp32", "fp16", "bf16", "sign", "3lc", "topk", "threshold",
                                       "randk", "powersgd", "int8", "qsgd", "terngrad"));
}

TEST(MakeCodecTest, RefusesUnknownSpecListingKnownOnes) {
  auto codec = MakeCodec("x");
  ASSERT_FALSE(codec.ok());
  EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.status().message(),
            "unknown codec 'x'; known: fp32, fp16, bf16, sign, 3lc, topk, threshold, randk, "
            "powersgd, int8, qsgd, terngrad");
}

TEST(MakeCodecTest, IgnoresSpacesButFoldsNoCase) {
  for (const char* spec : {" fp16", "fp16 ", " fp16 "}) {
    auto codec = MakeCodec(spec);
    ASSERT_TRUE(codec.ok()) << "'" << spec << "': " << codec.status();
    EXPECT_EQ((*codec)->spec(), "fp16");
  }
  for (const char* spec : {"FP16", "fp"}) {
    auto codec = MakeCodec(spec);
    ASSERT_FALSE(codec.ok()) << "'" << spec << "'";
    EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(MakeCodec("fp").status().message(),
            absl::StrCat("unknown codec 'fp'; known: ", absl::StrJoin(CodecNames(), ", ")));
  EXPECT_THAT(MakeCodec("FP16").status().message(), HasSubstr("bad stage name"));
  EXPECT_THAT(MakeCodec("").status().message(), HasSubstr("codec spec"));
}

TEST(MakeCodecTest, RefusesArgumentsAndStagesADenseCodecDoesNotTake) {
  EXPECT_EQ(MakeCodec("fp16(3)").status().message(),
            "codec spec 'fp16(3)': fp16 takes no arguments, got '3'");
  EXPECT_EQ(MakeCodec("fp32+raw").status().message(),
            "codec spec 'fp32+raw': fp32 is a whole codec; '+raw' cannot follow it");
}

// Codec x numel: the numels cover empty, below, at and above the 8-wide vector path.
class CodecFramingTest : public ::testing::TestWithParam<std::tuple<std::string, size_t>> {
 protected:
  void SetUp() override { codec_ = MakeOk(spec()); }
  const std::string& spec() const { return std::get<0>(GetParam()); }
  size_t numel() const { return std::get<1>(GetParam()); }

  std::string Encoded() {
    std::string bytes;
    EXPECT_TRUE(codec_->Encode(ExactValues(numel()), &bytes).ok());
    return bytes;
  }

  std::string SizeError(size_t got) const {
    const size_t per_value = (codec_->MaxEncodedBytes(1) - 1);
    return absl::StrCat(spec(), ": payload is ", got, " bytes, expected ",
                        codec_->MaxEncodedBytes(numel()), " (1 + ", per_value, " * ", numel(),
                        " values)");
  }

  std::unique_ptr<Codec> codec_;
};

TEST_P(CodecFramingTest, EncodingStartsWithItsFormatAndHasMaxEncodedBytes) {
  const std::string bytes = Encoded();
  ASSERT_FALSE(bytes.empty());
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]), FormatByte(codec_->format()));
  EXPECT_EQ(bytes.size(), codec_->MaxEncodedBytes(numel()));
}

TEST_P(CodecFramingTest, RoundTripsExactlyRepresentableValues) {
  const std::vector<float> values = ExactValues(numel());
  std::string bytes;
  ASSERT_TRUE(codec_->Encode(values, &bytes).ok());
  std::vector<float> decoded(numel(), -1.0f);
  ASSERT_TRUE(codec_->Decode(bytes, decoded).ok());
  EXPECT_EQ(decoded, values);
}

TEST_P(CodecFramingTest, EncodeReplacesPreviousContent) {
  std::string bytes = "stale content that is longer than some encodings";
  ASSERT_TRUE(codec_->Encode(ExactValues(numel()), &bytes).ok());
  EXPECT_EQ(bytes, Encoded());
}

TEST_P(CodecFramingTest, ReencodingADecodedPayloadGivesTheSameBytes) {
  const std::string bytes = Encoded();
  std::vector<float> decoded(numel());
  ASSERT_TRUE(codec_->Decode(bytes, decoded).ok());
  std::string again;
  ASSERT_TRUE(codec_->Encode(decoded, &again).ok());
  EXPECT_EQ(again, bytes);
}

TEST_P(CodecFramingTest, DecodeRefusesEmptyInput) {
  std::vector<float> out(numel());
  const absl::Status s = codec_->Decode("", out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            absl::StrCat(spec(), ": empty payload, expected ", codec_->MaxEncodedBytes(numel()),
                         " bytes for ", numel(), " values"));
}

TEST_P(CodecFramingTest, DecodeRefusesFormatsNoCodecWrites) {
  std::vector<float> out(numel());
  const uint8_t own = FormatByte(codec_->format());
  for (unsigned char format : {0, 0x7f, 0xee, 0xff}) {
    std::string bytes = Encoded();
    bytes[0] = static_cast<char>(format);
    const absl::Status s = codec_->Decode(bytes, out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), absl::StrCat(spec(), ": payload in format ", format,
                                        ", which no codec writes, expected the ", spec(),
                                        " format (", own, ")"));
  }
}

TEST_P(CodecFramingTest, DecodeRefusesTruncatedPayload) {
  std::vector<float> out(numel());
  const std::string bytes = Encoded();
  for (size_t cut = 1; cut <= std::min<size_t>(bytes.size() - 1, 5); ++cut) {
    const absl::Status s =
        codec_->Decode(std::string_view(bytes).substr(0, bytes.size() - cut), out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), SizeError(bytes.size() - cut));
  }
}

TEST_P(CodecFramingTest, DecodeRefusesTrailingBytes) {
  std::vector<float> out(numel());
  for (size_t extra : {1, 2, 4, 100}) {
    const std::string bytes = Encoded() + std::string(extra, '\0');
    const absl::Status s = codec_->Decode(bytes, out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), SizeError(bytes.size()));
  }
}

TEST_P(CodecFramingTest, DecodeRefusesPayloadOfAnotherSliceSize) {
  std::vector<float> bigger(numel() + 1);
  const absl::Status s = codec_->Decode(Encoded(), bigger);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(numel() + 1, " values")));
}

TEST_P(CodecFramingTest, EncodeRefusesNonFiniteAndKeepsOutput) {
  const float bad_values[] = {std::nanf(""), INFINITY, -INFINITY};
  const char* names[] = {"nan", "inf", "-inf"};
  for (int k = 0; k < 3; ++k) {
    std::vector<float> values = ExactValues(numel() + 1);
    const size_t at = numel() / 2;
    values[at] = bad_values[k];
    std::string bytes = "unchanged";
    const absl::Status s = codec_->Encode(values, &bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(),
              absl::StrCat(spec(), ": cannot encode value ", at, ": not finite (", names[k], ")"));
    EXPECT_EQ(bytes, "unchanged");
  }
}

TEST_P(CodecFramingTest, DecodeNeverAcceptsRandomBytesOfWrongSize) {
  std::mt19937 rng(static_cast<uint32_t>(numel()));
  std::vector<float> out(numel());
  const size_t good = codec_->MaxEncodedBytes(numel());
  for (int trial = 0; trial < 200; ++trial) {
    size_t len = rng() % (good + 16);
    if (len == good) ++len;
    std::string bytes(len, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    EXPECT_EQ(codec_->Decode(bytes, out).code(), absl::StatusCode::kInvalidArgument);
  }
}

// The casts: one fixed-size encoding per value. Every other codec is covered by
// every_codec_test.cc and its own tests.
INSTANTIATE_TEST_SUITE_P(CastCodecs, CodecFramingTest,
                         ::testing::Combine(::testing::Values("fp32", "fp16", "bf16"),
                                            ::testing::Values<size_t>(0, 1, 7, 8, 9, 33, 1000)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param), "_n",
                                               std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ps::codecs

namespace ps::codecs {
namespace {

TEST(SharedStructureTest, OnlyRandomKSignAnd3lcOfferOne) {
  EXPECT_EQ((*MakeCodec("randk(0.1, seed=3)"))->shared_structure(), SharedStructure::kSeededSupport);
  EXPECT_EQ((*MakeCodec("randk(0.1)+fp16"))->shared_structure(), SharedStructure::kSeededSupport);
  EXPECT_EQ((*MakeCodec("sign"))->shared_structure(), SharedStructure::kSignBits);
  EXPECT_EQ((*MakeCodec("3lc"))->shared_structure(), SharedStructure::kTernaryDigits);
  EXPECT_EQ((*MakeCodec("3lc(s=1.5, level=cat)"))->shared_structure(),
            SharedStructure::kTernaryDigits);
  for (const char* spec : {"fp32", "topk(0.1)", "threshold(1)", "int8", "terngrad", "qsgd", "powersgd"}) {
    EXPECT_EQ((*MakeCodec(spec))->shared_structure(), SharedStructure::kNone) << spec;
  }
}

}  // namespace
}  // namespace ps::codecs
