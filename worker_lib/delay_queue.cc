#include "worker_lib/delay_queue_internal.h"

#include <vector>

#include "absl/time/time.h"

namespace ps::internal {

DelayQueue::DelayQueue() : thread_([this] { Loop(); }) {}

DelayQueue::~DelayQueue() { Stop(); }

void DelayQueue::After(std::chrono::milliseconds delay, std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.emplace(std::chrono::steady_clock::now() + delay, std::move(fn));
      wake_ = true;
      return;
    }
  }
  fn();
}

void DelayQueue::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  thread_.join();
  std::multimap<std::chrono::steady_clock::time_point, std::function<void()>> rest;
  {
    absl::MutexLock lock(&mu_);
    rest.swap(queue_);
  }
  for (auto& [when, fn] : rest) fn();
}

void DelayQueue::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    if (!queue_.empty() && queue_.begin()->first <= now) {
      std::function<void()> fn = std::move(queue_.begin()->second);
      queue_.erase(queue_.begin());
      mu_.Unlock();
      fn();
      mu_.Lock();
      continue;
    }
    const absl::Duration wait = queue_.empty()
                                    ? absl::Seconds(1)
                                    : absl::FromChrono(queue_.begin()->first - now);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](DelayQueue* q) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                               return q->stopping_ || q->wake_;
                             },
                             this),
                         wait);
    wake_ = false;
  }
}

}  // namespace ps::internal
