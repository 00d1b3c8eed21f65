#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "aggregators/coordinate_internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators {
namespace {

using test::Aggregate;
using test::FromColumns;
using test::Options;
using ::testing::ElementsAre;
using ::testing::FloatEq;

AggregatorOptions MedianOptions(int n, EvenMedian even) {
  AggregatorOptions options = Options(n, 0);
  options.even_median = even;
  return options;
}

TEST(MedianTest, OddCountTakesTheMiddleValue) {
  const test::Vectors inputs = FromColumns({{1, 3, 2}, {5, -1, 0}, {7, 7, -7}});
  EXPECT_THAT(Aggregate("median", Options(3, 0), inputs),
              ElementsAre(FloatEq(2), FloatEq(0), FloatEq(7)));
}

TEST(MedianTest, EvenCountTakesTheMidpointByDefault) {
  const test::Vectors inputs = FromColumns({{4, 1, 3, 2}, {10, -10, 0, 1}});
  EXPECT_THAT(Aggregate("median", Options(4, 0), inputs),
              ElementsAre(FloatEq(2.5f), FloatEq(0.5f)));
}

TEST(MedianTest, EvenCountLowerAndUpperSwitches) {
  const test::Vectors inputs = FromColumns({{4, 1, 3, 2}, {10, -10, 0, 1}});
  EXPECT_THAT(Aggregate("median", MedianOptions(4, EvenMedian::kLower), inputs),
              ElementsAre(FloatEq(2), FloatEq(0)));
  EXPECT_THAT(Aggregate("median", MedianOptions(4, EvenMedian::kUpper), inputs),
              ElementsAre(FloatEq(3), FloatEq(1)));
}

TEST(MedianTest, TwoInputsGiveTheirMidpoint) {
  EXPECT_THAT(Aggregate("median", Options(2, 0), {{1, -3}, {2, 5}}),
              ElementsAre(FloatEq(1.5f), FloatEq(1)));
}

TEST(MedianTest, MidpointOfHugeValuesDoesNotOverflow) {
  const float big = 3.0e38f;
  EXPECT_THAT(Aggregate("median", Options(2, 0), {{big}, {big}}), ElementsAre(FloatEq(big)));
}

TEST(MedianTest, OneInputIsCopied) {
  EXPECT_THAT(Aggregate("median", Options(1, 0), {{0.25f, -9}}),
              ElementsAre(FloatEq(0.25f), FloatEq(-9)));
}

// 80 inputs take the nth_element path rather than the sorting network.
TEST(MedianTest, ManyInputsUseSelection) {
  static_assert(79 > internal::kMaxNetworkInputs);
  std::vector<float> column(80);
  std::iota(column.begin(), column.end(), 0.0f);
  std::shuffle(column.begin(), column.end(), std::mt19937(7));
  std::vector<float> reversed(column.rbegin(), column.rend());
  const test::Vectors inputs = FromColumns({column, reversed});
  EXPECT_THAT(Aggregate("median", Options(80, 0), inputs),
              ElementsAre(FloatEq(39.5f), FloatEq(39.5f)));
  EXPECT_THAT(Aggregate("median", MedianOptions(80, EvenMedian::kLower), inputs),
              ElementsAre(FloatEq(39), FloatEq(39)));
  EXPECT_THAT(Aggregate("median", MedianOptions(80, EvenMedian::kUpper), inputs),
              ElementsAre(FloatEq(40), FloatEq(40)));
  column.pop_back();  // 79 inputs, odd
  reversed.erase(reversed.begin());
  const float middle = [&] {
    std::vector<float> sorted = column;
    std::sort(sorted.begin(), sorted.end());
    return sorted[39];
  }();
  EXPECT_THAT(Aggregate("median", Options(79, 0), FromColumns({column, reversed})),
              ElementsAre(FloatEq(middle), FloatEq(middle)));
}

}  // namespace
}  // namespace ps::aggregators
