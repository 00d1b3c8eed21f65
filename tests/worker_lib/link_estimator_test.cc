#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "worker_lib/link_estimator_internal.h"

namespace ps::internal {
namespace {

constexpr double kAlpha = 2e-4;  // 200 us
constexpr double kBeta = 8e-9;   // 1 GB/s

double Line(uint64_t bytes) { return kAlpha + kBeta * static_cast<double>(bytes); }

TEST(LinkEstimatorTest, NothingSampledIsNotAnEstimate) {
  LinkEstimator e;
  EXPECT_FALSE(e.Estimate().valid);
  e.AddLatency(1e-3);
  EXPECT_FALSE(e.Estimate().valid);
}

TEST(LinkEstimatorTest, RecoversAnExactLine) {
  LinkEstimator e;
  for (uint64_t b = 1000; b <= 1000000; b *= 2) e.AddTransfer(b, Line(b));
  const LinkCost c = e.Estimate();
  ASSERT_TRUE(c.valid);
  EXPECT_TRUE(c.from_slope);
  EXPECT_NEAR(c.alpha_seconds, kAlpha, 1e-9);
  EXPECT_NEAR(c.seconds_per_byte, kBeta, 1e-15);
  EXPECT_NEAR(c.Seconds(500000), Line(500000), 1e-9);
}

TEST(LinkEstimatorTest, BytesInIsTheRateTimesTheSeconds) {
  LinkCost c;
  EXPECT_EQ(c.BytesIn(1.0), 0u);  // no estimate
  c.valid = true;
  EXPECT_EQ(c.BytesIn(1.0), 0u);  // no measured rate
  c.seconds_per_byte = 1e-9;      // 1 GB/s
  c.alpha_seconds = 0.5;          // the fixed cost does not count
  EXPECT_NEAR(static_cast<double>(c.BytesIn(0.002)), 2e6, 1.0);
  EXPECT_EQ(c.BytesIn(0), 0u);
  c.seconds_per_byte = 1e-300;  // a wild estimate stays a finite count
  EXPECT_EQ(c.BytesIn(1.0), 1'000'000'000'000'000'000u);
}

TEST(LinkEstimatorTest, AQuarterOfStallsDoesNotMoveTheFit) {
  LinkEstimator e;
  uint64_t b = 10000;
  for (int i = 0; i < 64; ++i) {
    b = 10000 + (b * 7919) % 2000000;  // sizes spread over [1e4, 2e6]
    // Every fourth transfer stalled: ten times as long.
    e.AddTransfer(b, i % 4 == 3 ? 10 * Line(b) : Line(b));
  }
  const LinkCost c = e.Estimate();
  ASSERT_TRUE(c.from_slope);
  EXPECT_NEAR(c.seconds_per_byte, kBeta, 0.05 * kBeta);
  EXPECT_NEAR(c.alpha_seconds, kAlpha, 0.05 * kAlpha);
}

TEST(LinkEstimatorTest, AlikeSizesTakeAlphaFromTheLatencies) {
  LinkEstimator e;
  for (int i = 0; i < 20; ++i) e.AddTransfer(1 << 20, Line(1 << 20));
  for (int i = 0; i < 9; ++i) e.AddLatency(kAlpha);
  e.AddLatency(1.0);  // one stalled round trip
  const LinkCost c = e.Estimate();
  ASSERT_TRUE(c.valid);
  EXPECT_FALSE(c.from_slope);
  EXPECT_DOUBLE_EQ(c.alpha_seconds, kAlpha);
  EXPECT_NEAR(c.seconds_per_byte, kBeta, 1e-15);
}

TEST(LinkEstimatorTest, AlikeSizesWithoutLatenciesChargeEverythingPerByte) {
  LinkEstimator e;
  e.AddTransfer(1000, 1e-3);
  const LinkCost c = e.Estimate();
  ASSERT_TRUE(c.valid);
  EXPECT_EQ(c.alpha_seconds, 0);
  EXPECT_DOUBLE_EQ(c.seconds_per_byte, 1e-6);
}

TEST(LinkEstimatorTest, FollowsALinkThatChanges) {
  LinkEstimator e(/*window=*/16);
  for (uint64_t i = 1; i <= 16; ++i) e.AddTransfer(i * 100000, Line(i * 100000));
  // The link gets four times slower per byte; after a window of samples the old ones
  // are gone.
  for (uint64_t i = 1; i <= 16; ++i)
    e.AddTransfer(i * 100000, kAlpha + 4 * kBeta * double(i * 100000));
  const LinkCost c = e.Estimate();
  EXPECT_EQ(c.transfers, 16u);
  EXPECT_NEAR(c.seconds_per_byte, 4 * kBeta, 1e-15);
  EXPECT_NEAR(c.alpha_seconds, kAlpha, 1e-9);
}

TEST(LinkEstimatorTest, IgnoresSamplesThatMeanNothing) {
  LinkEstimator e;
  e.AddTransfer(0, 1.0);
  e.AddTransfer(1000, std::numeric_limits<double>::quiet_NaN());
  e.AddTransfer(1000, std::numeric_limits<double>::infinity());
  e.AddTransfer(1000, -1.0);
  e.AddLatency(std::numeric_limits<double>::quiet_NaN());
  e.AddLatency(-1.0);
  EXPECT_FALSE(e.Estimate().valid);
  e.AddTransfer(1000, 1e-3);
  const LinkCost c = e.Estimate();
  EXPECT_EQ(c.transfers, 1u);
  EXPECT_TRUE(std::isfinite(c.seconds_per_byte));
}

TEST(LinkEstimatorTest, NeverPredictsNegativeCosts) {
  LinkEstimator e;
  // Larger transfers that happened to be faster (noise on an idle link): a negative
  // slope is clamped to zero, as is a negative intercept.
  for (uint64_t b = 1000; b <= 64000; b *= 2) e.AddTransfer(b, 1e-3 - 1e-9 * double(b));
  const LinkCost c = e.Estimate();
  EXPECT_GE(c.seconds_per_byte, 0);
  EXPECT_GE(c.alpha_seconds, 0);
}

TEST(TransferMeterTest, ABusyPeriodIsOneTransferOfWhatItsCallsDelivered) {
  double now = 0;
  TransferMeter m([&now] { return now; });
  EXPECT_EQ(m.Estimate().transfers, 0u);
  // Two overlapping calls: one transfer of 3000 bytes from t=0 to t=1.
  m.Started();
  now = 0.25;
  m.Started();
  now = 0.5;
  m.Finished(1000);
  EXPECT_EQ(m.Estimate().transfers, 0u);  // still busy
  now = 1.0;
  m.Finished(2000);
  LinkCost c = m.Estimate();
  ASSERT_EQ(c.transfers, 1u);
  EXPECT_DOUBLE_EQ(c.Seconds(3000), 1.0);
  // A period whose calls all failed delivered nothing: no sample.
  now = 2.0;
  m.Started();
  now = 3.0;
  m.Finished(0);
  EXPECT_EQ(m.Estimate().transfers, 1u);
  // 12000 bytes in 3.5 s: with the first (3000 bytes in 1 s), sizes 4x apart, a slope
  // of 2.5 s per 9000 bytes.
  now = 4.0;
  m.Started();
  now = 7.5;
  m.Finished(12000);
  c = m.Estimate();
  ASSERT_EQ(c.transfers, 2u);
  EXPECT_TRUE(c.from_slope);
  EXPECT_NEAR(c.seconds_per_byte, 2.5 / 9000, 1e-12);
  EXPECT_NEAR(c.alpha_seconds, 1.0 - 3000 * 2.5 / 9000, 1e-9);
  // An unmatched Finished changes nothing.
  m.Finished(5);
  EXPECT_EQ(m.Estimate().transfers, 2u);
}

// A pull stream's runs of back-to-back messages are the downlink's transfers: the
// first message of a stream and one written after the shard waited for its version
// (unqueued) start no sample, and the wait before them is in none.
TEST(BurstTimerTest, RunsOfQueuedMessagesAreTransfersAndWaitsAreNot) {
  SharedLinkEstimate link;
  {
    BurstTimer t(&link);
    t.Arrived(1000, /*queued=*/true, 0.0);  // a stream's first message: no gap to time
    t.Arrived(1000, true, 0.1);
    t.Arrived(1000, true, 0.2);   // a run of 2000 bytes in 0.2 s
    t.Arrived(1000, false, 5.0);  // the shard waited 4.8 s for this version
    t.Arrived(4000, true, 5.4);   // a run of 4000 bytes in 0.4 s
    EXPECT_EQ(link.Estimate().transfers, 1u) << "the second run is still going on";
    t.End();
    t.End();  // ending twice adds nothing
  }
  LinkCost c = link.Estimate();
  ASSERT_EQ(c.transfers, 2u);
  EXPECT_TRUE(c.from_slope);
  EXPECT_NEAR(c.seconds_per_byte, 1e-4, 1e-12);
  EXPECT_NEAR(c.alpha_seconds, 0, 1e-9);
  // A stream of unqueued messages only (each waited for its version) times nothing.
  BurstTimer idle(&link);
  for (int i = 0; i < 4; ++i) idle.Arrived(1000, false, 10.0 + i);
  idle.End();
  EXPECT_EQ(link.Estimate().transfers, 2u);
}

// A round's idle time runs from the last drain to the first push of the next round;
// drains inside a round (between tensors) move its start, pushes of the same round
// take no sample, and the mean weighs the newest round by a quarter.
TEST(RoundIdleMeterTest, MeasuresFromTheLastDrainToTheNextRoundsFirstPush) {
  double now = 0;
  RoundIdleMeter m([&now] { return now; });
  EXPECT_FALSE(m.Seconds().has_value());
  m.Pushing(0);
  now = 1;
  m.Drained();  // tensor a of round 0 answered
  now = 1.5;
  m.Pushing(0);  // tensor b of round 0: no sample
  now = 2;
  m.Drained();
  EXPECT_FALSE(m.Seconds().has_value());
  now = 5;
  m.Pushing(1);  // 3 s from the last drain
  ASSERT_TRUE(m.Seconds().has_value());
  EXPECT_DOUBLE_EQ(*m.Seconds(), 3);
  // Round 2 begins before round 1's pushes drained: no sample (nothing was idle).
  now = 6;
  m.Pushing(2);
  EXPECT_DOUBLE_EQ(*m.Seconds(), 3);
  now = 7;
  m.Drained();
  now = 8;
  m.Pushing(3);  // 1 s: 0.75 * 3 + 0.25 * 1
  EXPECT_DOUBLE_EQ(*m.Seconds(), 2.5);
  // An old round's late push takes no sample.
  now = 9;
  m.Drained();
  now = 20;
  m.Pushing(1);
  EXPECT_DOUBLE_EQ(*m.Seconds(), 2.5);
}

}  // namespace
}  // namespace ps::internal
