#include "aggregators/gram_internal.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators::internal {
namespace {

using ::testing::DoubleEq;
using ::testing::ElementsAre;

TEST(GramTest, SmallHandComputedCase) {
  const test::Vectors inputs = {{1, 2, 3}, {0, 1, 0}, {-1, 0, 2}};
  const SquareMatrix gram = GramMatrix(test::Pointers(inputs), 3, nullptr);
  EXPECT_THAT(gram.values, ElementsAre(DoubleEq(14), DoubleEq(2), DoubleEq(5),  //
                                       DoubleEq(2), DoubleEq(1), DoubleEq(0),   //
                                       DoubleEq(5), DoubleEq(0), DoubleEq(5)));
  const SquareMatrix dist = SquaredDistancesFromGram(gram);
  EXPECT_THAT(dist.values, ElementsAre(DoubleEq(0), DoubleEq(11), DoubleEq(9),  //
                                       DoubleEq(11), DoubleEq(0), DoubleEq(6),  //
                                       DoubleEq(9), DoubleEq(6), DoubleEq(0)));
}

TEST(GramTest, RoundingNeverMakesADistanceNegative) {
  SquareMatrix gram(2);
  gram.at(0, 0) = 1.0;
  gram.at(1, 1) = 1.0;
  gram.at(0, 1) = gram.at(1, 0) = 1.0 + 1e-15;
  const SquareMatrix dist = SquaredDistancesFromGram(gram);
  EXPECT_EQ(dist.at(0, 1), 0.0);
  EXPECT_EQ(dist.at(1, 0), 0.0);
}

// Long enough for two waves of chunks, odd so the last block is ragged; k = 6 covers the
// four-row kernel and its remainder.
TEST(GramTest, MatchesPairwiseLoopsAndIgnoresThePoolSize) {
  const size_t d = 2 * kGramChunksPerWave * kGramChunk + 1234;
  const test::Vectors inputs = test::RandomVectors(6, d, 11);
  const std::vector<const float*> ptrs = test::Pointers(inputs);
  const SquareMatrix serial = SquaredDistances(ptrs, d, nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(serial.at(i, i), 0.0);
    for (size_t j = i + 1; j < inputs.size(); ++j) {
      double want = 0.0;
      for (size_t c = 0; c < d; ++c) {
        const double diff = static_cast<double>(inputs[i][c]) - inputs[j][c];
        want += diff * diff;
      }
      EXPECT_NEAR(serial.at(i, j), want, 1e-9 * want) << i << ", " << j;
      EXPECT_EQ(serial.at(j, i), serial.at(i, j));
    }
  }
  for (size_t threads : {1, 3}) {
    core::ThreadPool pool(threads);
    const SquareMatrix pooled = SquaredDistances(ptrs, d, &pool);
    EXPECT_EQ(std::memcmp(pooled.values.data(), serial.values.data(),
                          serial.values.size() * sizeof(double)),
              0)
        << threads << " threads";
  }
}

}  // namespace
}  // namespace ps::aggregators::internal
