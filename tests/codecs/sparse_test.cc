// Sparse codecs: the wire format on hand-computed examples, the selection rules,
// random-k supports, Bloom policies, polyfit and deflate, spec parsing, and the
// refusal of every malformed section.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <zlib.h>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/compressed.h"
#include "codecs/sparse_internal.h"
#include "codecs/wire_internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::Hex;
using ::ps::codecs::testing::Gaussian;
using ::ps::codecs::testing::MakeOk;

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::string_literals;

std::string Encode(Codec& codec, std::span<const float> values, const EncodeContext& ctx = {}) {
  std::string bytes;
  const absl::Status s = codec.Encode(values, ctx, &bytes);
  EXPECT_TRUE(s.ok()) << s;
  return bytes;
}

std::vector<float> Decode(const Codec& codec, std::string_view bytes, size_t n) {
  std::vector<float> out(n, -7.0f);
  const absl::Status s = codec.Decode(bytes, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

bool Accepts(const Codec& codec, std::string_view bytes, size_t n) {
  std::vector<float> out(n);
  return codec.Decode(bytes, out).ok();
}

std::string DecodeError(const Codec& codec, std::string_view bytes, size_t n) {
  std::vector<float> out(n);
  const absl::Status s = codec.Decode(bytes, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

// A payload from its parts, for hostile inputs.
std::string Payload(uint8_t index_id, uint8_t value_id, uint64_t numel, uint64_t count,
                    std::string_view index, std::string_view value) {
  std::string b;
  internal::PutU8(&b, FormatByte(PayloadFormat::kSparse));
  internal::PutU8(&b, index_id);
  internal::PutU8(&b, value_id);
  internal::PutVarint(&b, numel);
  internal::PutVarint(&b, count);
  internal::PutVarint(&b, index.size());
  b += index;
  internal::PutVarint(&b, value.size());
  b += value;
  return b;
}

std::string U32s(std::initializer_list<uint32_t> v) {
  std::string s;
  for (uint32_t x : v) internal::PutU32(&s, x);
  return s;
}

// Top k by sorting: |x| descending, lower index first on ties; in index order
// unless !sorted.
std::vector<uint32_t> ReferenceTopk(const std::vector<float>& x, size_t k, bool sorted = true) {
  std::vector<uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  idx.resize(std::min(k, idx.size()));
  if (sorted) std::sort(idx.begin(), idx.end());
  return idx;
}

// ---- wire format ----

TEST(SparseWireTest, TopkRawRawExample) {
  auto codec = MakeOk("topk(0.5)");
  EXPECT_EQ(codec->spec(), "topk(ratio=0.5, method=exact)+raw+raw");
  const std::vector<float> x = {1, -3, 0.5, 2};
  const std::string bytes = Encode(*codec, x);
  // version, raw index id, raw value id, numel 4, count 2, 8 index bytes (1, 3),
  // 8 value bytes (-3.0f, 2.0f).
  EXPECT_EQ(Hex(bytes),
            "0a 01 01 04 02 08 01 00 00 00 03 00 00 00 08 00 00 40 c0 00 00 00 40");
  EXPECT_THAT(Decode(*codec, bytes, 4), ElementsAre(0, -3, 0, 2));
}

TEST(SparseWireTest, ThresholdVarintFp16Example) {
  auto codec = MakeOk("threshold(1)+varint+fp16");
  EXPECT_EQ(codec->spec(), "threshold(tau=1)+varint+fp16");
  const std::vector<float> x = {0, 2, 0, 0, -1, 0.5};
  const std::string bytes = Encode(*codec, x);
  // Indices 1, 4: first 1, then gap - 1 = 2; halves 0x4000 (2) and 0xbc00 (-1).
  EXPECT_EQ(Hex(bytes), "0a 02 02 06 02 02 01 02 04 00 40 00 bc");
  EXPECT_THAT(Decode(*codec, bytes, 6), ElementsAre(0, 2, 0, 0, -1, 0));
}

TEST(SparseWireTest, BitmapAndRleExamples) {
  const std::vector<float> x = {1, -3, 0.5, 2, 0, 0, 0, 0, 0, 4};
  // Top 3: indices 1, 3, 9.
  const std::string bitmap = Encode(*MakeOk("topk(0.3)+bitmap"), x);
  EXPECT_EQ(Hex(bitmap.substr(5, 3)), "02 0a 02");  // length 2, bits 1 and 3, bit 9
  const std::string rle = Encode(*MakeOk("topk(0.3)+rle"), x);
  // Runs: 1 zero, 1 one, 1 zero, 1 one, 5 zeros, 1 one.
  EXPECT_EQ(Hex(rle.substr(5, 7)), "06 01 01 01 01 05 01");
  for (const char* spec : {"topk(0.3)+bitmap", "topk(0.3)+rle"}) {
    EXPECT_THAT(Decode(*MakeOk(spec), Encode(*MakeOk(spec), x), x.size()),
                ElementsAre(0, -3, 0, 2, 0, 0, 0, 0, 0, 4))
        << spec;
  }
}

TEST(SparseWireTest, RandkSendsOnlyItsSeed) {
  auto codec = MakeOk("randk(0.5, seed=7)");
  EXPECT_EQ(codec->spec(), "randk(ratio=0.5, seed=7, scale=none)+raw");
  const std::vector<float> x = {1, 2, 3, 4};
  const std::string bytes = Encode(*codec, x);
  ASSERT_EQ(bytes.size(), 3 + 1 + 1 + 1 + 8 + 1 + 8u);
  EXPECT_EQ(Hex(bytes.substr(0, 6)), "0a 00 01 04 02 08");
}

// ---- sparsifiers ----

// n = 400000 runs both paths: the sampled prefilter (k = n/100 + 1, n/3 + 1 on
// Gaussian data) and the histogram select (k = 1, and ties that overflow the prefilter).
TEST(TopkTest, ExactMatchesSortingIncludingTies) {
  std::mt19937 rng(3);
  for (size_t n : {1, 2, 10, 100, 5000, 400000}) {
    std::vector<float> gauss = Gaussian(n, static_cast<uint32_t>(n));
    std::vector<float> ties(n);
    for (float& v : ties) v = static_cast<float>(static_cast<int>(rng() % 7) - 3);
    std::vector<float> zeros(n, 0.0f);
    for (const std::vector<float>* x : {&gauss, &ties, &zeros}) {
      const std::vector<uint32_t> order = ReferenceTopk(*x, n, /*sorted=*/false);
      for (size_t k : {size_t{1}, n / 100 + 1, n / 3 + 1, n}) {
        std::vector<uint32_t> expected(order.begin(), order.begin() + static_cast<ptrdiff_t>(k));
        std::sort(expected.begin(), expected.end());
        EXPECT_EQ(internal::TopkExact(*x, k), expected) << "n=" << n << " k=" << k;
      }
    }
  }
}

TEST(TopkTest, SampledKeepsEverythingAboveItsThresholdAndAboutK) {
  const std::vector<float> x = Gaussian(1 << 20, 5);
  const size_t k = x.size() / 100;
  const std::vector<uint32_t> kept = internal::TopkSampled(x, k, 11);
  EXPECT_GT(kept.size(), k * 3 / 4);
  EXPECT_LT(kept.size(), k * 5 / 4);
  EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
  std::vector<bool> in(x.size(), false);
  for (uint32_t i : kept) in[i] = true;
  float least_kept = INFINITY, most_dropped = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (in[i]) {
      least_kept = std::min(least_kept, std::fabs(x[i]));
    } else {
      most_dropped = std::max(most_dropped, std::fabs(x[i]));
    }
  }
  EXPECT_GE(least_kept, most_dropped);
}

TEST(TopkTest, KeepCountRoundsAndKeepsAtLeastOne) {
  EXPECT_EQ(internal::KeepCount(0.01, 0), 0u);
  EXPECT_EQ(internal::KeepCount(0.01, 10), 1u);
  EXPECT_EQ(internal::KeepCount(0.01, 250), 3u);  // 2.5 rounds away from zero
  EXPECT_EQ(internal::KeepCount(1, 7), 7u);
}

TEST(ThresholdTest, KeepsExactlyMagnitudesAtOrAboveTau) {
  const std::vector<float> x = {0.5f, -0.5f, 0.49999997f, -2, 0, 0.75f};
  EXPECT_THAT(internal::ThresholdSelect(x, 0.5f), ElementsAre(0, 1, 3, 5));
  EXPECT_THAT(Decode(*MakeOk("threshold(0.5)"), Encode(*MakeOk("threshold(0.5)"), x), x.size()),
              ElementsAre(0.5f, -0.5f, 0, -2, 0, 0.75f));
}

// ---- random-k ----

TEST(RandkTest, SampleSortedIndicesIsASortedSetOfK) {
  for (uint64_t n : {1, 5, 100, 100000}) {
    for (size_t k : {size_t{1}, static_cast<size_t>(n / 2), static_cast<size_t>(n)}) {
      if (k == 0) continue;
      const auto idx = internal::SampleSortedIndices(42, k, n);
      ASSERT_EQ(idx.size(), k);
      EXPECT_TRUE(std::adjacent_find(idx.begin(), idx.end(), std::greater_equal<>()) == idx.end());
      EXPECT_LT(idx.back(), n);
      EXPECT_EQ(idx, internal::SampleSortedIndices(42, k, n));
    }
  }
  EXPECT_NE(internal::SampleSortedIndices(1, 50, 1000), internal::SampleSortedIndices(2, 50, 1000));
}

TEST(RandkTest, SampleSortedIndicesIsUniform) {
  // 20 of 100 over 5000 seeds: each position expected 1000 times (sd ~28).
  std::vector<int> hits(100, 0);
  for (uint64_t seed = 0; seed < 5000; ++seed) {
    for (uint32_t i : internal::SampleSortedIndices(seed, 20, 100)) ++hits[i];
  }
  for (int h : hits) {
    EXPECT_GT(h, 850);
    EXPECT_LT(h, 1150);
  }
}

TEST(RandkTest, SupportIndicesAreWhatDecodeFills) {
  auto codec = MakeOk("randk(0.1, seed=9)+fp16");
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + static_cast<float>(i % 13);
  EncodeContext ctx{.round = 4, .slice_id = 2, .worker_id = 3};
  const std::string bytes = Encode(*codec, x, ctx);
  const auto support = SeededSupportOf(bytes);
  ASSERT_TRUE(support.has_value());
  EXPECT_EQ(support->k, 100u);
  const std::vector<float> out = Decode(*codec, bytes, x.size());
  std::vector<uint32_t> filled;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] != 0) {
      filled.push_back(static_cast<uint32_t>(i));
      EXPECT_EQ(out[i], x[i]);
    }
  }
  EXPECT_EQ(filled, SupportIndices(*support, x.size()));
}

