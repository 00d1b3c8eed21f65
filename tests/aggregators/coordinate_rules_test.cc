#include "aggregators/coordinate_rules_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "aggregators/coordinate_internal.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators::internal {
namespace {

using Kind = CoordinateRule::Kind;
using Centre = CoordinateRule::Centre;
using Masks = std::vector<std::vector<uint8_t>>;

CoordinateRule Mean() { return {.kind = Kind::kMean}; }
CoordinateRule Median(EvenMedian even = EvenMedian::kMidpoint) {
  return {.kind = Kind::kMedian, .even_median = even};
}
CoordinateRule Trimmed(size_t trim) { return {.kind = Kind::kTrimmedMean, .trim = trim}; }
CoordinateRule Meamed(size_t drop) { return {.kind = Kind::kNearestMean, .drop = drop}; }
CoordinateRule Phocas(size_t trim, size_t drop) {
  return {.kind = Kind::kNearestMean, .trim = trim, .drop = drop, .centre = Centre::kTrimmedMean};
}

std::string Describe(const CoordinateRule& rule) {
  const char* kinds[] = {"mean", "median", "trimmed_mean", "nearest_mean"};
  std::string s = kinds[static_cast<int>(rule.kind)];
  s += " even=" + std::to_string(static_cast<int>(rule.even_median));
  s += " trim=" + std::to_string(rule.trim) + " drop=" + std::to_string(rule.drop);
  s += rule.centre == Centre::kMedian ? " centre=median" : " centre=trimmed_mean";
  return s;
}

// The definitions, written out directly, on one coordinate's present values (in input
// order). Independent of the kernel: the nearest values are picked by sorting on
// (distance, value), not by windows.
float Reference(const CoordinateRule& rule, std::vector<float> v) {
  const size_t c = v.size();
  if (c == 0) return 0.0f;
  if (rule.kind == Kind::kMean) {
    float sum = v[0];
    for (size_t i = 1; i < c; ++i) sum += v[i];
    return sum / static_cast<float>(c);
  }
  std::sort(v.begin(), v.end());
  auto mean_of_ranks = [&v](size_t lo, size_t hi) {  // ascending, in double
    double sum = 0.0;
    for (size_t r = lo; r <= hi; ++r) sum += v[r];
    return sum / static_cast<double>(hi - lo + 1);
  };
  const double midpoint = mean_of_ranks((c - 1) / 2, c / 2);
  size_t min_count = 1;
  if (rule.kind == Kind::kTrimmedMean) min_count = 2 * rule.trim + 1;
  if (rule.kind == Kind::kNearestMean) {
    min_count = rule.drop + 1;
    if (rule.centre == Centre::kTrimmedMean) min_count = std::max(min_count, 2 * rule.trim + 1);
  }
  if (c < min_count) return static_cast<float>(midpoint);
  switch (rule.kind) {
    case Kind::kMedian:
      if (rule.even_median == EvenMedian::kLower) return v[(c - 1) / 2];
      if (rule.even_median == EvenMedian::kUpper) return v[c / 2];
      return static_cast<float>(midpoint);
    case Kind::kTrimmedMean:
      return static_cast<float>(mean_of_ranks(rule.trim, c - rule.trim - 1));
    case Kind::kNearestMean: {
      const double centre =
          rule.centre == Centre::kMedian ? midpoint : mean_of_ranks(rule.trim, c - rule.trim - 1);
      std::vector<float> by_distance = v;
      std::sort(by_distance.begin(), by_distance.end(), [centre](float a, float b) {
        const double da = std::fabs(a - centre);
        const double db = std::fabs(b - centre);
        return da < db || (da == db && a < b);
      });
      const size_t keep = c - rule.drop;
      std::vector<float> kept(by_distance.begin(), by_distance.begin() + keep);
      std::sort(kept.begin(), kept.end());
      double sum = 0.0;
      for (float x : kept) sum += x;
      return static_cast<float>(sum / static_cast<double>(keep));
    }
    case Kind::kMean:
    case Kind::kSignVote:  // not per coordinate: sign_majority_test.cc
      break;
  }
  return 0.0f;
}

bool IsPresent(const Masks& masks, size_t i, size_t c) {
  return masks.empty() || masks[i].empty() || ((masks[i][c / 8] >> (c % 8)) & 1) != 0;
}

std::vector<float> ReferenceAll(const CoordinateRule& rule, const test::Vectors& inputs,
                                const Masks& masks = {}) {
  const size_t d = inputs[0].size();
  std::vector<float> out(d);
  for (size_t c = 0; c < d; ++c) {
    std::vector<float> present;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (IsPresent(masks, i, c)) present.push_back(inputs[i][c]);
    }
    out[c] = Reference(rule, present);
  }
  return out;
}

