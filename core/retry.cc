#include "core/retry.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace ps::core {

bool RetryPolicy::IsRetriable(absl::StatusCode code) const {
  return std::find(retriable.begin(), retriable.end(), code) != retriable.end();
}

bool RetryPolicy::ShouldRetry(absl::StatusCode code, int attempt) const {
  return IsRetriable(code) && (max_attempts <= 0 || attempt + 1 < max_attempts);
}

bool RetryPolicy::IsRetriable(const absl::Status& status) const {
  if (IsRetriable(status.code())) return true;
  if (!retry_transient_exhaustion || status.code() != absl::StatusCode::kResourceExhausted) {
    return false;
  }
  const std::optional<Refusal> kind = RefusalOf(status);
  return !kind.has_value() || *kind == Refusal::kOverLimit || *kind == Refusal::kRateLimited;
}

bool RetryPolicy::ShouldRetry(const absl::Status& status, int attempt) const {
  return IsRetriable(status) && (max_attempts <= 0 || attempt + 1 < max_attempts);
}

std::chrono::milliseconds RetryPolicy::Backoff(int attempt) const {
  if (jitter <= 0) return Backoff(attempt, 0);
  // Per thread, so concurrent retry loops neither share state nor take a lock.
  thread_local std::minstd_rand rng{std::random_device{}()};
  return Backoff(attempt, std::uniform_real_distribution<double>(0, 1)(rng));
}

std::chrono::milliseconds RetryPolicy::Backoff(int attempt, double u) const {
  const double cap = static_cast<double>(max_backoff.count());
  // In doubles, so a long run of attempts saturates at the cap instead of overflowing.
  const double wait = std::min(cap, static_cast<double>(initial_backoff.count()) *
                                        std::pow(multiplier, std::max(attempt, 0)));
  const double fraction = std::clamp(jitter, 0.0, 1.0) * std::clamp(u, 0.0, 1.0);
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(wait * (1 - fraction))));
}

}  // namespace ps::core