TEST(RandkTest, GlobalSeedMaskIsSharedByWorkersAndChangesWithRoundAndSlice) {
  const std::vector<float> x = Gaussian(5000, 1);
  auto support = [&](std::string_view spec, uint32_t worker, uint64_t round, uint32_t slice,
                     uint64_t options_seed = 0) {
    auto codec = MakeOk(spec, CodecOptions{.seed = options_seed});
    return *SeededSupportOf(Encode(*codec, x, {.round = round, .slice_id = slice, .worker_id = worker}));
  };
  const SeededSupport base = support("randk(0.01, seed=5)", 0, 1, 1);
  EXPECT_EQ(support("randk(0.01, seed=5)", 7, 1, 1), base);
  EXPECT_EQ(support("randk(0.01, seed=5)", 7, 1, 1, /*options_seed=*/99), base);
  EXPECT_NE(support("randk(0.01, seed=5)", 0, 2, 1), base);
  EXPECT_NE(support("randk(0.01, seed=5)", 0, 1, 2), base);
  EXPECT_NE(support("randk(0.01, seed=6)", 0, 1, 1), base);
  EXPECT_NE(SupportIndices(support("randk(0.01, seed=5)", 0, 2, 1), x.size()),
            SupportIndices(base, x.size()));
  // Without a seed the mask is per worker.
  EXPECT_NE(support("randk(0.01)", 0, 1, 1), support("randk(0.01)", 1, 1, 1));
  EXPECT_EQ(support("randk(0.01)", 1, 1, 1), support("randk(0.01)", 1, 1, 1));
}

