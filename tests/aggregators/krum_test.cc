#include <vector>

#include "aggregators/gram_internal.h"
#include "aggregators/krum_internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators {
namespace {

using test::Aggregate;
using test::Options;
using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::HasSubstr;

AggregatorOptions KrumOptions(int n, int f, KrumNeighbours neighbours, int m = 0) {
  AggregatorOptions options = Options(n, f);
  options.krum_neighbours = neighbours;
  options.multi_krum_m = m;
  return options;
}

// Each input repeats its value in three coordinates, so squared distances are three times
// those of the plain values.
test::Vectors Broadcast(const std::vector<float>& values) {
  test::Vectors inputs;
  for (float v : values) inputs.push_back({v, v, v});
  return inputs;
}

TEST(KrumTest, PicksTheCentralMemberOfTheHonestCluster) {
  // n = 7, f = 2, 3 neighbours: scores 21, 11, 9, 22, 70 (x3) for the honest ones.
  const test::Vectors inputs = Broadcast({-1000, 10, 11, 12, 14, 17, 1000});
  EXPECT_THAT(Aggregate("krum", Options(7, 2), inputs),
              ElementsAre(FloatEq(12), FloatEq(12), FloatEq(12)));
  EXPECT_THAT(Aggregate("krum", KrumOptions(7, 2, KrumNeighbours::kByzFL), inputs),
              ElementsAre(FloatEq(12), FloatEq(12), FloatEq(12)));
}

TEST(KrumTest, TiesGoToTheLowestIndex) {
  // One neighbour each: every score is 1.
  EXPECT_THAT(Aggregate("krum", Options(3, 0), {{0}, {1}, {2}}), ElementsAre(FloatEq(0)));
  EXPECT_THAT(Aggregate("krum", Options(3, 0), {{2}, {1}, {0}}), ElementsAre(FloatEq(2)));
  // Scores 5, 2, 2, 5, huge: inputs 1 and 2 tie.
  EXPECT_THAT(Aggregate("krum", Options(5, 1), {{0}, {1}, {2}, {3}, {100}}),
              ElementsAre(FloatEq(1)));
  EXPECT_THAT(Aggregate("krum", Options(5, 1), {{0}, {2}, {1}, {3}, {100}}),
              ElementsAre(FloatEq(2)));
}

TEST(KrumTest, ByzFLNeighbourCountChangesThePick) {
  // Two neighbours: scores 5, 2, 5.
  EXPECT_THAT(Aggregate("krum", KrumOptions(3, 0, KrumNeighbours::kByzFL), {{0}, {1}, {2}}),
              ElementsAre(FloatEq(1)));
}

TEST(KrumTest, NeighbourCounts) {
  using internal::KrumNeighbourCount;
  EXPECT_EQ(KrumNeighbourCount(5, 1, KrumNeighbours::kPaper), 2u);
  EXPECT_EQ(KrumNeighbourCount(5, 1, KrumNeighbours::kByzFL), 3u);
  for (size_t f = 0; f < 10; ++f) {
    for (size_t k = 2 * f + 3; k < 2 * f + 10; ++k) {
      for (KrumNeighbours v : {KrumNeighbours::kPaper, KrumNeighbours::kByzFL}) {
        const size_t m = KrumNeighbourCount(k, f, v);
        EXPECT_GE(m, 1u) << "k " << k << " f " << f;
        EXPECT_LE(m, k - 1) << "k " << k << " f " << f;
      }
    }
  }
}

TEST(KrumTest, ScoresSumTheNearestSquaredDistances) {
  const test::Vectors inputs = {{0}, {1}, {2}, {3}, {100}};
  const std::vector<const float*> ptrs = test::Pointers(inputs);
  const internal::SquareMatrix dist = internal::SquaredDistances(ptrs, 1, nullptr);
  EXPECT_THAT(internal::KrumScores(dist, 2), ElementsAre(DoubleEq(5), DoubleEq(2), DoubleEq(2),
                                                         DoubleEq(5), DoubleEq(97 * 97 + 98 * 98)));
  EXPECT_THAT(internal::RankByScore({5, 2, 2, 5, 1}), ElementsAre(4, 1, 2, 0, 3));
}

TEST(KrumTest, OutputMayBeTheChosenInput) {
  test::Vectors inputs = {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {100, 100}};
  const std::vector<const float*> ptrs = test::Pointers(inputs);
  absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator("krum", Options(5, 1));
  ASSERT_TRUE(rule.ok()) << rule.status();
  ASSERT_TRUE((*rule)->Aggregate(ptrs, inputs[1], {}).ok());
  EXPECT_THAT(inputs[1], ElementsAre(FloatEq(1), FloatEq(1)));
}

TEST(MultiKrumTest, AveragesTheNMinusFLowestScoresByDefault) {
  // Scores 5, 2, 2, 5, huge: m = 4 keeps 0..3.
  EXPECT_THAT(Aggregate("multi_krum", Options(5, 1), Broadcast({0, 1, 2, 3, 100})),
              ElementsAre(FloatEq(1.5f), FloatEq(1.5f), FloatEq(1.5f)));
}

TEST(MultiKrumTest, AveragesTheConfiguredM) {
  const test::Vectors inputs = {{0}, {1}, {2}, {3}, {100}};
  // m = 3: inputs 1, 2 and then 0 (ties with 3, lower index).
  EXPECT_THAT(Aggregate("multi_krum", KrumOptions(5, 1, KrumNeighbours::kPaper, 3), inputs),
              ElementsAre(FloatEq(1)));
  EXPECT_THAT(Aggregate("multi_krum", KrumOptions(5, 1, KrumNeighbours::kPaper, 2), inputs),
              ElementsAre(FloatEq(1.5f)));
  // m = 1 is Krum.
  EXPECT_THAT(Aggregate("multi_krum", KrumOptions(5, 1, KrumNeighbours::kPaper, 1), inputs),
              ElementsAre(FloatEq(1)));
  // m = n is the mean.
  EXPECT_THAT(Aggregate("multi_krum", KrumOptions(5, 1, KrumNeighbours::kPaper, 5), inputs),
              ElementsAre(FloatEq(106.0f / 5)));
}

TEST(MultiKrumTest, DefaultMFollowsTheInputsGiven) {
  // Configured for n = 7 but given 5 inputs: m = 5 - 1 = 4.
  EXPECT_THAT(Aggregate("multi_krum", Options(7, 1), {{0}, {1}, {2}, {3}, {100}}),
              ElementsAre(FloatEq(1.5f)));
}

TEST(MultiKrumTest, RefusesMoreThanTheInputsGiven) {
  absl::StatusOr<std::unique_ptr<Aggregator>> rule =
      MakeAggregator("multi_krum", KrumOptions(7, 1, KrumNeighbours::kPaper, 6));
  ASSERT_TRUE(rule.ok()) << rule.status();
  const absl::StatusOr<std::vector<float>> out = test::Run(**rule, {{0}, {1}, {2}, {3}, {100}});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("m = 6"));
}

}  // namespace
}  // namespace ps::aggregators
