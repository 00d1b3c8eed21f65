// RetryPolicy: when a failed call is tried again and how long to wait first. One type
// for every retry loop (the worker's joins, pushes and pulls; later the server's), so
// the backoff arithmetic and the choice of retriable codes live in one place.
//
// A policy is a value: copy it freely; every method is const and thread-safe. It names
// codes as absl::StatusCode, so it carries no gRPC type (gRPC's codes have the same
// numbers).
#pragma once

#include <chrono>
#include <vector>

#include "absl/status/status.h"
#include "core/refusal.h"

namespace ps::core {

struct RetryPolicy {
  // Attempts in all, the first included; 0 leaves the number unbounded (the caller then
  // bounds the loop by a deadline).
  int max_attempts = 1;
  // Wait before the second attempt; every later wait is `multiplier` times the one
  // before, up to `max_backoff`.
  std::chrono::milliseconds initial_backoff{50};
  double multiplier = 2;
  std::chrono::milliseconds max_backoff{2000};
  // Fraction in [0, 1] of each wait that is random: the wait is drawn uniformly from
  // [(1 - jitter) * w, w]. 0 (the default) keeps the waits exact, which tests rely on.
  double jitter = 0;
  // The codes worth another attempt; any other failure is final.
  std::vector<absl::StatusCode> retriable;
  // RESOURCE_EXHAUSTED is also worth another attempt when it is transient: gRPC's own (a
  // stream the shard reset while its buffers were full carries no refusal kind) or a
  // shard's refusal of kind over_limit or rate_limited. Never decode_budget: the
  // worker's account for the round stays spent.
  bool retry_transient_exhaustion = false;

  bool IsRetriable(absl::StatusCode code) const;
  bool IsRetriable(const absl::Status& status) const;
  bool ShouldRetry(const absl::Status& status, int attempt) const;
  // Whether attempt `attempt` (0 for the first) failing with `code` may be followed by
  // another one.
  bool ShouldRetry(absl::StatusCode code, int attempt) const;
  // The wait after attempt `attempt` failed: initial_backoff * multiplier^attempt,
  // capped at max_backoff, less the jitter.
  std::chrono::milliseconds Backoff(int attempt) const;
  // As Backoff(attempt), with the jitter's uniform draw `u` in [0, 1) given (tests).
  std::chrono::milliseconds Backoff(int attempt, double u) const;
};

}  // namespace ps::core
