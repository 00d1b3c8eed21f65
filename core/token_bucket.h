// A token bucket's arithmetic, the one every rate in the project uses: the link shaper's
// byte pacing (net::TokenBucket), the admission limiter (server::RateLimiter) and the
// tarpit's budget of refused work (server::Tarpit).
//
// It refills at `rate` tokens per second up to `burst` and starts full. A cost may take
// it into debt (down to a floor the caller names), so that a cost larger than the bucket
// still passes at the average rate, and a client in debt waits for it to be repaid.
//
// Thread safety: a value. Its owner serialises calls and reads the clock; a clock that
// steps back refills nothing.
#pragma once

#include <limits>

#include "core/clock.h"

namespace ps::core {

class TokenBucket {
 public:
  static constexpr double kNoFloor = std::numeric_limits<double>::infinity();

  // Full at `now`. `rate` > 0 tokens per second; `burst` >= 0.
  TokenBucket(double rate, double burst, SteadyTime now);

  // Takes `cost` if the bucket, refilled to `now`, holds it; otherwise takes nothing.
  bool TryTake(double cost, SteadyTime now);
  // Takes `cost` whatever the bucket holds, going into debt no deeper than `max_debt`.
  // Returns whether the bucket covered it.
  bool Take(double cost, SteadyTime now, double max_debt = kNoFloor);
  // When a bucket in debt is back at zero (rounded up to the nanosecond, so never early,
  // and at most a day ahead); the last refill's time when it is not in debt.
  SteadyTime RepaidAt() const;
  // Whether the bucket would be full at `now`: one that is need not be kept, as a new
  // bucket starts full.
  bool FullAt(SteadyTime now) const;

  double tokens() const { return tokens_; }

 private:
  void Refill(SteadyTime now);
  // What `now` would add, uncapped. Nanoseconds times the rate first, then / 1e9: exact
  // for whole rates, so times a test computes by hand match to the nanosecond.
  double RefillFor(SteadyTime now) const;

  double rate_;
  double burst_;
  double tokens_;  // negative: debt
  SteadyTime last_;
};

}  // namespace ps::core
