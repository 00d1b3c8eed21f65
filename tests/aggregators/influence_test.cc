// AggregationContext::influence: each input's weight in what the rule made of the round.
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "aggregators/aggregator.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators {
namespace {

using test::Options;
using test::Pointers;
using test::RandomVectors;
using test::Vectors;

constexpr size_t kD = 1000;

// `honest` inputs of small noise around 1, then `byzantine` inputs far away (+50).
Vectors HonestThenFar(size_t honest, size_t byzantine, uint64_t seed) {
  Vectors v = RandomVectors(honest + byzantine, kD, seed);
  for (size_t i = 0; i < v.size(); ++i) {
    for (float& x : v[i]) x = i < honest ? 1.0f + 0.1f * x : 50.0f + x;
  }
  return v;
}

std::vector<double> InfluenceOf(std::string_view spec, int n, int f, const Vectors& inputs,
                                std::span<const uint8_t* const> masks = {}) {
  auto rule = MakeAggregator(spec, Options(n, f));
  EXPECT_TRUE(rule.ok()) << rule.status();
  if (!rule.ok()) return {};
  std::vector<float> out(inputs[0].size());
  std::vector<double> influence(inputs.size(), 0.0);
  std::vector<float> state((*rule)->StateRows() * out.size(), 0.0f);
  AggregationContext ctx;
  ctx.round = 3;
  ctx.masks = masks;
  ctx.state = state;
  ctx.influence = influence;
  const std::vector<const float*> ptrs = Pointers(inputs);
  EXPECT_TRUE((*rule)->Aggregate(ptrs, out, ctx).ok());
  return influence;
}

double Sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

TEST(InfluenceTest, KrumWeighsTheInputItSelectsAlone) {
  const Vectors in = HonestThenFar(6, 1, 1);
  const std::vector<double> w = InfluenceOf("krum", 7, 1, in);
  ASSERT_EQ(w.size(), 7u);
  size_t selected = 0;
  for (size_t j = 0; j < 7; ++j) {
    EXPECT_TRUE(w[j] == 0.0 || w[j] == static_cast<double>(kD)) << j << ": " << w[j];
    selected += w[j] > 0 ? 1 : 0;
  }
  EXPECT_EQ(selected, 1u);
  EXPECT_EQ(w[6], 0.0);
}

TEST(InfluenceTest, MultiKrumAndCafSetTheFarInputsAside) {
  const Vectors in = HonestThenFar(8, 2, 2);
  for (const std::string spec : {"multi_krum", "caf", "nnm+multi_krum"}) {
    const std::vector<double> w = InfluenceOf(spec, 10, 2, in);
    ASSERT_EQ(w.size(), 10u) << spec;
    EXPECT_NEAR(Sum(w), kD, 1e-6 * kD) << spec;
    for (size_t j = 0; j < 8; ++j) EXPECT_GT(w[j], 0.5 * kD / 8) << spec << " input " << j;
    EXPECT_LT(w[8], 1e-3 * kD) << spec;
    EXPECT_LT(w[9], 1e-3 * kD) << spec;
  }
}

TEST(InfluenceTest, TheMeanWeighsEveryInputEqually) {
  const Vectors in = HonestThenFar(4, 1, 3);
  for (const std::string spec : {"mean", "nnm+mean"}) {
    const std::vector<double> w = InfluenceOf(spec, 5, spec == "mean" ? 0 : 1, in);
    if (spec == "nnm+mean") {
      // Each row averages its n - f nearest: the far input is only in its own row.
      EXPECT_NEAR(w[4], kD / 5.0 / 4.0, 1e-9 * kD);
      EXPECT_NEAR(Sum(w), kD, 1e-9 * kD);  // the mixing's rows each sum to 1
      continue;
    }
    for (double x : w) EXPECT_NEAR(x, kD / 5.0, 1e-9 * kD);
  }
}

TEST(InfluenceTest, TrimmedMeanAndMedianTraceTheRanksTheyKeep) {
  const Vectors in = HonestThenFar(5, 2, 4);
  const std::vector<double> trimmed = InfluenceOf("trimmed_mean", 7, 2, in);
  // Every coordinate keeps 3 of the 5 honest ranks: the sampled weights add up to d.
  EXPECT_NEAR(Sum(trimmed), kD, 1e-9 * kD);
  EXPECT_EQ(trimmed[5], 0.0);
  EXPECT_EQ(trimmed[6], 0.0);
  for (size_t j = 0; j < 5; ++j) EXPECT_GT(trimmed[j], 0.0) << j;
  const std::vector<double> median = InfluenceOf("median", 7, 2, in);
  EXPECT_NEAR(Sum(median), kD, 1e-9 * kD);
  EXPECT_EQ(median[5] + median[6], 0.0);
}

// Equal values rank in input order, so on a constant column the trimmed mean weighs the
// middle inputs and the lower median of an even count the one before the middle, on both
// sides of the 32 inputs the sample sort does by insertion.
TEST(InfluenceTest, EqualValuesRankInInputOrder) {
  for (size_t k : {size_t{8}, size_t{40}}) {
    const Vectors in(k, std::vector<float>(kD, 0.5f));
    const size_t trim = k / 4;
    const std::vector<double> trimmed =
        InfluenceOf("trimmed_mean", static_cast<int>(k), static_cast<int>(trim), in);
    const std::vector<double> lower = InfluenceOf("median(even=lower)", static_cast<int>(k), 1, in);
    ASSERT_EQ(trimmed.size(), k);
    ASSERT_EQ(lower.size(), k);
    for (size_t j = 0; j < k; ++j) {
      const bool kept = j >= trim && j < k - trim;
      EXPECT_NEAR(trimmed[j],
                  kept ? static_cast<double>(kD) / static_cast<double>(k - 2 * trim) : 0.0,
                  1e-9 * kD)
          << "k " << k << " input " << j;
      EXPECT_NEAR(lower[j], j == k / 2 - 1 ? static_cast<double>(kD) : 0.0, 1e-9 * kD)
          << "k " << k << " input " << j;
    }
  }
}

TEST(InfluenceTest, MeamedKeepsTheWindowNearestTheMedian) {
  // One coordinate, values 0..4 and 100: meamed (drop f = 1) keeps 0..4.
  const Vectors in = test::FromColumns({{0, 1, 2, 3, 4, 100}});
  const std::vector<double> w = InfluenceOf("meamed", 6, 1, in);
  for (size_t j = 0; j < 5; ++j) EXPECT_NEAR(w[j], 0.2, 1e-12) << j;
  EXPECT_EQ(w[5], 0.0);
}

TEST(InfluenceTest, TheClipChainSetsTheFarInputsAside) {
  // The far inputs point the other way (clipped, a far input in the honest direction
  // would be an honest one).
  Vectors in = HonestThenFar(10, 2, 5);
  for (size_t j = 10; j < 12; ++j) {
    for (float& x : in[j]) x = -x;
  }
  const std::vector<double> w = InfluenceOf("clip(0.5)+nnm+trimmed_mean", 12, 2, in);
  // Clipping scales every input down (to norm 0.5 of about 32): the weights are those
  // of the clipped inputs, and the far ones weigh nothing.
  EXPECT_GT(Sum(w), 0.0);
  for (size_t j = 0; j < 10; ++j) EXPECT_GT(w[j], 0.5 * Sum(w) / 10) << j;
  EXPECT_LT(w[10] + w[11], 1e-6 * Sum(w));
}

TEST(InfluenceTest, CenteredClippingWeighsAnInputByItsClippingFactor) {
  // Centre 0 (fresh state), tau 1: the inputs at norm 0.5 keep weight 1 / n, the one at
  // norm 4 is clipped to a quarter of that.
  Vectors in(4, std::vector<float>(kD, 0.0f));
  const float near = 0.5f / std::sqrt(static_cast<float>(kD));
  for (size_t j = 0; j < 3; ++j) std::fill(in[j].begin(), in[j].end(), near);
  std::fill(in[3].begin(), in[3].end(), 8 * near);
  const std::vector<double> w = InfluenceOf("centered_clipping(tau=1)", 4, 1, in);
  for (size_t j = 0; j < 3; ++j) EXPECT_NEAR(w[j], kD / 4.0, 1e-4 * kD) << j;
  EXPECT_NEAR(w[3], kD / 16.0, 1e-4 * kD);
}

TEST(InfluenceTest, SignMajorityWeighsTheSignsThatWin) {
  const Vectors in = test::FromColumns({{1, 2, -3}, {-1, -2, 3}});
  const std::vector<double> w = InfluenceOf("sign_majority", 3, 0, in);
  // Column 0: inputs 0 and 1 win; column 1: inputs 0 and 1 win again.
  EXPECT_NEAR(w[0], 1.0, 1e-12);
  EXPECT_NEAR(w[1], 1.0, 1e-12);
  EXPECT_EQ(w[2], 0.0);
}

TEST(InfluenceTest, AnInputMissingCoordinatesWeighsOnlyWhereItIsPresent) {
  const Vectors in = RandomVectors(5, 64, 6);
  // Input 0 present on the first 32 coordinates only.
  std::vector<uint8_t> half(8, 0);
  for (size_t c = 0; c < 32; ++c) half[c / 8] |= static_cast<uint8_t>(1u << (c % 8));
  std::vector<const uint8_t*> masks(5, nullptr);
  masks[0] = half.data();
  const std::vector<double> w = InfluenceOf("mean", 5, 0, in, masks);
  EXPECT_NEAR(w[0], 32.0 / 5.0, 1e-9);
  EXPECT_NEAR(w[1], 32.0 / 5.0 + 32.0 / 4.0, 1e-9);
}

TEST(InfluenceTest, ModelScopeAddsUpToTheSliceScopeWeights) {
  const Vectors in = HonestThenFar(8, 2, 7);
  auto rule = MakeAggregator("caf", Options(10, 2));
  ASSERT_TRUE(rule.ok());
  const std::vector<const float*> ptrs = Pointers(in);
  std::vector<double> gram(100, 0.0);
  AggregationContext ctx;
  ASSERT_TRUE((*rule)->AccumulateGram(ptrs, kD, ctx, gram).ok());
  auto plan = (*rule)->Plan(10, gram, 0);
  ASSERT_TRUE(plan.ok());
  std::vector<double> influence(10, 0.0);
  ctx.influence = influence;
  std::vector<float> out(kD);
  ASSERT_TRUE((*rule)->Apply(*plan, ptrs, out, ctx).ok());
  const std::vector<double> direct = InfluenceOf("caf", 10, 2, in);
  for (size_t j = 0; j < 10; ++j) EXPECT_NEAR(influence[j], direct[j], 1e-9 * kD) << j;
}

TEST(InfluenceTest, AWronglySizedInfluenceIsRefused) {
  auto rule = MakeAggregator("mean", Options(3, 0));
  ASSERT_TRUE(rule.ok());
  const Vectors in = RandomVectors(3, 8, 8);
  std::vector<double> influence(2, 0.0);
  AggregationContext ctx;
  ctx.influence = influence;
  std::vector<float> out(8);
  const absl::Status st = (*rule)->Aggregate(Pointers(in), out, ctx);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("influence holds 2 entries for 3 inputs"), std::string::npos) << st;
}