// Masks as ApplyCoordinateRule takes them: an empty inner vector is a complete input.
std::vector<const uint8_t*> MaskPointers(const Masks& masks) {
  std::vector<const uint8_t*> ptrs;
  for (const std::vector<uint8_t>& m : masks) ptrs.push_back(m.empty() ? nullptr : m.data());
  return ptrs;
}

std::vector<float> Apply(const CoordinateRule& rule, const test::Vectors& inputs,
                         const Masks& masks = {}, core::ThreadPool* pool = nullptr) {
  std::vector<float> out(inputs[0].size(), -12345.0f);
  const std::vector<const float*> ptrs = test::Pointers(inputs);
  const std::vector<const uint8_t*> mask_ptrs = MaskPointers(masks);
  ApplyCoordinateRule(rule, ptrs, mask_ptrs, out, pool);
  return out;
}

// Bit-for-bit equality, reporting the first difference.
void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t c = 0; c < got.size(); ++c) {
    if (std::memcmp(&got[c], &want[c], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": coordinate " << c << " got " << got[c] << " want " << want[c];
      return;
    }
  }
}

// One value per coordinate and input, from the columns: Column({1, 2, 3}) is one
// coordinate whose three inputs hold 1, 2 and 3.
float ApplyToColumn(const CoordinateRule& rule, const std::vector<float>& column) {
  return Apply(rule, test::FromColumns({column}))[0];
}

test::Vectors RandomInputs(size_t k, size_t d, uint64_t seed, bool small_integers) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  test::Vectors inputs(k, std::vector<float>(d));
  for (std::vector<float>& v : inputs) {
    for (float& x : v) {
      // Small integers make ties in value and in distance common.
      x = small_integers ? static_cast<float>(static_cast<int>(rng() % 7) - 3) : uniform(rng);
    }
  }
  return inputs;
}

// Trims and drops that cover the edges for k inputs, fallbacks included.
std::vector<CoordinateRule> RulesFor(size_t k) {
  std::vector<CoordinateRule> rules = {Mean(), Median(), Median(EvenMedian::kLower),
                                       Median(EvenMedian::kUpper)};
  std::vector<size_t> counts = {0, 1, 2, 3, 4, k / 4, k / 3, (k - 1) / 2, k / 2, k - 1, k};
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  for (size_t t : counts) rules.push_back(Trimmed(t));
  for (size_t drop : counts) rules.push_back(Meamed(drop));
  for (size_t trim : {size_t{0}, size_t{1}, size_t{3}, (k - 1) / 2, k / 2}) {
    for (size_t drop : {size_t{0}, size_t{1}, size_t{2}, k / 4, (k - 1) / 2, 2 * (k / 4), k - 1}) {
      rules.push_back(Phocas(trim, drop));
    }
  }
  return rules;
}

const std::vector<size_t>& SweepCounts() {
  static const std::vector<size_t> counts = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13,
                                             14, 15, 16, 17, 18, 19, 20, 33, 64, 65, 70, 257};
  return counts;
}

TEST(CoordinateRuleMinCountTest, MatchesTheDefinitions) {
  EXPECT_EQ(CoordinateRuleMinCount(Mean()), 1u);
  EXPECT_EQ(CoordinateRuleMinCount(Median()), 1u);
  EXPECT_EQ(CoordinateRuleMinCount(Trimmed(0)), 1u);
  EXPECT_EQ(CoordinateRuleMinCount(Trimmed(3)), 7u);
  EXPECT_EQ(CoordinateRuleMinCount(Meamed(0)), 1u);
  EXPECT_EQ(CoordinateRuleMinCount(Meamed(4)), 5u);
  EXPECT_EQ(CoordinateRuleMinCount(Phocas(3, 1)), 7u);
  EXPECT_EQ(CoordinateRuleMinCount(Phocas(1, 5)), 6u);
}