TEST(RandkTest, SeededSupportOfRefusesOtherPayloads) {
  EXPECT_FALSE(SeededSupportOf(Encode(*MakeOk("topk(0.1)"), Gaussian(100, 1))).has_value());
  EXPECT_FALSE(SeededSupportOf("").has_value());
  std::string bytes = Encode(*MakeOk("randk(0.1)"), Gaussian(100, 1));
  EXPECT_TRUE(SeededSupportOf(bytes).has_value());
  EXPECT_FALSE(SeededSupportOf(bytes.substr(0, 10)).has_value());
}

TEST(RandkTest, UnbiasedScalingIsUnbiased) {
  auto codec = MakeOk("randk(0.25, scale=unbiased)");
  const std::vector<float> x = {1, -2, 3, 4, 0.5f, -1, 2, 8};
  std::vector<double> mean(x.size(), 0.0);
  const int rounds = 20000;
  for (int r = 0; r < rounds; ++r) {
    const auto out = Decode(*codec, Encode(*codec, x, {.round = static_cast<uint64_t>(r)}), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_TRUE(out[i] == 0 || out[i] == 4 * x[i]);
      mean[i] += out[i] / rounds;
    }
  }
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(mean[i], x[i], 0.08 * std::fabs(x[i]) + 0.05) << i;
}

