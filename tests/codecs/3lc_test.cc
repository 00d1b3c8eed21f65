// 3lc: wire format on hand-computed examples, the quantization rule, zero-run tokens
// against a plain reference encoder, both kernel paths, every decode refusal, args.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "aggregators/aggregator.h"
#include "codecs/3lc_internal.h"
#include "codecs/compressed.h"
#include "codecs/kernels_internal.h"
#include "codecs/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::Hex;
using ::ps::codecs::testing::ExpectRefused;
using ::ps::codecs::testing::MakeOk;

using ::testing::HasSubstr;

std::string Encode(Codec& codec, const std::vector<float>& values) {
  std::string bytes;
  const absl::Status s = codec.Encode(values, &bytes);
  EXPECT_TRUE(s.ok()) << s;
  return bytes;
}

std::string Bytes(std::initializer_list<int> bytes) {
  std::string out;
  for (int b : bytes) out.push_back(static_cast<char>(b));
  return out;
}

// The format from its definition: digits t + 1, value 5g + j at weight 3^j, greedy runs.
std::string ReferenceBody(const std::vector<float>& x, float half) {
  std::vector<int> groups;
  for (size_t g = 0; g * 5 < x.size(); ++g) {
    int b = 0, w = 1;
    for (size_t j = 0; j < 5; ++j, w *= 3) {
      int t = 0;
      if (5 * g + j < x.size()) t = x[5 * g + j] >= half ? 1 : (x[5 * g + j] <= -half ? -1 : 0);
      b += (t + 1) * w;
    }
    groups.push_back(b);
  }
  std::string out;
  for (size_t g = 0; g < groups.size();) {
    size_t r = 0;
    while (g + r < groups.size() && groups[g + r] == 121) ++r;
    if (r == 0) {
      out.push_back(static_cast<char>(groups[g++]));
      continue;
    }
    g += r;
    for (; r >= 14; r -= 14) out.push_back(static_cast<char>(255));
    if (r == 1) out.push_back(static_cast<char>(121));
    if (r >= 2) out.push_back(static_cast<char>(243 + r - 2));
  }
  return out;
}

absl::Status Decode(const Codec& codec, std::string_view bytes, size_t n) {
  std::vector<float> out(n);
  return codec.Decode(bytes, out);
}

TEST(ThreeLcTest, WireFormatOfASmallExample) {
  auto codec = MakeOk("3lc");
  // M = 1, M / 2 = 0.5: t = 1, -1, 0, 0, -1 | 1, 0 (+ three padding zeros).
  // Group 0: 2 + 0*3 + 1*9 + 1*27 + 0*81 = 38; group 1: 2 + 1*3 + 9 + 27 + 81 = 122.
  const std::vector<float> values = {1.0f, -0.5f, 0.25f, 0.0f, -1.0f, 0.6f, 0.0f};
  const std::string bytes = Encode(*codec, values);
  EXPECT_EQ(Hex(bytes), "08 07 00 00 80 3f 26 7a");
  std::vector<float> out(values.size());
  ASSERT_TRUE(codec->Decode(bytes, out).ok());
  EXPECT_EQ(out, (std::vector<float>{1, -1, 0, 0, -1, 1, 0}));
}

TEST(ThreeLcTest, WireFormatWithZeroRuns) {
  auto codec = MakeOk("3lc");
  // 20 groups: (2,1,1,1,1) = 122, 18 zero groups = 255 (14) + 245 (4), (1,1,1,1,0) = 40.
  std::vector<float> values(100, 0.0f);
  values[0] = 2.0f;
  values[99] = -2.0f;
  EXPECT_EQ(Hex(Encode(*codec, values)), "08 64 00 00 00 40 7a ff f5 28");
}