TEST(ApplyCoordinateRuleTest, HandComputedMeanMedianAndTrimmedMean) {
  EXPECT_EQ(ApplyToColumn(Mean(), {1, 2, 3, 4}), 2.5f);
  EXPECT_EQ(ApplyToColumn(Median(), {3, 1, 2}), 2.0f);
  EXPECT_EQ(ApplyToColumn(Median(), {4, 1, 3, 2}), 2.5f);
  EXPECT_EQ(ApplyToColumn(Median(EvenMedian::kLower), {4, 1, 3, 2}), 2.0f);
  EXPECT_EQ(ApplyToColumn(Median(EvenMedian::kUpper), {4, 1, 3, 2}), 3.0f);
  EXPECT_EQ(ApplyToColumn(Trimmed(1), {10, -100, 1, 2, 3, 100}), 4.0f);
  EXPECT_EQ(ApplyToColumn(Trimmed(2), {10, -100, 1, 2, 3, 100}), 2.5f);
  // Too few for the trimmed mean (2 * 2 + 1 > 4): the midpoint median.
  EXPECT_EQ(ApplyToColumn(Trimmed(2), {10, -100, 1, 2}), 1.5f);
}

TEST(ApplyCoordinateRuleTest, HandComputedMeamedWithTies) {
  // Median 2; 0 and 4 are both at distance 2 and the smaller goes first.
  EXPECT_EQ(ApplyToColumn(Meamed(1), {0, 1, 2, 3, 4}), 1.5f);
  EXPECT_EQ(ApplyToColumn(Meamed(1), {4, 3, 2, 1, 0}), 1.5f);
  EXPECT_EQ(ApplyToColumn(Meamed(1), {3, 0, 4, 2, 1}), 1.5f);
  // Even count: the centre is the midpoint 2; keep 1, 3 and then 0 over 4.
  EXPECT_EQ(ApplyToColumn(Meamed(1), {4, 0, 3, 1}), static_cast<float>(4.0 / 3.0));
  // Bulyan's step (drop 2f with f = 1): median 2, distances 7 2 1 0 7 8 9.
  EXPECT_EQ(ApplyToColumn(Meamed(2), {11, -5, 0, 10, 1, 2, 9}), 1.4f);
  // Drop 3: one of -5 and 9 (both at distance 7) stays: the smaller.
  EXPECT_EQ(ApplyToColumn(Meamed(3), {11, -5, 0, 10, 1, 2, 9}), -0.5f);
  // Drop 0 is the mean, drop k - 1 the value nearest the median (the lower on a tie).
  EXPECT_EQ(ApplyToColumn(Meamed(0), {1, 2, 6}), 3.0f);
  EXPECT_EQ(ApplyToColumn(Meamed(3), {1, 2, 3, 4}), 2.0f);
  // An outlier next to the median is kept, the far one dropped.
  EXPECT_EQ(ApplyToColumn(Meamed(1), {1, 2, 3, 1e30f}), 2.0f);
}

TEST(ApplyCoordinateRuleTest, HandComputedPhocasWithTies) {
  // Trimmed mean with trim 1 of {0, 2, 3, 4, 6} is 3; 0 and 6 tie at distance 3.
  EXPECT_EQ(ApplyToColumn(Phocas(1, 1), {6, 0, 4, 3, 2}), 2.25f);
  EXPECT_EQ(ApplyToColumn(Phocas(1, 2), {6, 0, 4, 3, 2}), 3.0f);
  // Centre 1 (mean of 0, 1, 2): the nearest four leave out 100.
  EXPECT_EQ(ApplyToColumn(Phocas(1, 1), {-10, 0, 1, 2, 100}), -1.75f);
  // Centre 1.5, not a data value: 1 and 2 tie, then 0 and 3 tie.
  EXPECT_EQ(ApplyToColumn(Phocas(1, 1), {3, 2, 1, 0}), 1.0f);
  EXPECT_EQ(ApplyToColumn(Phocas(1, 3), {3, 2, 1, 0}), 1.0f);
  EXPECT_EQ(ApplyToColumn(Phocas(1, 2), {3, 2, 1, 0}), 1.5f);
  // The centre uses its own trim (2 here: 1 and 2 of {0, 1, 2, 3, 50, -40}, centre 1.5),
  // not the median; drop 2 leaves 50 and -40 out.
  EXPECT_EQ(ApplyToColumn(Phocas(2, 2), {0, 1, 2, 3, 50, -40}), 1.5f);
  // Drop 1 of the same: -40 is 41.5 away, 50 is 48.5 away.
  EXPECT_EQ(ApplyToColumn(Phocas(2, 1), {0, 1, 2, 3, 50, -40}), -6.8f);
}

