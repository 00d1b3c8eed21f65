#include "server/tarpit.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"

namespace ps::server {
namespace {

using std::chrono::milliseconds;
using Steady = std::chrono::steady_clock;

TarpitOptions Small(double burst, uint32_t per_client = 8, uint32_t total = 32) {
  TarpitOptions o;
  o.rate = 1;  // the ManualClock decides when anything refills
  o.burst = burst;
  o.hold = milliseconds(100);
  o.max_held_per_client = per_client;
  o.max_held = total;
  return o;
}

// Refuses once for `client` and says whether the answer ran before Refuse returned (a
// held one runs later, on the tarpit's thread or in Stop).
bool AnsweredAtOnce(Tarpit& t, const std::string& client, uint64_t bytes = 0) {
  auto ran = std::make_shared<std::atomic<bool>>(false);
  const bool held = t.Refuse(client, bytes, [ran] { *ran = true; });
  const bool at_once = ran->load();
  EXPECT_EQ(held, !at_once);
  return at_once;
}

TEST(TarpitTest, ChargesRefusalsOfWhatTheClientSentOnly) {
  EXPECT_TRUE(Tarpit::Charges(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(Tarpit::Charges(absl::StatusCode::kOutOfRange));
  EXPECT_TRUE(Tarpit::Charges(absl::StatusCode::kUnauthenticated));
  EXPECT_TRUE(Tarpit::Charges(absl::StatusCode::kResourceExhausted));
  EXPECT_FALSE(Tarpit::Charges(absl::StatusCode::kOk));
  EXPECT_FALSE(Tarpit::Charges(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(Tarpit::Charges(absl::StatusCode::kCancelled));
  EXPECT_FALSE(Tarpit::Charges(absl::StatusCode::kDeadlineExceeded));
}

TEST(TarpitTest, AnswersAtOnceWithinTheBudgetAndHoldsBeyondIt) {
  core::ManualClock clock;
  Tarpit t(Small(3), &clock);
  EXPECT_TRUE(AnsweredAtOnce(t, "worker-3"));
  EXPECT_TRUE(AnsweredAtOnce(t, "worker-3"));
  EXPECT_TRUE(AnsweredAtOnce(t, "worker-3"));

  absl::Notification answered;
  std::thread::id on;
  const auto start = Steady::now();
  EXPECT_TRUE(t.Refuse("worker-3", 0, [&] {
    on = std::this_thread::get_id();
    answered.Notify();
  }));
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(Steady::now() - start, milliseconds(100));
  EXPECT_NE(on, std::this_thread::get_id());
  EXPECT_EQ(t.stats().held_total, 1u);
  EXPECT_EQ(t.stats().held_now, 0u);
}

TEST(TarpitTest, BudgetsAreKeptPerClient) {
  core::ManualClock clock;
  Tarpit t(Small(1), &clock);
  EXPECT_TRUE(AnsweredAtOnce(t, "worker-3"));
  EXPECT_FALSE(AnsweredAtOnce(t, "worker-3"));
  // Another client's budget is untouched.
  EXPECT_TRUE(AnsweredAtOnce(t, "worker-0"));
}

TEST(TarpitTest, LargeRequestsCostMore) {
  core::ManualClock clock;
  Tarpit t(Small(10), &clock);
  // 1 + 8 units: fits; the next one of the same size does not.
  EXPECT_TRUE(AnsweredAtOnce(t, "worker-3", 8 * Tarpit::kBytesPerUnit));
  EXPECT_FALSE(AnsweredAtOnce(t, "worker-3", 8 * Tarpit::kBytesPerUnit));
  // A small one after a quiet spell is fine again.
  clock.Advance(std::chrono::seconds(30));
  EXPECT_TRUE(AnsweredAtOnce(t, "worker-3", 100));
}

TEST(TarpitTest, TheBudgetRefillsAtTheRateAndDebtIsBounded) {
  core::ManualClock clock;
  TarpitOptions o = Small(4);
  o.max_held_per_client = 1000;
  o.max_held = 1000;
  Tarpit t(o, &clock);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(AnsweredAtOnce(t, "worker-3"));
  // Deep over the budget: the debt stops at one burst (-4).
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(AnsweredAtOnce(t, "worker-3"));
  // From -4, one unit per second: 4 s to zero, 5 s to one refusal answered at once.
  clock.Advance(std::chrono::seconds(4));
  EXPECT_FALSE(AnsweredAtOnce(t, "worker-3"));
  clock.Advance(std::chrono::seconds(6));
  EXPECT_TRUE(AnsweredAtOnce(t, "worker-3"));
}

TEST(TarpitTest, HeldAnswersAreBoundedPerClientAndInAll) {
  core::ManualClock clock;
  TarpitOptions o = Small(1, /*per_client=*/2, /*total=*/3);
  o.hold = std::chrono::milliseconds(60000);  // nothing comes back by itself here
  Tarpit t(o, &clock);
  EXPECT_TRUE(AnsweredAtOnce(t, "a"));
  EXPECT_FALSE(AnsweredAtOnce(t, "a"));
  EXPECT_FALSE(AnsweredAtOnce(t, "a"));
  EXPECT_TRUE(AnsweredAtOnce(t, "a"));  // a holds 2, its most
  EXPECT_TRUE(AnsweredAtOnce(t, "b"));
  EXPECT_FALSE(AnsweredAtOnce(t, "b"));
  EXPECT_TRUE(AnsweredAtOnce(t, "b"));  // 3 held in all
  EXPECT_EQ(t.stats().held_now, 3u);
  t.Stop();
}

TEST(TarpitTest, StopAnswersEveryHeldRefusalAndHoldsNoMore) {
  core::ManualClock clock;
  TarpitOptions o = Small(1);
  o.hold = std::chrono::milliseconds(60000);
  Tarpit t(o, &clock);
  std::atomic<int> answered{0};
  EXPECT_FALSE(t.Refuse("a", 0, [&] { ++answered; }));  // within the budget
  EXPECT_TRUE(t.Refuse("a", 0, [&] { ++answered; }));
  EXPECT_TRUE(t.Refuse("a", 0, [&] { ++answered; }));
  EXPECT_EQ(answered.load(), 1);
  t.Stop();
  EXPECT_EQ(answered.load(), 3);
  EXPECT_TRUE(AnsweredAtOnce(t, "a"));
  t.Stop();  // idempotent
}

TEST(TarpitTest, RateZeroNeverHolds) {
  core::ManualClock clock;
  TarpitOptions o = Small(1);
  o.rate = 0;
  Tarpit t(o, &clock);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(AnsweredAtOnce(t, "a", 1 << 20));
  EXPECT_EQ(t.stats().held_total, 0u);
}

TEST(TarpitTest, DestroyingItAnswersWhatItHolds) {
  core::ManualClock clock;
  TarpitOptions o = Small(1);
  o.hold = std::chrono::milliseconds(60000);
  std::atomic<int> answered{0};
  {
    Tarpit t(o, &clock);
    t.Refuse("a", 0, [&] { ++answered; });
    EXPECT_TRUE(t.Refuse("a", 0, [&] { ++answered; }));
  }
  EXPECT_EQ(answered.load(), 2);
}

}  // namespace
}  // namespace ps::server