TEST(ThreeLcTest, RunsAreGreedyFourteensThenTheRest) {
  auto codec = MakeOk("3lc");
  const std::pair<size_t, std::string> cases[] = {
      {1, "79"},       {2, "f3"},       {13, "fe"},    {14, "ff"},       {15, "ff 79"},
      {16, "ff f3"},   {27, "ff fe"},   {28, "ff ff"}, {29, "ff ff 79"}, {43, "ff ff ff 79"},
  };
  for (const auto& [run, tokens] : cases) {
    // A non-zero group, `run` zero groups, a non-zero group.
    std::vector<float> values(5 * (run + 2), 0.0f);
    values[0] = 1.0f;
    values.back() = 1.0f;
    const std::string bytes = Encode(*codec, values);
    EXPECT_EQ(Hex(bytes.substr(bytes.size() - (tokens.size() + 1) / 3 - 2)),
              absl::StrCat("7a ", tokens, " ca"))
        << run;
    std::vector<float> out(values.size(), -1.0f);
    ASSERT_TRUE(codec->Decode(bytes, out).ok()) << run;
    EXPECT_EQ(out, values) << run;
  }
}

TEST(ThreeLcTest, QuantizesToScaledTernaryWithTiesAwayFromZero) {
  auto codec = MakeOk("3lc(s=1.5)");
  // M = 1.5, M / 2 = 0.75: 0.75 and -0.75 are ties and go to +-1.
  const std::vector<float> values = {1.0f, 0.74f, 0.75f, -0.75f, -0.7499f, 0.0f};
  std::vector<float> out(values.size());
  ASSERT_TRUE(codec->Decode(Encode(*codec, values), out).ok());
  EXPECT_EQ(out, (std::vector<float>{1.5f, 0, 1.5f, -1.5f, 0, 0}));
}

TEST(ThreeLcTest, LargestValueSurvivesEvenAtTheMostAggressiveS) {
  auto codec = MakeOk("3lc(s=1.999)");
  for (float v : {1.0f, -3.0f, 1e-30f, FLT_TRUE_MIN, FLT_MAX, -FLT_MAX}) {
    const std::vector<float> values = {0.0f, v, v / 4};
    std::vector<float> out(values.size());
    ASSERT_TRUE(codec->Decode(Encode(*codec, values), out).ok()) << v;
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_NE(out[1], 0.0f) << v;
    EXPECT_EQ(std::signbit(out[1]), std::signbit(v));
    EXPECT_TRUE(std::isfinite(out[1])) << v;  // M = max * s is clamped to FLT_MAX
    EXPECT_EQ(out[2], 0.0f) << v;
  }
}

TEST(ThreeLcTest, ErrorIsAtMostHalfTheScalePerValue) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> values(10007);
  for (float& v : values) v = normal(rng) * (normal(rng) > 1 ? 10.0f : 1.0f);
  float max_abs = 0;
  for (float v : values) max_abs = std::max(max_abs, std::fabs(v));
  for (const char* spec : {"3lc", "3lc(s=1.3)", "3lc(s=1.9)"}) {
    auto codec = MakeOk(spec);
    const std::string bytes = Encode(*codec, values);
    float scale;
    std::memcpy(&scale, bytes.data() + 1 + 2, 4);  // numel 10007 is a 2-byte varint
    std::vector<float> out(values.size());
    ASSERT_TRUE(codec->Decode(bytes, out).ok());
    double num = 0, den = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(out[i] == 0 || std::fabs(out[i]) == scale) << i;
      ASSERT_LE(std::fabs(values[i] - out[i]), scale / 2) << spec << " " << i;
      num += (values[i] - out[i]) * double{values[i] - out[i]};
      den += values[i] * double{values[i]};
    }
    EXPECT_LE(num, den) << spec;  // relative L2 error <= 1 for every s < 2
  }
}