TEST(ApplyCoordinateRuleTest, NearestMeanFallsBackToTheMedianBelowItsCount) {
  // Meamed with drop 3 needs 4 values; with 3 it is their median.
  EXPECT_EQ(ApplyToColumn(Meamed(3), {5, 1, 3}), 3.0f);
  // Phocas with trim 2 needs 5 values; with 4, the midpoint median.
  EXPECT_EQ(ApplyToColumn(Phocas(2, 1), {5, 1, 3, 100}), 4.0f);
}

TEST(ApplyCoordinateRuleTest, MatchesTheDefinitionsOnRandomInputs) {
  for (bool small_integers : {false, true}) {
    for (size_t k : SweepCounts()) {
      const test::Vectors inputs = RandomInputs(k, 300, 1000 * k + small_integers, small_integers);
      for (const CoordinateRule& rule : RulesFor(k)) {
        ExpectSameBits(Apply(rule, inputs), ReferenceAll(rule, inputs),
                       "k " + std::to_string(k) + " " + Describe(rule) +
                           (small_integers ? " integers" : " uniform"));
      }
    }
  }
}

TEST(ApplyCoordinateRuleTest, OddLengthsAndASingleCoordinate) {
  for (size_t d : {size_t{1}, size_t{7}, size_t{129}, size_t{16384 + 3}}) {
    for (size_t k : {size_t{1}, size_t{5}, size_t{16}, size_t{65}}) {
      const test::Vectors inputs = RandomInputs(k, d, d + k, false);
      for (const CoordinateRule& rule : {Mean(), Median(), Trimmed(k / 4), Meamed(k / 3),
                                         Phocas(k / 4, k / 3), Meamed(2 * (k / 4))}) {
        ExpectSameBits(Apply(rule, inputs), ReferenceAll(rule, inputs),
                       "d " + std::to_string(d) + " k " + std::to_string(k) + " " + Describe(rule));
      }
    }
  }
}

TEST(ApplyCoordinateRuleTest, SameBitsForAnyPool) {
  const size_t d = 3 * kCoordinateBlock + 77;
  core::ThreadPool pool1(1);
  core::ThreadPool pool2(2);
  core::ThreadPool pool4(4);
  for (size_t k : {size_t{9}, size_t{70}}) {
    const test::Vectors inputs = RandomInputs(k, d, k, false);
    Masks masks(k);
    std::mt19937 rng(7);
    for (size_t i = 0; i < k; i += 2) {
      masks[i].assign((d + 7) / 8, 0xFF);
      for (uint8_t& byte : masks[i]) {
        if (rng() % 3 == 0) byte = static_cast<uint8_t>(rng());
      }
    }
    for (const CoordinateRule& rule :
         {Mean(), Median(), Trimmed(2), Meamed(3), Phocas(2, 3), Meamed(4)}) {
      for (const Masks& m : {Masks{}, masks}) {
        const std::vector<float> serial = Apply(rule, inputs, m);
        for (core::ThreadPool* pool : {&pool1, &pool2, &pool4}) {
          ExpectSameBits(Apply(rule, inputs, m, pool), serial,
                         "k " + std::to_string(k) + " " + Describe(rule) + " threads " +
                             std::to_string(pool->num_threads()) + (m.empty() ? "" : " masked"));
        }
      }
    }
  }
}

// Masks mixing the cases a tile can see: complete inputs (null or all bits set), absent
// ones, absent over whole tiles, missing runs across tile edges and scattered losses.
// Values where a bit is clear are NaN, so reading one shows.
struct MaskedInputs {
  test::Vectors inputs;
  Masks masks;
};

