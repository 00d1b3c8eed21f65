// sign_majority: the sign of the vote times the median of the inputs' mean |x|.
#include <cmath>
#include <vector>

#include "aggregators/aggregator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators {
namespace {

using test::Aggregate;
using test::FromColumns;
using test::Options;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SignMajorityTest, VotesPerCoordinateAndScalesByTheMedianMeanMagnitude) {
  // Rows (mean |x|): {1, 1, -1, 1} (1), {2, -2, -2, 0} (1.5), {-4, 4, -4, 0} (3).
  const test::Vectors x = {{1, 1, -1, 1}, {2, -2, -2, 0}, {-4, 4, -4, 0}};
  // Votes: +1, +1, -3, +1; scale median {1, 1.5, 3} = 1.5.
  EXPECT_THAT(Aggregate("sign_majority", Options(3, 1), x), ElementsAre(1.5f, 1.5f, -1.5f, 1.5f));
}

TEST(SignMajorityTest, TiesAndZerosGiveZeroAndEvenCountsTakeTheMidpointScale) {
  // Columns: {+, -} tie; {0, 0} no vote; {+, 0} and {0, -} one vote each. Rows
  // {1, 0, 2, 0} and {-2, 0, 0, -4} have mean |x| 0.75 and 1.5: midpoint 1.125.
  const test::Vectors x = FromColumns({{1, -2}, {0, 0}, {2, 0}, {0, -4}});
  EXPECT_THAT(Aggregate("sign_majority", Options(2, 0), x),
              ElementsAre(0.0f, 0.0f, 1.125f, -1.125f));
}

TEST(SignMajorityTest, AMinorityOfHugeInputsMovesNeitherSignNorScale) {
  test::Vectors x(7, std::vector<float>(50));
  for (size_t i = 0; i < 7; ++i) {
    for (size_t c = 0; c < 50; ++c) x[i][c] = (c % 3 == 0 ? -1.0f : 1.0f) * (1.0f + 0.01f * i);
  }
  for (size_t i = 5; i < 7; ++i) {
    for (float& v : x[i]) v = -1e6f * v;  // two attackers flip and blow up
  }
  const std::vector<float> out = Aggregate("sign_majority", Options(7, 2), x);
  ASSERT_EQ(out.size(), 50u);
  for (size_t c = 0; c < 50; ++c) {
    EXPECT_EQ(std::signbit(out[c]), c % 3 == 0) << c;
    EXPECT_NEAR(std::fabs(out[c]), 1.03f, 1e-6) << c;  // median of 1.00 .. 1.04 and two 1e6s
  }
}

TEST(SignMajorityTest, MaskedCoordinatesDoNotVoteNorCountInTheScale) {
  const test::Vectors x = {{1, 1, 1, 1}, {-3, -3, -3, -3}, {-5, 9, 9, 9}};
  std::vector<uint8_t> only_first = {0x01};  // input 2 keeps coordinate 0 only
  std::vector<const uint8_t*> masks = {nullptr, nullptr, only_first.data()};
  auto rule = MakeAggregator("sign_majority", Options(3, 1));
  ASSERT_TRUE(rule.ok()) << rule.status();
  std::vector<float> out(4);
  AggregationContext ctx;
  ctx.masks = masks;
  ASSERT_TRUE((*rule)->Aggregate(test::Pointers(x), out, ctx).ok());
  // Scales 1, 3, 5 (input 2's present value only) -> 3; votes -1, 0, 0, 0.
  EXPECT_THAT(out, ElementsAre(-3.0f, 0.0f, 0.0f, 0.0f));
}

TEST(SignMajorityTest, RefusesPreAggregatorsAndTooFewWorkers) {
  auto chained = MakeAggregator("nnm+sign_majority", Options(7, 1));
  EXPECT_THAT(std::string(chained.status().message()), HasSubstr("cannot follow pre-aggregators"));
  auto small = MakeAggregator("sign_majority", Options(4, 2));
  EXPECT_THAT(std::string(small.status().message()), HasSubstr("n >= 2f + 1 = 5"));
}

}  // namespace
}  // namespace ps::aggregators
