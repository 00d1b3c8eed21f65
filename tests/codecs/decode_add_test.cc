// Codec::DecodeAddPieces (codec.h) against its definition: DecodePieces, then the
// shard's addition (core::AddInto onto a copy of base) and a scan for non-finite sums.
// The same status (code and message) and, when it accepts, the same bits in what is
// held and in out, for every
// codec (the default and the fused overrides of 3lc, fp32, fp16, bf16 and int8), on
// random changes and bases (zeros and -0 among them), slice sizes on both sides of the
// fast paths' thresholds, pieces cut at odd places, corrupted payloads, and sums that
// overflow or start from Inf and NaN.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "core/fp32_bytes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"
#include "tests/codecs/example_specs.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::Gaussian;
using ::ps::codecs::testing::HeldValues;
using ::ps::codecs::testing::MakeOk;

// The codecs with a fused DecodeAddPieces (the rest take the default).
const char* const kFused[] = {"3lc", "3lc(s=1.9)", "3lc(s=1.5, level=cat)", "fp32", "fp16",
                              "bf16", "int8", "int8(bucket=7)"};

// What DecodeAddPieces must give: the worker's former steps, one by one.
absl::Status Reference(const Codec& codec, std::span<const std::string_view> pieces,
                       const std::vector<float>& base, std::vector<float>* out) {
  std::vector<float> change(base.size());
  if (absl::Status st = codec.DecodePieces(pieces, change); !st.ok()) return st;
  *out = base;
  core::AddInto(*out, change);  // held + change, as the shard adds
  if (const ptrdiff_t i = core::FindNonFinite(*out); i >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("value ", i, " is not finite once the change is applied"));
  }
  return absl::OkStatus();
}

// Ways to cut a payload into pieces: whole, the version byte alone, thirds with empty
// pieces between, a few random cuts (mostly inside a value), and pieces of 4093 bytes
// (across the 4096-byte blocks of the dense codecs).
std::vector<std::vector<std::string_view>> Cuts(std::string_view bytes, std::mt19937& rng) {
  std::vector<std::vector<std::string_view>> cuts;
  cuts.push_back({bytes});
  const size_t one = std::min<size_t>(1, bytes.size());
  cuts.push_back({bytes.substr(0, one), bytes.substr(one)});
  const size_t a = bytes.size() / 3, b = 2 * bytes.size() / 3;
  cuts.push_back({{}, bytes.substr(0, a), {}, bytes.substr(a, b - a), bytes.substr(b), {}});
  for (int k = 0; k < 2; ++k) {
    std::vector<size_t> at = {0, bytes.size()};
    for (int c = 0; c < 4; ++c) at.push_back(bytes.empty() ? 0 : rng() % bytes.size());
    std::sort(at.begin(), at.end());
    std::vector<std::string_view> pieces;
    for (size_t i = 0; i + 1 < at.size(); ++i) pieces.push_back(bytes.substr(at[i], at[i + 1] - at[i]));
    cuts.push_back(pieces);
  }
  if (bytes.size() > 8192) {
    std::vector<std::string_view> pieces;
    for (size_t at = 0; at < bytes.size(); at += 4093) pieces.push_back(bytes.substr(at, 4093));
    cuts.push_back(pieces);
  }
  return cuts;
}

// DecodeAddPieces of every cut of `bytes` onto a copy of base gives Reference's status
// and, when it accepts, its bits both in what is held and in out.
void ExpectSameAsReference(const Codec& codec, std::string_view bytes,
                           const std::vector<float>& base, std::mt19937& rng) {
  for (const std::vector<std::string_view>& pieces : Cuts(bytes, rng)) {
    std::vector<float> want;
    const absl::Status want_st = Reference(codec, pieces, base, &want);
    std::vector<float> held = base;
    std::vector<float> got(base.size(), std::numeric_limits<float>::quiet_NaN());
    const absl::Status got_st = codec.DecodeAddPieces(pieces, held, got);
    ASSERT_EQ(got_st, want_st) << codec.spec() << ", " << pieces.size() << " pieces, "
                               << bytes.size() << " bytes";
    if (want_st.ok()) {
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << codec.spec() << ": sums differ, " << pieces.size() << " pieces";
      ASSERT_EQ(std::memcmp(held.data(), want.data(), held.size() * sizeof(float)), 0)
          << codec.spec() << ": what is held is not the sums, " << pieces.size() << " pieces";
    }
  }
}

