#include "core/token_bucket.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>

namespace ps::core {

TokenBucket::TokenBucket(double rate, double burst, SteadyTime now)
    : rate_(rate), burst_(burst), tokens_(burst), last_(now) {}

double TokenBucket::RefillFor(SteadyTime now) const {
  if (now <= last_) return 0;
  const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_);
  return static_cast<double>(elapsed.count()) * rate_ / 1e9;
}

void TokenBucket::Refill(SteadyTime now) {
  if (now <= last_) return;
  tokens_ = std::min(burst_, tokens_ + RefillFor(now));
  last_ = now;
}

bool TokenBucket::TryTake(double cost, SteadyTime now) {
  Refill(now);
  if (tokens_ < cost) return false;
  tokens_ -= cost;
  return true;
}

bool TokenBucket::Take(double cost, SteadyTime now, double max_debt) {
  Refill(now);
  const bool covered = tokens_ >= cost;
  tokens_ = std::max(tokens_ - cost, -max_debt);
  return covered;
}

SteadyTime TokenBucket::RepaidAt() const {
  // A day: keeps `last_ + wait` far from overflowing whatever the rate.
  constexpr double kMaxWaitNs = 86400e9;
  if (tokens_ >= 0) return last_;
  const double wait_ns = std::min(std::ceil(-tokens_ * 1e9 / rate_), kMaxWaitNs);
  return last_ + std::chrono::duration_cast<Duration>(
                     std::chrono::nanoseconds(static_cast<int64_t>(wait_ns)));
}

bool TokenBucket::FullAt(SteadyTime now) const { return tokens_ + RefillFor(now) >= burst_; }

}  // namespace ps::core
