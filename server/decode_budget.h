// DecodeBudget: how much decoding time one worker's pushes of one round may take on a
// shard (--max-decode-ms, docs/adaptive.md "Shard-side policy"). Workers choose their
// codec per push, and a shard decodes a push under its slice's lock, so without a bound
// a Byzantine worker could choose the slowest decoder (or craft the slowest payload of
// a fast one) and hold every other worker's push of that slice behind it. Each worker
// has an account per shard: the decoding time its pushes of its newest round took,
// measured on the shard's steady clock, and its own last cost per value in the codec it
// last used. A push after the round's first is refused before decoding (refusal
// decode_budget, RESOURCE_EXHAUSTED) when the account is spent or when the push would
// overspend it at that cost; so a worker's pushes of a round take at most the budget plus
// one push (its first, or one in a codec it had not used just before). The first push of
// every round is decoded, so a cost measured once under a preempted thread does not
// refuse a worker for good. Accounts are per worker: one worker's slow pushes never count
// against another's.
//
// Thread safety: Admit and Spent may run concurrently; each account has its own lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ps::server {

class DecodeBudget {
 public:
  // `max_ms`: per worker and round, the decoding time its pushes may take; 0: unbounded.
  DecodeBudget(uint32_t num_workers, double max_ms);

  bool bounded() const { return max_ns_ > 0; }

  // OK, or a refusal of kind decode_budget naming the spent and predicted time, for a
  // push of `numel` values in `codec` from `worker` (< num_workers) for `round`. A
  // round newer than the account's opens a new account; an older one is charged to the
  // newest.
  absl::Status Admit(uint32_t worker, uint64_t round, uint32_t slice_id, std::string_view codec,
                     uint64_t numel);
  // The push Admit let through took `took` to decode.
  void Spent(uint32_t worker, uint64_t round, std::string_view codec, uint64_t numel,
             std::chrono::nanoseconds took);

 private:
  struct Account {
    absl::Mutex mu;
    uint64_t round ABSL_GUARDED_BY(mu) = 0;
    double spent_ns ABSL_GUARDED_BY(mu) = 0;
    // The last push's codec (by hash) and its decoding time per value.
    size_t codec_hash ABSL_GUARDED_BY(mu) = 0;
    double ns_per_value ABSL_GUARDED_BY(mu) = 0;
  };
  // Moves `a` to `round` when it is newer.
  static void RollLocked(Account& a, uint64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a.mu);

  const double max_ms_;
  const double max_ns_;
  std::vector<std::unique_ptr<Account>> accounts_;
};

}  // namespace ps::server