class DecodeAddTest
    : public ::testing::TestWithParam<std::tuple<testing::ExampleSpec, size_t>> {
 protected:
  void SetUp() override {
    codec_ = MakeOk(std::get<0>(GetParam()).spec, /*seed=*/5);
    ASSERT_NE(codec_, nullptr);
  }
  size_t numel() const { return std::get<1>(GetParam()); }

  std::unique_ptr<Codec> codec_;
};

TEST_P(DecodeAddTest, MatchesDecodeThenAdd) {
  const size_t n = numel();
  std::mt19937 rng(static_cast<uint32_t>(n) * 31 + 7);
  const std::vector<float> base = HeldValues(n, static_cast<uint32_t>(n) + 1);
  for (uint64_t round = 0; round < 3; ++round) {
    const std::string bytes =
        testing::EncodeOk(*codec_, Gaussian(n, static_cast<uint32_t>(n + 100 * round)), round);
    ExpectSameAsReference(*codec_, bytes, base, rng);
  }
  // Zeros: every change value 0, each sum base + 0.
  ExpectSameAsReference(*codec_, testing::EncodeOk(*codec_, std::vector<float>(n, 0.0f)), base, rng);
}

TEST_P(DecodeAddTest, CorruptedPayloadsAreRefusedAsDecodeRefusesThem) {
  const size_t n = numel();
  std::mt19937 rng(static_cast<uint32_t>(n) * 17 + 3);
  const std::vector<float> base = HeldValues(n, 9);
  const std::string bytes = testing::EncodeOk(*codec_, Gaussian(n, 4));
  for (int trial = 0; trial < 40; ++trial) {
    std::string bad = bytes;
    for (int f = 1 + static_cast<int>(rng() % 3); f > 0; --f) {
      bad[rng() % bad.size()] ^= static_cast<char>(1u << (rng() % 8));
    }
    ExpectSameAsReference(*codec_, bad, base, rng);
  }
  ExpectSameAsReference(*codec_, bytes.substr(0, bytes.size() / 2), base, rng);
  ExpectSameAsReference(*codec_, bytes + "\x01", base, rng);
}

INSTANTIATE_TEST_SUITE_P(
    Examples, DecodeAddTest,
    ::testing::Combine(::testing::ValuesIn(testing::ExampleSpecs()),
                       ::testing::Values<size_t>(0, 1, 7, 1000, 4099)),
    [](const auto& info) { return testing::ExampleName(info); });

// The fused codecs on longer slices: 3lc's branch-free path from 4096 values on, the
// dense codecs' blocks of 4096 bytes, a default slice and a bit.
TEST(DecodeAddFusedTest, LongSlicesMatchDecodeThenAdd) {
  for (const char* spec : kFused) {
    auto codec = MakeOk(spec, /*seed=*/3);
    ASSERT_NE(codec, nullptr);
    for (size_t n : {4095, 4096, 10007, 65539}) {
      std::mt19937 rng(static_cast<uint32_t>(n));
      const std::vector<float> base = HeldValues(n, static_cast<uint32_t>(n) + 2);
      std::vector<float> x = Gaussian(n, static_cast<uint32_t>(n) + 3);
      // A sparse change too (3lc's zero runs): most values far below the largest.
      std::vector<float> sparse(n, 0.0f);
      for (size_t i = 0; i < n; i += 97) sparse[i] = x[i];
      for (const std::vector<float>* change : {&x, &sparse}) {
        SCOPED_TRACE(absl::StrCat(spec, " n=", n, change == &x ? " dense" : " sparse"));
        ExpectSameAsReference(*codec, testing::EncodeOk(*codec, *change, n), base, rng);
      }
    }
  }
}