MaskedInputs MakeMaskedInputs(size_t k, size_t d, uint64_t seed, bool scattered) {
  MaskedInputs m{RandomInputs(k, d, seed, seed % 2 == 0), Masks(k)};
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < k; ++i) {
    const size_t mode = (i + seed) % (scattered ? 7 : 5);
    if (mode == 0) continue;  // null
    std::vector<bool> present(d, true);
    switch (mode) {
      case 1:  // all bits set
        break;
      case 2:  // absent
        present.assign(d, false);
        break;
      case 3:  // absent over whole tiles
        for (size_t c = kNetworkTile; c < std::min(d, 3 * kNetworkTile); ++c) present[c] = false;
        break;
      case 4:  // a run across a tile edge
        for (size_t c = 100; c < std::min(d, 300 + 13 * i); ++c) present[c] = false;
        break;
      default:  // scattered
        for (size_t c = 0; c < d; ++c) present[c] = rng() % 4 != 0;
        break;
    }
    m.masks[i].assign((d + 7) / 8, 0);
    for (size_t c = 0; c < d; ++c) {
      if (present[c]) {
        m.masks[i][c / 8] |= static_cast<uint8_t>(1u << (c % 8));
      } else {
        m.inputs[i][c] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    // Bits past d are garbage too.
    if (d % 8 != 0) m.masks[i].back() |= static_cast<uint8_t>(0xFF << (d % 8));
  }
  return m;
}

TEST(ApplyCoordinateRuleTest, MaskedMatchesTheDefinitionsOnPresentValues) {
  for (bool scattered : {false, true}) {
    for (size_t k : {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 33, 64, 65, 70, 257}) {
      for (size_t d : {size_t{5}, size_t{700}}) {
        const MaskedInputs m = MakeMaskedInputs(k, d, k * 31 + d + scattered, scattered);
        for (const CoordinateRule& rule : RulesFor(k)) {
          ExpectSameBits(Apply(rule, m.inputs, m.masks), ReferenceAll(rule, m.inputs, m.masks),
                         "k " + std::to_string(k) + " d " + std::to_string(d) + " " +
                             Describe(rule) + (scattered ? " scattered" : " runs"));
        }
      }
    }
  }
}

TEST(ApplyCoordinateRuleTest, CompleteMasksGiveTheUnmaskedBits) {
  for (size_t k : {size_t{3}, size_t{16}, size_t{64}, size_t{70}, size_t{257}}) {
    const size_t d = 1000;
    const test::Vectors inputs = RandomInputs(k, d, k + 5, false);
    Masks all_set(k, std::vector<uint8_t>((d + 7) / 8, 0xFF));
    Masks some_null = all_set;
    for (size_t i = 0; i < k; i += 2) some_null[i].clear();
    for (const CoordinateRule& rule : RulesFor(k)) {
      const std::vector<float> unmasked = Apply(rule, inputs);
      ExpectSameBits(Apply(rule, inputs, all_set), unmasked, "all set " + Describe(rule));
      ExpectSameBits(Apply(rule, inputs, some_null), unmasked, "some null " + Describe(rule));
    }
  }
}

TEST(ApplyCoordinateRuleTest, MaskedFallbacks) {
  // Five inputs, four coordinates: all present, 3 present, 1 present, none.
  const test::Vectors inputs = test::FromColumns({
      {5, 1, 4, 2, 3},
      {10, 1, 100, 7, 2},
      {8, 6, 7, 9, 5},
      {1, 2, 3, 4, 5},
  });
  Masks masks(5, std::vector<uint8_t>(1, 0));
  const bool present[4][5] = {{1, 1, 1, 1, 1}, {1, 0, 1, 1, 0}, {0, 0, 1, 0, 0}, {0, 0, 0, 0, 0}};
  for (size_t c = 0; c < 4; ++c) {
    for (size_t i = 0; i < 5; ++i) {
      if (present[c][i]) masks[i][0] |= static_cast<uint8_t>(1u << c);
    }
  }
  // Trimmed mean with trim 2 needs 5: coordinate 1 falls back to the median of
  // {10, 100, 7}, coordinate 2 to 7, coordinate 3 to 0.
  EXPECT_EQ(Apply(Trimmed(2), inputs, masks), (std::vector<float>{3, 10, 7, 0}));
  EXPECT_EQ(Apply(Trimmed(1), inputs, masks), (std::vector<float>{3, 10, 7, 0}));
  EXPECT_EQ(Apply(Mean(), inputs, masks), (std::vector<float>{3, 39, 7, 0}));
  EXPECT_EQ(Apply(Median(EvenMedian::kUpper), inputs, masks), (std::vector<float>{3, 10, 7, 0}));
  // Meamed with drop 1 on {10, 100, 7}: median 10, keep 10 and 7.
  EXPECT_EQ(Apply(Meamed(1), inputs, masks), (std::vector<float>{2.5f, 8.5f, 7, 0}));
  // Drop 3 needs 4 values: coordinate 1 falls back to its median.
  EXPECT_EQ(Apply(Meamed(3), inputs, masks), (std::vector<float>{2.5f, 10, 7, 0}));
  // Inputs 2 and 3 present at coordinate 2 ({7, 9}): phocas with trim 1 needs 3 and
  // falls back to the midpoint.
  masks[3][0] |= 1u << 2;
  EXPECT_EQ(Apply(Phocas(1, 1), inputs, masks)[2], 8.0f);  // midpoint of 7 and 9
}

TEST(ApplyCoordinateRuleTest, OutliersCannotLeaveTheHonestRange) {
  for (size_t k : {size_t{5}, size_t{9}, size_t{16}, size_t{33}, size_t{70}}) {
    const size_t f = (k - 1) / 2;
    const size_t d = 500;
    test::Vectors inputs = RandomInputs(k, d, k, false);
    std::mt19937 rng(static_cast<uint32_t>(k));
    // The last f inputs are Byzantine: +-1e30, the sign random per coordinate.
    for (size_t i = k - f; i < k; ++i) {
      for (float& x : inputs[i]) x = rng() % 2 == 0 ? 1e30f : -1e30f;
    }
    // Bulyan's step needs k >= 4g + 3 for its g; with g Byzantine it drops 2g.
    const size_t g = (k - 3) / 4;
    test::Vectors bulyan_inputs = RandomInputs(k, d, k + 1, false);
    for (size_t i = k - g; i < k; ++i) {
      for (float& x : bulyan_inputs[i]) x = rng() % 2 == 0 ? 1e30f : -1e30f;
    }
    struct Case {
      CoordinateRule rule;
      const test::Vectors* inputs;
      size_t byzantine;
    };
    for (const Case& tc :
         {Case{Meamed(f), &inputs, f}, Case{Phocas(f, f), &inputs, f}, Case{Trimmed(f), &inputs, f},
          Case{Median(), &inputs, f}, Case{Meamed(2 * g), &bulyan_inputs, g}}) {
      const std::vector<float> out = Apply(tc.rule, *tc.inputs);
      for (size_t c = 0; c < d; ++c) {
        float lo = std::numeric_limits<float>::infinity();
        float hi = -lo;
        for (size_t i = 0; i < k - tc.byzantine; ++i) {
          lo = std::min(lo, (*tc.inputs)[i][c]);
          hi = std::max(hi, (*tc.inputs)[i][c]);
        }
        ASSERT_GE(out[c], lo) << "k " << k << " " << Describe(tc.rule) << " c " << c;
        ASSERT_LE(out[c], hi) << "k " << k << " " << Describe(tc.rule) << " c " << c;
      }
    }
  }
}

TEST(ApplyCoordinateRuleTest, OutputMayBeAnInput) {
  for (size_t k : {size_t{7}, size_t{70}, size_t{257}}) {
    const size_t d = 2000;
    for (bool masked : {false, true}) {
      const MaskedInputs m = MakeMaskedInputs(k, d, k, true);
      test::Vectors inputs = masked ? m.inputs : RandomInputs(k, d, k, false);
      Masks usable = masked ? m.masks : Masks{};
      // The output is written everywhere, so the input it aliases is made complete.
      if (masked) {
        usable[0].clear();
        inputs[0] = RandomInputs(1, d, 99, false)[0];
      }
      for (const CoordinateRule& rule :
           {Mean(), Median(), Trimmed(2), Meamed(3), Phocas(2, 3), Meamed(0)}) {
        const std::vector<float> want = Apply(rule, inputs, usable);
        test::Vectors aliased = inputs;
        const std::vector<const float*> ptrs = test::Pointers(aliased);
        const std::vector<const uint8_t*> mask_ptrs = MaskPointers(usable);
        ApplyCoordinateRule(rule, ptrs, mask_ptrs, aliased[0], nullptr);
        ExpectSameBits(aliased[0], want,
                       "k " + std::to_string(k) + " " + Describe(rule) + (masked ? " masked" : ""));
      }
    }
  }
}

}  // namespace
}  // namespace ps::aggregators::internal
