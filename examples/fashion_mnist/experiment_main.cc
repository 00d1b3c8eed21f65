// ps-experiment: runs a grid of robust-training experiments (rules x attacks x f x
// split x codec x worker momentum x seed) on the in-process cluster and writes
// results.csv, summary.csv, table.md and, with python3-matplotlib, PNG plots
// (docs/evaluation.md). Progress is shown while it runs.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/process_tuning.h"
#include "core/status.h"
#include "examples/fashion_mnist/cluster.h"
#include "examples/fashion_mnist/experiment.h"
#include "examples/fashion_mnist/training.h"
#include "server/optimizer.h"
#include "server/options.h"

namespace ps::fashion_mnist {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string config;
  std::string out = "out/experiment";
  bool plots = true;
  std::string plot_script;
  std::vector<std::string> overrides;  // --set
  std::vector<std::string> merge;      // --merge: report these runs' rows, run nothing
  bool resume = false;                 // --resume: keep the cells --out already holds
  bool select = false;                 // --select: --merge takes only this grid's rows
};

// One status line per cell, rewritten in place on a terminal.
class CellProgress final : public TrainerEvents {
 public:
  CellProgress(size_t index, size_t total, std::string label, uint64_t steps,
               Clock::time_point grid_start)
      : index_(index),
        total_(total),
        label_(std::move(label)),
        steps_(steps),
        grid_start_(grid_start),
        tty_(isatty(fileno(stdout)) != 0) {}
  void Step(uint64_t step, double loss) override {
    step_ = step;
    Show(false);
  }
  void Eval(uint64_t step, double accuracy) override {
    accuracy_ = accuracy;
    step_ = step;
    Show(false);
  }
  void Finish(const CellResult& r) {
    accuracy_ = r.final_accuracy.value_or(-1);
    step_ = steps_;
    Show(true);
    if (!r.error.empty()) std::printf("    failed: %s\n", r.error.c_str());
    if (r.diverged) std::printf("    diverged\n");
  }

 private:
  void Show(bool final) {
    const int filled = static_cast<int>(20 * step_ / std::max<uint64_t>(1, steps_));
    const double elapsed = std::chrono::duration<double>(Clock::now() - grid_start_).count();
    const std::string line = absl::StrFormat(
        "[%zu/%zu] %-60s [%s%s] %5u/%u acc %s  %4.0f s", index_ + 1, total_, label_.substr(0, 60),
        std::string(filled, '#'), std::string(20 - filled, '.'), step_, steps_,
        accuracy_ < 0 ? "  -   " : absl::StrFormat("%.4f", accuracy_), elapsed);
    if (tty_) {
      std::printf("\r%s%s", line.c_str(), final ? "\n" : "");
    } else if (const uint64_t quarter = 4 * step_ / std::max<uint64_t>(1, steps_);
               final || (quarter > printed_quarter_ && step_ < steps_)) {
      // Logs and pipes: a line at each quarter and at the end.
      printed_quarter_ = quarter;
      std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
  }

  size_t index_, total_;
  std::string label_;
  uint64_t steps_;
  Clock::time_point grid_start_;
  bool tty_;
  uint64_t step_ = 0;
  double accuracy_ = -1;
  uint64_t printed_quarter_ = 0;
};

// Written beside and renamed over `path`, so a run stopped at any moment leaves whole
// files for --resume and --merge.
absl::Status WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::path partial = path;
  partial += ".partial";
  {
    std::ofstream out(partial, std::ios::trunc);
    out << text;
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", partial.string()));
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", partial.string(), " to ",
                                               path.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

void Plot(const Flags& flags, const std::filesystem::path& out) {
  // Debian's interpreter, where python3-matplotlib installs, before any other python3
  // on the PATH (a pyenv shim, a virtual environment).
  const std::string python =
      std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const std::string command =
      absl::StrCat(python, " '", flags.plot_script, "' '", out.string(), "'");
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr,
                 "ps-experiment: plotting failed (%s); the CSV files and table.md are written\n",
                 command.c_str());
  }
}

// --merge: the rows of earlier runs of this grid (a slice run a seed at a time, or a
// run whose table is to be drawn again) reported as one run, in the grid's order.
absl::Status Merge(const Flags& flags, const ExperimentConfig& config) {
  std::vector<std::pair<std::string, std::vector<CellResult>>> runs;
  size_t left_out = 0;
  for (const std::string& dir : flags.merge) {
    PS_ASSIGN_OR_RETURN(std::vector<CellResult> rows, ReadRunRows(dir));
    if (flags.select) left_out += KeepGridRows(config, rows);
    runs.emplace_back(dir, std::move(rows));
  }
  PS_ASSIGN_OR_RETURN(const std::vector<CellResult> results, MergeRunRows(config, runs));
  const size_t grid = ExpandGrid(config).size();
  const std::filesystem::path out = flags.out;
  std::filesystem::create_directories(out);
  PS_RETURN_IF_ERROR(WriteFile(out / "results.csv", ResultsCsv(results)));
  PS_RETURN_IF_ERROR(WriteFile(out / "summary.csv", SummaryCsv(results)));
  const std::string table = MarkdownTable(config, results);
  PS_RETURN_IF_ERROR(WriteFile(out / "table.md", table));
  std::printf("%s\n", table.c_str());
  if (flags.plots) Plot(flags, out);
  std::printf(
      "ps-experiment: merged %zu of the grid's %zu cells from %zu run(s)%s into "
      "%s/{results.csv,summary.csv,table.md%s}\n",
      results.size(), grid, runs.size(),
      flags.select
          ? absl::StrFormat(" (--select left out %zu rows of other cells)", left_out).c_str()
          : "",
      out.c_str(), flags.plots ? ",accuracy-*.png,worst-case-*.png" : "");
  return absl::OkStatus();
}