// Sums that are not finite: from an Inf or NaN held value, and from a finite held value
// near FLT_MAX whose change pushes it over. Refused with the first such index, as the
// reference says, on short and long slices (ExpectSameAsReference).
TEST(DecodeAddFusedTest, NonFiniteSumsAreRefusedNamingTheFirst) {
  for (const char* spec : {"3lc", "3lc(s=1.9)", "fp32", "fp16", "bf16", "int8", "sign", "topk(0.3)"}) {
    auto codec = MakeOk(spec);
    ASSERT_NE(codec, nullptr);
    for (size_t n : {64, 5000}) {
      SCOPED_TRACE(absl::StrCat(spec, " n=", n));
      std::mt19937 rng(static_cast<uint32_t>(n) + 1);
      std::vector<float> x = Gaussian(n, 21);
      for (float& v : x) v *= 1e34f;
      const std::string bytes = testing::EncodeOk(*codec, x);
      std::vector<float> change(n);
      ASSERT_TRUE(codec->Decode(bytes, change).ok());

      std::vector<float> base = HeldValues(n, 5);
      base[n - 3] = INFINITY;
      ExpectSameAsReference(*codec, bytes, base, rng);
      base[n / 2] = std::numeric_limits<float>::quiet_NaN();
      ExpectSameAsReference(*codec, bytes, base, rng);

      // Overflow where the change is large enough to carry FLT_MAX past the last float.
      base = HeldValues(n, 5);
      int overflows = 0;
      for (size_t i = n / 3; i < n && overflows < 2; ++i) {
        if (std::abs(change[i]) >= 1e32f) {
          base[i] = std::copysign(FLT_MAX, change[i]);
          ++overflows;
        }
      }
      if (overflows == 0) continue;  // fp16 saturates at 65504: no sum can overflow
      std::vector<float> held = base, got(n);
      const absl::Status st =
          codec->DecodeAddPieces(std::vector<std::string_view>{bytes}, held, got);
      EXPECT_THAT(st.message(), ::testing::HasSubstr("is not finite once the change is applied"));
      ExpectSameAsReference(*codec, bytes, base, rng);
    }
  }
}

// 3lc's bound (max|base| + scale < FLT_MAX) fails, yet every sum is finite: held values
// near FLT_MAX whose change points back: accepted, the same bits.
TEST(DecodeAddFusedTest, ThreeLcNearFltMaxButFiniteIsAccepted) {
  auto codec = MakeOk("3lc");
  ASSERT_NE(codec, nullptr);
  for (size_t n : {64, 5000}) {
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::vector<float> x(n, 0.0f);
    x[n / 2] = -1e36f;
    const std::string bytes = testing::EncodeOk(*codec, x);
    std::vector<float> base = HeldValues(n, 8);
    base[n / 2] = FLT_MAX;
    std::vector<float> held = base, got(n);
    ASSERT_TRUE(codec->DecodeAddPieces(std::vector<std::string_view>{bytes}, held, got).ok());
    EXPECT_EQ(got[n / 2], FLT_MAX - 1e36f);
    EXPECT_EQ(held[n / 2], FLT_MAX - 1e36f);
    ExpectSameAsReference(*codec, bytes, base, rng);
  }
}

TEST(DecodeAddFusedTest, BaseOfAnotherSizeIsRefused) {
  for (const char* spec : kFused) {
    auto codec = MakeOk(spec);
    ASSERT_NE(codec, nullptr);
    const std::string bytes = testing::EncodeOk(*codec, Gaussian(10, 1));
    std::vector<float> held(9, 1.0f);
    std::vector<float> out(10);
    const absl::Status st = codec->DecodeAddPieces(std::vector<std::string_view>{bytes}, held, out);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << spec;
  }
}

}  // namespace
}  // namespace ps::codecs
