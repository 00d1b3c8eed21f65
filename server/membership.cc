#include "server/membership.h"

namespace ps::server {

Membership::Membership(uint32_t num_workers, core::Duration timeout)
    : num_workers_(num_workers),
      timeout_(timeout),
      state_(std::make_unique<std::atomic<int>[]>(num_workers)),
      active_(std::make_unique<std::atomic<int64_t>[]>(num_workers)) {
  for (uint32_t w = 0; w < num_workers; ++w) {
    state_[w].store(static_cast<int>(State::kNeverJoined));
    active_[w].store(0);
  }
}

bool Membership::Move(uint32_t worker, State from, State to) {
  int expected = static_cast<int>(from);
  if (!state_[worker].compare_exchange_strong(expected, static_cast<int>(to))) return false;
  const bool was_absent = from == State::kLeft || from == State::kExpired;
  const bool is_absent = to == State::kLeft || to == State::kExpired;
  if (was_absent && !is_absent) absent_.fetch_sub(1);
  if (!was_absent && is_absent) absent_.fetch_add(1);
  return true;
}

bool Membership::Joined(uint32_t worker, core::SteadyTime now) { return Active(worker, now); }

bool Membership::Active(uint32_t worker, core::SteadyTime now) {
  if (worker >= num_workers_) return false;
  active_[worker].store(Ticks(now), std::memory_order_relaxed);
  // The common case, already present, is one load.
  if (state_[worker].load(std::memory_order_acquire) == static_cast<int>(State::kPresent)) {
    return false;
  }
  bool returned = false;
  for (State from : {State::kNeverJoined, State::kLeft, State::kExpired}) {
    if (Move(worker, from, State::kPresent)) {
      returned = from != State::kNeverJoined;
      break;
    }
  }
  return returned;
}

void Membership::Waited(uint32_t worker, core::SteadyTime now) {
  if (worker >= num_workers_ || timeout_ <= core::Duration::zero()) return;
  active_[worker].store(Ticks(now), std::memory_order_relaxed);
}

bool Membership::Leave(uint32_t worker) {
  if (worker >= num_workers_) return false;
  if (Move(worker, State::kPresent, State::kLeft)) return true;
  if (Move(worker, State::kNeverJoined, State::kLeft)) return true;
  Move(worker, State::kExpired, State::kLeft);  // not waited for already
  return false;
}

std::vector<uint32_t> Membership::Expire(core::SteadyTime now) {
  std::vector<uint32_t> expired;
  if (timeout_ <= core::Duration::zero()) return expired;
  const int64_t cutoff = Ticks(now - timeout_);
  for (uint32_t w = 0; w < num_workers_; ++w) {
    if (state_[w].load(std::memory_order_acquire) != static_cast<int>(State::kPresent)) continue;
    if (active_[w].load(std::memory_order_relaxed) >= cutoff) continue;
    if (Move(w, State::kPresent, State::kExpired)) expired.push_back(w);
  }
  return expired;
}

Membership::State Membership::state(uint32_t worker) const {
  if (worker >= num_workers_) return State::kNeverJoined;
  return static_cast<State>(state_[worker].load(std::memory_order_acquire));
}

bool Membership::Absent(uint32_t worker) const {
  const State s = state(worker);
  return s == State::kLeft || s == State::kExpired;
}

std::string_view MembershipStateName(Membership::State state) {
  switch (state) {
    case Membership::State::kNeverJoined:
      return "never_joined";
    case Membership::State::kPresent:
      return "present";
    case Membership::State::kLeft:
      return "left";
    case Membership::State::kExpired:
      return "expired";
  }
  return "unknown";
}

}  // namespace ps::server
