#include "server/suspicion.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "spdlog/spdlog.h"

namespace ps::server {

Suspicion::Suspicion(Config config)
    : config_(config),
      open_sums_(config.num_workers),
      workers_(config.num_workers) {}

void Suspicion::Record(uint64_t round, std::span<const uint32_t> workers,
                       std::span<const double> influence, std::span<const double> alignment,
                       uint64_t numel) {
  if (config_.window_rounds == 0 || workers.empty() || workers.size() != influence.size() ||
      workers.size() != alignment.size() || numel == 0) {
    return;
  }
  double total = 0.0;
  for (double w : influence) total += w;
  if (!(total > 0.0) || !std::isfinite(total)) return;
  const double k = static_cast<double>(workers.size());
  absl::MutexLock lock(&mu_);
  const uint64_t window = round / config_.window_rounds;
  if (window > window_) {
    if (open_) CloseWindow();
    window_ = window;
  }
  open_ = true;
  // A slice of an earlier window that closed late counts in the open one.
  for (size_t i = 0; i < workers.size(); ++i) {
    const uint32_t w = workers[i];
    if (w >= workers_.size()) continue;
    const double share = std::max(0.0, k * influence[i] / total);
    WindowSums& sums = open_sums_[w];
    sums.share += share * static_cast<double>(numel);
    sums.coordinates += numel;
    if (std::isfinite(alignment[i])) {
      sums.cosine += std::clamp(alignment[i], -1.0, 1.0) * static_cast<double>(numel);
      sums.cosine_coordinates += numel;
    }
    ++workers_[w].slice_rounds_weighed;
    workers_[w].share_sum += share;
  }
}

void Suspicion::Restore(uint32_t worker, const WorkerSuspicion& suspicion) {
  absl::MutexLock lock(&mu_);
  if (worker < workers_.size()) workers_[worker] = suspicion;
}

void Suspicion::RestoreHistory(std::vector<Window> history) {
  const size_t n = workers_.size();
  for (Window& w : history) {
    for (std::vector<double>* v : {&w.scores, &w.set_aside, &w.alignment}) {
      v->resize(n, std::numeric_limits<double>::quiet_NaN());
    }
  }
  absl::MutexLock lock(&mu_);
  history_.assign(std::make_move_iterator(history.begin()),
                  std::make_move_iterator(history.end()));
  while (history_.size() > kHistoryWindows) history_.pop_front();
}

void Suspicion::CloseWindow() {
  Window closed;
  closed.first_round = window_ * config_.window_rounds;
  closed.scores.assign(workers_.size(), std::numeric_limits<double>::quiet_NaN());
  closed.set_aside = closed.scores;
  closed.alignment = closed.scores;
  for (size_t w = 0; w < workers_.size(); ++w) {
    const WindowSums sums = std::exchange(open_sums_[w], WindowSums{});
    if (sums.coordinates == 0) continue;
    const double mean = sums.share / static_cast<double>(sums.coordinates);
    const double set_aside = 1.0 - std::min(1.0, mean);
    const double cosine = sums.cosine_coordinates == 0
                              ? std::numeric_limits<double>::quiet_NaN()
                              : sums.cosine / static_cast<double>(sums.cosine_coordinates);
    const double score = std::isnan(cosine) ? set_aside : std::max(set_aside, -cosine);
    WorkerSuspicion& ws = workers_[w];
    ws.score = score;
    ws.set_aside = set_aside;
    ws.alignment = cosine;
    ++ws.windows;
    closed.scores[w] = score;
    closed.set_aside[w] = set_aside;
    closed.alignment[w] = cosine;
    const bool suspected = score >= config_.threshold;
    if (suspected) ++ws.windows_suspected;
    if (suspected != ws.suspected) {
      // Once per crossing: a worker cannot make these more often than once a window.
      if (suspected) {
        spdlog::warn("shard {}: worker {} is suspected: over rounds {}-{} the rule used its pushes "
                     "at {:.2f} of an equal share, at a mean cosine of {:.2f} with the aggregate "
                     "(score {:.2f} >= --suspicion-threshold {})",
                     config_.shard_id, w, closed.first_round,
                     closed.first_round + config_.window_rounds - 1, mean, cosine, score,
                     config_.threshold);
      } else {
        spdlog::info("shard {}: worker {} is no longer suspected: over rounds {}-{} the rule used "
                     "its pushes at {:.2f} of an equal share, at a mean cosine of {:.2f} with "
                     "the aggregate (score {:.2f})",
                     config_.shard_id, w, closed.first_round,
                     closed.first_round + config_.window_rounds - 1, mean, cosine, score);
      }
      ws.suspected = suspected;
    }
  }
  history_.push_back(std::move(closed));
  if (history_.size() > kHistoryWindows) history_.pop_front();
  open_ = false;
}

std::vector<WorkerSuspicion> Suspicion::Get() const {
  absl::MutexLock lock(&mu_);
  return workers_;
}

std::vector<Suspicion::Window> Suspicion::History() const {
  absl::MutexLock lock(&mu_);
  return {history_.begin(), history_.end()};
}

}  // namespace ps::server
