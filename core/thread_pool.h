// ThreadPool: a fixed set of threads for background jobs (Submit) and data-parallel
// loops (ParallelFor). The pool owns its threads; the destructor finishes queued jobs
// and joins. All methods are thread-safe. ParallelFor may be called from inside a
// pool job: the caller runs tasks itself, so it never waits on a busy pool.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps::core {

// Names the calling thread `name` (at most 15 bytes are kept), as `top -H`, `perf` and
// debuggers show it; "ps-agg-2" rather than the process's name on every thread.
void NameThisThread(std::string_view name);

class ThreadPool {
 public:
  // num_threads == 0 means one per CPU the process may use (core/resource_limits.h). Thread i is named
  // "<name>-<i>".
  explicit ThreadPool(size_t num_threads, std::string name = "ps-pool");
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t num_threads() const { return threads_.size(); }

  // Runs `job` on a pool thread, some time later.
  void Submit(std::function<void()> job);

  // Runs fn(i) for i in [0, num_tasks) on the pool and the calling thread; returns
  // when all are done. Which thread runs which task is unspecified, so callers that
  // need results independent of the thread count give each task fixed work.
  void ParallelFor(size_t num_tasks, const std::function<void(size_t)>& fn);

 private:
  void WorkerLoop();
  static bool HasWork(ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // What an idle pool thread waits for: a member, written once before the threads start.
  // Abseil evaluates a waiter's Condition on the thread that unlocks the mutex, inside
  // the library, where ThreadSanitizer sees no synchronization (tests/sanitizers/
  // tsan.supp); a Condition on the waiter's stack shared its slot with the job the waiter
  // took next, and when the unlocking thread's history was too long to restore (a large
  // slice's aggregation after it) the suppression could not match and TSan reported a
  // race between the two pool threads.
  const absl::Condition has_work_{&HasWork, this};
  std::vector<std::thread> threads_;
};

}  // namespace ps::core
