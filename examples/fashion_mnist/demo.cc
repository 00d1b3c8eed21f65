#include "examples/fashion_mnist/demo.h"

#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "cli/json_line.h"
#include "harness/child_process.h"
#include "server/local_cluster.h"
#include "server/port_file.h"

namespace ps::fashion_mnist {
namespace {

using Clock = std::chrono::steady_clock;
using harness::ChildProcess;
using harness::LineReader;
using harness::SpawnOptions;
using cli::JsonObjectWriter;
using cli::ParseFlatJson;
constexpr std::chrono::milliseconds kTick{100};

struct Named {
  std::string name;
  std::string log;
  std::unique_ptr<ChildProcess> process;
};

std::string FormatArg(double value) { return absl::StrFormat("%g", value); }

enum class Startup { kReady, kShardExited, kFailed };

class Scenario {
 public:
  Scenario(const DemoConfig& config, const std::string& aggregator,
           const std::function<bool()>& interrupted,
           const std::function<void(const ScenarioProgress&)>& on_progress)
      : config_(config),
        interrupted_(interrupted),
        on_progress_(on_progress),
        start_(Clock::now()),
        deadline_(start_ + config.timeout),
        dir_((std::filesystem::path(config.out_dir) / aggregator).string()) {
    result_.aggregator = aggregator;
    result_.attack = config.byzantine == 0 ? "none" : config.attack;
    result_.workers = config.workers;
    result_.byzantine = config.byzantine;
    progress_.aggregator = aggregator;
    progress_.phase = "starting";
    progress_.steps_total = config.steps;
  }

  ScenarioResult Run() {
    Execute();
    result_.wall_seconds = Seconds();
    if (!saw_done_) result_.steps = progress_.steps_done;  // how far it got
    // Whatever is still running goes now (destructors kill and reap).
    trainers_.clear();
    shards_.clear();
    return result_;
  }

 private:
  double Seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  void Report() {
    progress_.elapsed_seconds = Seconds();
    if (on_progress_) on_progress_(progress_);
  }

  void Fail(std::string error) {
    result_.ok = false;
    result_.error = std::move(error);
  }

  // Checks the interrupt flag and the deadline; sets the error when it is time to stop.
  bool ShouldStop() {
    if (interrupted_ && interrupted_()) {
      Fail("interrupted");
      return true;
    }
    if (Clock::now() >= deadline_) {
      Fail(absl::StrCat("timed out after ", config_.timeout.count(), " s (", progress_.phase, ", ",
                        progress_.steps_done, " of ", config_.steps, " steps)"));
      return true;
    }
    return false;
  }

  // The shards' private run directory (secret and token files).
  std::string RunDir() const { return (std::filesystem::path(dir_) / "run").string(); }

  std::string LogPath(const std::string& name) const {
    return (std::filesystem::path(dir_) / (name + ".log")).string();
  }

  absl::Status Spawn(std::vector<Named>& into, const std::string& name, const std::string& binary,
                     std::vector<std::string> args, bool pipe_stdout) {
    SpawnOptions options;
    options.path = binary;
    options.args = std::move(args);
    options.stderr_file = LogPath(name);
    if (pipe_stdout) {
      options.stdout_pipe = true;
    } else {
      options.stdout_file = options.stderr_file;
    }
    auto child = ChildProcess::Spawn(options);
    if (!child.ok()) return child.status();
    into.push_back(Named{name, options.stderr_file, *std::move(child)});
    return absl::OkStatus();
  }

