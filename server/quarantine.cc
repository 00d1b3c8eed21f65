#include "server/quarantine.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/refusal.h"

namespace ps::server {

Quarantine::Quarantine(uint32_t num_workers, core::Duration duration)
    : num_workers_(num_workers),
      duration_(duration),
      until_(std::make_unique<std::atomic<int64_t>[]>(num_workers)) {
  for (uint32_t w = 0; w < num_workers; ++w) until_[w].store(0);
}

bool Quarantine::Start(uint32_t worker, core::SteadyTime now) {
  if (duration_ <= core::Duration::zero() || worker >= num_workers_) return false;
  const int64_t end = Ticks(now + duration_);
  const int64_t was = until_[worker].exchange(end);
  int64_t latest = latest_.load();
  while (latest < end && !latest_.compare_exchange_weak(latest, end)) {
  }
  return was <= Ticks(now);
}

bool Quarantine::Contains(uint32_t worker, core::SteadyTime now) const {
  return worker < num_workers_ && until_[worker].load() > Ticks(now);
}

std::optional<core::SteadyTime> Quarantine::Until(uint32_t worker, core::SteadyTime now) const {
  if (!Contains(worker, now)) return std::nullopt;
  return core::SteadyTime(core::Duration(until_[worker].load()));
}

bool Quarantine::Any(core::SteadyTime now) const { return latest_.load() > Ticks(now); }

absl::Status Quarantine::Check(uint32_t worker, core::SteadyTime now) const {
  const std::optional<core::SteadyTime> until = Until(worker, now);
  if (!until.has_value()) return absl::OkStatus();
  return core::Refused(
      core::Refusal::kQuarantined,
      absl::StrCat("worker ", worker, " is quarantined for another ",
                   std::chrono::duration_cast<std::chrono::milliseconds>(*until - now).count(),
                   " ms after a malformed push: its pushes are refused and no round waits for "
                   "it (--quarantine-ms)"));
}

}  // namespace ps::server
