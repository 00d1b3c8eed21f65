// LinkEstimator: what moving bytes to one shard costs, as alpha + beta x bytes
// (docs/adaptive.md, "The cost model"), estimated from timed transfers.
//
// Samples are (bytes, seconds) of whole transfers. Estimate() fits them robustly:
// Theil-Sen (beta the median of the pairwise slopes, alpha the median of the
// residuals), which a quarter of wild samples (a slow round, a stall) does not move.
// When the samples' sizes are too alike for a slope (every round pushes the same
// bytes), alpha comes from the latency samples (round trips of tiny calls, AddLatency)
// and beta from the median of (seconds - alpha) / bytes. Only the last `window`
// samples of each kind count, so the estimate follows a link that changes, and memory
// and Estimate()'s cost (window^2 / 2 slopes) are bounded.
//
// TransferMeter turns calls that overlap (a push pipeline's window) into such
// samples: a busy period, from a call started while none was in flight to the moment
// none is, is one transfer of the bytes its calls delivered. BurstTimer turns a pull
// stream's messages into samples of the downlink: a run of messages the shard wrote
// back to back (PullResponse.queued), from the arrival of the message before the run
// to the arrival of its last, is one transfer of the run's bytes; the time a shard
// waited for a version (an unqueued message) is never in a sample.
//
// LinkEstimator (Estimate too: it reuses a buffer) and BurstTimer are not thread-safe (the
// owner serializes calls); SharedLinkEstimate and TransferMeter are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker_lib/worker.h"

namespace ps::internal {

// Seconds on steady_clock: the meters' default clock.
double SteadySeconds();

struct LinkCost {
  bool valid = false;        // false until a transfer was sampled
  double alpha_seconds = 0;  // fixed cost of a transfer
  double seconds_per_byte = 0;
  size_t transfers = 0;     // samples the estimate rests on
  bool from_slope = false;  // Theil-Sen (else alpha from latencies or 0)

  // Predicted seconds to move `bytes`.
  double Seconds(uint64_t bytes) const {
    return alpha_seconds + seconds_per_byte * static_cast<double>(bytes);
  }
  // Bytes the link moves in `seconds` beyond the fixed cost (its rate x seconds); 0
  // before an estimate or for a link with no measured rate.
  uint64_t BytesIn(double seconds) const {
    if (!valid || !(seconds_per_byte > 0) || !(seconds > 0)) return 0;
    const double bytes = seconds / seconds_per_byte;
    return bytes >= 1e18 ? uint64_t{1'000'000'000'000'000'000} : static_cast<uint64_t>(bytes);
  }
  // As WorkerStats reports it.
  LinkStats stats() const {
    return {.alpha_seconds = alpha_seconds,
            .seconds_per_byte = seconds_per_byte,
            .transfers = transfers};
  }
};

class LinkEstimator {
 public:
  // window: samples kept of each kind, >= 2. min_spread: the largest sample must be at
  // least this many times the smallest for a slope to be fitted (> 1).
  explicit LinkEstimator(size_t window = 64, double min_spread = 2.0);

  // A transfer of `bytes` (> 0) that took `seconds` (finite, >= 0); others are ignored.
  void AddTransfer(uint64_t bytes, double seconds);
  // The round trip of a call that carries next to no bytes (finite, >= 0).
  void AddLatency(double seconds);

  LinkCost Estimate() const;

 private:
  struct Transfer {
    double bytes = 0;
    double seconds = 0;
  };

  size_t window_;
  double min_spread_;
  std::vector<Transfer> transfers_;  // ring of the last window_
  size_t next_transfer_ = 0;
  std::vector<double> latencies_;  // ring of the last window_
  size_t next_latency_ = 0;
  mutable std::vector<double> scratch_;  // Estimate's slopes and residuals
};

// A LinkEstimator behind a lock. Estimate() refits only when a sample came since the
// last call, so callers on the push path pay a lock and a copy.
class SharedLinkEstimate {
 public:
  void AddTransfer(uint64_t bytes, double seconds);
  LinkCost Estimate() const;

 private:
  mutable absl::Mutex mu_;
  LinkEstimator estimator_ ABSL_GUARDED_BY(mu_);
  // Estimate() of the samples so far; fitted again only after a new sample.
  mutable std::optional<LinkCost> cached_ ABSL_GUARDED_BY(mu_);
};

class TransferMeter {
 public:
  // `now` gives seconds on a monotonic clock (default: steady_clock).
  explicit TransferMeter(std::function<double()> now = {});

  // A call went on the wire.
  void Started();
  // A call started before is over, having delivered `bytes` (0: refused or failed).
  // Ends the busy period when it was the last in flight; a period that delivered
  // nothing is not a sample.
  void Finished(uint64_t bytes);

  LinkCost Estimate() const { return link_.Estimate(); }

 private:
  const std::function<double()> now_;
  mutable absl::Mutex mu_;
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  double start_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  SharedLinkEstimate link_;
};

// One pull stream's back-to-back runs, as samples of `link` (which outlives it).
class BurstTimer {
 public:
  explicit BurstTimer(SharedLinkEstimate* link) : link_(link) {}

  // A message of `bytes` arrived at `seconds` (monotonic); `queued`: the shard wrote it
  // right after the one before. An unqueued message ends the run in progress.
  void Arrived(uint64_t bytes, bool queued, double seconds);
  // The stream is over: ends the run in progress.
  void End();

 private:
  SharedLinkEstimate* const link_;
  std::optional<double> last_;  // the previous message's arrival
  double run_start_ = 0;        // the arrival before the run's first message
  double run_end_ = 0;
  uint64_t run_bytes_ = 0;  // 0: no run in progress
};

// The part of a round that no push's size changes, seen from one worker: from the
// moment its last push of a round was answered to its first push of the next round (the
// shards' aggregation, the pull, the forward and backward passes up to the first
// gradient), as an exponentially weighted mean over rounds. CAT counts it into every
// push's fixed cost (docs/adaptive.md, "CAT"). Thread-safe.
class RoundIdleMeter {
 public:
  // `now` gives seconds on a monotonic clock (default: steady_clock).
  explicit RoundIdleMeter(std::function<double()> now = {});

  // No push is in flight or queued any more.
  void Drained();
  // A push of `round` starts. The first push of a round later than the last one seen,
  // after a drain since that round began, is a sample.
  void Pushing(uint64_t round);
  // The mean idle seconds per round; nullopt before the first sample.
  std::optional<double> Seconds() const;

 private:
  const std::function<double()> now_;
  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // a round was seen
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;    // the latest round seen
  double round_start_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<double> drained_at_ ABSL_GUARDED_BY(mu_);
  std::optional<double> mean_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::internal
