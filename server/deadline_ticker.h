// DeadlineTicker: the shard's thread that closes rounds at their deadlines. It sleeps until
// the earliest deadline (`next`, read each time round), a Wake() (a deadline registered
// sooner), or at most `max_sleep`, then calls `tick` with the clock's time.
//
// The deadlines are on `clock` (a ManualClock in tests); the sleeps are real time, so
// a test that advances its clock calls Wake() for the ticker to see it.
//
// Thread safety: Start, Wake and Stop from any thread; `next` and `tick` run on the
// ticker's thread, without its lock.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "core/clock.h"

namespace ps::server {

class DeadlineTicker {
 public:
  using Next = std::function<std::optional<core::SteadyTime>()>;
  using Tick = std::function<void(core::SteadyTime now)>;

  DeadlineTicker(core::Clock* clock, Next next, Tick tick,
                 std::chrono::milliseconds max_sleep = std::chrono::milliseconds(200));
  ~DeadlineTicker();  // Stop()
  DeadlineTicker(const DeadlineTicker&) = delete;
  DeadlineTicker& operator=(const DeadlineTicker&) = delete;

  void Start();
  // Ends the current sleep: the ticker reads `next` again and ticks.
  void Wake();
  // Returns once the thread has ended (after a tick in progress). Idempotent.
  void Stop();

 private:
  void Loop();
  // How long to sleep before the next tick: until `next` (rounded up to the millisecond,
  // plus one, so that the tick comes after it), at most max_sleep_.
  std::chrono::milliseconds SleepFor(core::SteadyTime now) const;

  core::Clock* const clock_;
  const Next next_;
  const Tick tick_;
  const std::chrono::milliseconds max_sleep_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps::server
