// An in-process cluster (docs/evaluation.md): real ps-server shards (server::Server,
// gRPC on loopback ports) and n workers as threads, each running TrainWithServer with
// its own ps::Worker and model; the last f workers attack. Omniscient attacks see the
// honest gradients of each round through a SharedGradientBoard. Used by the
// experiment runner and by tests; the multi-process path (ps-demo, one process per
// worker and shard) gives the same parameters for the same seed and no attack.
//
// Thread safety: RunCluster() may not run concurrently with itself (it sets torch's
// thread count and starts servers on free ports); it blocks until the run ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/fashion_mnist/experiment.h"
#include "examples/fashion_mnist/training.h"
#include "server/options.h"

namespace ps::fashion_mnist {

struct ClusterConfig {
  // Every worker's settings; RunCluster fills in worker_id, shards, attack, byzantine
  // and rule per worker. trainer.workers is n.
  TrainerConfig trainer;
  uint32_t num_shards = 2;
  // The servers' rule and optimizer.
  std::string aggregator = "mean";
  server::AggregationScope aggregation_scope = server::AggregationScope::kModel;
  double lr = 0.05;
  double momentum = 0.9;
  std::string lr_schedule = "constant";  // the shards' --lr-schedule
  double weight_decay = 0;
  std::chrono::milliseconds round_deadline{5000};
  // ServerOptions::pull_codec: compressed pulls in this codec; empty: dense.
  std::string pull_codec;
  // f workers (the last ones) push `attack` (an attacks::MakeAttack spec).
  uint32_t byzantine = 0;
  std::string attack = "none";
  // The shards' --suspicion-window (rounds).
  uint32_t suspicion_window = 50;
  // Elastic membership: `workers` of the honest workers (the last ones before the
  // attackers) join when the job reaches step `join` and leave at step `leave` (0: stay
  // to the end). The shards start with --workers n - workers and --max-workers n, so
  // trainer.workers stays the id space. Not with f > 0 (the omniscient attacks expect
  // every honest gradient of every round).
  struct Elastic {
    uint32_t workers = 0;
    uint64_t join = 0;
    uint64_t leave = 0;
  } elastic;
};

struct ClusterResult {
  std::vector<std::pair<uint64_t, double>> evals;  // worker 0's (step, test accuracy)
  // Per evaluation: seconds since the workers started, less the time worker 0 spent
  // evaluating so far (the other workers wait for it at the next round).
  std::vector<double> eval_seconds;
  std::vector<std::pair<uint64_t, double>> losses;  // worker 0's (step, training loss)
  std::vector<PeriodChange> periods;                // local-update training, as they changed
  std::vector<PlanChange> plans;                    // --codec auto, as they came
  std::optional<double> final_accuracy;
  bool diverged = false;
  double wall_seconds = 0;
  uint64_t refused_pushes = 0;  // pushes the workers saw refused (Byzantine ones mostly)
  uint64_t push_bytes = 0;      // payload bytes of every worker's accepted pushes
  // Every shard's closed suspicion windows (the last Suspicion::kHistoryWindows of each).
  std::vector<SuspicionWindow> suspicion;
};

// Runs one cluster to the end. `events`, if given, also receives worker 0's events
// (progress display). Fails when a shard does not start or an honest worker fails.
absl::StatusOr<ClusterResult> RunCluster(const ClusterConfig& config, const TrainingData& data,
                                         TrainerEvents* events = nullptr);

}  // namespace ps::fashion_mnist