// ---- Bloom filter ----

TEST(BloomTest, P0SendsEveryPositiveWithItsTrueValue) {
  const std::vector<float> x = Gaussian(100000, 8);
  auto codec = MakeOk("topk(0.01)+bloom(p0, fpr=0.01)");
  const std::string bytes = Encode(*codec, x);
  const auto out = Decode(*codec, bytes, x.size());
  size_t positives = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (out[i] != 0) {
      ++positives;
      EXPECT_EQ(out[i], x[i]);
    }
  }
  for (uint32_t i : ReferenceTopk(x, 1000)) EXPECT_EQ(out[i], x[i]);
  // 1000 true positives and about 1% of the other 99000 coordinates.
  EXPECT_GT(positives, 1000u + 400);
  EXPECT_LT(positives, 1000u + 2000);
  // Filter: ceil(1000 * log2(100) / ln 2 / 8) = 1199 bytes, 7 hashes.
  const auto shape = internal::BloomShapeFor(1000, x.size(), 0.01);
  EXPECT_EQ(shape.hashes, 7);
  EXPECT_EQ(shape.bytes, 1199u);
}

TEST(BloomTest, P1AndP2SendKValuesAndP2FindsMoreTruePositives) {
  const std::vector<float> x = Gaussian(50000, 9);
  const auto truth = ReferenceTopk(x, 500);
  const std::set<uint32_t> true_set(truth.begin(), truth.end());
  size_t hits[2] = {0, 0};
  for (int p = 1; p <= 2; ++p) {
    auto codec = MakeOk(absl::StrCat("topk(0.01)+bloom(p", p, ", fpr=0.05)"));
    for (uint64_t round = 0; round < 5; ++round) {
      const auto out = Decode(*codec, Encode(*codec, x, {.round = round}), x.size());
      size_t sent = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (out[i] == 0) continue;
        ++sent;
        EXPECT_EQ(out[i], x[i]);
        hits[p - 1] += true_set.count(static_cast<uint32_t>(i));
      }
      EXPECT_EQ(sent, 500u);
    }
  }
  EXPECT_GT(hits[1], hits[0]);
}

std::string BloomSection(uint8_t policy, uint8_t hashes, std::optional<uint64_t> positives,
                         uint64_t bytes, char fill) {
  std::string s;
  internal::PutU8(&s, policy);
  internal::PutU8(&s, hashes);
  internal::PutU64(&s, 1234);
  if (positives) internal::PutVarint(&s, *positives);
  internal::PutVarint(&s, bytes);
  s += std::string(bytes, fill);
  return s;
}

TEST(BloomTest, DecodeRefusesImplausibleFilters) {
  auto p0 = MakeOk("topk(0.1)+bloom(p0)+raw");
  const std::string four_values = U32s({0, 0, 0, 0});
  // An all-ones filter claims every coordinate: more positives than values.
  EXPECT_THAT(DecodeError(*p0, Payload(5, 1, 100, 1, BloomSection(0, 3, {}, 4, '\xff'), U32s({0})), 100),
              HasSubstr("bloom filter has more than 1 positives"));
  EXPECT_THAT(DecodeError(*p0, Payload(5, 1, 100, 4, BloomSection(0, 3, {}, 4, '\0'), four_values), 100),
              HasSubstr("bloom filter has 0 positives, expected 4"));
  EXPECT_THAT(DecodeError(*p0, Payload(5, 1, 100, 0, BloomSection(0, 0, {}, 4, '\0'), ""), 100),
              HasSubstr("bloom hash count 0 is not in [1, 16]"));
  EXPECT_THAT(DecodeError(*p0, Payload(5, 1, 100, 0, BloomSection(0, 17, {}, 4, '\0'), ""), 100),
              HasSubstr("bloom hash count 17"));
  EXPECT_THAT(DecodeError(*p0, Payload(5, 1, 100, 0, BloomSection(0, 3, {}, 109, '\0'), ""), 100),
              HasSubstr("bloom filter of 109 bytes for 100 values"));
  EXPECT_THAT(DecodeError(*p0, Payload(5, 1, 100, 0, BloomSection(0, 3, {}, 0, '\0'), ""), 100),
              HasSubstr("bloom filter of 0 bytes"));
  EXPECT_THAT(DecodeError(*p0, Payload(5, 1, 100, 0, BloomSection(1, 3, 0, 4, '\0'), ""), 100),
              HasSubstr("bloom policy 1, expected p0"));
  auto p1 = MakeOk("topk(0.1)+bloom(p1)+raw");
  EXPECT_THAT(DecodeError(*p1, Payload(5, 1, 100, 2, BloomSection(1, 3, 1, 4, '\0'), U32s({0, 0})), 100),
              HasSubstr("bloom positive count 1 is not in [2, 100]"));
  EXPECT_THAT(DecodeError(*p1, Payload(5, 1, 100, 1, BloomSection(1, 3, 5, 4, '\xff'), U32s({0})), 100),
              HasSubstr("bloom filter has more than 5 positives"));
  std::string trailing = BloomSection(0, 3, {}, 4, '\0') + "x";
  EXPECT_THAT(DecodeError(*p0, Payload(5, 1, 100, 0, trailing, ""), 100),
              HasSubstr("1 trailing bytes after the bloom filter"));
}

