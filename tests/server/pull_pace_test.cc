// PullPace (server/transport/tcp/pull_pace.h): how many slices of a pull a TCP data
// connection takes at once, from the pace of its writes of slices.
#include "server/transport/tcp/pull_pace.h"

#include <gtest/gtest.h>

namespace ps::server::transport::tcp {
namespace {

TEST(PullPaceTest, TwoSlicesUntilAWriteWasMeasured) {
  PullPace pace;
  EXPECT_EQ(pace.WritesInFlight(), PullPace::kMinSlices);
  pace.Wrote(0, 0.001);  // a write without slices says nothing
  EXPECT_EQ(pace.WritesInFlight(), PullPace::kMinSlices);
}

TEST(PullPaceTest, AFastLinkTakesUpToEight) {
  PullPace pace;
  // 100 µs a slice: 20 slices in 2 ms, capped at 8.
  for (int i = 0; i < 10; ++i) pace.Wrote(1, 100e-6);
  EXPECT_EQ(pace.WritesInFlight(), PullPace::kMaxSlices);
  // Writes the socket took at once.
  PullPace instant;
  instant.Wrote(3, 0.0);
  EXPECT_EQ(instant.WritesInFlight(), PullPace::kMaxSlices);
}

TEST(PullPaceTest, ASlowLinkKeepsTwo) {
  PullPace pace;
  // 256 KiB at 100 Mbit/s: 21 ms a slice.
  for (int i = 0; i < 10; ++i) pace.Wrote(1, 0.021);
  EXPECT_EQ(pace.WritesInFlight(), PullPace::kMinSlices);
}

TEST(PullPaceTest, InBetweenAsManyAsTheWindowMoves) {
  PullPace pace;
  for (int i = 0; i < 50; ++i) pace.Wrote(2, 0.0008);  // 400 µs a slice: 5 in 2 ms
  EXPECT_EQ(pace.WritesInFlight(), 5u);
}

TEST(PullPaceTest, FollowsALinkThatSlowsDown) {
  PullPace pace;
  // A socket buffer that took the first writes at once, then the link's pace.
  for (int i = 0; i < 16; ++i) pace.Wrote(2, 0.0);
  EXPECT_EQ(pace.WritesInFlight(), PullPace::kMaxSlices);
  for (int i = 0; i < 40; ++i) pace.Wrote(1, 0.021);
  EXPECT_EQ(pace.WritesInFlight(), PullPace::kMinSlices);
  // And speeds up again.
  for (int i = 0; i < 80; ++i) pace.Wrote(1, 50e-6);
  EXPECT_EQ(pace.WritesInFlight(), PullPace::kMaxSlices);
}

}  // namespace
}  // namespace ps::server::transport::tcp
