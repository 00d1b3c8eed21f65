#include "server/deadline_queue.h"

namespace ps::server {

void DeadlineQueue::Add(uint32_t slice, core::SteadyTime deadline) {
  {
    absl::MutexLock lock(&mu_);
    due_.emplace(deadline, slice);
  }
  Notify();
}

void DeadlineQueue::Remove(uint32_t slice, core::SteadyTime deadline) {
  absl::MutexLock lock(&mu_);
  due_.erase({deadline, slice});
}

std::vector<uint32_t> DeadlineQueue::PopDue(core::SteadyTime now) {
  std::vector<uint32_t> expired;
  absl::MutexLock lock(&mu_);
  while (!due_.empty() && due_.begin()->first <= now) {
    expired.push_back(due_.begin()->second);
    due_.erase(due_.begin());
  }
  return expired;
}

std::optional<core::SteadyTime> DeadlineQueue::Next() const {
  absl::MutexLock lock(&mu_);
  if (due_.empty()) return std::nullopt;
  return due_.begin()->first;
}

void DeadlineQueue::SetListener(std::function<void()> listener) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

void DeadlineQueue::Notify() const {
  std::function<void()> listener;
  {
    absl::MutexLock lock(&mu_);
    listener = listener_;
  }
  if (listener) listener();
}

}  // namespace ps::server