  Startup StartShards() {
    shards_.clear();
    auto ports = server::PickFreePorts(config_.num_shards);
    if (!ports.ok()) {
      Fail(absl::StrCat("picking ports: ", ports.status().message()));
      return Startup::kFailed;
    }
    std::vector<std::string> addresses;
    for (uint16_t port : *ports) addresses.push_back(absl::StrCat("127.0.0.1:", port));
    shard_addresses_ = absl::StrJoin(addresses, ",");
    std::vector<std::string> port_files;
    for (uint32_t i = 0; i < config_.num_shards; ++i) {
      const std::string name = absl::StrCat("shard-", i);
      port_files.push_back((std::filesystem::path(dir_) / (name + ".port")).string());
      std::error_code ignored;
      std::filesystem::remove(port_files.back(), ignored);
      // Flag and value pairs, one pair a line.
      // clang-format off
      std::vector<std::string> args = {
          "--host", "127.0.0.1",
          "--port", std::to_string((*ports)[i]),
          "--port-file", port_files.back(),
          "--shard-id", std::to_string(i),
          "--num-shards", std::to_string(config_.num_shards),
          "--peers", shard_addresses_,
          "--workers", std::to_string(config_.workers),
          "--byzantine", std::to_string(config_.byzantine),
          "--quorum", "0",
          "--round-deadline-ms", std::to_string(config_.round_deadline_ms),
          "--aggregator", result_.aggregator,
          "--lr", FormatArg(config_.lr),
          "--momentum", FormatArg(config_.momentum),
          "--weight-decay", "0",
          // Two shards and six trainers share a small machine: one aggregation thread.
          "--threads", "1",
          // Authenticated, as by default: the shards make a secret and a token file per
          // worker in the scenario's run directory; each trainer reads its own.
          "--run-dir", RunDir(),
          "--log-level", "info",
      };
      // clang-format on
      if (config_.udp_loss >= 0) args.insert(args.end(), {"--udp-port", "0"});
      if (!config_.pull_codec.empty()) args.insert(args.end(), {"--pull-codec", config_.pull_codec});
      if (absl::Status s = Spawn(shards_, name, config_.server_bin, std::move(args), false);
          !s.ok()) {
        Fail(absl::StrCat("starting ", name, ": ", s.message()));
        return Startup::kFailed;
      }
    }
    // Serving once each shard wrote the port it bound.
    const auto startup_deadline = Clock::now() + config_.startup_timeout;
    while (true) {
      bool ready = true;
      for (size_t i = 0; i < shards_.size(); ++i) {
        if (shards_[i].process->Poll()) {
          Fail(absl::StrCat(shards_[i].name, " exited during startup: ",
                            shards_[i].process->Describe(), "; see ", shards_[i].log));
          return Startup::kShardExited;
        }
        auto port = server::ReadPortFile(port_files[i]);
        if (!port) {
          ready = false;
        } else if (*port != (*ports)[i]) {
          Fail(absl::StrCat(shards_[i].name, " bound port ", *port, ", not ", (*ports)[i]));
          return Startup::kFailed;
        }
      }
      if (ready) return Startup::kReady;
      if (ShouldStop()) return Startup::kFailed;
      if (Clock::now() >= startup_deadline) {
        Fail(absl::StrCat("shards did not write their port files within ",
                          config_.startup_timeout.count(), " s; see ", dir_));
        return Startup::kFailed;
      }
      Report();
      std::this_thread::sleep_for(kTick);
    }
  }

  std::vector<std::string> TrainerArgs(uint32_t worker) const {
    // Flag and value pairs, one pair a line.
    // clang-format off
    std::vector<std::string> args = {
        "--shards", shard_addresses_,
        "--worker-id", std::to_string(worker),
        "--workers", std::to_string(config_.workers),
        "--data-dir", config_.data_dir,
        "--steps", std::to_string(config_.steps),
        "--batch-size", std::to_string(config_.batch_size),
        "--hidden", std::to_string(config_.hidden),
        "--seed", std::to_string(config_.seed),
        "--codec", config_.codec,
        "--eval-every", std::to_string(config_.eval_every),
        "--progress", "jsonl",
        "--log-every", "1",
        "--run-dir", RunDir(),
    };
    // clang-format on
    if (config_.error_feedback) args.emplace_back("--error-feedback");
    if (config_.udp_loss >= 0) {
      args.insert(args.end(), {"--udp", "--udp-loss", FormatArg(config_.udp_loss),
                               "--udp-end-copies", absl::StrCat(config_.udp_end_copies)});
    }
    if (worker == 0) {
      args.insert(args.end(), {"--save-parameters", (std::filesystem::path(dir_) / "parameters.f32").string()});
    }
    if (config_.worker_momentum > 0) {
      args.insert(args.end(), {"--worker-momentum", FormatArg(config_.worker_momentum)});
    }
    if (config_.byzantine > 0) {
      args.insert(args.end(), {"--byzantine", std::to_string(config_.byzantine), "--rule",
                               result_.aggregator});
    }
    if (worker >= config_.workers - config_.byzantine) {
      const std::string attack = config_.attack == "signflip"
                                     ? absl::StrCat("signflip(scale=", FormatArg(config_.byzantine_scale), ")")
                                     : config_.attack;
      args.insert(args.end(), {"--attack", attack, "--collude-dir",
                               (std::filesystem::path(dir_) / "collude").string()});
    }
    return args;
  }

