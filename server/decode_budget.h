// DecodeBudget: how much decoding one worker's pushes of one round may cost on a shard
// (--max-decode-ms, docs/adaptive.md "Shard-side policy"). Workers choose their codec per
// push, and a shard decodes a push under its slice's lock, so without a bound a
// Byzantine worker could choose the slowest decoder (or craft the slowest payload of a
// fast one) and hold every other worker's push of that slice behind it. Each worker has
// an account per shard: the CPU time the decoding of its pushes of its newest round
// took (the decoding thread's CPU clock, so a thread preempted on a busy machine is not
// charged for the wait). Once the account is spent, the worker's further pushes of that
// round are refused before decoding (refusal decode_budget, RESOURCE_EXHAUSTED); so its
// pushes of a round cost at most the budget plus the one push that crossed it.
// Accounts are per worker: one worker's slow pushes never count against another's.
//
// Thread safety: Admit and Spent may run concurrently; each account has its own lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ps::server {

class DecodeBudget {
 public:
  // `max_ms`: per worker and round, the decoding its pushes may cost; 0: unbounded.
  DecodeBudget(uint32_t num_workers, double max_ms);

  bool bounded() const { return max_ns_ > 0; }

  // OK, or a refusal of kind decode_budget for a push of `worker` (< num_workers) for
  // `round` when the account is spent. A round newer than the account's opens a new
  // account; an older one is charged to the newest.
  absl::Status Admit(uint32_t worker, uint64_t round, uint32_t slice_id);
  // A push Admit let through cost `took` to decode.
  void Spent(uint32_t worker, uint64_t round, std::chrono::nanoseconds took);

  // The calling thread's CPU time, the clock decodes are measured on.
  static std::chrono::nanoseconds ThreadCpuNow();

 private:
  struct Account {
    absl::Mutex mu;
    uint64_t round ABSL_GUARDED_BY(mu) = 0;
    int64_t spent_ns ABSL_GUARDED_BY(mu) = 0;
  };
  // Moves `a` to `round` when it is newer.
  static void RollLocked(Account& a, uint64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a.mu);

  const double max_ms_;
  const double max_ns_;
  std::vector<std::unique_ptr<Account>> accounts_;
};

}  // namespace ps::server
