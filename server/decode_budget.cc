#include "server/decode_budget.h"

#include <time.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/refusal.h"

namespace ps::server {

DecodeBudget::DecodeBudget(uint32_t num_workers, double max_ms)
    : max_ms_(max_ms), max_ns_(max_ms * 1e6) {
  accounts_.reserve(num_workers);
  for (uint32_t w = 0; w < num_workers; ++w) accounts_.push_back(std::make_unique<Account>());
}

std::chrono::nanoseconds DecodeBudget::ThreadCpuNow() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

void DecodeBudget::RollLocked(Account& a, uint64_t round) {
  if (round <= a.round) return;
  a.round = round;
  a.spent_ns = 0;  // decodes in flight keep their reservations: they end in any round
}

absl::StatusOr<DecodeBudget::Reservation> DecodeBudget::Admit(uint32_t worker, uint64_t round,
                                                              uint32_t slice_id) {
  if (!bounded() || worker >= accounts_.size()) return Reservation();
  Account& a = *accounts_[worker];
  absl::MutexLock lock(&a.mu);
  RollLocked(a, round);
  // What this decode is expected to cost: the costliest one of this worker measured so
  // far; before any, the shard's costliest capped at 1/64 of the budget.
  const auto cap = static_cast<int64_t>(max_ns_ / 64);
  const int64_t shard = costliest_ns_.load(std::memory_order_relaxed);
  const int64_t expected = a.costliest_ns > 0 ? a.costliest_ns
                                              : std::min(cap, shard > 0 ? shard : cap);
  const double spent = static_cast<double>(a.spent_ns);
  const double committed = spent + static_cast<double>(a.reserved_ns + expected);
  if (spent < max_ns_ && (a.in_flight == 0 || committed < max_ns_)) {
    ++a.in_flight;
    a.reserved_ns += expected;
    return Reservation(this, worker, a.round, expected);
  }
  if (spent >= max_ns_) {
    return core::Refused(
        core::Refusal::kDecodeBudget,
        absl::StrFormat("push from worker %u for round %u of slice %u: decoding its pushes of "
                        "round %u already took %.3f ms of CPU on this shard (--max-decode-ms %g)",
                        worker, round, slice_id, a.round, spent / 1e6, max_ms_));
  }
  return core::Refused(
      core::Refusal::kDecodeBudget,
      absl::StrFormat("push from worker %u for round %u of slice %u: decoding its pushes of "
                      "round %u took %.3f ms of CPU on this shard and %u more are decoding, "
                      "which would spend --max-decode-ms %g",
                      worker, round, slice_id, a.round, spent / 1e6, a.in_flight, max_ms_));
}

DecodeBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)),
      worker_(other.worker_),
      round_(other.round_),
      reserved_ns_(other.reserved_ns_) {}

DecodeBudget::Reservation& DecodeBudget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Release(std::chrono::nanoseconds(0));
    budget_ = std::exchange(other.budget_, nullptr);
    worker_ = other.worker_;
    round_ = other.round_;
    reserved_ns_ = other.reserved_ns_;
  }
  return *this;
}

DecodeBudget::Reservation::~Reservation() { Release(std::chrono::nanoseconds(0)); }

void DecodeBudget::Reservation::Spent(std::chrono::nanoseconds took) { Release(took); }

void DecodeBudget::Reservation::Release(std::chrono::nanoseconds took) {
  DecodeBudget* const budget = std::exchange(budget_, nullptr);
  if (budget == nullptr) return;
  Account& a = *budget->accounts_[worker_];
  absl::MutexLock lock(&a.mu);
  --a.in_flight;
  a.reserved_ns -= reserved_ns_;
  if (took.count() <= 0) return;
  RollLocked(a, round_);
  a.spent_ns += took.count();
  a.costliest_ns = std::max<int64_t>(a.costliest_ns, took.count());
  std::atomic<int64_t>& shard = budget->costliest_ns_;
  int64_t seen = shard.load(std::memory_order_relaxed);
  while (took.count() > seen && !shard.compare_exchange_weak(seen, took.count())) {
  }
}

}  // namespace ps::server