  void HandleLine(const std::string& line) {
    if (jsonl_) *jsonl_ << line << '\n';
    auto event = ParseFlatJson(line);
    if (!event.ok()) return;  // not ours (a stray print); kept in the jsonl copy
    const std::string kind = event->String("event").value_or("");
    if (kind == "step") {
      if (auto step = event->Number("step")) progress_.steps_done = static_cast<uint64_t>(*step);
      if (auto loss = event->Number("loss")) progress_.loss = *loss;
    } else if (kind == "eval") {
      if (auto acc = event->Number("test_accuracy")) progress_.test_accuracy = *acc;
    } else if (kind == "done") {
      saw_done_ = true;
      if (auto steps = event->Number("steps")) {
        result_.steps = static_cast<uint64_t>(*steps);
        progress_.steps_done = result_.steps;
      }
      if (auto acc = event->Number("final_test_accuracy")) {
        result_.final_test_accuracy = *acc;
        progress_.test_accuracy = *acc;
      }
      result_.diverged = event->Bool("diverged").value_or(false);
    }
  }

  // Runs until the trainers end; false (with the error set) when the scenario failed.
  bool WatchTrainers() {
    progress_.phase = "training";
    LineReader reader;
    int fd = trainers_.front().process->stdout_fd();
    while (true) {
      if (ShouldStop()) return false;
      if (fd >= 0) {
        pollfd pfd{fd, POLLIN, 0};
        poll(&pfd, 1, static_cast<int>(kTick.count()));
        std::vector<std::string> lines;
        if (!reader.ReadAvailable(fd, lines)) fd = -1;
        for (const std::string& line : lines) HandleLine(line);
      } else {
        std::this_thread::sleep_for(kTick);
      }
      bool all_done = true;
      for (Named& trainer : trainers_) {
        if (!trainer.process->Poll()) {
          all_done = false;
        } else if (trainer.process->exit_code() != 0) {
          Fail(absl::StrCat(trainer.name, " failed: ", trainer.process->Describe(), "; see ",
                            trainer.log));
          return false;
        }
      }
      for (Named& shard : shards_) {
        if (shard.process->Poll()) {
          Fail(absl::StrCat(shard.name, " exited while training: ", shard.process->Describe(),
                            "; see ", shard.log));
          return false;
        }
      }
      Report();
      if (all_done && fd < 0) return true;
      if (all_done) {
        // Worker 0 has exited: take what is left in the pipe, then finish.
        std::vector<std::string> lines;
        reader.ReadAvailable(fd, lines);
        for (const std::string& line : lines) HandleLine(line);
        return true;
      }
    }
  }

  bool StopShards() {
    progress_.phase = "stopping";
    for (Named& shard : shards_) shard.process->Signal(SIGTERM);
    const auto stop_deadline = Clock::now() + config_.shutdown_grace;
    while (true) {
      bool all_exited = true;
      for (Named& shard : shards_) all_exited = shard.process->Poll() && all_exited;
      if (all_exited) break;
      if (ShouldStop()) return false;
      if (Clock::now() >= stop_deadline) {
        std::vector<std::string> stuck;
        for (Named& shard : shards_) {
          if (!shard.process->exited()) stuck.push_back(shard.name);
        }
        Fail(absl::StrCat(absl::StrJoin(stuck, ", "), " still running ",
                          config_.shutdown_grace.count(), " s after SIGTERM; killed"));
        return false;
      }
      Report();
      std::this_thread::sleep_for(kTick);
    }
    for (Named& shard : shards_) {
      if (shard.process->exit_code() != 0) {
        Fail(absl::StrCat(shard.name, " did not exit cleanly on SIGTERM: ",
                          shard.process->Describe(), "; see ", shard.log));
        return false;
      }
    }
    return true;
  }

