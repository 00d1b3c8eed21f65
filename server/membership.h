// Membership: which workers the rounds wait for (docs/operations.md, "Workers that come
// and go").
//
// Worker ids are [0, ids): the first `expected` (--workers) are waited for from the start
// (they may still be starting); the rest are spares (--max-workers), waited for only once
// they joined. A worker stops being waited for when it leaves (the Leave call, which a
// worker sends when it closes) or when it expires: no push or chunk of it taken for
// --worker-timeout-ms (0: never), counted from its join, its last push, or the close of
// the last round it pushed to, whichever came last (a worker whose push waits for slower
// ones is not idle). A round then closes once every worker waited for pushed and it has
// its quorum, instead of waiting for its deadline every time, and the absent worker no
// longer counts as one of the workers a round is missing. Its next join, push or chunk
// makes it waited for again. The quorum (n - f, or --quorum) and the rule's bound f stay
// the configured ones whatever the round's member count, so a round never closes with
// fewer inputs than the quorum; with fewer workers present than the quorum, rounds cannot
// close, which the shard says loudly.
//
// Thread-safe and lock-free: one atomic state and one atomic activity time per worker.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/clock.h"

namespace ps::server {

class Membership {
 public:
  // kNeverJoined: an expected worker still starting (waited for); kSpare: an id beyond
  // the expected ones that never joined (not waited for).
  enum class State : int { kNeverJoined = 0, kPresent, kLeft, kExpired, kSpare };

  // Ids [0, ids), of which [0, expected) are waited for before they join. `timeout` 0
  // turns expiry off.
  Membership(uint32_t expected, uint32_t ids, core::Duration timeout);
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // `worker` joined, or had a push or chunk taken, at `now`: present (again). True when
  // it was absent (left or expired) before.
  bool Joined(uint32_t worker, core::SteadyTime now);
  bool Active(uint32_t worker, core::SteadyTime now);
  // A round `worker` pushed to closed at `now`: until then it was waiting for the others
  // and could not push again, so its time without a push counts from now. Changes no
  // state (an absent worker stays absent).
  void Waited(uint32_t worker, core::SteadyTime now);
  // `worker` left. True when it was waited for until now.
  bool Leave(uint32_t worker);
  // The present workers with nothing taken for longer than the timeout, now expired (each
  // reported once per expiry). Empty when expiry is off.
  std::vector<uint32_t> Expire(core::SteadyTime now);

  // From a checkpoint: `worker` was present, left or expired when it was written (other
  // states and ids out of range change nothing). A present one's idle time starts `now`.
  void Restore(uint32_t worker, State state, core::SteadyTime now);

  State state(uint32_t worker) const;
  // Left, expired or a spare that never joined: no round waits for it.
  bool Absent(uint32_t worker) const;
  // Whether any id is not waited for (one atomic load: the rounds' fast path).
  bool AnyAbsent() const { return not_waited_.load(std::memory_order_acquire) > 0; }
  // Workers that left or expired.
  uint32_t absent_count() const { return absent_.load(std::memory_order_acquire); }
  // Workers the rounds wait for: present ones and expected ones still starting.
  uint32_t waited_count() const { return ids_ - not_waited_.load(std::memory_order_acquire); }
  uint32_t ids() const { return ids_; }
  core::Duration timeout() const { return timeout_; }

 private:
  static int64_t Ticks(core::SteadyTime t) { return t.time_since_epoch().count(); }
  // Moves `worker` from `from` to `to`; false when it was not in `from`.
  bool Move(uint32_t worker, State from, State to);

  const uint32_t ids_;
  const core::Duration timeout_;
  const std::unique_ptr<std::atomic<int>[]> state_;
  const std::unique_ptr<std::atomic<int64_t>[]> active_;
  std::atomic<uint32_t> absent_{0};      // left or expired
  std::atomic<uint32_t> not_waited_{0};  // absent, or spares that never joined
};

std::string_view MembershipStateName(Membership::State state);

}  // namespace ps::server
