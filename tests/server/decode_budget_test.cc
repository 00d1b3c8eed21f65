// --max-decode-ms: per worker and round accounts of decoding CPU time
// (server/decode_budget.h).
#include "server/decode_budget.h"

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "core/refusal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

bool Refused(const absl::Status& s) { return core::RefusalOf(s) == core::Refusal::kDecodeBudget; }

TEST(DecodeBudgetTest, ZeroIsUnbounded) {
  DecodeBudget budget(2, 0);
  EXPECT_FALSE(budget.bounded());
  budget.Spent(0, 0, std::chrono::hours(1));
  EXPECT_TRUE(budget.Admit(0, 0, 0).ok());
}

// Pushes are let through until their decoding took the budget, whatever their size (so a
// round's pushes cost at most the budget plus the one that crossed it); then the
// worker's further pushes of that round are refused, and another worker's, and its own
// of the next round, are not.
TEST(DecodeBudgetTest, ASpentAccountRefusesTheRestOfItsRoundOnly) {
  DecodeBudget budget(3, 1.0);
  ASSERT_TRUE(budget.Admit(1, 4, 0).ok());
  budget.Spent(1, 4, std::chrono::microseconds(999));
  ASSERT_TRUE(budget.Admit(1, 4, 1).ok()) << "0.999 ms of 1 ms";
  budget.Spent(1, 4, milliseconds(2));
  const absl::Status refused = budget.Admit(1, 4, 7);
  EXPECT_TRUE(Refused(refused)) << refused;
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              HasSubstr("push from worker 1 for round 4 of slice 7: decoding its pushes of round 4 "
                        "already took 2.999 ms of CPU on this shard (--max-decode-ms 1)"));
  EXPECT_TRUE(budget.Admit(0, 4, 7).ok()) << "another worker's account";
  EXPECT_TRUE(budget.Admit(1, 5, 7).ok()) << "a new round, a new account";
  // A push for an older round than the account's is charged to the newest.
  budget.Spent(1, 4, milliseconds(3));
  EXPECT_TRUE(Refused(budget.Admit(1, 5, 7)));
  EXPECT_TRUE(Refused(budget.Admit(1, 4, 7)));
}

TEST(DecodeBudgetTest, UnknownWorkersAreLeftToTheCallersChecks) {
  DecodeBudget budget(1, 1.0);
  budget.Spent(5, 0, milliseconds(9));
  EXPECT_TRUE(budget.Admit(5, 0, 0).ok());
}

// The clock decodes are measured on counts this thread's CPU, not the wall: a sleep adds
// nothing, a busy loop adds about its length.
TEST(DecodeBudgetTest, TheClockIsTheThreadsCpuTime) {
  const std::chrono::nanoseconds start = DecodeBudget::ThreadCpuNow();
  std::this_thread::sleep_for(milliseconds(30));
  const std::chrono::nanoseconds slept = DecodeBudget::ThreadCpuNow() - start;
  EXPECT_LT(slept, milliseconds(10));
  const auto wall = std::chrono::steady_clock::now();
  volatile double x = 1;
  while (std::chrono::steady_clock::now() - wall < milliseconds(20)) x = std::sqrt(x + 1);
  EXPECT_GT(DecodeBudget::ThreadCpuNow() - start, std::chrono::microseconds(1));
}

}  // namespace
}  // namespace ps::server
