#include "core/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/resource_limits.h"

namespace ps::core {

void NameThisThread(std::string_view name) {
  // The kernel keeps 15 bytes and the terminating NUL; a longer name is refused whole.
  const std::string kept(name.substr(0, 15));
  ::pthread_setname_np(::pthread_self(), kept.c_str());
}

ThreadPool::ThreadPool(size_t num_threads, std::string name) {
  // 0: one per CPU this process may use (its cgroup's quota, not the node's cores).
  if (num_threads == 0) num_threads = ProcessResourceLimits().cpus;
  threads_.reserve(num_threads);
  for (size_t i = 0; i < num_threads; ++i) {
    threads_.emplace_back([this, thread_name = absl::StrCat(name, "-", i)] {
      NameThisThread(thread_name);
      WorkerLoop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::Submit(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(job));
}

bool ThreadPool::HasWork(ThreadPool* p) { return p->stopping_ || !p->queue_.empty(); }

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(has_work_);
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

void ThreadPool::ParallelFor(size_t num_tasks, const std::function<void(size_t)>& fn) {
  if (num_tasks == 0) return;
  if (num_tasks == 1 || threads_.empty()) {
    for (size_t i = 0; i < num_tasks; ++i) fn(i);
    return;
  }
  struct Batch {
    std::atomic<size_t> next{0};
    absl::Mutex mu;
    size_t done ABSL_GUARDED_BY(mu) = 0;
  };
  auto batch = std::make_shared<Batch>();
  // `fn` outlives every use: a helper only calls it after claiming an index, and
  // the caller waits until every index has been completed.
  auto run = [batch, &fn, num_tasks] {
    size_t finished = 0;
    for (size_t i; (i = batch->next.fetch_add(1)) < num_tasks;) {
      fn(i);
      ++finished;
    }
    if (finished > 0) {
      absl::MutexLock lock(&batch->mu);
      batch->done += finished;
    }
  };
  const size_t helpers = std::min(threads_.size(), num_tasks - 1);
  {
    absl::MutexLock lock(&mu_);
    for (size_t h = 0; h < helpers; ++h) queue_.push_back(run);
  }
  run();
  absl::MutexLock lock(&batch->mu);
  std::pair<Batch*, size_t> arg(batch.get(), num_tasks);
  batch->mu.Await(absl::Condition(
      +[](std::pair<Batch*, size_t>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return a->first->done == a->second;
      },
      &arg));
}

}  // namespace ps::core
