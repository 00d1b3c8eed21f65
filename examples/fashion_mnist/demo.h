// The demo scenario: two ps-server shards and n ps-fashion-mnist trainers on loopback,
// the last f of them Byzantine, run to completion under one aggregation rule.
//
// RunScenario owns every process it starts (ChildProcess kills and reaps on all return
// paths), writes each one's output to <out>/<aggregator>/<name>.log, reads worker 0's
// jsonl progress, and stops the shards with SIGTERM once the trainers are done, checking
// they exit 0. It gives up on a timeout or when `interrupted` says so, killing all.
//
// Single-threaded: call from one thread; the callbacks run on it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ps::fashion_mnist {

struct DemoConfig {
  // Binaries: the shard and the trainer.
  std::string server_bin;
  std::string trainer_bin;
  // Output root: <out_dir>/<aggregator>/ gets the logs.
  std::string out_dir = "out/demo";
  // Passed to the trainers.
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  uint32_t num_shards = 2;
  // n workers, the last f of them attack with `attack` (a worker_lib/attacks spec;
  // plain "signflip" takes `byzantine_scale`). They share gradients through
  // <out>/<aggregator>/collude (ps-fashion-mnist --collude-dir).
  uint32_t workers = 6;
  uint32_t byzantine = 1;
  std::string attack = "signflip";
  double byzantine_scale = 10;
  // Training.
  uint64_t steps = 2000;
  uint32_t batch_size = 32;
  uint32_t hidden = 128;
  double lr = 0.05;
  double momentum = 0.9;
  uint64_t seed = 1;
  uint64_t eval_every = 200;
  std::string codec = "fp32";
  // The shards publish each version's change in this codec (ps-server --pull-codec,
  // docs/data_path.md); empty: dense fp32 pulls.
  std::string pull_codec;
  // Trainers push over the shards' UDP path with this injected loss (< 0: gRPC).
  double udp_loss = -1;
  uint32_t udp_end_copies = 2;  // with udp_loss >= 0
  bool error_feedback = false;
  double worker_momentum = 0;
  // Server round deadline (quorum n - f closes a round this long after its first push).
  uint32_t round_deadline_ms = 5000;
  // Whole-scenario limit; everything is killed past it.
  std::chrono::seconds timeout{600};
  // How long the shards get to exit after SIGTERM.
  std::chrono::seconds shutdown_grace{30};
  // How long to wait for the shards to write their port files.
  std::chrono::seconds startup_timeout{60};
};

struct ScenarioResult {
  std::string aggregator;
  std::string attack;  // "none" when byzantine == 0
  uint32_t workers = 0;
  uint32_t byzantine = 0;
  uint64_t steps = 0;  // rounds worker 0 completed
  std::optional<double> final_test_accuracy;
  double wall_seconds = 0;
  // Training blew up (worker 0 reported "diverged") and stopped early; still a result.
  bool diverged = false;
  bool ok = false;
  std::string error;  // why it failed, when !ok
};

// What the progress callback sees, several times a second.
struct ScenarioProgress {
  std::string aggregator;
  std::string phase;  // "starting", "training", "stopping"
  uint64_t steps_done = 0;
  uint64_t steps_total = 0;
  std::optional<double> loss;
  std::optional<double> test_accuracy;
  double elapsed_seconds = 0;
};

ScenarioResult RunScenario(const DemoConfig& config, const std::string& aggregator,
                           const std::function<bool()>& interrupted,
                           const std::function<void(const ScenarioProgress&)>& on_progress);

// `[{"aggregator":...,"attack":...,"byzantine":...,"steps":...,
//    "final_test_accuracy":...,"wall_seconds":...}, ...]` plus "workers", "diverged",
// "ok" and, for a failed scenario, "error".
std::string SummaryJson(const std::vector<ScenarioResult>& results);

// A fixed-width text table of the same columns.
std::string SummaryTable(const std::vector<ScenarioResult>& results);

}  // namespace ps::fashion_mnist
