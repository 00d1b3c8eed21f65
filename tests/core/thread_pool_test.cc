#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <vector>

#include "absl/synchronization/notification.h"

namespace ps::core {
namespace {

TEST(ThreadPoolTest, ParallelForRunsEveryTaskOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  pool.ParallelFor(hits.size(), [&](size_t i) { hits[i].fetch_add(1); });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, ParallelForInsideAPoolJobDoesNotDeadlock) {
  ThreadPool pool(1);  // the only worker runs the outer job
  absl::Notification done;
  std::atomic<int> sum{0};
  pool.Submit([&] {
    pool.ParallelFor(50, [&](size_t i) { sum.fetch_add(static_cast<int>(i)); });
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(sum.load(), 49 * 50 / 2);
}

TEST(ThreadPoolTest, DestructorFinishesQueuedJobs) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(2);
    for (int i = 0; i < 100; ++i) pool.Submit([&] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(ThreadPoolTest, ZeroMeansHardwareConcurrency) {
  ThreadPool pool(0);
  EXPECT_GE(pool.num_threads(), 1u);
}

}  // namespace
}  // namespace ps::core