// ---- value stages ----

TEST(PolyfitTest, FitsSortedValuesClosely) {
  auto codec = MakeOk("topk(1)+raw+polyfit");
  EXPECT_EQ(codec->spec(), "topk(ratio=1, method=exact)+raw+polyfit(degree=5)");
  const std::vector<float> x = Gaussian(20000, 4);
  const auto out = Decode(*codec, Encode(*codec, x), x.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - out[i]) * (x[i] - out[i]);
    den += x[i] * x[i];
  }
  // Also shows that the ranks put each value back in place (a wrong permutation
  // would give an error near sqrt(2)).
  EXPECT_LT(std::sqrt(num / den), 0.01);
}

TEST(PolyfitTest, SegmentsHalveTowardTheExtremes) {
  EXPECT_THAT(internal::PolySegments(100, 100, 0, 12), ElementsAre(12, 13, 25, 50));
  EXPECT_THAT(internal::PolySegments(30, 10, 15, 12), ElementsAre(10, 5, 15));
  EXPECT_THAT(internal::PolySegments(0, 0, 0, 12), ElementsAre());
}

std::string PolySection(uint8_t degree, std::vector<uint64_t> lens, std::vector<float> coef,
                        std::string ranks) {
  std::string s;
  internal::PutU8(&s, degree);
  internal::PutVarint(&s, lens.size());
  for (uint64_t l : lens) internal::PutVarint(&s, l);
  for (float c : coef) internal::PutF32(&s, c);
  return s + ranks;
}

// Found by the codec_decode fuzzer: values near -FLT_MAX fit to a cubic whose fp32
// coefficients evaluate past FLT_MAX, so the decoder refused what the encoder wrote.
TEST(PolyfitTest, HugeValuesStayDecodable) {
  for (const char* spec : {"topk(0.3)+bloom(p2)+polyfit(degree=3)", "topk(1)+raw+polyfit(degree=7)"}) {
    auto codec = MakeOk(spec);
    std::vector<float> x(64, 0.0f);
    for (size_t i = 0; i <= 18; ++i) {
      const double t = (static_cast<double>(i) - 9.0) / 9.0;
      x[i] = static_cast<float>(-FLT_MAX * t * t);
    }
    std::string bytes;
    ASSERT_TRUE(codec->Encode(x, &bytes).ok());
    std::vector<float> out(x.size());
    const absl::Status s = codec->Decode(bytes, out);
    ASSERT_TRUE(s.ok()) << spec << ": " << s;
    for (float v : out) EXPECT_TRUE(std::isfinite(v));
  }
}