// Random data of every mix of zero and non-zero groups, every size mod 5 and 40,
// against the reference encoder, on both kernel paths.
TEST(ThreeLcTest, MatchesTheReferenceEncoderOnBothKernelPaths) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto codec = MakeOk("3lc");
  for (bool portable : {false, true}) {
    const bool have_avx2 = internal::SetPortableKernelsForTesting(portable);
    if (!portable && !have_avx2) continue;
    for (size_t n : {1, 4, 5, 6, 39, 40, 41, 79, 200, 2559, 2560, 2561, 6000, 20011}) {
      for (float density : {0.0f, 0.02f, 0.1f, 0.3f, 0.6f, 1.0f}) {
        std::vector<float> values(n);
        for (float& v : values) v = std::fabs(uniform(rng)) < density ? uniform(rng) : 0.0f;
        values[rng() % n] = 1.0f;  // M = 1 (or 0 when the others are zero: still 1 here)
        const std::string bytes = Encode(*codec, values);
        const size_t header = 1 + (n < 128 ? 1 : n < 16384 ? 2 : 3) + 4;
        ASSERT_EQ(Hex(bytes.substr(header)), Hex(ReferenceBody(values, 0.5f)))
            << "n=" << n << " density=" << density << " portable=" << portable;
        std::vector<float> out(n);
        ASSERT_TRUE(codec->Decode(bytes, out).ok());
      }
    }
  }
  internal::SetPortableKernelsForTesting(false);
}

// Every group byte at every place of a chunk of eight groups (the token writer's step),
// between zero runs of every length up to a chunk and a half, on both kernel paths,
// against the reference encoder.
TEST(ThreeLcTest, EveryGroupByteInEveryChunkPlaceOnBothKernelPaths) {
  std::vector<float> values;
  for (int b = 0; b < 243; ++b) {
    for (size_t place = 0; place < 8; ++place) {
      // `place` zero groups, then the group of byte b, then a run of (b % 13) zeros.
      values.insert(values.end(), 5 * place, 0.0f);
      for (int j = 0, w = 1; j < 5; ++j, w *= 3) {
        values.push_back(static_cast<float>(b / w % 3 - 1));  // t, with M = 1
      }
      values.insert(values.end(), 5 * static_cast<size_t>(b % 13), 0.0f);
    }
  }
  values.push_back(1.0f);  // M = 1 whatever came before
  auto codec = MakeOk("3lc");
  for (bool portable : {false, true}) {
    const bool have_avx2 = internal::SetPortableKernelsForTesting(portable);
    if (!portable && !have_avx2) continue;
    const std::string bytes = Encode(*codec, values);
    const size_t header = 1 + 3 + 4;  // version, numel (3 varint bytes), scale
    ASSERT_GE(values.size(), size_t{16384});
    EXPECT_EQ(Hex(bytes.substr(header)), Hex(ReferenceBody(values, 0.5f)))
        << "portable=" << portable;
  }
  internal::SetPortableKernelsForTesting(false);
}

// Long slices decode through the branch-free fast path; every value must be t * M
// with t from the encoder's rule, on every mix of groups and runs.
TEST(ThreeLcTest, LongSlicesDecodeToScaledTernaryValues) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto codec = MakeOk("3lc");
  for (size_t n : {4096, 4097, 4163, 6000, 20011}) {
    for (float density : {0.0f, 0.01f, 0.05f, 0.3f, 1.0f}) {
      std::vector<float> values(n);
      for (float& v : values) v = std::fabs(uniform(rng)) < density ? uniform(rng) : 0.0f;
      values[rng() % n] = 1.0f;  // M = 1
      std::vector<float> out(n, 7.0f);
      ASSERT_TRUE(codec->Decode(Encode(*codec, values), out).ok());
      for (size_t i = 0; i < n; ++i) {
        const float t = values[i] >= 0.5f ? 1.0f : values[i] <= -0.5f ? -1.0f : 0.0f;
        ASSERT_EQ(out[i], t) << "n=" << n << " density=" << density << " i=" << i;
      }
    }
  }
}

TEST(ThreeLcTest, KernelPathsGiveIdenticalDigits) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(1000);
  for (float& v : x) v = normal(rng);
  x[10] = 0.5f;
  x[11] = -0.5f;
  x[12] = -0.0f;
  std::vector<uint8_t> a(x.size()), b(x.size());
  if (!internal::SetPortableKernelsForTesting(false)) GTEST_SKIP() << "no AVX2 on this CPU";
  internal::TernaryDigits(x.data(), x.size(), 0.5f, a.data());
  const uint32_t max_a = internal::MaxAbsBits(x.data(), x.size());
  internal::SetPortableKernelsForTesting(true);
  internal::TernaryDigits(x.data(), x.size(), 0.5f, b.data());
  const uint32_t max_b = internal::MaxAbsBits(x.data(), x.size());
  internal::SetPortableKernelsForTesting(false);
  EXPECT_EQ(a, b);
  EXPECT_EQ(max_a, max_b);
  EXPECT_EQ(a[10], 2);
  EXPECT_EQ(a[11], 0);
  EXPECT_EQ(a[12], 1);
}

