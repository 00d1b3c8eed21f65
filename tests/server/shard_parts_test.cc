// The shard's parts with their own locks: SessionTable, DeadlineQueue, AggregationJobs,
// SnapshotPool, and the lock-free Quarantine.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/clock.h"
#include "core/thread_pool.h"
#include "crypto/auth_proof.h"
#include "server/aggregation_jobs.h"
#include "server/deadline_queue.h"
#include "server/quarantine.h"
#include "server/session_table.h"
#include "server/snapshot_pool.h"

namespace ps::server {
namespace {

using std::chrono::milliseconds;

TEST(SnapshotPoolTest, ABufferComesBackWithItsLastReferenceAndIsTakenAgain) {
  std::shared_ptr<SnapshotPool> pool;
  std::shared_ptr<std::string> a = SnapshotPool::Take(pool, 64);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(a->size(), 64u);
  EXPECT_EQ(*a, std::string(64, '\0')) << "a new buffer is zeroed";
  a->assign(64, 'x');
  // The buffer's bytes are what is reused (the string object holding them is new).
  const char* first = a->data();
  std::shared_ptr<const std::string> reader = a;  // a pull still sending it
  a.reset();
  EXPECT_EQ(pool->free_count(), 0u) << "not back while a reader holds it";
  std::shared_ptr<std::string> b = SnapshotPool::Take(pool, 64);
  EXPECT_NE(b->data(), first);
  reader.reset();
  EXPECT_EQ(pool->free_count(), 1u);
  std::shared_ptr<std::string> c = SnapshotPool::Take(pool, 64);
  EXPECT_EQ(c->data(), first) << "the returned buffer is reused";
  EXPECT_EQ(*c, std::string(64, 'x')) << "with its old contents, to be overwritten";

  // At most kMaxFree are kept.
  std::vector<std::shared_ptr<std::string>> many;
  for (size_t i = 0; i < SnapshotPool::kMaxFree + 3; ++i) many.push_back(SnapshotPool::Take(pool, 64));
  many.clear();
  EXPECT_EQ(pool->free_count(), SnapshotPool::kMaxFree);

  // Another size: another pool; a buffer of the old one still goes back to its own pool.
  const std::shared_ptr<SnapshotPool> old = pool;
  std::shared_ptr<std::string> d = SnapshotPool::Take(pool, 128);
  EXPECT_NE(pool, old);
  EXPECT_EQ(d->size(), 128u);
  const size_t old_free = old->free_count();
  c.reset();
  EXPECT_EQ(old->free_count(), std::min(old_free + 1, SnapshotPool::kMaxFree));
}

TEST(SnapshotPoolTest, AFirstVersionFillsThePoolForTheStepsAfterIt) {
  std::shared_ptr<SnapshotPool> pool = std::make_shared<SnapshotPool>(4);  // another size
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  std::shared_ptr<std::string> first = SnapshotPool::TakeFilled(pool, values);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->bytes(), 12u) << "made again for the values' size";
  ASSERT_EQ(first->size(), 12u);
  EXPECT_EQ(std::memcmp(first->data(), values.data(), 12), 0);
  EXPECT_EQ(pool->free_count(), SnapshotPool::kMaxFree) << "buffers made for the first steps";
  std::vector<std::shared_ptr<std::string>> steps;
  for (size_t i = 0; i < SnapshotPool::kMaxFree; ++i) {
    steps.push_back(SnapshotPool::Take(pool, 12));
    EXPECT_EQ(pool->free_count(), SnapshotPool::kMaxFree - i - 1) << "taken from those";
  }
  first.reset();
  EXPECT_EQ(pool->free_count(), 1u) << "the first version's buffer is the pool's too";

