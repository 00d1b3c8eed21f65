#include "server/peer_monitor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ps::server {

PeerMonitor::PeerMonitor(Options options, PeerGreeter* greeter, core::Clock* clock, Hooks hooks)
    : options_(std::move(options)),
      greeter_(greeter),
      clock_(clock),
      hooks_(std::move(hooks)),
      catch_up_until_(clock->Now() + options_.peer_timeout),
      heard_(options_.peers.size(), false) {}

PeerMonitor::~PeerMonitor() { Stop(); }

void PeerMonitor::Round() {
  std::string problem;
  for (uint32_t i = 0; i < options_.peers.size() && problem.empty(); ++i) {
    if (i == options_.self) continue;
    absl::StatusOr<PeerReply> reply = greeter_->Hello(i);
    if (!reply.ok()) {
      const absl::StatusCode code = reply.status().code();
      if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded) {
        problem = absl::StrCat("peer shard ", i, " at ", options_.peers[i], ": ",
                               reply.status().message());
      }
      continue;
    }
    if (!reply->agreement.ok()) problem = std::string(reply->agreement.message());
    heard_[i] = true;
    if (reply->ready) peers_version_ = std::max(peers_version_, reply->max_version);
  }
  if (hooks_.catching_up()) CatchUp();
  if (problem == last_problem_) return;
  if (problem.empty()) {
    spdlog::info("shard {}: peers agree on the configuration", options_.self);
  } else {
    spdlog::error("shard {}: not serving: {}", options_.self, problem);
  }
  last_problem_ = problem;
  hooks_.agreement(problem.empty());
}

void PeerMonitor::CatchUp() {
  const uint32_t answered =
      static_cast<uint32_t>(std::count(heard_.begin(), heard_.end(), true));
  const uint32_t peers = static_cast<uint32_t>(options_.peers.size()) - 1;
  if (answered < peers && clock_->Now() < catch_up_until_) return;
  const uint64_t own = hooks_.own_version();
  const uint32_t moved = hooks_.fast_forward(peers_version_);
  if (peers_version_ > own) {
    spdlog::warn("shard {}: restored at version {}, peers are at {}: moved {} slices up; the "
                 "updates of versions {} to {} are lost on this shard",
                 options_.self, own, peers_version_, moved, own + 1, peers_version_);
  }
  spdlog::info("shard {}: caught up with {} of {} peers at version {}; admitting workers",
               options_.self, answered, peers, std::max(own, peers_version_));
  hooks_.admit();
}

void PeerMonitor::Start() { thread_ = std::thread([this] { Loop(); }); }

void PeerMonitor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void PeerMonitor::Loop() {
  for (int round = 0;; ++round) {
    Round();
    absl::MutexLock lock(&mu_);
    const auto period = round < 20 ? absl::Milliseconds(250) : absl::Seconds(5);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), period);
    if (stopping_) return;
  }
}

}  // namespace ps::server
