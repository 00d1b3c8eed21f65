// Suspicion: per-worker shares of the aggregates, scored per window of rounds.
#include "server/suspicion.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace ps::server {
namespace {

// No alignment for k inputs: the score is the set-aside part alone.
std::vector<double> NoAlignment(size_t k) { return std::vector<double>(k, NAN); }

Suspicion::Config Config(uint32_t workers, uint32_t window, double threshold = 0.5) {
  return Suspicion::Config{/*shard_id=*/0, workers, window, threshold};
}

TEST(SuspicionTest, AWindowScoresEachWorkersShareOfTheAggregates) {
  Suspicion s(Config(3, 2));
  const std::vector<uint32_t> all = {0, 1, 2};
  // Rounds 0 and 1: worker 2 set aside; 0 and 1 weigh alike (a share of 1.5 each).
  s.Record(0, all, std::vector<double>{1, 1, 0}, NoAlignment(3), 10);
  s.Record(1, all, std::vector<double>{1, 1, 0}, NoAlignment(3), 10);
  EXPECT_TRUE(std::isnan(s.Get()[0].score)) << "no window closed yet";
  // Round 2 opens the next window and closes the first.
  s.Record(2, all, std::vector<double>{1, 1, 1}, NoAlignment(3), 10);
  const std::vector<WorkerSuspicion> w = s.Get();
  EXPECT_EQ(w[0].score, 0.0);
  EXPECT_EQ(w[1].score, 0.0);
  EXPECT_EQ(w[2].score, 1.0);
  EXPECT_TRUE(w[2].suspected);
  EXPECT_FALSE(w[0].suspected);
  EXPECT_EQ(w[2].windows, 1u);
  EXPECT_EQ(w[2].windows_suspected, 1u);
  EXPECT_EQ(w[0].slice_rounds_weighed, 3u);
  EXPECT_DOUBLE_EQ(w[0].share_sum, 1.5 + 1.5 + 1.0);
  EXPECT_DOUBLE_EQ(w[2].share_sum, 1.0);
  const std::vector<Suspicion::Window> h = s.History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].first_round, 0u);
  EXPECT_EQ(h[0].scores, (std::vector<double>{0.0, 0.0, 1.0}));
}

TEST(SuspicionTest, SharesAreWeightedBySliceSizeAndScoredAgainstAnEqualShare) {
  Suspicion s(Config(2, 1));
  const std::vector<uint32_t> both = {0, 1};
  // A large slice at 0.5 of an equal share for worker 1 and a small one at 1.5:
  // (0.5 * 30 + 1.5 * 10) / 40 = 0.75, so a score of 0.25.
  s.Record(0, both, std::vector<double>{3, 1}, NoAlignment(2), 30);
  s.Record(0, both, std::vector<double>{1, 3}, NoAlignment(2), 10);
  s.Record(1, both, std::vector<double>{1, 1}, NoAlignment(2), 10);
  const std::vector<WorkerSuspicion> w = s.Get();
  EXPECT_DOUBLE_EQ(w[1].score, 0.25);
  EXPECT_FALSE(w[1].suspected);
  EXPECT_EQ(w[0].score, 0.0) << "1.25 of an equal share scores 0, not below";
}

TEST(SuspicionTest, AWorkerCrossesTheThresholdBothWays) {
  Suspicion s(Config(2, 1, 0.6));
  const std::vector<uint32_t> both = {0, 1};
  // Worker 1 at 1/3 of an equal share.
  s.Record(0, both, std::vector<double>{1, 0.2}, NoAlignment(2), 8);
  s.Record(1, both, std::vector<double>{1, 1}, NoAlignment(2), 8);
  EXPECT_TRUE(s.Get()[1].suspected);
  EXPECT_NEAR(s.Get()[1].score, 1.0 - 2 * 0.2 / 1.2, 1e-12);
  s.Record(2, both, std::vector<double>{1, 1}, NoAlignment(2), 8);
  EXPECT_FALSE(s.Get()[1].suspected);
  EXPECT_EQ(s.Get()[1].windows_suspected, 1u);
  EXPECT_EQ(s.Get()[1].windows, 2u);
}

