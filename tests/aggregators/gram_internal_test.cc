#include "aggregators/gram_internal.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
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

// Long enough for two waves of chunks, odd so the last block is ragged; k = 6 covers a
// full four-row panel, a two-row one and three- and two-column tiles.
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

// Small integers: every sum is exact in double, so the Gram must equal the plain sums
// whatever the order. Covers every panel and tile remainder (k mod 4, k mod 3), k = 1,
// and lengths that are not a multiple of the lanes, the block or the chunk.
TEST(GramTest, EveryShapeGivesExactSumsOfSmallIntegers) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> value(-8, 8);
  for (size_t k : {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16, 17}) {
    for (size_t d : {size_t{0}, size_t{1}, size_t{3}, size_t{5}, kGramBlock - 1, kGramBlock + 1,
                     3 * kGramBlock + 7, kGramChunk + 3}) {
      test::Vectors inputs(k, std::vector<float>(d));
      for (std::vector<float>& v : inputs) {
        for (float& x : v) x = static_cast<float>(value(rng));
      }
      const SquareMatrix gram = GramMatrix(test::Pointers(inputs), d, nullptr);
      ASSERT_EQ(gram.k, k);
      for (size_t i = 0; i < k; ++i) {
        for (size_t j = 0; j < k; ++j) {
          double want = 0.0;
          for (size_t c = 0; c < d; ++c) want += double{inputs[i][c]} * inputs[j][c];
          EXPECT_EQ(gram.at(i, j), want)
              << "k=" << k << " d=" << d << " (" << i << ", " << j << ")";
        }
      }
    }
  }
}

TEST(GramTest, NoInputs) { EXPECT_EQ(GramMatrix({}, 100, nullptr).k, 0u); }

// Products of the largest and the smallest floats are exact in double, and so are these
// sums: no overflow, underflow or flush to zero anywhere.
TEST(GramTest, ExtremeMagnitudesAreExact) {
  const float big = std::numeric_limits<float>::max();
  const float tiny = std::numeric_limits<float>::denorm_min();
  const size_t d = 5;
  const test::Vectors inputs = {std::vector<float>(d, big), std::vector<float>(d, -tiny),
                                std::vector<float>(d, 1.0f)};
  const SquareMatrix gram = GramMatrix(test::Pointers(inputs), d, nullptr);
  const double b = big;
  const double t = tiny;
  EXPECT_EQ(gram.at(0, 0), 5 * (b * b));
  EXPECT_EQ(gram.at(0, 1), -5 * (b * t));
  EXPECT_EQ(gram.at(0, 2), 5 * b);
  EXPECT_EQ(gram.at(1, 1), 5 * (t * t));
  EXPECT_GT(gram.at(1, 1), 0.0);
  EXPECT_EQ(gram.at(1, 2), -5 * t);
  EXPECT_EQ(gram.at(2, 2), 5.0);
}

// Every kernel this CPU runs gives the bits of the default one, with or without a pool.
TEST(GramTest, KernelsGiveIdenticalBits) {
  const size_t d = 2 * kGramChunk + 1001;
  for (size_t k : {1, 7, 16}) {
    const test::Vectors inputs = test::RandomVectors(k, d, 3 + k);
    const std::vector<const float*> ptrs = test::Pointers(inputs);
    const SquareMatrix want = GramMatrix(ptrs, d, nullptr);
    core::ThreadPool pool(2);
    for (GramKernel kernel : {GramKernel::kBaseline, GramKernel::kFma}) {
      if (!GramKernelSupported(kernel)) continue;
      for (core::ThreadPool* p : {static_cast<core::ThreadPool*>(nullptr), &pool}) {
        const SquareMatrix got = GramMatrix(ptrs, d, p, kernel);
        EXPECT_EQ(
            std::memcmp(got.values.data(), want.values.data(), want.values.size() * sizeof(double)),
            0)
            << "k=" << k << " kernel " << static_cast<int>(kernel) << (p ? " pooled" : "");
      }
    }
  }
}

}  // namespace
// An entry depends on its two rows alone: the Gram matrix of some of the rows is, bit
// for bit, the submatrix of theirs in the Gram matrix of all (what lets a shard compute
// a slice's part over every worker that pushed it before it knows the round's
// participants: server/round_aggregation.h, GramPerSlice).
TEST(GramTest, TheGramOfSomeRowsIsTheSubmatrixOfTheGramOfAll) {
  const size_t d = 2 * kGramChunk + 1001;
  const size_t k = 13;
  const test::Vectors inputs = test::RandomVectors(k, d, 29);
  const std::vector<const float*> all = test::Pointers(inputs);
  core::ThreadPool pool(2);
  const SquareMatrix whole = GramMatrix(all, d, &pool);
  for (const std::vector<size_t>& pick :
       {std::vector<size_t>{0}, {12}, {1, 2}, {0, 5, 6, 11}, {3, 4, 5, 6, 7, 8, 9, 10, 11, 12},
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12}}) {
    std::vector<const float*> rows;
    for (size_t i : pick) rows.push_back(all[i]);
    for (core::ThreadPool* p : {static_cast<core::ThreadPool*>(nullptr), &pool}) {
      const SquareMatrix some = GramMatrix(rows, d, p);
      for (size_t a = 0; a < pick.size(); ++a) {
        for (size_t b = 0; b < pick.size(); ++b) {
          const double want = whole.at(pick[a], pick[b]);
          const double got = some.at(a, b);
          EXPECT_EQ(std::memcmp(&got, &want, sizeof(double)), 0)
              << "rows " << pick[a] << " and " << pick[b] << " of " << pick.size() << ": " << got
              << " against " << want;
        }
      }
    }
  }
}

}  // namespace ps::aggregators::internal