  std::shared_ptr<SnapshotPool> empty;
  EXPECT_EQ(SnapshotPool::TakeFilled(empty, {})->size(), 0u);
}

TEST(SessionTableTest, ARejoinReplacesBothSessionsOfThatWorkerOnly) {
  SessionTable t(3, "shard-0");
  EXPECT_EQ(t.joined(), 0u);
  absl::StatusOr<SessionTable::Issued> a = t.Issue(1);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<SessionTable::Issued> b = t.Issue(2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->joins, 1u);
  EXPECT_EQ(a->session.size(), 16u);
  EXPECT_NE(a->session, b->session);
  EXPECT_EQ(t.WorkerOf(a->session), 1u);
  ASSERT_NE(t.DataSessionOf(a->data_session), nullptr);
  EXPECT_EQ(t.DataSessionOf(a->data_session)->worker_id, 1u);
  EXPECT_EQ(std::string(t.DataSessionOf(a->data_session)->key.bytes()), a->udp_key);
  EXPECT_EQ(t.DataSessionOf(a->data_session)->tcp_key, a->data_secret) << "no token";
  EXPECT_EQ(a->data_secret.size(), SessionTable::kDataSecretBytes);
  EXPECT_NE(a->data_secret, b->data_secret);
  EXPECT_EQ(t.joined(), 2u);

  absl::StatusOr<SessionTable::Issued> again = t.Issue(1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->joins, 2u);
  EXPECT_EQ(t.WorkerOf(a->session), std::nullopt);
  EXPECT_EQ(t.DataSessionOf(a->data_session), nullptr);
  EXPECT_EQ(t.WorkerOf(again->session), 1u);
  EXPECT_EQ(t.WorkerOf(b->session), 2u);
  EXPECT_EQ(t.joined(), 2u);
  EXPECT_EQ(t.WorkerOf("not a session"), std::nullopt);
}

// A data session's keys bind the secrets handed out to the token the join proved and to
// the shard's name (crypto::BoundUdpKey, BoundDataKey); without a token they are the
// secrets themselves.
TEST(SessionTableTest, TheDataSessionsKeysAreBoundToTheJoinsToken) {
  SessionTable t(3, "shard-4");
  const std::string token = "tttttttttttttttttttttttt";
  absl::StatusOr<SessionTable::Issued> a = t.Issue(2, token);
  ASSERT_TRUE(a.ok()) << a.status();
  std::shared_ptr<const DataSession> s = t.DataSessionOf(a->data_session);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(std::string(s->key.bytes()),
            crypto::BoundUdpKey(token, "shard-4", a->data_session, a->udp_key));
  EXPECT_EQ(s->tcp_key, crypto::BoundDataKey(token, "shard-4", a->data_session, a->data_secret));
  EXPECT_NE(std::string(s->key.bytes()), a->udp_key);
  EXPECT_NE(s->tcp_key, a->data_secret);
  EXPECT_NE(std::string(s->key.bytes()), s->tcp_key);

  absl::StatusOr<SessionTable::Issued> none = t.Issue(1);
  ASSERT_TRUE(none.ok()) << none.status();
  s = t.DataSessionOf(none->data_session);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(std::string(s->key.bytes()), none->udp_key);
  EXPECT_EQ(s->tcp_key, none->data_secret);
}

TEST(DeadlineQueueTest, PopsDueSlicesEarliestFirstAndTellsTheListener) {
  DeadlineQueue q;
  int told = 0;
  q.SetListener([&] { ++told; });
  const core::SteadyTime t0{};
  EXPECT_EQ(q.Next(), std::nullopt);
  q.Add(7, t0 + milliseconds(30));
  q.Add(3, t0 + milliseconds(10));
  q.Add(5, t0 + milliseconds(20));
  EXPECT_EQ(told, 3);
  EXPECT_EQ(q.Next(), t0 + milliseconds(10));
  q.Remove(5, t0 + milliseconds(20));
  q.Remove(5, t0 + milliseconds(20));  // absent now: a no-op
  EXPECT_EQ(q.PopDue(t0 + milliseconds(5)), std::vector<uint32_t>{});
  EXPECT_EQ(q.PopDue(t0 + milliseconds(30)), (std::vector<uint32_t>{3, 7}));
  EXPECT_EQ(q.Next(), std::nullopt);
  q.Notify();
  EXPECT_EQ(told, 4);
}

TEST(AggregationJobsTest, RankedJobsTakeTheMostUrgentQueuedSlice) {
  core::ThreadPool pool(1);
  AggregationJobs jobs(&pool);
  // Block the only thread so that all three slices are queued before any job starts.
  absl::Notification release;
  jobs.Submit([&] { release.WaitForNotification(); });
  std::vector<uint32_t> order;
  std::mutex mu;
  auto aggregate = [&](uint32_t slice) {
    std::lock_guard lock(mu);
    order.push_back(slice);
  };
  jobs.SubmitRanked(5, 50, aggregate);
  jobs.SubmitRanked(1, 10, aggregate);
  jobs.SubmitRanked(1, 11, aggregate);  // same rank: after 10
  EXPECT_FALSE(jobs.WaitIdle(milliseconds(20)));
  release.Notify();
  EXPECT_TRUE(jobs.WaitIdle(milliseconds(10000)));
  EXPECT_EQ(order, (std::vector<uint32_t>{10, 11, 50}));
}

TEST(AggregationJobsTest, TheDestructorWaitsForRunningJobs) {
  core::ThreadPool pool(2);
  std::atomic<bool> finished{false};
  {
    AggregationJobs jobs(&pool);
    jobs.Submit([&] {
      std::this_thread::sleep_for(milliseconds(50));
      finished = true;
    });
  }
  EXPECT_TRUE(finished.load());
}

TEST(QuarantineTest, AWorkerSitsOutForTheDurationAndAgainAfterTheNextOffence) {
  core::ManualClock clock;
  Quarantine q(3, std::chrono::seconds(10));
  const core::SteadyTime t0 = clock.Now();
  EXPECT_FALSE(q.Any(t0));
  EXPECT_TRUE(q.Start(1, t0)) << "newly quarantined";
  EXPECT_TRUE(q.Contains(1, t0));
  EXPECT_FALSE(q.Contains(0, t0));
  EXPECT_TRUE(q.Any(t0));
  EXPECT_EQ(q.Until(1, t0), t0 + std::chrono::seconds(10));
  EXPECT_FALSE(q.Until(2, t0).has_value());
  EXPECT_FALSE(q.Start(1, t0 + std::chrono::seconds(5))) << "already quarantined";
  EXPECT_TRUE(q.Contains(1, t0 + std::chrono::seconds(14)));
  EXPECT_FALSE(q.Contains(1, t0 + std::chrono::seconds(15))) << "ends by itself";
  EXPECT_FALSE(q.Any(t0 + std::chrono::seconds(15)));
  EXPECT_TRUE(q.Start(1, t0 + std::chrono::seconds(20))) << "the next offence starts another";
  EXPECT_FALSE(q.Start(7, t0)) << "out of range: ignored";
  EXPECT_FALSE(q.Contains(7, t0));
}

TEST(QuarantineTest, ZeroDurationTurnsItOff) {
  core::ManualClock clock;
  Quarantine q(2, core::Duration::zero());
  EXPECT_FALSE(q.Start(0, clock.Now()));
  EXPECT_FALSE(q.Contains(0, clock.Now()));
  EXPECT_FALSE(q.Any(clock.Now()));
}

}  // namespace
}  // namespace ps::server
