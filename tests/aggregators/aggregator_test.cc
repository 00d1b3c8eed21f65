// The factory, argument checks, and properties every rule shares.
#include "aggregators/aggregator.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators {
namespace {

using test::Options;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(AggregatorFactoryTest, NamesAreStableAndAllMakeable) {
  EXPECT_THAT(AggregatorNames(),
              ElementsAre("mean", "median", "trimmed_mean", "meamed", "phocas", "krum",
                          "multi_krum", "bulyan", "geometric_median", "centered_clipping",
                          "mda", "sign_majority", "monna", "caf", "smea"));
  EXPECT_THAT(PreAggregatorNames(), ElementsAre("clip", "arc", "nnm", "bucketing"));
  for (const std::string& name : AggregatorNames()) {
    absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(name, Options(20, 2));
    ASSERT_TRUE(rule.ok()) << name << ": " << rule.status();
    EXPECT_EQ((*rule)->name(), name);
  }
}

TEST(AggregatorFactoryTest, UnknownNameListsTheKnownOnes) {
  absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator("bulyan2", Options(10, 1));
  ASSERT_FALSE(rule.ok());
  EXPECT_EQ(rule.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rule.status().message(), HasSubstr("bulyan2"));
  for (const std::string& name : AggregatorNames()) {
    EXPECT_THAT(rule.status().message(), HasSubstr(name));
  }
}

TEST(AggregatorFactoryTest, RefusesNegativeFAndNoWorkers) {
  absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator("mean", Options(3, -1));
  EXPECT_EQ(rule.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rule.status().message(), HasSubstr("-1"));
  rule = MakeAggregator("median", Options(0, 0));
  EXPECT_EQ(rule.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rule.status().message(), HasSubstr("num_workers"));
}

TEST(AggregatorFactoryTest, BoundsAndTheirMessages) {
  struct Case {
    const char* name;
    int f;
    int min_inputs;
    const char* message;
  };
  for (const Case& c : {
           Case{"mean", 3, 1, ""},
           Case{"median", 3, 1, ""},
           Case{"trimmed_mean", 2, 5, "trimmed_mean needs n >= 2f + 1 = 5, got n = 4 (f = 2)"},
           Case{"krum", 3, 9, "krum needs n >= 2f + 3 = 9, got n = 8 (f = 3)"},
           Case{"multi_krum", 1, 5, "multi_krum needs n >= 2f + 3 = 5, got n = 4 (f = 1)"},
       }) {
    absl::StatusOr<std::unique_ptr<Aggregator>> rule =
        MakeAggregator(c.name, Options(c.min_inputs, c.f));
    ASSERT_TRUE(rule.ok()) << c.name << ": " << rule.status();
    EXPECT_EQ((*rule)->MinInputs(), c.min_inputs) << c.name;
    if (c.min_inputs > 1) {
      rule = MakeAggregator(c.name, Options(c.min_inputs - 1, c.f));
      EXPECT_EQ(rule.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
      EXPECT_EQ(rule.status().message(), c.message);
    }
  }
}

TEST(AggregatorFactoryTest, HugeFIsRefusedWithoutOverflow) {
  // 2f + 3 would wrap around to a small int and let n = INT_MAX pass.
  absl::StatusOr<std::unique_ptr<Aggregator>> rule =
      MakeAggregator("krum", Options(INT_MAX, INT_MAX / 2));
  EXPECT_EQ(rule.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rule.status().message(), HasSubstr("too large"));
  rule = MakeAggregator("krum", Options(100, INT_MAX / 4 - 1));
  EXPECT_EQ(rule.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rule.status().message(), HasSubstr("krum needs n >= 2f + 3 = "));
}

TEST(AggregatorFactoryTest, MultiKrumRefusesBadM) {
  AggregatorOptions options = Options(7, 1);
  options.multi_krum_m = 8;
  absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator("multi_krum", options);
  EXPECT_EQ(rule.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rule.status().message(), HasSubstr("m (multi_krum_m) = 8 exceeds n = 7"));
  options.multi_krum_m = -1;
  rule = MakeAggregator("multi_krum", options);
  EXPECT_EQ(rule.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rule.status().message(), HasSubstr("must be >= 1"));
  options.multi_krum_m = 7;
  EXPECT_TRUE(MakeAggregator("multi_krum", options).ok());
}

TEST(AggregatorTest, AggregateRefusesTooFewInputsNamingRuleAndCounts) {
  absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator("krum", Options(9, 3));
  ASSERT_TRUE(rule.ok()) << rule.status();
  const absl::StatusOr<std::vector<float>> out = test::Run(**rule, test::RandomVectors(8, 4, 1));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "krum needs n >= 2f + 3 = 9 inputs, got 8");
}

TEST(AggregatorTest, AggregateRefusesEmptyOutputAndNullInputs) {
  for (const std::string& name : AggregatorNames()) {
    absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(name, Options(7, 1));
    ASSERT_TRUE(rule.ok()) << rule.status();
    const test::Vectors inputs = test::RandomVectors(7, 3, 2);
    std::vector<const float*> ptrs = test::Pointers(inputs);
    absl::Status status = (*rule)->Aggregate(ptrs, std::span<float>(), {});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(status.message(), HasSubstr(name));
    std::vector<float> out(3);
    ptrs[2] = nullptr;
    status = (*rule)->Aggregate(ptrs, out, {});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(status.message(), HasSubstr("input 2"));
  }
}

// Every rule may write over one of its inputs: tiles are read before they are written.
TEST(AggregatorTest, OutputMayBeOneOfTheInputs) {
  const size_t d = 20000;
  for (const std::string& name : AggregatorNames()) {
    const test::Vectors inputs = test::RandomVectors(11, d, 5);
    const std::vector<float> want = test::Aggregate(name, Options(11, 2), inputs);
    for (size_t target : {0, 4}) {
      test::Vectors scratch = inputs;
      absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(name, Options(11, 2));
      ASSERT_TRUE(rule.ok()) << rule.status();
      ASSERT_TRUE((*rule)->Aggregate(test::Pointers(scratch), scratch[target], {}).ok());
      EXPECT_EQ(scratch[target], want) << name << " into input " << target;
    }
  }
}

// Every rule writes every coordinate of its output, whatever the output held before:
// the shard reuses one buffer per thread for the slices' aggregates without zeroing it
// (AggregateBuffer, server/round_aggregation.h). Checked on complete inputs, on masked inputs (a
// coordinate range nobody sent, one input missing every third coordinate) and on a
// shared support, in slice scope and, for the Gram rules, model scope's Apply.
TEST(AggregatorTest, EveryCoordinateOfTheOutputIsWritten) {
  const size_t n = 11, d = 3000;
  const test::Vectors inputs = test::RandomVectors(n, d, 17);
  const std::vector<const float*> ptrs = test::Pointers(inputs);
  std::vector<std::vector<uint8_t>> bitmaps(n, std::vector<uint8_t>((d + 7) / 8, 0xff));
  for (size_t c = 0; c < d; ++c) {
    const auto clear = [&](size_t i) { bitmaps[i][c / 8] &= uint8_t(~(1u << (c % 8))); };
    if (c >= 640 && c < 704) {
      for (size_t i = 0; i < n; ++i) clear(i);  // nobody sent these
    }
    if (c % 3 == 0) clear(5);
  }
  std::vector<const uint8_t*> masks(n, nullptr);
  masks[2] = bitmaps[2].data();  // complete, as a bitmap
  masks[5] = bitmaps[5].data();
  masks[7] = bitmaps[7].data();
  std::vector<uint32_t> support;
  for (uint32_t c = 3; c < d; c += 7) support.push_back(c);
  struct Case {
    const char* what;
    AggregationContext ctx;
  };
  std::vector<Case> cases(3);
  cases[0].what = "complete";
  cases[1].what = "masked";
  cases[1].ctx.masks = masks;
  cases[2].what = "support";
  cases[2].ctx.support = support;
  // Each run gets its own rule, so stateful rules start alike.
  const auto run = [&](const std::string& name, const AggregationContext& ctx, float fill,
                       std::vector<float>& out) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(name, Options(int(n), 2));
    if (!rule.ok()) return rule.status();
    out.assign(d, fill);
    if (!(*rule)->NeedsGram()) return (*rule)->Aggregate(ptrs, out, ctx);
    const size_t rows = n + (*rule)->StateRows();
    std::vector<double> gram(rows * rows, 0.0);
    PS_RETURN_IF_ERROR((*rule)->AccumulateGram(ptrs, d, ctx, gram));
    PS_ASSIGN_OR_RETURN(RoundPlan plan, (*rule)->Plan(n, gram, ctx.round));
    return (*rule)->Apply(plan, ptrs, out, ctx);
  };
  size_t compared = 0;
  for (const std::string& name : AggregatorNames()) {
    for (const Case& c : cases) {
      std::vector<float> zeroed, poisoned;
      const absl::Status a = run(name, c.ctx, 0.0f, zeroed);
      const absl::Status b = run(name, c.ctx, std::numeric_limits<float>::quiet_NaN(), poisoned);
      ASSERT_EQ(a, b) << name << ", " << c.what;
      if (!a.ok()) continue;
      ++compared;
      ASSERT_EQ(std::memcmp(zeroed.data(), poisoned.data(), d * sizeof(float)), 0)
          << name << ", " << c.what << ": a coordinate of the output was left as it was";
    }
  }
  // Every rule aggregates complete inputs and most take the masks and the support.
  EXPECT_GE(compared, 2 * AggregatorNames().size());
}

