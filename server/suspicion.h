// Suspicion: how little the rule used each worker's pushes, and how much they pulled
// against what it made of them (docs/metrics.md, "Suspicion").
//
// Every aggregated slice round reports, per input:
//  - its weight in the aggregate (aggregators::AggregationContext::influence): Krum's
//    selection, the weights CAF and centered clipping give, the ranks a trimmed mean
//    keeps, traced back through NNM's and clipping's mixing. Its share of the slice
//    round is that weight over the mean weight of the round's inputs, k w_j / sum(w): 1
//    when every input weighs the same, 0 when the rule set it aside;
//  - its alignment, the cosine between it and the aggregate (aggregators::Alignment):
//    an honest gradient points roughly where the aggregate does; a push that
//    points against it (inner-product manipulation, a flipped sign) is one the rule
//    failed to set aside.
// Over a window of --suspicion-window rounds (rounds [i W, (i + 1) W)) both are averaged
// over the worker's slice rounds, weighted by their sizes, and its score for the window
// is the larger of 1 - min(1, mean share) (set aside) and max(0, -mean cosine)
// (opposed): 0 for a worker used at least as much as an equal share and pointing with
// the aggregate, 1 for one the rule never used or that pointed exactly against it. A
// worker whose score reaches --suspicion-threshold is logged (a warning, once until it
// falls below again), as is its return below it.
//
// Rounds aggregated by a vote on packed sign bits, or below the quorum, report nothing.
// A worker with no push aggregated in a window keeps its last score (absent from that
// window's history).
//
// Thread-safe: one mutex around O(k) work per slice round. Memory: O(workers x
// kHistoryWindows).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps::server {

struct WorkerSuspicion {
  // The last closed window's score in [0, 1]; NaN before the worker's first window.
  double score = std::numeric_limits<double>::quiet_NaN();
  // Its parts: 1 - min(1, mean share), and the mean cosine with the aggregate (NaN when
  // none was defined in the window).
  double set_aside = std::numeric_limits<double>::quiet_NaN();
  double alignment = std::numeric_limits<double>::quiet_NaN();
  bool suspected = false;  // score >= the threshold
  // Totals since the start: slice rounds its push was aggregated in, and the sum of its
  // shares of them (1 each at an equal share).
  uint64_t slice_rounds_weighed = 0;
  double share_sum = 0.0;
  uint64_t windows = 0;            // windows closed with a push of it
  uint64_t windows_suspected = 0;  // of which scored >= the threshold
};

class Suspicion {
 public:
  // The last windows kept for History().
  static constexpr size_t kHistoryWindows = 64;

  struct Config {
    uint32_t shard_id = 0;
    uint32_t num_workers = 0;
    uint32_t window_rounds = 50;  // 0: Record does nothing
    double threshold = 0.5;
  };
  explicit Suspicion(Config config);
  Suspicion(const Suspicion&) = delete;
  Suspicion& operator=(const Suspicion&) = delete;

  // One slice round of `round` aggregated over `numel` coordinates: workers[i]'s push was
  // input i, weighed influence[i] and had the cosine alignment[i] with the aggregate
  // (NaN: undefined). A round of a later window closes the current one. Ignored when the
  // sizes differ or the influences do not add up to a positive finite total.
  void Record(uint64_t round, std::span<const uint32_t> workers,
              std::span<const double> influence, std::span<const double> alignment,
              uint64_t numel);

  std::vector<WorkerSuspicion> Get() const;
  // The scores of the last closed windows, oldest first: per window, the first round and
  // per worker its score and the score's parts (NaN: no push of it aggregated in that
  // window; an alignment also where none was defined).
  struct Window {
    uint64_t first_round = 0;
    std::vector<double> scores;
    std::vector<double> set_aside;
    std::vector<double> alignment;
  };
  std::vector<Window> History() const;
  // From a checkpoint: `worker`'s scores and totals, and the windows of History() (each
  // padded or cut to this shard's workers; the last kHistoryWindows kept). Ids out of
  // range change nothing.
  void Restore(uint32_t worker, const WorkerSuspicion& suspicion);
  void RestoreHistory(std::vector<Window> history);
  const Config& config() const { return config_; }

 private:
  void CloseWindow() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Config config_;
  mutable absl::Mutex mu_;
  uint64_t window_ ABSL_GUARDED_BY(mu_) = 0;   // index of the open window
  bool open_ ABSL_GUARDED_BY(mu_) = false;     // a slice round was recorded in it
  // A worker's sums over the open window, weighted by slice size.
  struct WindowSums {
    double share = 0;              // share x numel
    uint64_t coordinates = 0;      // numel
    double cosine = 0;             // cosine x numel, where defined
    uint64_t cosine_coordinates = 0;
  };
  std::vector<WindowSums> open_sums_ ABSL_GUARDED_BY(mu_);
  std::vector<WorkerSuspicion> workers_ ABSL_GUARDED_BY(mu_);
  std::deque<Window> history_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
