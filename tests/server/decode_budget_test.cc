// --max-decode-ms: per worker and round accounts of decoding time
// (server/decode_budget.h).
#include "server/decode_budget.h"

#include <chrono>
#include <string>

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
  budget.Spent(0, 0, "fp32", 100, std::chrono::hours(1));
  EXPECT_TRUE(budget.Admit(0, 0, 0, "fp32", 100).ok());
}

// Once a worker's pushes of a round took the budget, its further pushes of that round
// are refused; another worker's, and its own of the next round, are not.
TEST(DecodeBudgetTest, ASpentAccountRefusesTheRestOfItsRoundOnly) {
  DecodeBudget budget(3, 1.0);
  ASSERT_TRUE(budget.Admit(1, 4, 0, "3lc(s=1.9)", 1000).ok());
  budget.Spent(1, 4, "3lc(s=1.9)", 1000, milliseconds(2));
  const absl::Status refused = budget.Admit(1, 4, 7, "fp32", 10);
  EXPECT_TRUE(Refused(refused)) << refused;
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              HasSubstr("push from worker 1 for round 4 of slice 7: its pushes of round 4 took "
                        "2.000 ms of decoding on this shard, and this one (codec \"fp32\", 10 "
                        "values) would take about 0.000 ms more (--max-decode-ms 1)"));
  EXPECT_TRUE(budget.Admit(0, 4, 7, "fp32", 10).ok()) << "another worker's account";
  EXPECT_TRUE(budget.Admit(1, 5, 7, "fp32", 10).ok()) << "a new round, a new account";
  // A push for an older round than the account's is charged to the newest.
  budget.Spent(1, 5, "fp32", 10, milliseconds(3));
  EXPECT_TRUE(Refused(budget.Admit(1, 4, 7, "fp32", 10)));
}

// A push that would overspend the account at the worker's own last cost per value in
// the same codec is refused before it is decoded; one in a codec whose cost the account
// does not know is let through (so at most one push overspends).
TEST(DecodeBudgetTest, APushThatWouldOverspendAtTheLastCostIsRefused) {
  DecodeBudget budget(1, 10.0);
  budget.Spent(0, 0, "qsgd", 1000, milliseconds(4));                 // 4 us per value
  EXPECT_TRUE(budget.Admit(0, 0, 1, "qsgd", 1000).ok());             // 4 + 4 <= 10
  const absl::Status refused = budget.Admit(0, 0, 1, "qsgd", 2000);  // 4 + 8 > 10
  EXPECT_TRUE(Refused(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("would take about 8.000 ms more"));
  EXPECT_TRUE(budget.Admit(0, 0, 1, "fp32", 2000).ok()) << "no cost known for fp32 yet";
  // Spending exactly the budget leaves nothing.
  budget.Spent(0, 0, "fp32", 2000, milliseconds(6));
  EXPECT_TRUE(Refused(budget.Admit(0, 0, 2, "fp16", 1)));
}

// The first push of a round is decoded whatever the last cost said: a cost measured
// once (a preempted thread) cannot refuse a worker for good.
TEST(DecodeBudgetTest, ARoundsFirstPushIsAlwaysDecoded) {
  DecodeBudget budget(1, 1.0);
  budget.Spent(0, 0, "fp32", 10, milliseconds(50));  // 5 ms per value: over on its own
  EXPECT_TRUE(budget.Admit(0, 1, 0, "fp32", 10).ok());
  budget.Spent(0, 1, "fp32", 10, std::chrono::microseconds(10));
  EXPECT_TRUE(budget.Admit(0, 1, 1, "fp32", 10).ok()) << "1 us per value now";
}

TEST(DecodeBudgetTest, UnknownWorkersAreLeftToTheCallersChecks) {
  DecodeBudget budget(1, 1.0);
  budget.Spent(5, 0, "fp32", 10, milliseconds(9));
  EXPECT_TRUE(budget.Admit(5, 0, 0, "fp32", 10).ok());
}

}  // namespace
}  // namespace ps::server
