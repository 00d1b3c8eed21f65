#include "server/reset_watch.h"

#include <algorithm>
#include <limits>

namespace ps::server {
namespace {
constexpr core::Duration kCancelWindow = std::chrono::seconds(1);
}  // namespace

ResetLimits ResetLimits::ForStreams(uint32_t max_streams) {
  ResetLimits l;
  l.max_held_per_connection = static_cast<uint32_t>(std::clamp<uint64_t>(
      4 * uint64_t{max_streams}, 64, std::numeric_limits<uint32_t>::max()));
  return l;
}

bool ResetWatch::Begin(const std::string& connection) {
  absl::MutexLock lock(&mu_);
  Held& h = held_[connection];
  if (++h.calls <= limits_.max_held_per_connection || h.reported) return false;
  h.reported = true;
  return true;
}

void ResetWatch::End(const std::string& connection) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(connection);
  if (it == held_.end()) return;
  if (--it->second.calls == 0) held_.erase(it);
}

bool ResetWatch::EarlyCancel(const std::string& connection) {
  const core::SteadyTime now = clock_->Now();
  absl::MutexLock lock(&mu_);
  Cancels& c = cancels_[connection];
  if (now - c.since >= kCancelWindow) c = Cancels{now, 0};
  return ++c.count == limits_.max_early_cancels;
}

void ResetWatch::Sweep() {
  const core::SteadyTime now = clock_->Now();
  absl::MutexLock lock(&mu_);
  absl::erase_if(cancels_, [&](const auto& kv) { return now - kv.second.since >= kCancelWindow; });
}

size_t ResetWatch::connections() const {
  absl::MutexLock lock(&mu_);
  size_t n = held_.size();
  for (const auto& [connection, c] : cancels_) n += held_.contains(connection) ? 0 : 1;
  return n;
}

}  // namespace ps::server
