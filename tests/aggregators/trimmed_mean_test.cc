#include <vector>

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

TEST(TrimmedMeanTest, DropsOneLargestAndOneSmallestWithFOne) {
  const test::Vectors inputs = FromColumns({{1, 2, 3, 4, 100}, {0, -100, 2, 1, 3}});
  EXPECT_THAT(Aggregate("trimmed_mean", Options(5, 1), inputs),
              ElementsAre(FloatEq(3), FloatEq(1)));
}

TEST(TrimmedMeanTest, DropsTwoLargestAndTwoSmallestWithFTwo) {
  EXPECT_THAT(Aggregate("trimmed_mean", Options(6, 2), FromColumns({{5, 1000, 1, 4, 2, 3}})),
              ElementsAre(FloatEq(3.5f)));
  EXPECT_THAT(Aggregate("trimmed_mean", Options(7, 2), FromColumns({{-50, 1, 5, 2, 3, 4, 1000}})),
              ElementsAre(FloatEq(3)));
}

TEST(TrimmedMeanTest, SmallestAllowedCountLeavesTheMedian) {
  EXPECT_THAT(Aggregate("trimmed_mean", Options(5, 2), FromColumns({{9, 1, 4, 100, 3}})),
              ElementsAre(FloatEq(4)));
}

TEST(TrimmedMeanTest, FZeroIsTheMean) {
  EXPECT_THAT(Aggregate("trimmed_mean", Options(3, 0), FromColumns({{1, 2, 6}})),
              ElementsAre(FloatEq(3)));
}

TEST(TrimmedMeanTest, TrimsByValueNotByInput) {
  // Input 0 is the largest in coordinate 0 and the smallest in coordinate 1.
  const test::Vectors inputs = FromColumns({{9, 1, 2, 3}, {-9, 1, 2, 3}});
  EXPECT_THAT(Aggregate("trimmed_mean", Options(4, 1), inputs),
              ElementsAre(FloatEq(2.5f), FloatEq(1.5f)));
}

TEST(TrimmedMeanTest, RefusesTooFewInputs) {
  absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator("trimmed_mean", Options(5, 2));
  ASSERT_TRUE(rule.ok()) << rule.status();
  const absl::StatusOr<std::vector<float>> out = test::Run(**rule, {{1}, {2}, {3}, {4}});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::aggregators