TEST(PolyfitTest, DecodeRefusesBadSections) {
  auto codec = MakeOk("topk(1)+raw+polyfit(degree=0)");
  const std::string idx = U32s({0, 1, 2});
  auto err = [&](const std::string& section) {
    return DecodeError(*codec, Payload(1, 4, 3, 3, idx, section), 3);
  };
  // Ranks 2 bits each for 3 values: (0, 1, 2) = 0b100100 -> 0x24.
  EXPECT_TRUE(Accepts(*codec, Payload(1, 4, 3, 3, idx, PolySection(0, {3}, {1.5f}, "\x24")), 3));
  EXPECT_THAT(err(PolySection(8, {3}, {}, "")), HasSubstr("polyfit degree 8 is above 7"));
  EXPECT_THAT(err(PolySection(0, {}, {}, "\x24")), HasSubstr("segment count 0 is not in [1, 3]"));
  EXPECT_THAT(err(PolySection(0, {2, 2}, {1, 1}, "\x24")), HasSubstr("does not fit"));
  EXPECT_THAT(err(PolySection(0, {1, 0}, {1, 1}, "\x24")), HasSubstr("of length 0"));
  EXPECT_THAT(err(PolySection(0, {2}, {1}, "\x24")), HasSubstr("cover 2 values, expected 3"));
  EXPECT_THAT(err(PolySection(0, {3}, {NAN}, "\x24")), HasSubstr("coefficient 0 is not finite"));
  EXPECT_THAT(err(PolySection(0, {3}, {1}, "\x14")), HasSubstr("not a permutation"));
  EXPECT_THAT(err(PolySection(0, {3}, {1}, "\x34")), HasSubstr("not a permutation"));
  EXPECT_THAT(err(PolySection(0, {3}, {1}, "\x64")), HasSubstr("padding bits"));
  EXPECT_THAT(err(PolySection(0, {3}, {1}, "\x24\x00"s)), HasSubstr("trailing"));
  EXPECT_THAT(err(PolySection(0, {3}, {1}, "")), HasSubstr("payload ends inside the polyfit ranks"));
  auto cubic = MakeOk("topk(1)+raw+polyfit(degree=1)");
  EXPECT_THAT(DecodeError(*cubic, Payload(1, 4, 3, 3, idx, PolySection(1, {3}, {3e38f, 3e38f}, "\x24")), 3),
              HasSubstr("polyfit value 2 in sorted order is not finite"));
}

std::string Deflated(std::string_view raw) {
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::string out(size, '\0');
  compress2(reinterpret_cast<Bytef*>(out.data()), &size,
            reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()), 9);
  out.resize(size);
  return out;
}

TEST(DeflateTest, RoundTripsExactlyAndRefusesBombsAndShortStreams) {
  auto codec = MakeOk("topk(1)+raw+deflate");
  EXPECT_EQ(codec->spec(), "topk(ratio=1, method=exact)+raw+deflate(level=6)");
  const std::vector<float> x = Gaussian(3000, 2);
  EXPECT_EQ(Decode(*codec, Encode(*codec, x), x.size()), x);
  const std::string idx = U32s({0, 1});
  // 2 values = 8 bytes expected; a megabyte of zeros is a bomb and is cut off.
  EXPECT_THAT(DecodeError(*codec, Payload(1, 3, 2, 2, idx, Deflated(std::string(1 << 20, '\0'))), 2),
              HasSubstr("inflate beyond 8 bytes"));
  EXPECT_THAT(DecodeError(*codec, Payload(1, 3, 2, 2, idx, Deflated(std::string(4, '\0'))), 2),
              HasSubstr("inflate to 4 bytes, expected 8"));
  const std::string good = Deflated(std::string(8, '\0'));
  EXPECT_TRUE(Accepts(*codec, Payload(1, 3, 2, 2, idx, good), 2));
  EXPECT_THAT(DecodeError(*codec, Payload(1, 3, 2, 2, idx, good.substr(0, good.size() - 3)), 2),
              HasSubstr("truncated"));
  EXPECT_THAT(DecodeError(*codec, Payload(1, 3, 2, 2, idx, good + "z"), 2),
              HasSubstr("1 trailing bytes after the deflate stream"));
  EXPECT_THAT(DecodeError(*codec, Payload(1, 3, 2, 2, idx, "garbage!"), 2),
              HasSubstr("corrupt deflate stream"));
  // Planes: 8 bytes of 0xff are two NaNs.
  EXPECT_THAT(DecodeError(*codec, Payload(1, 3, 2, 2, idx, Deflated(std::string(8, '\xff'))), 2),
              HasSubstr("value 0 is not finite"));
}

// ---- header and index refusals ----