TEST(ThreeLcTest, PackingMatchesBaseThree) {
  for (int b = 0; b < 243; ++b) {
    uint8_t d[8] = {};
    for (int j = 0, w = 1; j < 5; ++j, w *= 3) d[j] = static_cast<uint8_t>(b / w % 3);
    d[5] = d[6] = d[7] = 0xff;  // ignored
    uint64_t v;
    std::memcpy(&v, d, sizeof(v));
    EXPECT_EQ(internal::Pack3lcDigits(v), b);
  }
}

TEST(ThreeLcTest, CompressesGaussianData) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> values(1 << 18);
  for (float& v : values) v = normal(rng);
  // The scale is the maximum (about 4.5 sigma here), so few values reach M / 2.
  EXPECT_GT(4.0 * values.size() / Encode(*MakeOk("3lc"), values).size(), 80);
  EXPECT_GT(4.0 * values.size() / Encode(*MakeOk("3lc(s=1.9)"), values).size(), 250);
}

// ---- decode refusals ----

// Header for `numel` < 128 values and scale 1.
std::string Header(int numel, float scale = 1.0f) {
  std::string h = Bytes({8, numel});
  h.append(reinterpret_cast<const char*>(&scale), 4);
  return h;
}

TEST(ThreeLcDecodeTest, RefusesBadHeaders) {
  auto codec = MakeOk("3lc");
  ExpectRefused(*codec, "", 5, "3lc: empty payload");
  ExpectRefused(*codec, Bytes({2}), 5,
                "3lc: payload in the fp16 format (2), expected the 3lc format (8)");
  ExpectRefused(*codec, Header(6) + Bytes({122, 122}), 5,
                "3lc: payload is for 6 values, the slice has 5");
  ExpectRefused(*codec, Bytes({8, 5, 0, 0}), 5,
                "3lc: payload ends inside scale at byte 2 (needs 4, has 2)");
  ExpectRefused(*codec, Header(5, INFINITY) + Bytes({122}), 5, "3lc: scale inf is not finite");
  ExpectRefused(*codec, Header(5, NAN) + Bytes({122}), 5, "3lc: scale nan is not finite");
  ExpectRefused(*codec, Header(5, -1.0f) + Bytes({122}), 5, "3lc: scale -1 is negative");
  ExpectRefused(*codec, Header(5, -0.0f) + Bytes({121}), 5, "3lc: scale -0 is negative");
}

TEST(ThreeLcDecodeTest, RefusesGroupsThatDoNotMatchTheSliceSize) {
  auto codec = MakeOk("3lc");
  ExpectRefused(*codec, Header(10) + Bytes({122}), 10, "3lc: payload ends after 1 of 2 groups (10 values)");
  ExpectRefused(*codec, Header(10) + Bytes({122, 122, 122}), 10,
                "3lc: 1 trailing bytes after the last of 2 groups (10 values)");
  ExpectRefused(*codec, Header(10) + Bytes({122, 122, 0, 0}), 10,
                "3lc: 2 trailing bytes after the last of 2 groups (10 values)");
  // A run of 3 from group 1 of 3.
  ExpectRefused(*codec, Header(15) + Bytes({122, 244}), 15,
                "3lc: byte 7 is a run of 3 zero groups from group 1, past the 3 groups of 15 values");
  ExpectRefused(*codec, Header(0, 0.0f) + Bytes({243}), 0,
                "3lc: 1 trailing bytes after the last of 0 groups (0 values)");
  // A run may end exactly at the last (partial) group.
  std::vector<float> out(12);
  EXPECT_TRUE(codec->Decode(Header(12) + Bytes({122, 243}), out).ok());
}

