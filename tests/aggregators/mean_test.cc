#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators {
namespace {

using test::Aggregate;
using test::Options;
using ::testing::ElementsAre;
using ::testing::FloatEq;

TEST(MeanTest, AveragesEachCoordinate) {
  const test::Vectors inputs = {{1, 2, 3}, {3, 4, 5}, {5, 6, 10}};
  EXPECT_THAT(Aggregate("mean", Options(3, 0), inputs),
              ElementsAre(FloatEq(3), FloatEq(4), FloatEq(6)));
}

TEST(MeanTest, OneInputIsCopied) {
  EXPECT_THAT(Aggregate("mean", Options(1, 0), {{-1.5f, 7}}),
              ElementsAre(FloatEq(-1.5f), FloatEq(7)));
}

TEST(MeanTest, IgnoresFAndAcceptsMoreInputsThanWorkers) {
  EXPECT_THAT(Aggregate("mean", Options(1, 3), {{1}, {2}, {3}, {6}}), ElementsAre(FloatEq(3)));
}

TEST(MeanTest, LongVectorsCrossTileAndBlockBoundaries) {
  const size_t d = 40000;  // several coordinate blocks and a partial tile
  test::Vectors inputs(3, std::vector<float>(d));
  for (size_t c = 0; c < d; ++c) {
    inputs[0][c] = static_cast<float>(c);
    inputs[1][c] = 1.0f;
    inputs[2][c] = -static_cast<float>(c) + 2.0f;
  }
  const std::vector<float> out = Aggregate("mean", Options(3, 0), inputs);
  ASSERT_EQ(out.size(), d);
  for (size_t c = 0; c < d; ++c) ASSERT_FLOAT_EQ(out[c], 1.0f) << "coordinate " << c;
}

}  // namespace
}  // namespace ps::aggregators
