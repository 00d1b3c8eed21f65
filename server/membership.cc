#include "server/membership.h"

#include <algorithm>

namespace ps::server {

namespace {

bool IsAbsent(Membership::State s) {
  return s == Membership::State::kLeft || s == Membership::State::kExpired;
}

}  // namespace

Membership::Membership(uint32_t expected, uint32_t ids, core::Duration timeout)
    : ids_(std::max(ids, expected)),
      timeout_(timeout),
      state_(std::make_unique<std::atomic<int>[]>(ids_)),
      active_(std::make_unique<std::atomic<int64_t>[]>(ids_)) {
  for (uint32_t w = 0; w < ids_; ++w) {
    state_[w].store(static_cast<int>(w < expected ? State::kNeverJoined : State::kSpare));
    active_[w].store(0);
  }
  not_waited_.store(ids_ - expected);
}

bool Membership::Move(uint32_t worker, State from, State to) {
  int expected = static_cast<int>(from);
  if (!state_[worker].compare_exchange_strong(expected, static_cast<int>(to))) return false;
  if (IsAbsent(from) && !IsAbsent(to)) absent_.fetch_sub(1);
  if (!IsAbsent(from) && IsAbsent(to)) absent_.fetch_add(1);
  const bool was_waited = from == State::kPresent || from == State::kNeverJoined;
  const bool is_waited = to == State::kPresent || to == State::kNeverJoined;
  if (was_waited && !is_waited) not_waited_.fetch_add(1);
  if (!was_waited && is_waited) not_waited_.fetch_sub(1);
  return true;
}

bool Membership::Joined(uint32_t worker, core::SteadyTime now) { return Active(worker, now); }

bool Membership::Active(uint32_t worker, core::SteadyTime now) {
  if (worker >= ids_) return false;
  active_[worker].store(Ticks(now), std::memory_order_relaxed);
  // The common case, already present, is one load.
  if (state_[worker].load(std::memory_order_acquire) == static_cast<int>(State::kPresent)) {
    return false;
  }
  bool returned = false;
  for (State from : {State::kNeverJoined, State::kSpare, State::kLeft, State::kExpired}) {
    if (Move(worker, from, State::kPresent)) {
      returned = IsAbsent(from);
      break;
    }
  }
  return returned;
}

void Membership::Waited(uint32_t worker, core::SteadyTime now) {
  if (worker >= ids_ || timeout_ <= core::Duration::zero()) return;
  active_[worker].store(Ticks(now), std::memory_order_relaxed);
}

bool Membership::Leave(uint32_t worker) {
  if (worker >= ids_) return false;
  if (Move(worker, State::kPresent, State::kLeft)) return true;
  if (Move(worker, State::kNeverJoined, State::kLeft)) return true;
  Move(worker, State::kExpired, State::kLeft);  // not waited for already; a spare stays one
  return false;
}

std::vector<uint32_t> Membership::Expire(core::SteadyTime now) {
  std::vector<uint32_t> expired;
  if (timeout_ <= core::Duration::zero()) return expired;
  const int64_t cutoff = Ticks(now - timeout_);
  for (uint32_t w = 0; w < ids_; ++w) {
    if (state_[w].load(std::memory_order_acquire) != static_cast<int>(State::kPresent)) continue;
    if (active_[w].load(std::memory_order_relaxed) >= cutoff) continue;
    if (Move(w, State::kPresent, State::kExpired)) expired.push_back(w);
  }
  return expired;
}

void Membership::Restore(uint32_t worker, State to, core::SteadyTime now) {
  if (worker >= ids_ || (to != State::kPresent && !IsAbsent(to))) return;
  active_[worker].store(Ticks(now), std::memory_order_relaxed);
  Move(worker, state(worker), to);
}

Membership::State Membership::state(uint32_t worker) const {
  if (worker >= ids_) return State::kSpare;
  return static_cast<State>(state_[worker].load(std::memory_order_acquire));
}

bool Membership::Absent(uint32_t worker) const {
  const State s = state(worker);
  return IsAbsent(s) || s == State::kSpare;
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
    case Membership::State::kSpare:
      return "spare";
  }
  return "unknown";
}

}  // namespace ps::server
