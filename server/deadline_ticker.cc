#include "server/deadline_ticker.h"

#include <algorithm>
#include <utility>

namespace ps::server {

DeadlineTicker::DeadlineTicker(core::Clock* clock, Next next, Tick tick,
                               std::chrono::milliseconds max_sleep)
    : clock_(clock), next_(std::move(next)), tick_(std::move(tick)), max_sleep_(max_sleep) {}

DeadlineTicker::~DeadlineTicker() { Stop(); }

void DeadlineTicker::Start() { thread_ = std::thread([this] { Loop(); }); }

void DeadlineTicker::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

void DeadlineTicker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::chrono::milliseconds DeadlineTicker::SleepFor(core::SteadyTime now) const {
  const std::optional<core::SteadyTime> next = next_();
  if (!next.has_value()) return max_sleep_;
  return std::min(max_sleep_, std::chrono::duration_cast<std::chrono::milliseconds>(*next - now) +
                                  std::chrono::milliseconds(1));
}

void DeadlineTicker::Loop() {
  // Built once: abseil evaluates a waiter's Condition on the unlocking thread.
  const absl::Condition stopping_or_woken(
      +[](DeadlineTicker* t) ABSL_NO_THREAD_SAFETY_ANALYSIS { return t->stopping_ || t->woken_; },
      this);
  for (;;) {
    const std::chrono::milliseconds wait = SleepFor(clock_->Now());
    {
      absl::MutexLock lock(&mu_);
      if (wait.count() > 0) mu_.AwaitWithTimeout(stopping_or_woken, absl::FromChrono(wait));
      woken_ = false;
      if (stopping_) return;
    }
    tick_(clock_->Now());
  }
}

}  // namespace ps::server
