// AggregationJobs: the shard's work on the thread pool (slice aggregations and the
// steps of model-scope rounds), counted from submission until the job returns, so that
// the shard can wait for it: Drain with a deadline, the destructor until none runs (the
// jobs use the shard). Closed slices wait in a queue by rank: each slice job aggregates
// the most urgent slice queued when it starts (P3), not necessarily the one that
// submitted it.
//
// Thread-safe: one mutex, taken by nothing else; jobs run without it.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/thread_pool.h"

namespace ps::server {

class AggregationJobs {
 public:
  // Borrows `pool`, which must outlive this.
  explicit AggregationJobs(core::ThreadPool* pool) : pool_(pool) {}
  // Waits until no job runs.
  ~AggregationJobs() { WaitIdle(); }
  AggregationJobs(const AggregationJobs&) = delete;
  AggregationJobs& operator=(const AggregationJobs&) = delete;

  // Runs `job` on the pool.
  void Submit(std::function<void()> job);
  // Queues `slice` at `rank` (lower first, then in arrival order) and runs one job that
  // calls `aggregate` with the slice first in the queue when it starts.
  void SubmitRanked(int64_t rank, uint32_t slice, std::function<void(uint32_t)> aggregate);
  // Runs fn(i) for i in [0, num_tasks) on the calling thread and the pool's idle threads,
  // claimed in increasing order (core::ThreadPool::ParallelFor); returns when all are
  // done. Called from a job, it stays that one job for WaitIdle.
  void ParallelFor(size_t num_tasks, const std::function<void(size_t)>& fn) {
    pool_->ParallelFor(num_tasks, fn);
  }

  // Waits until no job is queued or running, or `timeout` passed; whether none is.
  bool WaitIdle(core::Duration timeout);
  void WaitIdle();

 private:
  // Counts one job out, waking waiters when it was the last.
  void Done();

  core::ThreadPool* const pool_;
  absl::Mutex mu_;
  uint64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  // (rank, arrival, slice)
  std::set<std::tuple<int64_t, uint64_t, uint32_t>> queue_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
