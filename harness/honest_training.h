// Honest training against a running shard, for the hostile tests and `ps-bench hostile`:
// ps::Worker clients in this process that train a model round after round while the
// caller attacks the shard, and count the rounds they complete.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
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

namespace ps::harness {

struct HonestTrainingOptions {
  // The shard (one shard holds the whole layout).
  std::string address;
  // Workers 0..workers-1 train, worker w with tokens[w] (at least `workers` entries).
  std::vector<std::string> tokens;
  uint32_t workers = 3;
  // Every parameter's initial value, registered with the layout.
  float init = 0.01f;
  // Worker w's gradient, the same value everywhere, every round.
  std::function<float(uint32_t)> gradient = [](uint32_t w) { return 1e-4f * float(w + 1); };
  std::chrono::milliseconds pull_timeout{1000};
  std::chrono::milliseconds rpc_timeout{3000};
  std::chrono::milliseconds connect_timeout{15000};
  int max_attempts = 3;
};

// Each worker in a loop: pull version t (again after a failed pull), push round t, wait
// for the answers, t + 1. Thread-safe readers; Stop() (or the destructor) ends the loops.
class HonestTraining {
 public:
  // The error of the first worker that cannot start, naming it.
  // Each worker registers `layout` (one shard).
  static absl::StatusOr<std::unique_ptr<HonestTraining>> Start(const core::ModelLayout& layout,
                                                               HonestTrainingOptions options);

  ~HonestTraining() { Stop(); }
  HonestTraining(const HonestTraining&) = delete;
  HonestTraining& operator=(const HonestTraining&) = delete;

  void Stop();

  // Rounds completed with every push accepted, by all workers together (each round of
  // the model counts once per worker).
  uint64_t rounds() const { return rounds_.load(); }
  // Rounds worker 0 pulled and pushed for, its pushes answered whether accepted or not:
  // how far the model moved as one worker sees it.
  uint64_t lead_rounds() const { return lead_rounds_.load(); }
  // Waits (bounded) until `more` lead rounds past now completed; false if they did not.
  bool AdvancesBy(uint64_t more, std::chrono::milliseconds within = std::chrono::milliseconds(20000)) const;
  // Lead rounds per second over the next `period`.
  double RateOver(std::chrono::milliseconds period) const;

  // Failed pulls and refused or failed pushes.
  uint64_t errors() const { return errors_.load(); }
  std::string last_error() const;
  // The newest version a worker has pulled: round open_version() is open (or was just
  // closed).
  uint64_t open_version() const;
  // Waits until some worker pulled at least `version`; false after `timeout`.
  bool WaitOpen(uint64_t version, std::chrono::milliseconds timeout) const;

 private:
  HonestTraining(core::ModelLayout layout, HonestTrainingOptions options)
      : layout_(std::move(layout)), options_(std::move(options)) {}

  void Fail(const absl::Status& st);
  void Loop(size_t w);

  const core::ModelLayout layout_;
  const HonestTrainingOptions options_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> rounds_{0}, lead_rounds_{0}, errors_{0};
  mutable absl::Mutex error_mu_;
  std::string last_error_ ABSL_GUARDED_BY(error_mu_);
  mutable std::mutex open_mu_;
  mutable std::condition_variable open_cv_;
  uint64_t open_ = 0;  // guarded by open_mu_
};

}  // namespace ps::harness