TEST(SparseDecodeTest, RefusesAnotherCompositionAndBadHeaders) {
  auto codec = MakeOk("topk(0.5)+raw+fp16");
  const std::string idx = U32s({1});
  const std::string half = "\x00\x3c"s;
  EXPECT_TRUE(Accepts(*codec, Payload(1, 2, 4, 1, idx, half), 4));
  EXPECT_EQ(DecodeError(*codec, Payload(2, 2, 4, 1, idx, half), 4),
            "topk(ratio=0.5, method=exact)+raw+fp16: payload has index stage varint, expected raw");
  EXPECT_THAT(DecodeError(*codec, Payload(9, 2, 4, 1, idx, half), 4),
              HasSubstr("payload has index stage id 9, expected raw"));
  EXPECT_THAT(DecodeError(*codec, Payload(1, 1, 4, 1, idx, half), 4),
              HasSubstr("payload has value stage raw, expected fp16"));
  EXPECT_THAT(DecodeError(*codec, Payload(1, 2, 5, 1, idx, half), 4),
              HasSubstr("payload is for 5 values, the slice has 4"));
  EXPECT_THAT(DecodeError(*codec, Payload(1, 2, 4, 5, idx, half), 4),
              HasSubstr("value count 5 exceeds the 4 values"));
  EXPECT_THAT(DecodeError(*codec, Payload(1, 2, 4, 1, idx, half) + "!", 4),
              HasSubstr("1 trailing bytes after the value section"));
  EXPECT_THAT(DecodeError(*codec, "", 4), HasSubstr("empty payload"));
  EXPECT_THAT(DecodeError(*codec, Payload(1, 2, 4, 1, idx, "\x00\x7c"s), 4),
              HasSubstr("value 0 is not finite (bits 0x7c00)"));
  EXPECT_THAT(DecodeError(*codec, Payload(1, 2, 4, 1, idx, half + half), 4),
              HasSubstr("fp16 value section is 4 bytes, expected 2"));
  auto randk = MakeOk("randk(0.5)");
  EXPECT_THAT(DecodeError(*randk, Payload(0, 1, 4, 1, "1234567", U32s({0})), 4),
              HasSubstr("random-k seed section is 7 bytes, expected 8"));
}

TEST(SparseDecodeTest, RefusesBadIndexSections) {
  const std::string one = U32s({0x3f800000});  // 1.0f
  const std::string two = U32s({0x3f800000, 0x3f800000});
  auto raw = MakeOk("topk(0.5)");
  EXPECT_THAT(DecodeError(*raw, Payload(1, 1, 4, 1, U32s({4}), one), 4),
              HasSubstr("index 0 is 4, not below 4"));
  EXPECT_THAT(DecodeError(*raw, Payload(1, 1, 4, 2, U32s({2, 2}), two), 4),
              HasSubstr("index 1 (2) does not increase"));
  EXPECT_THAT(DecodeError(*raw, Payload(1, 1, 4, 1, U32s({1, 2}), one), 4),
              HasSubstr("raw index section is 8 bytes, expected 4"));
  auto varint = MakeOk("topk(0.5)+varint");
  EXPECT_THAT(DecodeError(*varint, Payload(2, 1, 4, 2, "\x02\x01", two), 4),
              HasSubstr("varint index 1 lies beyond 4 values"));
  EXPECT_THAT(DecodeError(*varint, Payload(2, 1, 4, 1, "\x01\x00"s, one), 4),
              HasSubstr("1 trailing bytes after the varint indices"));
  EXPECT_THAT(DecodeError(*varint, Payload(2, 1, 4, 1, "\x81\x00"s, one), 4),
              HasSubstr("not minimally encoded"));
  auto bitmap = MakeOk("topk(0.5)+bitmap");
  EXPECT_THAT(DecodeError(*bitmap, Payload(3, 1, 4, 1, "\x11", one), 4),
              HasSubstr("bitmap padding bits are not zero"));
  EXPECT_THAT(DecodeError(*bitmap, Payload(3, 1, 4, 1, "\x03", one), 4),
              HasSubstr("bitmap has 2 ones, expected 1"));
  EXPECT_THAT(DecodeError(*bitmap, Payload(3, 1, 4, 1, "\x01\x00"s, one), 4),
              HasSubstr("bitmap is 2 bytes, expected 1"));
  auto rle = MakeOk("topk(0.5)+rle");
  EXPECT_THAT(DecodeError(*rle, Payload(4, 1, 4, 1, "\x01\x04", one), 4),
              HasSubstr("rle run of 4 at coordinate 1 overruns 4 values"));
  EXPECT_THAT(DecodeError(*rle, Payload(4, 1, 4, 1, "\x01\x00\x03"s, one), 4),
              HasSubstr("empty rle run at coordinate 1"));
  EXPECT_THAT(DecodeError(*rle, Payload(4, 1, 4, 1, "\x00\x02\x02"s, one), 4),
              HasSubstr("rle runs hold more than 1 ones"));
  EXPECT_THAT(DecodeError(*rle, Payload(4, 1, 4, 2, "\x04", two), 4),
              HasSubstr("rle runs hold 0 ones, expected 2"));
  EXPECT_THAT(DecodeError(*rle, Payload(4, 1, 4, 1, "\x03\x01\x01", one), 4),
              HasSubstr("1 trailing bytes after the rle runs"));
}

// ---- specs ----