// AggregateOrPick on a single input: where it returns that input (every rule without
// state whose value of one value is that value), the bits are Aggregate's and `out` is
// left as it was; otherwise it writes `out` as Aggregate does and returns it.
TEST(AggregatorTest, TheAggregateOfOneInputIsThatInputUnlessTheRuleChangesIt) {
  const size_t d = 3000;
  const test::Vectors one = test::RandomVectors(1, d, 3);
  const std::vector<const float*> ptrs = test::Pointers(one);
  std::vector<std::string> picked;
  for (const std::string& name : AggregatorNames()) {
    absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(name, Options(1, 0));
    if (!rule.ok()) continue;  // needs more inputs
    std::vector<float> want(d);
    ASSERT_TRUE((*rule)->Aggregate(ptrs, want, {}).ok()) << name;
    absl::StatusOr<std::unique_ptr<Aggregator>> again = MakeAggregator(name, Options(1, 0));
    ASSERT_TRUE(again.ok());
    std::vector<float> out(d, std::numeric_limits<float>::quiet_NaN());
    absl::StatusOr<std::span<const float>> got = (*again)->AggregateOrPick(ptrs, out, {});
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    ASSERT_EQ(got->size(), d) << name;
    EXPECT_EQ(std::memcmp(got->data(), want.data(), d * sizeof(float)), 0) << name;
    if (got->data() == ptrs[0]) {
      picked.push_back(name);
      EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return std::isnan(v); }))
          << name << ": returned its input, yet wrote its output";
    } else {
      EXPECT_EQ(got->data(), out.data()) << name;
    }
  }
  EXPECT_THAT(picked, ::testing::IsSupersetOf({"mean", "median", "trimmed_mean"}));
  // The vote's value of one value is its sign times a scale, and centered clipping keeps
  // a centre it updates from the output.
  EXPECT_THAT(picked, ::testing::Not(::testing::Contains("sign_majority")));
  EXPECT_THAT(picked, ::testing::Not(::testing::Contains("centered_clipping")));
}