TEST(AlignmentTest, TheCosineWithTheAggregateWhereTheInputIsPresent) {
  const std::vector<float> out = {1, 1, 0, 0};
  const std::vector<float> with = {2, 2, 0, 0}, against = {-1, -1, 5, 0}, zero = {0, 0, 0, 0},
                           half = {1, -1, 0, 0};
  const std::vector<const float*> rows = {with.data(), against.data(), zero.data(), half.data()};
  std::vector<double> a = Alignment(rows, {}, out);
  EXPECT_NEAR(a[0], 1.0, 1e-12);
  EXPECT_NEAR(a[1], -2.0 / std::sqrt(2.0 * 27.0), 1e-12);
  EXPECT_TRUE(std::isnan(a[2])) << "a zero push has no direction";
  EXPECT_NEAR(a[3], 0.0, 1e-12);
  // Input 3 present at coordinate 0 only: there it points with the aggregate.
  const uint8_t first_only = 0x01;
  const std::vector<const uint8_t*> masks = {nullptr, nullptr, nullptr, &first_only};
  a = Alignment(rows, masks, out);
  EXPECT_NEAR(a[3], 1.0 / std::sqrt(1.0 * 1.0), 1e-12);
}

// Over a long slice (1024 samples 64 apart, with masks): the same bits as the
// definition computed input by input.
TEST(AlignmentTest, EqualsTheDefinitionBitForBitOnALongSlice) {
  constexpr size_t kLong = 65536 + 37;
  const Vectors v = RandomVectors(5, kLong, 11);
  const std::vector<float> out = RandomVectors(1, kLong, 12)[0];
  std::vector<uint8_t> odd_bytes((kLong + 7) / 8, 0xaa), head((kLong + 7) / 8, 0);
  for (size_t c = 0; c < 3000; ++c) head[c / 8] |= static_cast<uint8_t>(1u << (c % 8));
  const std::vector<const uint8_t*> masks = {nullptr, odd_bytes.data(), nullptr, head.data(),
                                             nullptr};
  const std::vector<double> got = Alignment(Pointers(v), masks, out);
  const size_t stride = kLong / kAlignmentSamples;
  ASSERT_EQ(got.size(), v.size());
  for (size_t j = 0; j < v.size(); ++j) {
    double dot = 0, xx = 0, oo = 0;
    for (size_t t = 0; t < kAlignmentSamples; ++t) {
      const size_t c = t * stride;
      if (masks[j] != nullptr && ((masks[j][c / 8] >> (c % 8)) & 1u) == 0) continue;
      const double x = v[j][c], o = out[c];
      dot += x * o;
      xx += x * x;
      oo += o * o;
    }
    if (xx > 0 && oo > 0) {
      EXPECT_EQ(got[j], dot / std::sqrt(xx * oo)) << j;
    } else {
      EXPECT_TRUE(std::isnan(got[j])) << j;
    }
  }
  // Row 1 is present at odd coordinates only, and every sample is even: no direction.
  EXPECT_TRUE(std::isnan(got[1]));
}

}  // namespace
}  // namespace ps::aggregators
