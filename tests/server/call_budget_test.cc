#include "server/call_budget.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace ps::server {
namespace {

using std::chrono::milliseconds;

CallLimits SmallCallLimits() {
  CallLimits l;
  l.max_calls_per_client = 3;
  l.max_reads_per_client = 2;
  l.max_reads = 3;
  l.read_timeout = milliseconds(100);
  return l;
}

TEST(CallBudgetTest, AClientOverItsOpenCallsIsRefusedOthersAreNot) {
  core::ManualClock clock;
  CallBudget b(SmallCallLimits(), &clock);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(b.OpenCall("worker-1").ok());
  absl::Status s = b.OpenCall("worker-1");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("--max-calls-per-client"), std::string::npos) << s;
  EXPECT_TRUE(b.OpenCall("worker-2").ok());
  b.CloseCall("worker-1");
  EXPECT_TRUE(b.OpenCall("worker-1").ok());
  EXPECT_EQ(b.stats().calls, 4u);
}

TEST(CallBudgetTest, ReadsBeyondTheBoundsWaitAndStartInOrderSkippingClientsAtTheirBound) {
  core::ManualClock clock;
  CallBudget b(SmallCallLimits(), &clock);
  std::vector<std::string> started;
  auto request = [&](const std::string& client, const std::string& label) {
    return b.RequestRead(client, [&started, label](CallBudget::Ticket) { started.push_back(label); });
  };
  const CallBudget::Ticket a1 = request("a", "a1");
  const CallBudget::Ticket a2 = request("a", "a2");
  request("a", "a3");  // a is at its bound of 2: waits
  const CallBudget::Ticket b1 = request("b", "b1");
  request("b", "b2");  // all 3 places are taken: waits
  EXPECT_EQ(started, (std::vector<std::string>{"a1", "a2", "b1"}));
  EXPECT_EQ(b.stats().waiting, 2u);
  // b1 ends: b2 is the first waiting read whose client may read (a3's may not).
  b.ReadDone(b1);
  EXPECT_EQ(started.back(), "b2");
  b.ReadDone(a1);
  EXPECT_EQ(started.back(), "a3");
  b.ReadDone(a1);  // again: a no-op
  b.ReadDone(a2);
  EXPECT_EQ(b.stats().reading, 2u);
  EXPECT_EQ(b.stats().waiting, 0u);
}

TEST(CallBudgetTest, ACancelledWaitingReadNeverStarts) {
  core::ManualClock clock;
  CallBudget b(SmallCallLimits(), &clock);
  int ran = 0;
  const CallBudget::Ticket t1 = b.RequestRead("a", [&](CallBudget::Ticket) { ++ran; });
  b.RequestRead("a", [&](CallBudget::Ticket) { ++ran; });
  const CallBudget::Ticket t3 = b.RequestRead("a", [&](CallBudget::Ticket) { ran += 100; });
  EXPECT_TRUE(b.CancelRead(t3));
  EXPECT_FALSE(b.CancelRead(t1));  // already reading
  b.ReadDone(t1);
  EXPECT_EQ(ran, 2);
}

TEST(CallBudgetTest, ReadsNotDoneWithinTheTimeoutAreOverdue) {
  core::ManualClock clock;
  CallBudget b(SmallCallLimits(), &clock);
  const CallBudget::Ticket t1 = b.RequestRead("a", [](CallBudget::Ticket) {});
  clock.Advance(milliseconds(60));
  const CallBudget::Ticket t2 = b.RequestRead("b", [](CallBudget::Ticket) {});
  EXPECT_TRUE(b.Overdue(clock.Now()).empty());
  clock.Advance(milliseconds(50));
  EXPECT_EQ(b.Overdue(clock.Now()), std::vector<CallBudget::Ticket>{t1});
  b.ReadDone(t1);
  clock.Advance(milliseconds(100));
  EXPECT_EQ(b.Overdue(clock.Now()), std::vector<CallBudget::Ticket>{t2});
}

TEST(CallBudgetTest, ConcurrentReadsNeverExceedTheBounds) {
  core::ManualClock clock;
  CallLimits l = SmallCallLimits();
  l.max_reads = 4;
  l.max_reads_per_client = 2;
  CallBudget b(l, &clock);
  std::atomic<int> in_flight{0}, peak{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::string client = "c" + std::to_string(t % 3);
      for (int i = 0; i < 200; ++i) {
        std::atomic<bool> go{false};
        const CallBudget::Ticket ticket = b.RequestRead(client, [&](CallBudget::Ticket) {
          const int now = in_flight.fetch_add(1) + 1;
          int p = peak.load();
          while (now > p && !peak.compare_exchange_weak(p, now)) {
          }
          go.store(true);
        });
        while (!go.load()) std::this_thread::yield();
        in_flight.fetch_sub(1);
        b.ReadDone(ticket);
        done.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(done.load(), 800);
  EXPECT_LE(peak.load(), 4);
  EXPECT_EQ(b.stats().reading, 0u);
}

}  // namespace
}  // namespace ps::server
