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
// Accounts are per worker: one worker's slow pushes never count against another's. A
// raw fp32 row that the TCP plane read straight into place is only checked for NaN and
// Inf, a cost its size fixes and its bytes cannot raise: it is admitted like any push but
// charged nothing, and not timed (reading a thread's CPU clock is a system call).
//
// Concurrent pushes of one worker: Admit reserves, atomically with its check, what the
// decode is expected to cost (the costliest decode of this worker measured so far on
// this shard), and the reservation is replaced by the measured cost when the decode is
// done. A push is admitted while the spent time, the reservations of the decodes in
// flight and its own reservation stay under the budget, or when none of the worker's
// decodes is in flight (so sequential pushes are admitted exactly as before). Pushes in
// flight together are thus admitted no more often than the same pushes one after the
// other, give or take the one that crosses the budget, as long as none costs more than
// the costliest one of that worker seen so far (a burst of pushes costlier than any
// before is admitted at the old estimate once; the next rounds reserve the new one).
// Before any decode of the worker was measured, a push reserves the costliest decode of
// any worker on this shard, at most 1/64 of the budget (1/64 before any was measured),
// so a fresh account lets at most 64 decodes in flight and another worker cannot raise
// that estimate to lock it out. Honest accounts stay far below the budget, where none of
// this refuses anything.
//
// Thread safety: all methods may run concurrently; each account has its own lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ps::server {

class DecodeBudget {
 public:
  // `max_ms`: per worker and round, the decoding its pushes may cost; 0: unbounded.
  DecodeBudget(uint32_t num_workers, double max_ms);

  bool bounded() const { return max_ns_ > 0; }

  // A decode Admit let through: holds its reservation until Spent() or destruction (a
  // push refused after admission, for its codec or its payload, charges nothing).
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();
    // The decode took `took`: charged to the account instead of the reservation.
    void Spent(std::chrono::nanoseconds took);

   private:
    friend class DecodeBudget;
    Reservation(DecodeBudget* budget, uint32_t worker, uint64_t round, int64_t reserved_ns)
        : budget_(budget), worker_(worker), round_(round), reserved_ns_(reserved_ns) {}
    void Release(std::chrono::nanoseconds took);
    DecodeBudget* budget_ = nullptr;  // null: nothing held
    uint32_t worker_ = 0;
    uint64_t round_ = 0;
    int64_t reserved_ns_ = 0;
  };

  // A reservation for a push of `worker` (< num_workers) for `round`, or a refusal of
  // kind decode_budget when the account is spent, or would be with the decodes in flight
  // (see above). A round newer than the account's opens a new account; an older one is
  // charged to the newest. Unbounded budgets and unknown workers reserve nothing.
  absl::StatusOr<Reservation> Admit(uint32_t worker, uint64_t round, uint32_t slice_id);

  // The calling thread's CPU time, the clock decodes are measured on.
  static std::chrono::nanoseconds ThreadCpuNow();

 private:
  struct Account {
    absl::Mutex mu;
    uint64_t round ABSL_GUARDED_BY(mu) = 0;
    int64_t spent_ns ABSL_GUARDED_BY(mu) = 0;
    // Decodes admitted and not yet done (any round), and what they reserved.
    uint32_t in_flight ABSL_GUARDED_BY(mu) = 0;
    int64_t reserved_ns ABSL_GUARDED_BY(mu) = 0;
    // The costliest decode of this worker measured on this shard (0: none yet).
    int64_t costliest_ns ABSL_GUARDED_BY(mu) = 0;
  };
  // Moves `a` to `round` when it is newer.
  static void RollLocked(Account& a, uint64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a.mu);

  const double max_ms_;
  const double max_ns_;
  std::vector<std::unique_ptr<Account>> accounts_;
  // The costliest decode measured on this shard, of any worker (0: none yet).
  std::atomic<int64_t> costliest_ns_{0};
};

}  // namespace ps::server
