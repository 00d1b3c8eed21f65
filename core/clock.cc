#include "core/clock.h"

namespace ps::core {
namespace {

class RealClock final : public Clock {
 public:
  SteadyTime Now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();  // never destroyed: used by detached threads
  return clock;
}

SteadyTime ManualClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void ManualClock::Advance(Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

}  // namespace ps::core