TEST(SuspicionTest, AnAbsentWorkerKeepsItsScoreAndIsMissingFromTheWindow) {
  Suspicion s(Config(3, 1));
  s.Record(0, std::vector<uint32_t>{0, 1, 2}, std::vector<double>{1, 1, 0}, NoAlignment(3), 4);
  s.Record(1, std::vector<uint32_t>{0, 1}, std::vector<double>{1, 1}, NoAlignment(2), 4);
  // Skips rounds 2-4.
  s.Record(5, std::vector<uint32_t>{0, 1}, std::vector<double>{1, 1}, NoAlignment(2), 4);
  EXPECT_EQ(s.Get()[2].score, 1.0);
  const std::vector<Suspicion::Window> h = s.History();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[1].first_round, 1u);
  EXPECT_TRUE(std::isnan(h[1].scores[2]));
}

TEST(SuspicionTest, APushAgainstTheAggregateIsSuspectEvenWhenTheRuleUsedIt) {
  Suspicion s(Config(3, 1));
  const std::vector<uint32_t> all = {0, 1, 2};
  // Every input weighs alike; worker 2 points against the aggregate (cosine -0.8, then
  // -0.4 on a slice three times the size), worker 1 at a right angle half the time.
  s.Record(0, all, std::vector<double>{1, 1, 1}, std::vector<double>{0.9, 0.0, -0.8}, 10);
  s.Record(0, all, std::vector<double>{1, 1, 1}, std::vector<double>{0.7, NAN, -0.4}, 30);
  s.Record(1, all, std::vector<double>{1, 1, 1}, std::vector<double>{1, 1, 1}, 10);
  const std::vector<WorkerSuspicion> w = s.Get();
  EXPECT_DOUBLE_EQ(w[2].alignment, (-0.8 * 10 - 0.4 * 30) / 40);
  EXPECT_DOUBLE_EQ(w[2].score, 0.5);
  EXPECT_EQ(w[2].set_aside, 0.0);
  EXPECT_TRUE(w[2].suspected);
  EXPECT_DOUBLE_EQ(w[1].alignment, 0.0) << "the undefined cosine is left out";
  EXPECT_EQ(w[1].score, 0.0);
  EXPECT_DOUBLE_EQ(w[0].alignment, (0.9 * 10 + 0.7 * 30) / 40);
  EXPECT_EQ(w[0].score, 0.0) << "pointing with the aggregate adds nothing";
}

TEST(SuspicionTest, ALateSliceOfAnEarlierWindowCountsInTheOpenOne) {
  Suspicion s(Config(2, 2));
  const std::vector<uint32_t> both = {0, 1};
  s.Record(2, both, std::vector<double>{1, 1}, NoAlignment(2), 4);
  // Late: window 0 is already past.
  s.Record(1, both, std::vector<double>{1, 0}, NoAlignment(2), 4);
  s.Record(4, both, std::vector<double>{1, 1}, NoAlignment(2), 4);
  // Window 1 (rounds 2-3) holds both: worker 1 at (1 + 0) / 2 of an equal share.
  EXPECT_DOUBLE_EQ(s.Get()[1].score, 0.5);
  ASSERT_EQ(s.History().size(), 1u);
  EXPECT_EQ(s.History()[0].first_round, 2u);
}

TEST(SuspicionTest, NonsenseIsIgnoredAndTheHistoryIsBounded) {
  Suspicion s(Config(2, 1));
  const std::vector<uint32_t> both = {0, 1};
  s.Record(0, both, std::vector<double>{0, 0}, NoAlignment(2), 4);    // nothing weighed
  s.Record(0, both, std::vector<double>{NAN, 1}, NoAlignment(2), 4);  // not finite
  s.Record(0, both, std::vector<double>{1}, NoAlignment(1), 4);       // sizes differ
  s.Record(0, std::vector<uint32_t>{0, 7}, std::vector<double>{1, 1}, NoAlignment(2),
           4);  // an id beyond n
  EXPECT_EQ(s.Get()[0].slice_rounds_weighed, 1u);
  EXPECT_EQ(s.Get()[1].slice_rounds_weighed, 0u);
  for (uint64_t r = 1; r < 3 * Suspicion::kHistoryWindows; ++r) {
    s.Record(r, both, std::vector<double>{1, 1}, NoAlignment(2), 4);
  }
  EXPECT_EQ(s.History().size(), Suspicion::kHistoryWindows);
  Suspicion off(Config(2, 0));
  off.Record(0, both, std::vector<double>{1, 0}, NoAlignment(2), 4);
  EXPECT_EQ(off.Get()[0].slice_rounds_weighed, 0u);
}

}  // namespace
}  // namespace ps::server