absl::Status Run(const Flags& flags) {
  std::ifstream in(flags.config);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot read the config file '", flags.config, "'"));
  std::stringstream text;
  text << in.rdbuf();
  PS_ASSIGN_OR_RETURN(const ExperimentConfig config,
                      ParseExperimentConfig(text.str(), flags.overrides));
  for (const std::string& schedule : config.lr_schedules) {
    if (absl::StatusOr<server::LrSchedule> s = server::LrSchedule::Parse(schedule); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: lr_schedules: ", s.status().message()));
    }
    for (const std::string& codec : config.codecs) {
      if (schedule != "constant" && ParseStrategy(codec, config).comm == "adacomm") {
        // There the workers run the optimizer and the shards add the change as it is.
        return absl::InvalidArgumentError(absl::StrCat(
            "config: lr schedule '", schedule, "' with the local-update strategy '", codec,
            "': the shards apply the workers' change with lr 1; schedules are for sync cells"));
      }
    }
  }
  if (flags.select && flags.merge.empty()) {
    return absl::InvalidArgumentError("--select picks the rows of --merge; there is no --merge");
  }
  if (!flags.merge.empty()) return Merge(flags, config);
  const std::vector<Cell> cells = ExpandGrid(config);
  const std::filesystem::path out = flags.out;
  std::filesystem::create_directories(out);
  // --resume: the cells an earlier, interrupted run of this grid finished in --out are
  // kept as read back (a failed one runs again); the rest run.
  std::vector<std::optional<CellResult>> done(cells.size());
  size_t kept = 0;
  if (flags.resume && std::filesystem::exists(out / "summary.csv")) {
    PS_ASSIGN_OR_RETURN(std::vector<CellResult> rows,
                        ReadRunRows(out.string(), /*interrupted=*/true));
    PS_ASSIGN_OR_RETURN(done, PlaceRunRows(config, {{out.string(), std::move(rows)}}));
    for (std::optional<CellResult>& r : done) {
      if (r && !r->error.empty()) r.reset();  // a failed cell runs again
      if (r) ++kept;
    }
  }
  auto finished = [&done] {
    std::vector<CellResult> results;
    for (const std::optional<CellResult>& r : done) {
      if (r) results.push_back(*r);
    }
    return results;
  };
  std::printf("ps-experiment: %zu cells (n = %u, %lu steps each) from %s; results in %s%s\n",
              cells.size(), config.workers, static_cast<unsigned long>(config.steps),
              flags.config.c_str(), out.c_str(),
              flags.resume ? absl::StrFormat(" (resuming: %zu done before)", kept).c_str() : "");
  PS_ASSIGN_OR_RETURN(const TrainingData data,
                      LoadTrainingData(config.data_dir, /*with_test=*/true));

  const auto grid_start = Clock::now();
  for (size_t i = 0; i < cells.size(); ++i) {
    if (done[i]) continue;
    const Cell& cell = cells[i];
    ClusterConfig cc;
    cc.trainer.workers = config.workers;
    cc.trainer.steps = config.steps;
    cc.trainer.batch_size = config.batch_size;
    cc.trainer.model = config.model;
    cc.trainer.hidden = config.hidden;
    cc.trainer.split = cell.split;
    cc.trainer.seed = cell.seed;
    const Strategy strategy = ParseStrategy(cell.codec, config);
    cc.trainer.codec = strategy.push_codec;
    if (!strategy.candidates.empty()) cc.trainer.codec_candidates = strategy.candidates;
    if (cell.bandwidth_mbps > 0 || config.latency_ms > 0) {
      std::vector<std::string> shaping;
      if (cell.bandwidth_mbps > 0)
        shaping.push_back(absl::StrCat("rate=", cell.bandwidth_mbps, "mbps"));
      if (config.latency_ms > 0)
        shaping.push_back(absl::StrCat("latency=", config.latency_ms, "ms"));
      cc.trainer.shaping = absl::StrJoin(shaping, ",");
    }
    cc.trainer.error_feedback = config.error_feedback;
    cc.trainer.worker_momentum = cell.worker_momentum;
    cc.trainer.eval_every = config.eval_every;
    cc.trainer.log_every = std::max<uint64_t>(1, config.steps / 100);
    cc.num_shards = config.shards;
    cc.aggregator = cell.rule;
    cc.lr = config.lr;
    cc.momentum = config.momentum;
    cc.lr_schedule = cell.lr_schedule;
    cc.trainer.comm = strategy.comm;
    if (strategy.comm == "adacomm") {
      // The workers run the optimizer; the shards apply the aggregated change as it is.
      cc.trainer.lr = config.lr;
      cc.trainer.momentum = config.momentum;
      cc.trainer.tau0 = config.tau0;
      cc.trainer.tau_max = config.tau_max;
      cc.lr = 1;
      cc.momentum = 0;
    }
    cc.round_deadline = std::chrono::milliseconds(config.round_deadline_ms);
    cc.pull_codec = strategy.pull_codec;
    cc.byzantine = cell.byzantine;
    cc.attack = cell.attack;
    cc.suspicion_window = config.suspicion_window;
    cc.elastic = {config.elastic_workers, config.elastic_join, config.elastic_leave};
    CellProgress progress(i, cells.size(), cell.Label(), config.steps, grid_start);
    CellResult r;
    r.cell = cell;
    auto ran = RunCluster(cc, data, &progress);
    if (ran.ok()) {
      r.evals = ran->evals;
      r.eval_seconds = ran->eval_seconds;
      r.bytes_sent = ran->push_bytes;
      r.plans = ran->plans;
      r.periods = ran->periods;
      r.final_accuracy = ran->final_accuracy;
      r.diverged = ran->diverged;
      r.wall_seconds = ran->wall_seconds;
      r.refused_pushes = ran->refused_pushes;
      r.suspicion = ran->suspicion;
    } else {
      r.error = std::string(ran.status().message());
    }
    progress.Finish(r);
    done[i] = std::move(r);
    // Written after every cell, so an interrupted grid keeps what it ran (--resume).
    const std::vector<CellResult> results = finished();
    PS_RETURN_IF_ERROR(WriteFile(out / "results.csv", ResultsCsv(results)));
    PS_RETURN_IF_ERROR(WriteFile(out / "summary.csv", SummaryCsv(results)));
    PS_RETURN_IF_ERROR(WriteFile(out / "table.md", MarkdownTable(config, results)));
    PS_RETURN_IF_ERROR(WriteFile(out / "runs.json", RunsJson(config, results)));
    PS_RETURN_IF_ERROR(WriteFile(out / "suspicion.csv", SuspicionCsv(results)));
    PS_RETURN_IF_ERROR(
        WriteFile(out / "suspicion.md",
                  SuspicionTable(results, server::ServerOptions().suspicion_threshold)));
  }
  const std::vector<CellResult> results = finished();
  std::printf("\n%s", MarkdownTable(config, results).c_str());
  const std::string suspects = SuspicionTable(results, server::ServerOptions().suspicion_threshold);
  if (!suspects.empty()) std::printf("\nSuspicion (suspicion.md):\n%s", suspects.c_str());
  if (flags.plots) Plot(flags, out);
  std::printf("wrote %s/{results.csv,summary.csv,table.md,runs.json%s} in %.0f s\n", out.c_str(),
              flags.plots ? ",accuracy-*.png,worst-case-*.png,time-to-accuracy-*.png" : "",
              std::chrono::duration<double>(Clock::now() - grid_start).count());
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps::fashion_mnist

int main(int argc, char** argv) {
  ps::cli::TuneProcessForThroughput();  // docs/data_path.md, "Allocator"
  ps::fashion_mnist::Flags f;
  CLI::App app{"ps-experiment: robust-training experiments on an in-process ps-server cluster"};
  app.option_defaults()->always_capture_default();
  app.add_option("--config", f.config, "Grid config file (docs/evaluation.md)")->required();
  app.add_option("--out", f.out, "Output directory");
  app.add_option("--plots", f.plots, "Draw PNG plots with python3-matplotlib");
  app.add_option("--set", f.overrides,
                 "'key = value' replacing that key's line of the config (repeatable), e.g. "
                 "--set 'splits = [\"iid\"]'");
  app.add_option("--merge", f.merge,
                 "Run nothing: report the rows of earlier runs of this grid (their --out "
                 "directories; repeatable) as one run in --out, e.g. seeds run one at a time");
  app.add_flag("--select", f.select,
               "With --merge: take only the rows of this grid's cells (the --set lines pick "
               "part of the runs, e.g. three rules of eleven) instead of refusing the rest");
  app.add_flag("--resume", f.resume,
               "Keep the cells an interrupted run of this grid finished in --out (its "
               "summary.csv and results.csv) and run the rest");
  app.add_option("--plot-script", f.plot_script, "The plotting script")
      ->default_val(PS_PLOT_SCRIPT);
  CLI11_PARSE(app, argc, argv);
  const absl::Status status = ps::fashion_mnist::Run(f);
  if (!status.ok()) std::fprintf(stderr, "ps-experiment: %s\n", status.ToString().c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  // As ps-fashion-mnist: no destructors after the runs (gRPC teardown race, see there).
  std::_Exit(status.ok() ? 0 : 1);
}