// The one difference in bits: the sums of ranks start at +0.0, so the median (and the
// trimmed mean) of a single -0 is +0, while the input itself, returned as the aggregate,
// keeps its -0. The mean sums in input order from the first value, which keeps it.
TEST(AggregatorTest, APickedInputKeepsItsNegativeZeros) {
  const std::vector<float> input = {-0.0f, 1.5f, -0.0f, -2.0f};
  const std::vector<const float*> ptrs = {input.data()};
  for (const char* name : {"mean", "median", "trimmed_mean"}) {
    absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(name, Options(1, 0));
    ASSERT_TRUE(rule.ok());
    std::vector<float> written(input.size());
    ASSERT_TRUE((*rule)->Aggregate(ptrs, written, {}).ok());
    EXPECT_EQ(std::signbit(written[0]), std::string_view(name) == "mean") << name;
    std::vector<float> out(input.size(), 7.0f);
    absl::StatusOr<std::span<const float>> got = (*rule)->AggregateOrPick(ptrs, out, {});
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->data(), input.data()) << name;
    EXPECT_TRUE(std::signbit((*got)[0])) << name;
    EXPECT_EQ(std::vector<float>(got->begin(), got->end()), written) << name;  // as values
  }
}

// Krum in model scope: ApplyOrPick returns the input the plan picked, the bits Apply
// writes, adds the same influence, and leaves `out` unwritten; with masks (filled rows)
// and with a shared support it writes `out` as Apply does.
TEST(AggregatorTest, KrumsPickIsReadInPlaceWithTheInfluenceApplyGives) {
  const size_t n = 11, d = 2000;
  const test::Vectors inputs = test::RandomVectors(n, d, 29);
  const std::vector<const float*> ptrs = test::Pointers(inputs);
  absl::StatusOr<std::unique_ptr<Aggregator>> krum = MakeAggregator("krum", Options(int(n), 2));
  ASSERT_TRUE(krum.ok());
  std::vector<double> gram(n * n, 0.0);
  ASSERT_TRUE((*krum)->AccumulateGram(ptrs, d, {}, gram).ok());
  absl::StatusOr<RoundPlan> plan = (*krum)->Plan(n, gram, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();

  std::vector<double> want_influence(n, 0.0), got_influence(n, 0.0);
  AggregationContext want_ctx, got_ctx;
  want_ctx.influence = want_influence;
  got_ctx.influence = got_influence;
  std::vector<float> want(d);
  ASSERT_TRUE((*krum)->Apply(*plan, ptrs, want, want_ctx).ok());
  std::vector<float> out(d, std::numeric_limits<float>::quiet_NaN());
  absl::StatusOr<std::span<const float>> got = (*krum)->ApplyOrPick(*plan, ptrs, out, got_ctx);
  ASSERT_TRUE(got.ok()) << got.status();
  const auto at = std::find(ptrs.begin(), ptrs.end(), got->data());
  ASSERT_NE(at, ptrs.end()) << "Krum's aggregate was not read in place";
  EXPECT_THAT(plan->Describe(), HasSubstr(absl::StrCat("input ", at - ptrs.begin())));
  EXPECT_EQ(std::memcmp(got->data(), want.data(), d * sizeof(float)), 0);
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[d - 1]));
  EXPECT_EQ(got_influence, want_influence);
  EXPECT_EQ(got_influence[size_t(at - ptrs.begin())], double(d));

  // Masks: the picked row would be a filled copy that the call frees.
  std::vector<uint8_t> bits((d + 7) / 8, 0xff);
  bits[3] = 0;
  std::vector<const uint8_t*> masks(n, nullptr);
  masks[size_t(at - ptrs.begin())] = bits.data();
  AggregationContext masked;
  masked.masks = masks;
  got = (*krum)->ApplyOrPick(*plan, ptrs, out, masked);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->data(), out.data());
  std::vector<float> masked_want(d);
  ASSERT_TRUE((*krum)->Apply(*plan, ptrs, masked_want, masked).ok());
  EXPECT_EQ(std::memcmp(out.data(), masked_want.data(), d * sizeof(float)), 0);

  // A shared support: the aggregate is gathered, aggregated and scattered into `out`.
  test::Vectors sparse(n, std::vector<float>(d, 0.0f));
  std::vector<uint32_t> support;
  for (uint32_t c = 1; c < d; c += 5) support.push_back(c);
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t c : support) sparse[i][c] = inputs[i][c];
  }
  AggregationContext on_support;
  on_support.support = support;
  std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
  got = (*krum)->ApplyOrPick(*plan, test::Pointers(sparse), out, on_support);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->data(), out.data());
  EXPECT_FALSE(std::isnan(out[0]));
}

class ByzantineTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// f Byzantine inputs at 1e6 (one coordinate at -1e6) among f + 3 honest ones in [-1, 1):
// the robust rules stay within the honest coordinate range, the mean does not.
TEST_P(ByzantineTest, HugeInputsCannotDragTheOutputOutOfTheHonestRange) {
  const auto& [name, f] = GetParam();
  const size_t d = 257;
  const int n = 2 * f + 3;
  test::Vectors inputs = test::RandomVectors(static_cast<size_t>(n), d, 100 + f);
  for (int b = 0; b < f; ++b) {
    inputs[static_cast<size_t>(2 * b + 1)].assign(d, 1e6f);
  }
  inputs[1][0] = -1e6f;  // one coordinate pulled the other way
  const std::vector<float> out = test::Aggregate(name, Options(n, f), inputs);
  ASSERT_EQ(out.size(), d);
  bool outside = false;
  for (size_t c = 0; c < d; ++c) {
    float lo = 1e30f;
    float hi = -1e30f;
    for (int i = 0; i < n; ++i) {
      const bool byzantine = i % 2 == 1 && i < 2 * f;
      if (byzantine) continue;
      lo = std::min(lo, inputs[static_cast<size_t>(i)][c]);
      hi = std::max(hi, inputs[static_cast<size_t>(i)][c]);
    }
    if (out[c] < lo || out[c] > hi) outside = true;
  }
  if (name == "mean") {
    EXPECT_TRUE(outside);
    EXPECT_GT(std::abs(out[1]), 1e5f);
  } else {
    EXPECT_FALSE(outside) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, ByzantineTest,
                         ::testing::Combine(::testing::Values("mean", "median", "trimmed_mean",
                                                              "krum", "multi_krum"),
                                            ::testing::Values(1, 2, 3)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_f" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ps::aggregators

namespace ps::aggregators {
namespace {

TEST(AggregatorOptionNamesTest, ParseAndNameRoundTripAndRefuseOtherSpellings) {
  for (KrumNeighbours k : {KrumNeighbours::kPaper, KrumNeighbours::kByzFL}) {
    EXPECT_EQ(ParseKrumNeighbours(KrumNeighboursName(k)).value(), k);
  }
  for (EvenMedian m : {EvenMedian::kMidpoint, EvenMedian::kLower, EvenMedian::kUpper}) {
    EXPECT_EQ(ParseEvenMedian(EvenMedianName(m)).value(), m);
  }
  EXPECT_EQ(KrumNeighboursName(KrumNeighbours::kByzFL), "byzfl");
  EXPECT_EQ(EvenMedianName(EvenMedian::kUpper), "upper");
  EXPECT_EQ(ParseKrumNeighbours("all").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEvenMedian("mean").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::aggregators
