#include "server/reset_watch.h"

#include <gtest/gtest.h>

#include <string>

namespace ps::server {
namespace {

using std::chrono::milliseconds;

ResetLimits SmallResetLimits() {
  ResetLimits l;
  l.max_early_cancels = 4;
  l.max_held_per_connection = 3;
  return l;
}

TEST(ResetWatchTest, AConnectionHoldingMoreCallsThanTheBoundIsNamedOnce) {
  core::ManualClock clock;
  ResetWatch w(SmallResetLimits(), &clock);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(w.Begin("ipv4:127.0.0.1:1000"));
  EXPECT_TRUE(w.Begin("ipv4:127.0.0.1:1000"));  // the 4th held at once
  EXPECT_FALSE(w.Begin("ipv4:127.0.0.1:1000"));  // named already
  // Another connection of the same address has its own count.
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(w.Begin("ipv4:127.0.0.1:1001"));
  EXPECT_EQ(w.connections(), 2u);
}

TEST(ResetWatchTest, CallsThatEndAsTheyBeginAreNeverTooMany) {
  core::ManualClock clock;
  ResetWatch w(SmallResetLimits(), &clock);
  for (int i = 0; i < 10000; ++i) {
    EXPECT_FALSE(w.Begin("c"));
    EXPECT_FALSE(w.Begin("c"));
    w.End("c");
    w.End("c");
  }
  EXPECT_EQ(w.connections(), 0u);  // nothing kept for a connection without calls
}

TEST(ResetWatchTest, AConnectionNamedForHeldCallsIsNamedAgainOnlyAfterItsCallsEnded) {
  core::ManualClock clock;
  ResetWatch w(SmallResetLimits(), &clock);
  for (int i = 0; i < 3; ++i) w.Begin("c");
  EXPECT_TRUE(w.Begin("c"));
  for (int i = 0; i < 2; ++i) w.End("c");
  EXPECT_FALSE(w.Begin("c"));  // 3 held again, still the same connection's episode
  EXPECT_FALSE(w.Begin("c"));
  for (int i = 0; i < 4; ++i) w.End("c");
  EXPECT_EQ(w.connections(), 0u);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(w.Begin("c"));
  EXPECT_TRUE(w.Begin("c"));  // a new connection on the same port
}

TEST(ResetWatchTest, EarlyCancelsAreCountedPerSecond) {
  core::ManualClock clock;
  ResetWatch w(SmallResetLimits(), &clock);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(w.EarlyCancel("c"));
  clock.Advance(milliseconds(1000));  // a new second: counting starts again
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(w.EarlyCancel("c"));
  clock.Advance(milliseconds(999));
  EXPECT_TRUE(w.EarlyCancel("c"));   // the 4th within the second
  EXPECT_FALSE(w.EarlyCancel("c"));  // named once per second
  EXPECT_FALSE(w.EarlyCancel("d"));
}

TEST(ResetWatchTest, SweepForgetsOldCounts) {
  core::ManualClock clock;
  ResetWatch w(SmallResetLimits(), &clock);
  w.EarlyCancel("c");
  w.EarlyCancel("d");
  clock.Advance(milliseconds(500));
  w.EarlyCancel("d");
  w.Sweep();
  EXPECT_EQ(w.connections(), 2u);
  clock.Advance(milliseconds(500));
  w.Sweep();
  EXPECT_EQ(w.connections(), 0u);  // both windows began a second ago
}

TEST(ResetWatchTest, TheBoundOnHeldCallsIsFourTimesTheStreamsAtLeast64) {
  EXPECT_EQ(ResetLimits::ForStreams(32).max_held_per_connection, 128u);
  EXPECT_EQ(ResetLimits::ForStreams(2).max_held_per_connection, 64u);
  EXPECT_EQ(ResetLimits::ForStreams(0x40000000u).max_held_per_connection, 0xffffffffu);
  EXPECT_EQ(ResetLimits::ForStreams(0xffffffffu).max_held_per_connection, 0xffffffffu);
  EXPECT_EQ(ResetLimits::ForStreams(32).max_early_cancels, 64u);
}

TEST(ResetWatchTest, EndWithoutBeginIsIgnored) {
  core::ManualClock clock;
  ResetWatch w(SmallResetLimits(), &clock);
  w.End("c");
  EXPECT_EQ(w.connections(), 0u);
  EXPECT_FALSE(w.Begin("c"));
}

}  // namespace
}  // namespace ps::server
