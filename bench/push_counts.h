// What worker 3's cover pushed in `ps-bench hostile` (docs/bench.md, "Hostile clients"),
// over gRPC (Cover, hostile_cover.h) or over the TCP data port (DataPortCover,
// hostile_data_phases.h): the pushes the shard took, those it refused, and why it
// refused the last one. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps::bench {

class PushCounts {
 public:
  void Pushed() { pushed_.fetch_add(1); }
  void Refused(std::string why) {
    refused_.fetch_add(1);
    absl::MutexLock lock(&mu_);
    last_refusal_ = std::move(why);
  }

  uint64_t pushed() const { return pushed_.load(); }
  uint64_t refused() const { return refused_.load(); }
  std::string last_refusal() const {
    absl::MutexLock lock(&mu_);
    return last_refusal_;
  }

 private:
  std::atomic<uint64_t> pushed_{0}, refused_{0};
  mutable absl::Mutex mu_;
  std::string last_refusal_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::bench
