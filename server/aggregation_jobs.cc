#include "server/aggregation_jobs.h"

#include <utility>

#include "absl/time/time.h"

namespace ps::server {

void AggregationJobs::Submit(std::function<void()> job) {
  {
    absl::MutexLock lock(&mu_);
    ++running_;
  }
  pool_->Submit([this, job = std::move(job)] {
    job();
    Done();
  });
}

void AggregationJobs::SubmitRanked(int64_t rank, uint32_t slice,
                                   std::function<void(uint32_t)> aggregate) {
  {
    absl::MutexLock lock(&mu_);
    ++running_;
    queue_.emplace(rank, arrivals_++, slice);
  }
  pool_->Submit([this, aggregate = std::move(aggregate)] {
    uint32_t next;
    {
      // One job per queued slice: the queue is never empty here.
      absl::MutexLock lock(&mu_);
      next = std::get<2>(*queue_.begin());
      queue_.erase(queue_.begin());
    }
    aggregate(next);
    Done();
  });
}

void AggregationJobs::Done() {
  absl::MutexLock lock(&mu_);
  --running_;
}

bool AggregationJobs::WaitIdle(core::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](uint64_t* running) { return *running == 0; }, &running_),
                              absl::FromChrono(timeout));
}

void AggregationJobs::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](uint64_t* running) { return *running == 0; }, &running_));
}

}  // namespace ps::server