  void Execute() {
    std::error_code error;
    // The Byzantine trainers' side channel (--collude-dir), emptied per scenario.
    std::filesystem::remove_all(std::filesystem::path(dir_) / "collude", error);
    std::filesystem::create_directories(std::filesystem::path(dir_) / "collude", error);
    if (error) {
      Fail(absl::StrCat("cannot create ", dir_, ": ", error.message()));
      return;
    }
    // A port picked free may be taken before the shard binds it: one retry.
    Startup startup = StartShards();
    if (startup == Startup::kShardExited) {
      const std::string first_error = result_.error;
      startup = StartShards();
      if (startup != Startup::kReady) {
        result_.error =
            absl::StrCat(result_.error, " (after a retry; first attempt: ", first_error, ")");
      }
    }
    if (startup != Startup::kReady) return;

    jsonl_ = std::make_unique<std::ofstream>(std::filesystem::path(dir_) / "worker-0.jsonl");
    for (uint32_t w = 0; w < config_.workers; ++w) {
      const std::string name = absl::StrCat("worker-", w);
      if (absl::Status s = Spawn(trainers_, name, config_.trainer_bin, TrainerArgs(w), w == 0);
          !s.ok()) {
        Fail(absl::StrCat("starting ", name, ": ", s.message()));
        return;
      }
    }
    if (!WatchTrainers()) return;
    if (!StopShards()) return;
    if (!saw_done_ || !result_.final_test_accuracy) {
      Fail(absl::StrCat("worker-0 ended without a final accuracy; see ", dir_, "/worker-0.jsonl"));
      return;
    }
    result_.ok = true;
    result_.error.clear();
  }

  const DemoConfig& config_;
  const std::function<bool()>& interrupted_;
  const std::function<void(const ScenarioProgress&)>& on_progress_;
  const Clock::time_point start_;
  const Clock::time_point deadline_;
  const std::string dir_;
  ScenarioResult result_;
  ScenarioProgress progress_;
  std::string shard_addresses_;
  std::vector<Named> shards_;
  std::vector<Named> trainers_;
  std::unique_ptr<std::ofstream> jsonl_;
  bool saw_done_ = false;
};

std::string AccuracyText(const ScenarioResult& r) {
  return r.final_test_accuracy ? absl::StrFormat("%.4f", *r.final_test_accuracy) : "-";
}

}  // namespace

ScenarioResult RunScenario(const DemoConfig& config, const std::string& aggregator,
                           const std::function<bool()>& interrupted,
                           const std::function<void(const ScenarioProgress&)>& on_progress) {
  return Scenario(config, aggregator, interrupted, on_progress).Run();
}

std::string SummaryJson(const std::vector<ScenarioResult>& results) {
  std::string out = "[";
  for (size_t i = 0; i < results.size(); ++i) {
    const ScenarioResult& r = results[i];
    JsonObjectWriter w;
    w.Add("aggregator", r.aggregator)
        .Add("attack", r.attack)
        .Add("byzantine", r.byzantine)
        .Add("workers", r.workers)
        .Add("steps", r.steps);
    if (r.final_test_accuracy) {
      w.Add("final_test_accuracy", *r.final_test_accuracy);
    } else {
      w.AddNull("final_test_accuracy");
    }
    w.Add("wall_seconds", std::round(r.wall_seconds * 100) / 100)
        .Add("diverged", r.diverged)
        .Add("ok", r.ok);
    if (!r.ok) w.Add("error", r.error);
    absl::StrAppend(&out, i == 0 ? "\n  " : ",\n  ", w.str());
  }
  absl::StrAppend(&out, results.empty() ? "]\n" : "\n]\n");
  return out;
}

std::string SummaryTable(const std::vector<ScenarioResult>& results) {
  std::vector<std::vector<std::string>> rows = {
      {"aggregator", "attack", "byzantine", "steps", "final test acc", "wall s", "status"}};
  for (const ScenarioResult& r : results) {
    rows.push_back({r.aggregator, r.attack, absl::StrCat(r.byzantine, " of ", r.workers),
                    absl::StrCat(r.steps), AccuracyText(r), absl::StrFormat("%.1f", r.wall_seconds),
                    !r.ok        ? absl::StrCat("FAILED: ", r.error)
                    : r.diverged ? "ok (diverged, stopped early)"
                                 : "ok"});
  }
  std::vector<size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows) {
    // The status column is last and left unpadded.
    for (size_t c = 0; c + 1 < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line;
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const bool numeric = c >= 2 && c <= 5;
      if (c + 1 == rows[r].size()) {
        line += rows[r][c];
      } else if (numeric) {
        line += std::string(widths[c] - rows[r][c].size(), ' ') + rows[r][c] + "  ";
      } else {
        line += rows[r][c] + std::string(widths[c] - rows[r][c].size(), ' ') + "  ";
      }
    }
    out += line + "\n";
    if (r == 0) {
      size_t total = 0;
      for (size_t c = 0; c + 1 < widths.size(); ++c) total += widths[c] + 2;
      out += std::string(total + rows[0].back().size(), '-') + "\n";
    }
  }
  return out;
}

}  // namespace ps::fashion_mnist
