// Clock: the source of time for deadlines, behind an interface so tests can drive
// time by hand. RealClock reads std::chrono::steady_clock; ManualClock only moves
// when told. Both are thread-safe.
#pragma once

#include <chrono>

#include "absl/synchronization/mutex.h"

namespace ps::core {

using SteadyTime = std::chrono::steady_clock::time_point;
using Duration = std::chrono::steady_clock::duration;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual SteadyTime Now() const = 0;
  // The process-wide real clock.
  static Clock* Real();
};

class ManualClock final : public Clock {
 public:
  SteadyTime Now() const override;
  void Advance(Duration d);

 private:
  mutable absl::Mutex mu_;
  SteadyTime now_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace ps::core
