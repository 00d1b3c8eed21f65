// ps-demo: Byzantine-robust training on one machine, robust rule against plain mean.
//
// For each rule it starts two ps-server shards and six ps-fashion-mnist trainers on
// 127.0.0.1 (the last one flips and scales its gradient), shows progress, stops the
// shards with SIGTERM, and finally prints a table and writes <out>/summary.json.
// See docs/examples.md.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codecs/codec.h"
#include "examples/fashion_mnist/demo.h"
#include "harness/child_process.h"

namespace {

volatile sig_atomic_t g_interrupted = 0;

void OnSignal(int) { g_interrupted = 1; }

void InstallSignalHandlers() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a signal wakes the wait loop at once
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

// Draws one status line: in place on a terminal, otherwise every few seconds.
class ProgressBar {
 public:
  ProgressBar() : tty_(isatty(STDOUT_FILENO) == 1) {}

  void Update(const ps::fashion_mnist::ScenarioProgress& p) {
    if (!tty_) {
      if (p.elapsed_seconds < next_plain_ && p.phase == last_phase_) return;
      next_plain_ = p.elapsed_seconds + 10;
      last_phase_ = p.phase;
    }
    constexpr int kWidth = 30;
    const double fraction =
        p.steps_total == 0
            ? 0
            : std::min(1.0, static_cast<double>(p.steps_done) / static_cast<double>(p.steps_total));
    const int filled = static_cast<int>(fraction * kWidth);
    std::string line = absl::StrFormat(
        "%-13s [%s%s] %5u/%u steps  acc %s  loss %s  %5.1f s  %s", p.aggregator,
        std::string(filled, '#'), std::string(kWidth - filled, '.'), p.steps_done, p.steps_total,
        p.test_accuracy ? absl::StrFormat("%.3f", *p.test_accuracy) : "  -  ",
        p.loss ? absl::StrFormat("%.3g", *p.loss) : "-", p.elapsed_seconds, p.phase);
    if (tty_) {
      std::printf("\r\033[K%s", line.c_str());
    } else {
      std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
    drawn_ = true;
  }

  // Ends the in-place line.
  void Finish() {
    if (tty_ && drawn_) std::printf("\n");
    drawn_ = false;
    next_plain_ = 0;
    std::fflush(stdout);
  }

 private:
  bool tty_;
  bool drawn_ = false;
  double next_plain_ = 0;
  std::string last_phase_;
};

}  // namespace

int main(int argc, char** argv) {
  ps::fashion_mnist::DemoConfig config;
  std::vector<std::string> rules = {"trimmed_mean", "mean"};
  std::string bin_dir;
  double timeout_s = 600;
  CLI::App app{"ps-demo: Byzantine-robust Fashion-MNIST training on loopback, robust rule vs mean"};
  app.option_defaults()->always_capture_default();
  app.add_option("--out", config.out_dir, "Output directory (logs, summary.json)");
  app.add_option("--rules", rules, "Aggregation rules to run, in order (comma-separated)")
      ->delimiter(',');
  app.add_option("--steps", config.steps, "Training steps per scenario");
  app.add_option("--batch-size", config.batch_size, "Batch size per worker");
  app.add_option("--hidden", config.hidden, "MLP hidden width");
  app.add_option("--lr", config.lr, "Server learning rate");
  app.add_option("--momentum", config.momentum, "Server momentum");
  app.add_option("--eval-every", config.eval_every, "Worker 0 evaluates every this many steps");
  app.add_option("--workers", config.workers, "Workers n");
  app.add_option("--byzantine", config.byzantine, "Byzantine workers f (the last f workers)");
  app.add_option("--attack", config.attack,
                 "Attack of the Byzantine workers (docs/evaluation.md); signflip uses --byzantine-scale; "
                 "omniscient attacks collude through a directory under --out");
  app.add_option("--byzantine-scale", config.byzantine_scale,
                 "Sign-flip attack: Byzantine workers push -scale * gradient");
  app.add_option("--seed", config.seed, "Seed shared by all trainers");
  app.add_option("--codec", config.codec, "Push codec of the trainers (docs/codecs.md)");
  app.add_option("--pull-codec", config.pull_codec,
                 "The shards send each parameter change in this codec, keeping what it loses "
                 "for the next one (docs/data_path.md; default: dense fp32 pulls)");
  app.add_option("--udp-loss", config.udp_loss,
                 "Trainers push over the shards' UDP path with this injected datagram loss in "
                 "[0, 1) (default: the shards' data plane, TCP)");
  app.add_option("--udp-end-copies", config.udp_end_copies,
                 "With --udp-loss: copies of the end datagram after each push's chunks (0: "
                 "none; a round that lost a chunk then waits for its deadline)")
      ->check(CLI::Range(0, 16));
  app.add_flag("--error-feedback", config.error_feedback,
               "Trainers add what the codec lost to their next push");
  app.add_option("--worker-momentum", config.worker_momentum,
                 "Trainers push a moving average of their gradients (beta; 0: off)")
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--round-deadline-ms", config.round_deadline_ms, "Server round deadline");
  app.add_option("--data-dir", config.data_dir, "Fashion-MNIST directory");
  app.add_option("--timeout-s", timeout_s, "Per-scenario time limit, seconds");
  app.add_option("--bin-dir", bin_dir,
                 "Where ps-server and ps-fashion-mnist are (default: next to ps-demo)");
  CLI11_PARSE(app, argc, argv);

  auto self_dir = ps::harness::SelfDirectory();
  if (!self_dir.ok()) {
    std::fprintf(stderr, "ps-demo: %s\n", self_dir.status().ToString().c_str());
    return 2;
  }
  if (bin_dir.empty()) bin_dir = *self_dir;
  config.server_bin = (std::filesystem::path(bin_dir) / "ps-server").string();
  config.trainer_bin = (std::filesystem::path(bin_dir) / "ps-fashion-mnist").string();
  for (const std::string& bin : {config.server_bin, config.trainer_bin}) {
    if (access(bin.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "ps-demo: %s is missing or not executable (build it first)\n",
                   bin.c_str());
      return 2;
    }
  }
  // Before any process starts: a bad spec would otherwise surface as a shard or a
  // trainer exiting with its reason in a log file.
  for (const auto& [flag, spec] : {std::pair<const char*, const std::string*>{"--codec", &config.codec},
                                   {"--pull-codec", &config.pull_codec}}) {
    if (spec->empty()) continue;
    if (auto codec = ps::codecs::MakeCodec(*spec); !codec.ok()) {
      std::fprintf(stderr, "ps-demo: %s '%s': %s\n", flag, spec->c_str(),
                   std::string(codec.status().message()).c_str());
      return 2;
    }
  }
  if (config.byzantine * 2 >= config.workers) {
    std::fprintf(stderr, "ps-demo: --byzantine must be below half of --workers\n");
    return 2;
  }
  config.timeout = std::chrono::seconds(static_cast<int64_t>(timeout_s));

  InstallSignalHandlers();
  std::printf(
      "ps-demo: %u shards, %u workers (last %u: %s x%g), %llu steps, batch %u, "
      "lr %g, momentum %g; logs in %s/<rule>/\n",
      config.num_shards, config.workers, config.byzantine, config.attack.c_str(),
      config.byzantine_scale, static_cast<unsigned long long>(config.steps), config.batch_size,
      config.lr, config.momentum, config.out_dir.c_str());
  ProgressBar bar;
  std::vector<ps::fashion_mnist::ScenarioResult> results;
  for (const std::string& rule : rules) {
    if (g_interrupted) break;
    results.push_back(ps::fashion_mnist::RunScenario(
        config, rule, [] { return g_interrupted != 0; },
        [&bar](const ps::fashion_mnist::ScenarioProgress& p) { bar.Update(p); }));
    bar.Finish();
    const auto& r = results.back();
    if (!r.ok) std::printf("%s: FAILED: %s\n", rule.c_str(), r.error.c_str());
  }

  std::printf("\n%s", ps::fashion_mnist::SummaryTable(results).c_str());
  const std::string summary_path =
      (std::filesystem::path(config.out_dir) / "summary.json").string();
  std::error_code ignored;
  std::filesystem::create_directories(config.out_dir, ignored);
  std::ofstream summary(summary_path);
  summary << ps::fashion_mnist::SummaryJson(results);
  summary.close();
  if (!summary) {
    std::fprintf(stderr, "ps-demo: cannot write %s\n", summary_path.c_str());
    return 1;
  }
  std::printf("wrote %s\n", summary_path.c_str());

  if (g_interrupted) return 130;
  for (const auto& r : results) {
    if (!r.ok) return 1;
  }
  return 0;
}
