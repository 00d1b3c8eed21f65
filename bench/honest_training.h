// Honest training against a running shard, for `ps-bench hostile` (docs/bench.md,
// "Hostile clients"): ps::Worker clients in this process that train a model round after
// round while the benchmark attacks the shard, and count the rounds they complete.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/layout.h"
#include "worker_lib/worker.h"

namespace ps::bench {

// Workers 0..honest-1 in a loop: pull version t, push round t (a constant gradient per
// worker), wait for the answers, t + 1. Thread-safe readers; Stop() (or the destructor)
// ends the loops.
class Training {
 public:
  // Starts `honest` workers on the shard at `address`, worker w with tokens[w] (tokens has
  // at least `honest` entries), each registering `layout` with every value 0.01. The
  // error of the first worker that cannot start, naming it.
  static absl::StatusOr<std::unique_ptr<Training>> Start(const std::string& address,
                                                         const std::vector<std::string>& tokens,
                                                         const core::ModelLayout& layout,
                                                         uint32_t honest);

  ~Training() { Stop(); }
  Training(const Training&) = delete;
  Training& operator=(const Training&) = delete;

  void Stop();

  // Rounds completed (pull, push accepted) by the honest workers together (each round
  // of the model counts once per honest worker).
  uint64_t rounds() const { return rounds_.load(); }
  // Failed pulls and refused or failed pushes.
  uint64_t errors() const { return errors_.load(); }
  std::string last_error() const;
  // The newest version an honest worker has pulled: round open_version() is open (or
  // was just closed).
  uint64_t open_version() const;
  // Waits until some honest worker pulled at least `version`; false after `timeout`.
  bool WaitOpen(uint64_t version, std::chrono::milliseconds timeout) const;

 private:
  explicit Training(core::ModelLayout layout) : layout_(std::move(layout)) {}

  void Fail(const absl::Status& st);
  void Loop(size_t w);

  const core::ModelLayout layout_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> rounds_{0}, errors_{0};
  mutable absl::Mutex error_mu_;
  std::string last_error_ ABSL_GUARDED_BY(error_mu_);
  mutable std::mutex open_mu_;
  mutable std::condition_variable open_cv_;
  uint64_t open_ = 0;  // guarded by open_mu_
};

}  // namespace ps::bench
