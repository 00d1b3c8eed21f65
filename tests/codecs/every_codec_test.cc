// Properties every codec has, run over ExampleSpecs(): framing, bounded error,
// determinism, refusal of non-finite input, and decoders that refuse (never crash on,
// never accept non-finite values from) truncated, extended, resized and bit-flipped
// payloads.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/codecs/example_specs.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::Gaussian;

using testing::ExampleSpec;
using testing::ExampleSpecs;

double RelL2Error(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
    den += double{x[i]} * x[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

class EveryCodecTest : public ::testing::TestWithParam<std::tuple<ExampleSpec, size_t>> {
 protected:
  void SetUp() override {
    auto made = MakeCodec(example().spec);
    ASSERT_TRUE(made.ok()) << made.status();
    codec_ = *std::move(made);
    ctx_.round = 3;
    ctx_.slice_id = 5;
    ctx_.worker_id = 1;
    values_ = Gaussian(numel(), static_cast<uint32_t>(numel()) + 17);
    ASSERT_TRUE(codec_->Encode(values_, ctx_, &bytes_).ok());
  }
  const ExampleSpec& example() const { return std::get<0>(GetParam()); }
  size_t numel() const { return std::get<1>(GetParam()); }

  // Decode must refuse with INVALID_ARGUMENT and a message, or accept only finite values.
  void ExpectSafeDecode(std::string_view bytes, size_t n, bool must_refuse) {
    std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
    const absl::Status s = codec_->Decode(bytes, out);
    if (s.ok()) {
      EXPECT_FALSE(must_refuse) << "accepted " << bytes.size() << " bytes for " << n << " values";
      for (float v : out) ASSERT_TRUE(std::isfinite(v));
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_FALSE(s.message().empty());
    }
    ExpectPiecesAgree(bytes, s, out);
    EXPECT_EQ(codec_->Check(bytes, n), s) << "Check and Decode disagree";
  }

  // DecodePieces of `bytes` cut into pieces (the version byte alone; thirds; with empty
  // pieces between) gives Decode's status and, when it accepts, Decode's bits.
  void ExpectPiecesAgree(std::string_view bytes, const absl::Status& whole,
                         const std::vector<float>& whole_out) {
    const size_t a = bytes.size() / 3, b = 2 * bytes.size() / 3, one = std::min<size_t>(1, bytes.size());
    const std::vector<std::vector<std::string_view>> cuts = {
        {bytes.substr(0, one), bytes.substr(one)},
        {bytes.substr(0, a), {}, bytes.substr(a, b - a), bytes.substr(b), {}},
    };
    for (const auto& pieces : cuts) {
      std::vector<float> out(whole_out.size(), std::numeric_limits<float>::quiet_NaN());
      const absl::Status s = codec_->DecodePieces(pieces, out);
      EXPECT_EQ(s, whole) << pieces.size() << " pieces";
      if (s.ok() && whole.ok()) {
        EXPECT_EQ(std::memcmp(out.data(), whole_out.data(), out.size() * sizeof(float)), 0);
      }
    }
  }

  std::unique_ptr<Codec> codec_;
  EncodeContext ctx_;
  std::vector<float> values_;
  std::string bytes_;
};

TEST_P(EveryCodecTest, SpecIsCanonicalAndMakesTheSameCodec) {
  auto again = MakeCodec(codec_->spec());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->spec(), codec_->spec());
  std::string bytes;
  ASSERT_TRUE((*again)->Encode(values_, ctx_, &bytes).ok());
  EXPECT_EQ(bytes, bytes_) << "same spec, input and context must give the same bytes";
}

// Bytes handed to another family's codec are refused, naming the format they are in
// (an fp16 payload decoded as bf16 gave other values before formats named their family).
TEST_P(EveryCodecTest, AnotherFamilysCodecRefusesThePayloadNamingItsFormat) {
  const std::string name(PayloadFormatName(FormatByte(codec_->format())));
  ASSERT_FALSE(name.empty());
  for (const ExampleSpec& other : ExampleSpecs()) {
    auto decoder = MakeCodec(other.spec);
    ASSERT_TRUE(decoder.ok()) << decoder.status();
    if ((*decoder)->format() == codec_->format()) continue;
    std::vector<float> out(numel());
    const absl::Status s = (*decoder)->Decode(bytes_, out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << other.spec << ": " << s;
    EXPECT_THAT(std::string(s.message()),
                ::testing::HasSubstr(absl::StrCat("payload in the ", name, " format")))
        << example().spec << " decoded as " << other.spec;
  }
}

TEST_P(EveryCodecTest, StartsWithItsFormatAndFitsMaxEncodedBytes) {
  ASSERT_FALSE(bytes_.empty());
  EXPECT_EQ(static_cast<unsigned char>(bytes_[0]), FormatByte(codec_->format()));
  EXPECT_LE(bytes_.size(), codec_->MaxEncodedBytes(numel()));
}

TEST_P(EveryCodecTest, RoundTripErrorIsBounded) {
  std::vector<float> out(numel());
  ASSERT_TRUE(codec_->Decode(bytes_, out).ok()) << codec_->Decode(bytes_, out);
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LE(RelL2Error(values_, out), example().max_rel_l2_error + 1e-9);
}

TEST_P(EveryCodecTest, EncodesZerosAsZeros) {
  const std::vector<float> zeros(numel(), 0.0f);
  std::string bytes;
  ASSERT_TRUE(codec_->Encode(zeros, ctx_, &bytes).ok());
  std::vector<float> out(numel(), 1.0f);
  ASSERT_TRUE(codec_->Decode(bytes, out).ok());
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

// Slices with a value to poison (NonEmpty below).
class NonEmptyCodecTest : public EveryCodecTest {};

TEST_P(NonEmptyCodecTest, EncodeRefusesNonFiniteAndKeepsOutput) {
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> values = values_;
    values[numel() / 2] = bad;
    std::string bytes = "unchanged";
    const absl::Status s = codec_->Encode(values, ctx_, &bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("not finite"));
    EXPECT_EQ(bytes, "unchanged");
  }
}

// The same after the codec encoded into a longer used output, which it keeps (fp32 then
// copies and checks in one pass into what it keeps).
TEST_P(NonEmptyCodecTest, EncodeRefusesNonFiniteAfterAUsedOutputAndKeepsOutput) {
  std::string used(bytes_.size() + 64, 'x');
  ASSERT_TRUE(codec_->Encode(values_, ctx_, &used).ok());
  for (size_t at : {size_t{0}, numel() / 2, numel() - 1}) {
    std::vector<float> values = values_;
    values[at] = std::nanf("");
    std::string bytes = "unchanged";
    const absl::Status s = codec_->Encode(values, ctx_, &bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("not finite"));
    EXPECT_EQ(bytes, "unchanged");
  }
  std::string again;
  ASSERT_TRUE(codec_->Encode(values_, ctx_, &again).ok());
}

// A used output, of any length (a worker hands the strings of a round's sent payloads
// back for the next round's encode), ends with the bytes an empty one gets, call after
// call (two codecs made alike, so a codec that keeps state between calls is compared
// with itself).
TEST_P(EveryCodecTest, EncodeIntoUsedOutputsGivesTheSameBytes) {
  auto fresh = MakeCodec(example().spec);
  auto reused = MakeCodec(example().spec);
  ASSERT_TRUE(fresh.ok() && reused.ok());
  const std::vector<float> other = Gaussian(numel(), static_cast<uint32_t>(numel()) + 29);
  const std::vector<const std::vector<float>*> inputs = {&values_, &other, &values_, &other,
                                                         &values_};
  std::vector<std::string> used = {std::string(bytes_.size() + 100, 'x'),
                                   std::string(bytes_.size(), 'y'), "z", std::string(3, 'w'),
                                   std::string(bytes_.size() + 1, 'v')};
  for (size_t k = 0; k < inputs.size(); ++k) {
    std::string want;
    ASSERT_TRUE((*fresh)->Encode(*inputs[k], ctx_, &want).ok());
    ASSERT_TRUE((*reused)->Encode(*inputs[k], ctx_, &used[k]).ok());
    EXPECT_EQ(used[k], want) << "call " << k;
  }
}

TEST_P(EveryCodecTest, DecodePiecesGivesDecodesValues) {
  std::vector<float> whole(numel());
  ASSERT_TRUE(codec_->Decode(bytes_, whole).ok());
  ExpectPiecesAgree(bytes_, absl::OkStatus(), whole);
}

TEST_P(EveryCodecTest, DecodeRefusesEveryTruncation) {
  const size_t step = std::max<size_t>(1, bytes_.size() / 64);
  for (size_t len = 0; len < bytes_.size(); len += step) {
    ExpectSafeDecode(std::string_view(bytes_).substr(0, len), numel(), /*must_refuse=*/true);
  }
}

TEST_P(EveryCodecTest, DecodeRefusesTrailingBytes) {
  for (size_t extra : {1, 7, 100}) {
    ExpectSafeDecode(bytes_ + std::string(extra, '\x01'), numel(), /*must_refuse=*/true);
  }
}

TEST_P(EveryCodecTest, DecodeRefusesAnotherSliceSize) {
  ExpectSafeDecode(bytes_, numel() + 1, /*must_refuse=*/true);
  if (numel() > 0) ExpectSafeDecode(bytes_, numel() - 1, /*must_refuse=*/true);
}

TEST_P(EveryCodecTest, DecodeRefusesAFormatNoCodecWrites) {
  std::string bytes = bytes_;
  bytes[0] = static_cast<char>(0xee);
  ExpectSafeDecode(bytes, numel(), /*must_refuse=*/true);
}

TEST_P(EveryCodecTest, DecodeSurvivesBitFlipsAndRandomBytes) {
  std::mt19937 rng(static_cast<uint32_t>(numel()) * 7 + 1);
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes = bytes_;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      bytes[rng() % bytes.size()] ^= static_cast<char>(1u << (rng() % 8));
    }
    ExpectSafeDecode(bytes, numel(), /*must_refuse=*/false);
  }
  for (int trial = 0; trial < 100; ++trial) {
    std::string bytes(rng() % (bytes_.size() + 32), '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    if (!bytes.empty()) bytes[0] = static_cast<char>(FormatByte(codec_->format()));
    ExpectSafeDecode(bytes, numel(), /*must_refuse=*/false);
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, EveryCodecTest,
                         ::testing::Combine(::testing::ValuesIn(ExampleSpecs()),
                                            ::testing::Values<size_t>(0, 1, 7, 64, 1000, 4099)),
                         [](const auto& info) { return testing::ExampleName(info); });
INSTANTIATE_TEST_SUITE_P(NonEmpty, NonEmptyCodecTest,
                         ::testing::Combine(::testing::ValuesIn(ExampleSpecs()),
                                            ::testing::Values<size_t>(1, 7, 64, 1000, 4099)),
                         [](const auto& info) { return testing::ExampleName(info); });

}  // namespace
}  // namespace ps::codecs
