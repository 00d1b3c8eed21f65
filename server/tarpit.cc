#include "server/tarpit.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace ps::server {
namespace {

constexpr size_t kTrimAbove = 4096;

}  // namespace

bool Tarpit::Charges(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      return false;
    default:
      return true;
  }
}

Tarpit::Tarpit(const TarpitOptions& options, core::Clock* clock)
    : options_(options), clock_(clock) {
  if (options_.rate > 0) thread_ = std::thread([this] { Run(); });
}

Tarpit::~Tarpit() { Stop(); }

bool Tarpit::Refuse(std::string_view client, uint64_t bytes, absl::AnyInvocable<void() &&> answer) {
  bool hold = false;
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_ && options_.rate > 0) {
      const core::SteadyTime now = clock_->Now();
      TrimLocked(now);
      Client& c = clients_
                      .try_emplace(std::string(client),
                                   Client{core::TokenBucket(options_.rate, options_.burst, now)})
                      .first->second;
      const double cost = 1.0 + static_cast<double>(bytes / kBytesPerUnit);
      // In debt at most one burst: a client that stops misbehaving is back within
      // 2 x burst / rate seconds.
      if (!c.budget.Take(cost, now, /*max_debt=*/options_.burst)) {
        hold = c.held < options_.max_held_per_client && held_.size() < options_.max_held;
        if (hold) {
          ++c.held;
          ++held_total_;
          held_.push_back(Held{std::chrono::steady_clock::now() + options_.hold,
                               std::string(client), std::move(answer)});
        }
      }
    }
  }
  if (!hold) std::move(answer)();
  return hold;
}

void Tarpit::TrimLocked(core::SteadyTime now) {
  if (clients_.size() <= kTrimAbove) return;
  absl::erase_if(clients_, [&](const auto& kv) {
    return kv.second.held == 0 && kv.second.budget.FullAt(now);
  });
}

void Tarpit::Run() {
  // Mutex::Await rather than a CondVar: the TSan build's absl::Mutex shim sees the
  // former (tests/sanitizers/tsan_absl_mutex.cc).
  const auto stopped_or_held = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || !held_.empty();
  };
  const auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_; };
  mu_.Lock();
  while (!stopped_) {
    if (held_.empty()) {
      mu_.Await(absl::Condition(&stopped_or_held));
      continue;
    }
    // Every hold has the same length, so a later one is never due before the front.
    const auto left = held_.front().due - std::chrono::steady_clock::now();
    if (left > std::chrono::steady_clock::duration::zero()) {
      mu_.AwaitWithTimeout(absl::Condition(&stopped), absl::FromChrono(left));
      continue;
    }
    Held h = std::move(held_.front());
    held_.pop_front();
    auto it = clients_.find(h.client);
    if (it != clients_.end() && it->second.held > 0) --it->second.held;
    mu_.Unlock();
    std::move(h.answer)();
    mu_.Lock();
  }
  mu_.Unlock();
}

void Tarpit::Stop() {
  std::deque<Held> pending;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    pending.swap(held_);
    for (auto& [name, c] : clients_) c.held = 0;
  }
  if (thread_.joinable()) thread_.join();
  for (Held& h : pending) std::move(h.answer)();
}

Tarpit::Stats Tarpit::stats() const {
  absl::MutexLock lock(&mu_);
  return Stats{held_total_, static_cast<uint32_t>(held_.size())};
}

}  // namespace ps::server