TEST(ThreeLcDecodeTest, RefusesNonZeroPaddingDigits) {
  auto codec = MakeOk("3lc");
  // 7 values: the last group holds 2 values, digits 2..4 are padding (must be 1).
  // 122 = (2,1,1,1,1) is fine; 2 + 3 + 9 + 27 + 0 = 41 has digit 4 = 0 (t = -1).
  EXPECT_TRUE(Decode(*codec, Header(7) + Bytes({122, 122}), 7).ok());
  ExpectRefused(*codec, Header(7) + Bytes({122, 41}), 7,
                "3lc: byte 7 (41) of the last group has non-zero padding digits (2 values in the group)");
  ExpectRefused(*codec, Header(7) + Bytes({122, 242}), 7,
                "3lc: byte 7 (242) of the last group has non-zero padding digits (2 values in the group)");
  ExpectRefused(*codec, Header(1) + Bytes({0}), 1,
                "3lc: byte 6 (0) of the last group has non-zero padding digits (1 values in the group)");
}

TEST(ThreeLcDecodeTest, RefusesRunsTheGreedyEncoderWouldHaveMerged) {
  auto codec = MakeOk("3lc");
  const std::string h = Header(50);  // 10 groups
  for (const auto& body : {Bytes({122, 121, 121, 243, 243, 243, 243}),
                           Bytes({122, 121, 243, 243, 243, 243, 121}),
                           Bytes({122, 244, 121, 243, 243, 243, 243}),
                           Bytes({122, 243, 243, 245, 121, 243})}) {
    const absl::Status s = Decode(*codec, h + body, 50);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("continues a zero run the encoder would have written as one byte"))
        << Hex(body);
  }
  ExpectRefused(*codec, h + Bytes({122, 121, 121, 0, 0, 0, 0, 0, 0, 0}), 50,
                "3lc: byte 8 (121) continues a zero run the encoder would have written as one byte");
  // After a full run of 14, another token is canonical.
  std::vector<float> out(75);
  EXPECT_TRUE(codec->Decode(Header(75, 0.0f) + Bytes({255, 121}), out).ok());
}

// The same refusals deep inside a long slice, where the fast path runs first.
TEST(ThreeLcDecodeTest, RefusesNonCanonicalRunsInLongSlices) {
  auto codec = MakeOk("3lc");
  const size_t n = 10000;  // 2000 groups: 1000 x (122, then a run of 2 = 243) + ...
  std::string h = Bytes({8, 0x90, 0x4e});  // numel 10000
  const float one = 1.0f;
  h.append(reinterpret_cast<const char*>(&one), 4);
  std::string body;
  for (int i = 0; i < 666; ++i) body += Bytes({122, 243});  // 1998 groups
  body += Bytes({122, 122});
  std::vector<float> out(n);
  ASSERT_TRUE(codec->Decode(h + body, out).ok());
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_EQ(out[0], 1.0f);
  std::string bad = body;
  bad[601] = static_cast<char>(121);  // group 122, then 121, 243: a run split in two
  bad.insert(602, Bytes({243}));
  bad.erase(bad.size() - 2, 1);
  ExpectRefused(*codec, h + bad, n,
                "3lc: byte 609 (243) continues a zero run the encoder would have written as one byte");
}

