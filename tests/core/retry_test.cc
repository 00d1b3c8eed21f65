// RetryPolicy: which failures are retried, how often, and the waits in between.
#include "core/retry.h"

#include <gtest/gtest.h>

namespace ps::core {
namespace {

using std::chrono::milliseconds;

RetryPolicy Rpc() {
  RetryPolicy p;
  p.max_attempts = 4;
  p.initial_backoff = milliseconds(50);
  p.max_backoff = milliseconds(300);
  p.retriable = {absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded};
  return p;
}

TEST(RetryPolicyTest, BackoffDoublesFromTheFirstWaitUpToTheCap) {
  const RetryPolicy p = Rpc();
  EXPECT_EQ(p.Backoff(0), milliseconds(50));
  EXPECT_EQ(p.Backoff(1), milliseconds(100));
  EXPECT_EQ(p.Backoff(2), milliseconds(200));
  EXPECT_EQ(p.Backoff(3), milliseconds(300));
  EXPECT_EQ(p.Backoff(1000), milliseconds(300));  // saturates, no overflow
}

TEST(RetryPolicyTest, TheMultiplierScalesEachWait) {
  RetryPolicy p = Rpc();
  p.multiplier = 3;
  p.max_backoff = milliseconds(10000);
  EXPECT_EQ(p.Backoff(0), milliseconds(50));
  EXPECT_EQ(p.Backoff(1), milliseconds(150));
  EXPECT_EQ(p.Backoff(2), milliseconds(450));
}

TEST(RetryPolicyTest, JitterTakesAtMostItsFractionOffTheWait) {
  RetryPolicy p = Rpc();
  p.jitter = 0.5;
  EXPECT_EQ(p.Backoff(1, 0.0), milliseconds(100));
  EXPECT_EQ(p.Backoff(1, 0.5), milliseconds(75));
  EXPECT_EQ(p.Backoff(1, 0.999999), milliseconds(50));
  for (int i = 0; i < 100; ++i) {
    const milliseconds w = p.Backoff(2);
    EXPECT_GE(w, milliseconds(100));
    EXPECT_LE(w, milliseconds(200));
  }
}

TEST(RetryPolicyTest, OnlyTheListedCodesAreRetried) {
  const RetryPolicy p = Rpc();
  EXPECT_TRUE(p.IsRetriable(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(p.IsRetriable(absl::StatusCode::kDeadlineExceeded));
  EXPECT_FALSE(p.IsRetriable(absl::StatusCode::kUnauthenticated));
  EXPECT_FALSE(p.IsRetriable(absl::StatusCode::kOk));
  EXPECT_FALSE(p.ShouldRetry(absl::StatusCode::kInvalidArgument, 0));
}

TEST(RetryPolicyTest, MaxAttemptsCountsTheFirstAttempt) {
  const RetryPolicy p = Rpc();  // 4 attempts: retries after attempts 0, 1 and 2
  EXPECT_TRUE(p.ShouldRetry(absl::StatusCode::kUnavailable, 0));
  EXPECT_TRUE(p.ShouldRetry(absl::StatusCode::kUnavailable, 2));
  EXPECT_FALSE(p.ShouldRetry(absl::StatusCode::kUnavailable, 3));
  RetryPolicy once = p;
  once.max_attempts = 1;
  EXPECT_FALSE(once.ShouldRetry(absl::StatusCode::kUnavailable, 0));
}

TEST(RetryPolicyTest, ZeroMaxAttemptsLeavesTheCountUnbounded) {
  RetryPolicy p = Rpc();
  p.max_attempts = 0;
  EXPECT_TRUE(p.ShouldRetry(absl::StatusCode::kUnavailable, 1'000'000));
  EXPECT_FALSE(p.ShouldRetry(absl::StatusCode::kAborted, 0));
}

TEST(RetryPolicyTest, TransientExhaustionIsRetriedOnlyWhenAskedAndNeverADecodeBudget) {
  RetryPolicy p = Rpc();
  const absl::Status reset = absl::ResourceExhaustedError("Buffers full");  // gRPC's own
  const absl::Status over = Refused(Refusal::kOverLimit, "too many calls open");
  const absl::Status rate = Refused(Refusal::kRateLimited, "slow down");
  const absl::Status budget = Refused(Refusal::kDecodeBudget, "round's decoding spent");
  for (const absl::Status& s : {reset, over, rate, budget}) EXPECT_FALSE(p.IsRetriable(s)) << s;
  p.retry_transient_exhaustion = true;
  EXPECT_TRUE(p.IsRetriable(reset));
  EXPECT_TRUE(p.IsRetriable(over));
  EXPECT_TRUE(p.IsRetriable(rate));
  EXPECT_FALSE(p.IsRetriable(budget));
  EXPECT_FALSE(p.IsRetriable(absl::InvalidArgumentError("bad")));
  EXPECT_TRUE(p.ShouldRetry(reset, 0));
  EXPECT_FALSE(p.ShouldRetry(reset, 3));  // 4 attempts in all
  // The codes listed stay retriable whatever their payload.
  EXPECT_TRUE(p.IsRetriable(absl::UnavailableError("down")));
}

}  // namespace
}  // namespace ps::core