TEST(SparseSpecTest, CanonicalSpecs) {
  const std::pair<const char*, const char*> cases[] = {
      {"topk", "topk(ratio=0.01, method=exact)+raw+raw"},
      {"topk(0.01)+bloom(p0, fpr=0.01)+fp16", "topk(ratio=0.01, method=exact)+bloom(policy=p0, fpr=0.01)+fp16"},
      {"topk(0.1)+fp16", "topk(ratio=0.1, method=exact)+raw+fp16"},
      {"topk(0.1)+bloom", "topk(ratio=0.1, method=exact)+bloom(policy=p0, fpr=0.01)+raw"},
      {"threshold", "threshold(tau=0.01)+raw+raw"},
      {"threshold(0.5)+varint+raw", "threshold(tau=0.5)+varint+raw"},
      {"randk", "randk(ratio=0.01, scale=none)+raw"},
      {"randk(0.01, seed=7)+fp16", "randk(ratio=0.01, seed=7, scale=none)+fp16"},
      {"randk(scale=unbiased)+deflate(level=1)", "randk(ratio=0.01, scale=unbiased)+deflate(level=1)"},
      {"topk(method=sampled)+rle+polyfit(3)", "topk(ratio=0.01, method=sampled)+rle+polyfit(degree=3)"},
  };
  for (const auto& [spec, canonical] : cases) EXPECT_EQ(MakeOk(spec)->spec(), canonical) << spec;
}

TEST(SparseSpecTest, RefusesBadArgumentsAndCompositions) {
  auto err = [](std::string_view spec) { return std::string(MakeCodec(spec).status().message()); };
  EXPECT_THAT(err("topk(0)"), HasSubstr("topk: ratio must be > 0, got 0"));
  EXPECT_THAT(err("topk(1.5)"), HasSubstr("topk: ratio must be <= 1, got 1.5"));
  EXPECT_THAT(err("topk(method=fast)"), HasSubstr("method = 'fast' is not one of exact, sampled"));
  EXPECT_THAT(err("threshold(-1)"), HasSubstr("threshold: tau must be > 0"));
  EXPECT_THAT(err("threshold(1e39)"), HasSubstr("threshold: tau 1e+39 is not a finite float"));
  EXPECT_THAT(err("randk(seed=-1)"), HasSubstr("randk: seed must lie in [0, 9223372036854775807]"));
  EXPECT_THAT(err("randk(0.1)+varint"),
              HasSubstr("randk sends no indices (its mask comes from a seed), so no index stage: "
                        "'+varint' cannot follow it"));
  EXPECT_THAT(err("randk+raw+fp16"), HasSubstr("'+raw' cannot follow it"));
  EXPECT_THAT(err("topk+fp16+raw"), HasSubstr("'+fp16' is not an index codec (raw, varint, bitmap, rle, bloom)"));
  EXPECT_THAT(err("topk+raw+bitmap"), HasSubstr("'+bitmap' is not a value codec (raw, fp16, deflate, polyfit)"));
  EXPECT_THAT(err("topk+zstd"), HasSubstr("'+zstd' is neither an index codec"));
  EXPECT_THAT(err("topk+raw+raw+raw"), HasSubstr("topk takes an index and a value stage at most"));
  EXPECT_THAT(err("topk+bloom(fpr=1)"), HasSubstr("bloom: fpr must be < 1, got 1"));
  EXPECT_THAT(err("topk+bloom(p3)"), HasSubstr("policy = 'p3' is not one of p0, p1, p2"));
  EXPECT_THAT(err("topk+varint(3)"), HasSubstr("varint takes no arguments"));
  EXPECT_THAT(err("topk+raw+deflate(level=10)"), HasSubstr("deflate: level must lie in [0, 9], got 10"));
  EXPECT_THAT(err("topk+raw+polyfit(degree=8)"), HasSubstr("polyfit: degree must lie in [0, 7], got 8"));
}

TEST(SparseSpecTest, MaxEncodedBytesBoundsWorstCases) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 2 ? i : -static_cast<float>(i));
  for (const char* spec : {"threshold(0.001)+varint+raw", "threshold(0.001)+rle+polyfit",
                           "topk(0.5, method=sampled)+bloom(p0, fpr=0.5)+deflate",
                           "topk(1)+bitmap+fp16", "randk(1)+polyfit"}) {
    auto codec = MakeOk(spec);
    EXPECT_LE(Encode(*codec, x).size(), codec->MaxEncodedBytes(x.size())) << spec;
  }
}

}  // namespace
}  // namespace ps::codecs