// The fast path finds the flags of its tokens in blocks of 64 after storing them, and
// the fused decode-add takes 1024 groups at a time: a zero token after a short one is
// refused wherever it lies against those bounds, by Decode and by DecodeAddPieces
// alike, and a zero group after a full run of 14 is decoded wherever it lies.
TEST(ThreeLcDecodeTest, NonCanonicalPairsAreRefusedAcrossTheFastPathsBlocks) {
  auto codec = MakeOk("3lc");
  const size_t n = 10000;  // 2000 groups, a token 122 (values 1, 0, 0, 0, 0) each
  std::string h = Bytes({8, 0x90, 0x4e});  // numel 10000; with the scale, 7 bytes
  const float one = 1.0f;
  h.append(reinterpret_cast<const char*>(&one), 4);
  const std::string body(2000, static_cast<char>(122));
  std::vector<float> held(n, 0.5f);
  std::vector<float> out(n);
  std::vector<size_t> positions;
  for (size_t k = 0; k < 200; ++k) positions.push_back(k);
  for (size_t k = 1000; k < 1100; ++k) positions.push_back(k);
  for (size_t k : positions) {
    std::string bad = body;  // two zero groups: the second should have joined the first
    bad[k] = static_cast<char>(121);
    bad[k + 1] = static_cast<char>(121);
    const std::string expected = absl::StrCat("3lc: byte ", 7 + k + 1,
                                              " (121) continues a zero run the encoder would "
                                              "have written as one byte");
    absl::Status s = codec->Decode(h + bad, out);
    EXPECT_EQ(s.message(), expected) << "pair at token " << k;
    EXPECT_EQ(codec->Check(h + bad, n).message(), expected) << "Check, pair at token " << k;
    const std::string payload = h + bad;
    const std::string_view pieces[1] = {payload};
    s = codec->DecodeAddPieces(pieces, held, out);
    EXPECT_EQ(s.message(), expected) << "decode-add, pair at token " << k;

    // A full run of 14 in place of tokens k..k+13, then a zero group: canonical.
    std::string good = body;
    good.replace(k, 14, Bytes({255}));
    good[k + 1] = static_cast<char>(121);
    ASSERT_TRUE(codec->Decode(h + good, out).ok()) << "run at token " << k;
    ASSERT_TRUE(codec->Check(h + good, n).ok()) << "Check, run at token " << k;
    for (size_t g = 0; g < 2000; ++g) {
      const float want = g >= k && g < k + 15 ? 0.0f : 1.0f;
      ASSERT_EQ(out[5 * g], want) << "group " << g << ", run at token " << k;
      ASSERT_EQ(out[5 * g + 1], 0.0f) << "group " << g << ", run at token " << k;
    }
  }
}

TEST(ThreeLcDecodeTest, RefusesAScaleThatDisagreesWithTheDigits) {
  auto codec = MakeOk("3lc");
  ExpectRefused(*codec, Header(5, 0.0f) + Bytes({122}), 5, "3lc: scale 0 with non-zero digits");
  ExpectRefused(*codec, Header(5, 2.0f) + Bytes({121}), 5,
                "3lc: scale 2 with every digit zero (the encoder writes 0)");
  EXPECT_TRUE(Decode(*codec, Header(5, 0.0f) + Bytes({121}), 5).ok());
}

TEST(ThreeLcDecodeTest, DecodesHugeScalesFinitely) {
  auto codec = MakeOk("3lc");
  std::vector<float> out(5);
  ASSERT_TRUE(codec->Decode(Header(5, FLT_MAX) + Bytes({0}), out).ok());
  for (float v : out) EXPECT_EQ(v, -FLT_MAX);
}

// ---- arguments ----

TEST(ThreeLcArgsTest, CanonicalSpec) {
  EXPECT_EQ(MakeOk("3lc")->spec(), "3lc(s=1)");
  EXPECT_EQ(MakeOk("3lc(1.5)")->spec(), "3lc(s=1.5)");
  EXPECT_EQ(MakeOk("3lc(s=1.9)")->spec(), "3lc(s=1.9)");
  EXPECT_EQ(MakeOk("3lc(s=1.0)")->spec(), "3lc(s=1)");
}

TEST(ThreeLcArgsTest, RefusesSOutsideOneToTwo) {
  EXPECT_EQ(MakeCodec("3lc(s=2)").status().message(),
            "codec spec '3lc(s=2)': 3lc: s must lie in [1, 2), got 2");
  EXPECT_EQ(MakeCodec("3lc(s=0.99)").status().message(),
            "codec spec '3lc(s=0.99)': 3lc: s must lie in [1, 2), got 0.99");
  EXPECT_EQ(MakeCodec("3lc(s=-1)").status().message(),
            "codec spec '3lc(s=-1)': 3lc: s must lie in [1, 2), got -1");
  EXPECT_THAT(std::string(MakeCodec("3lc(s=x)").status().message()),
              HasSubstr("s = 'x' is not a finite number"));
  EXPECT_THAT(std::string(MakeCodec("3lc(s=inf)").status().message()),
              HasSubstr("is not a finite number"));
  EXPECT_FALSE(MakeCodec("3lc(k=1)").ok());
  EXPECT_THAT(std::string(MakeCodec("3lc+raw").status().message()),
              HasSubstr("3lc is a whole codec; '+raw' cannot follow it"));
}

