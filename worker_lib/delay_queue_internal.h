// DelayQueue: runs callbacks on one background thread after a delay (retry backoff
// without blocking gRPC's callback threads). Owns its thread. Stop() (also run by the
// destructor) runs every queued callback at once and joins; After() following Stop()
// runs the callback inline. Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace ps::internal {

class DelayQueue {
 public:
  DelayQueue();
  ~DelayQueue();
  DelayQueue(const DelayQueue&) = delete;
  DelayQueue& operator=(const DelayQueue&) = delete;

  void After(std::chrono::milliseconds delay, std::function<void()> fn);
  void Stop();

 private:
  void Loop();

  absl::Mutex mu_;
  std::multimap<std::chrono::steady_clock::time_point, std::function<void()>> queue_
      ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // an item was added: recompute the wait
  std::thread thread_;
};

}  // namespace ps::internal
