#include "core/token_bucket.h"

#include <chrono>

#include "gtest/gtest.h"

namespace ps::core {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

const SteadyTime kT0 = SteadyTime{} + seconds(100);

TEST(TokenBucketTest, StartsFullAndRefusesWhatItDoesNotHold) {
  TokenBucket b(/*rate=*/10, /*burst=*/3, kT0);
  EXPECT_TRUE(b.TryTake(1, kT0));
  EXPECT_TRUE(b.TryTake(2, kT0));
  EXPECT_FALSE(b.TryTake(1, kT0));
  EXPECT_EQ(b.tokens(), 0);  // a refused take takes nothing
  EXPECT_FALSE(b.TryTake(1, kT0 + milliseconds(99)));
  EXPECT_TRUE(b.TryTake(1, kT0 + milliseconds(100)));  // 10 per second: one in 100 ms
}

TEST(TokenBucketTest, RefillsUpToTheBurstOnly) {
  TokenBucket b(1000, 5, kT0);
  EXPECT_TRUE(b.TryTake(5, kT0));
  EXPECT_FALSE(b.FullAt(kT0 + milliseconds(4)));
  EXPECT_TRUE(b.FullAt(kT0 + milliseconds(5)));
  // An hour of refill still holds only the burst.
  EXPECT_FALSE(b.TryTake(6, kT0 + seconds(3600)));
  EXPECT_TRUE(b.TryTake(5, kT0 + seconds(3600)));
}

TEST(TokenBucketTest, DebtIsRepaidAtTheRateToTheNanosecond) {
  TokenBucket b(/*rate=*/1e6, /*burst=*/1000, kT0);  // a byte a microsecond
  EXPECT_FALSE(b.Take(3500, kT0));                   // covered 1000, owes 2500
  EXPECT_EQ(b.tokens(), -2500);
  EXPECT_EQ(b.RepaidAt(), kT0 + nanoseconds(2'500'000));
  // A rate that does not divide evenly rounds the wait up, never early.
  TokenBucket odd(3, 0, kT0);
  odd.Take(1, kT0);
  EXPECT_EQ(odd.RepaidAt(), kT0 + nanoseconds(333'333'334));
  // Not in debt: repaid at the last refill.
  TokenBucket full(5, 5, kT0);
  EXPECT_TRUE(full.Take(2, kT0 + seconds(1)));
  EXPECT_EQ(full.RepaidAt(), kT0 + seconds(1));
}

TEST(TokenBucketTest, DebtStopsAtItsFloor) {
  TokenBucket b(10, 20, kT0);
  EXPECT_TRUE(b.Take(20, kT0, /*max_debt=*/20));
  EXPECT_FALSE(b.Take(1000, kT0, 20));
  EXPECT_EQ(b.tokens(), -20);
  // Back to full after (debt + burst) / rate = 4 s.
  EXPECT_FALSE(b.FullAt(kT0 + milliseconds(3999)));
  EXPECT_TRUE(b.FullAt(kT0 + seconds(4)));
}

TEST(TokenBucketTest, AClockThatStepsBackRefillsNothing) {
  TokenBucket b(10, 1, kT0);
  EXPECT_TRUE(b.TryTake(1, kT0));
  EXPECT_FALSE(b.TryTake(1, kT0 - seconds(10)));
  EXPECT_FALSE(b.FullAt(kT0 - seconds(10)));
  EXPECT_TRUE(b.TryTake(1, kT0 + milliseconds(100)));
}

TEST(TokenBucketTest, TheLongestWaitIsADay) {
  TokenBucket b(1e-9, 0, kT0);
  b.Take(1e9, kT0);
  EXPECT_EQ(b.RepaidAt(), kT0 + seconds(86400));
}

}  // namespace
}  // namespace ps::core