// Mean3lc equals the rule `mean` on the decoded pushes bit for bit, for every count of
// pushes (a power of two or not), slices short (the general loop) and long (the fast
// decode, with a partial last group and block), pushes with scale 0 and a larger s; its
// samples are the decoded values at their coordinates.
TEST(Mean3lcTest, EqualsTheMeanOfTheDecodedPushes) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (size_t k : {1, 2, 3, 4, 5, 8}) {
    for (size_t n : {1, 7, 255, 256, 1001, 4099, 65539}) {
      SCOPED_TRACE(absl::StrCat("k ", k, " n ", n));
      std::vector<std::string> payloads(k);
      std::vector<std::vector<float>> rows(k, std::vector<float>(n));
      for (size_t j = 0; j < k; ++j) {
        auto codec = MakeOk(j % 2 == 0 ? "3lc" : "3lc(s=1.9)");
        std::vector<float> g(n, 0.0f);
        if (j % 4 != 3) {  // every fourth push all zeros: scale 0
          for (float& v : g) v = normal(rng) * static_cast<float>(j + 1);
        }
        payloads[j] = Encode(*codec, g);
        ASSERT_TRUE(codec->Decode(payloads[j], rows[j]).ok());
      }
      aggregators::AggregatorOptions o;
      o.num_workers = static_cast<int>(k);
      auto rule = aggregators::MakeAggregator("mean", o);
      ASSERT_TRUE(rule.ok()) << rule.status();
      std::vector<const float*> ptrs;
      for (const auto& r : rows) ptrs.push_back(r.data());
      std::vector<float> dense(n), fused(n, 9.0f);
      ASSERT_TRUE((*rule)->Aggregate(ptrs, dense, {}).ok());
      const size_t count = std::min<size_t>(n, 16);
      const size_t stride = n / count;
      std::vector<std::vector<float>> sampled(k, std::vector<float>(count, 9.0f));
      std::vector<float*> sample_rows;
      for (auto& s : sampled) sample_rows.push_back(s.data());
      const std::vector<std::string_view> views(payloads.begin(), payloads.end());
      ASSERT_TRUE(
          Mean3lc(views, fused, ValueSamples{.count = count, .stride = stride, .rows = sample_rows})
              .ok());
      ASSERT_EQ(std::memcmp(fused.data(), dense.data(), n * sizeof(float)), 0);
      for (size_t j = 0; j < k; ++j) {
        for (size_t t = 0; t < count; ++t) {
          ASSERT_EQ(std::bit_cast<uint32_t>(sampled[j][t]),
                    std::bit_cast<uint32_t>(rows[j][t * stride]));
        }
      }
    }
  }
}

TEST(Mean3lcTest, RefusesAPayloadOfAnotherSizeNamingIt) {
  auto codec = MakeOk("3lc");
  const std::string a = Encode(*codec, std::vector<float>(10, 1.0f));
  const std::string b = Encode(*codec, std::vector<float>(11, 1.0f));
  const std::vector<std::string_view> views = {a, b};
  std::vector<float> out(10);
  const absl::Status st = Mean3lc(views, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("payload 1: 3lc"));
  EXPECT_EQ(Mean3lc({}, out).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> row(4);
  float* rows[] = {row.data()};
  // Samples past the end, or not one row per payload.
  EXPECT_EQ(Mean3lc(std::span(views).first(1), out,
                    ValueSamples{.count = 4, .stride = 4, .rows = rows})
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mean3lc(views, out, ValueSamples{.count = 1, .stride = 1, .rows = rows}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::codecs
