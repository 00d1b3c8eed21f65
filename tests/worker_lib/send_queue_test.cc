// The P3 send queue: order and window.
#include "worker_lib/send_queue_internal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace ps::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<std::string> Items(std::vector<std::pair<uint64_t, std::string>> taken) {
  std::vector<std::string> out;
  for (auto& [bytes, item] : taken) out.push_back(item);
  return out;
}

TEST(SendQueueTest, AnUrgentItemQueuedLateOvertakesTheWaitingOnes) {
  SendQueue<std::string> q(/*priority_order=*/true, /*max_inflight_bytes=*/100);
  // Backward produces the last layer (priority 3) first.
  q.Push(3, 0, 100, "fc.0");
  q.Push(3, 0, 100, "fc.1");
  q.Push(3, 0, 100, "fc.2");
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("fc.0"));  // the window holds one
  EXPECT_THAT(Items(q.TakeSendable()), IsEmpty());
  q.Push(0, 0, 100, "conv1.0");
  q.Push(1, 0, 100, "conv2.0");
  q.Release(100);
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("conv1.0"));
  q.Release(100);
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("conv2.0"));
  q.Release(100);
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("fc.1"));
  q.Release(100);
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("fc.2"));
  EXPECT_EQ(q.size(), 0u);
}

TEST(SendQueueTest, FifoKeepsPushOrder) {
  SendQueue<std::string> q(/*priority_order=*/false, 100);
  q.Push(3, 0, 100, "fc.0");
  q.Push(3, 0, 100, "fc.1");
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("fc.0"));
  q.Push(0, 0, 100, "conv1.0");
  q.Release(100);
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("fc.1"));
  q.Release(100);
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("conv1.0"));
}

TEST(SendQueueTest, EarlierRoundsGoFirstAtEqualPriority) {
  SendQueue<std::string> q(true, 1000);
  q.Push(1, 5, 10, "r5");
  q.Push(1, 4, 10, "r4");
  q.Push(2, 3, 10, "r3 but later layer");
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("r4", "r5", "r3 but later layer"));
}

TEST(SendQueueTest, TakeNextKeepsTheOrderAndIgnoresTheWindow) {
  // The UDP sender's use: one item at a time, paced by its token bucket, not the window.
  SendQueue<std::string> q(/*priority_order=*/true, /*window=*/10);
  q.Push(2, 0, 100, "late layer");
  q.Push(0, 1, 200, "first layer, round 1");
  q.Push(0, 0, 300, "first layer, round 0");
  ASSERT_FALSE(q.empty());
  EXPECT_EQ(q.next_bytes(), 300u);
  EXPECT_EQ(q.TakeNext(), "first layer, round 0");
  EXPECT_EQ(q.next_bytes(), 200u);
  EXPECT_EQ(q.TakeNext(), "first layer, round 1");
  EXPECT_EQ(q.TakeNext(), "late layer");
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.inflight_bytes(), 0u);  // nothing counted in flight

  SendQueue<std::string> fifo(/*priority_order=*/false, 10);
  fifo.Push(2, 0, 1, "a");
  fifo.Push(0, 0, 1, "b");
  EXPECT_EQ(fifo.TakeNext(), "a");
  EXPECT_EQ(fifo.TakeNext(), "b");
}

TEST(SendQueueTest, TheWindowCountsBytesAndLetsAnOversizedItemGoAlone) {
  SendQueue<std::string> q(true, 250);
  q.Push(0, 0, 100, "a");
  q.Push(0, 0, 100, "b");
  q.Push(0, 0, 100, "c");
  q.Push(0, 0, 1000, "huge");
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("a", "b"));
  EXPECT_EQ(q.inflight_bytes(), 200u);
  q.Release(100);
  q.Release(100);
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("c"));
  q.Release(100);
  EXPECT_THAT(Items(q.TakeSendable()), ElementsAre("huge"));  // nothing else in flight
  EXPECT_EQ(q.inflight_bytes(), 1000u);
  q.Push(0, 0, 1, "tiny");
  EXPECT_THAT(Items(q.TakeSendable()), IsEmpty());
  EXPECT_THAT(q.TakeAll(), ElementsAre("tiny"));
}

}  // namespace
}  // namespace ps::internal
