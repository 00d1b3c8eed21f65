#include "server/decode_budget.h"

#include <time.h>

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
  a.spent_ns = 0;
}

absl::Status DecodeBudget::Admit(uint32_t worker, uint64_t round, uint32_t slice_id) {
  if (!bounded() || worker >= accounts_.size()) return absl::OkStatus();
  Account& a = *accounts_[worker];
  absl::MutexLock lock(&a.mu);
  RollLocked(a, round);
  if (static_cast<double>(a.spent_ns) < max_ns_) return absl::OkStatus();
  return core::Refused(
      core::Refusal::kDecodeBudget,
      absl::StrFormat("push from worker %u for round %u of slice %u: decoding its pushes of "
                      "round %u already took %.3f ms of CPU on this shard (--max-decode-ms %g)",
                      worker, round, slice_id, a.round, static_cast<double>(a.spent_ns) / 1e6,
                      max_ms_));
}

void DecodeBudget::Spent(uint32_t worker, uint64_t round, std::chrono::nanoseconds took) {
  if (!bounded() || worker >= accounts_.size()) return;
  Account& a = *accounts_[worker];
  absl::MutexLock lock(&a.mu);
  RollLocked(a, round);
  a.spent_ns += took.count();
}

}  // namespace ps::server
