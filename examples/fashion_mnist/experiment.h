// The experiment grid of ps-experiment (docs/evaluation.md): a config file names lists
// of rules, attacks, f, splits, codecs, worker momenta and seeds plus scalar settings;
// every combination is one cell, run on the in-process cluster. This file holds the
// torch-free parts: the config format, the grid (experiment.cc), and the reports (CSV,
// Markdown, JSON) with the CSV rows read back (experiment_report.cc).
//
// Config format, the config-file grammar ps-server's --config reads too
// (core/config_text.h), a subset of TOML: `key = value` lines, `#` comments; a value is
// a quoted string, a number, true/false, or an array of those (over several lines if
// need be):
//
//   rules = ["mean", "clip(2)+nnm+trimmed_mean"]
//   attacks = ["signflip", "ipm", "alie"]
//   byzantine = [2]
//   workers = 12
//   steps = 1000
//
// Thread safety: plain functions and values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ps::fashion_mnist {

struct ExperimentConfig {
  // Grid dimensions.
  std::vector<std::string> rules = {"mean"};
  std::vector<std::string> attacks = {"signflip"};
  std::vector<uint32_t> byzantine = {0};
  std::vector<std::string> splits = {"iid"};
  std::vector<std::string> codecs = {"fp32"};
  std::vector<double> worker_momentum = {0};
  // The shards' step-size schedules (--lr-schedule: constant, step(every=N, gamma=G),
  // inv_sqrt(t0=T), cosine(steps=N, min=M)).
  std::vector<std::string> lr_schedules = {"constant"};
  std::vector<uint64_t> seeds = {1};
  // Every worker's link in Mbit/s, both directions (the worker library's shaper,
  // net::ParseLinkShaping); 0 = unshaped.
  std::vector<double> bandwidths = {0};
  // Every cell.
  // One-way delay added to every worker's link, shaped or not (0: none).
  uint32_t latency_ms = 0;
  // A run's seconds_to_target: the training seconds (evaluations excluded) at its first
  // evaluation at or above this accuracy; 0: not reported.
  double target_accuracy = 0;
  uint32_t workers = 12;
  uint32_t shards = 2;
  uint64_t steps = 1000;
  uint32_t batch_size = 32;
  std::string model = "mlp";
  uint32_t hidden = 128;
  double lr = 0.05;
  double momentum = 0.9;
  uint64_t eval_every = 100;
  bool error_feedback = false;
  // The shards' --pull-codec (empty: dense pulls).
  std::string pull_codec;
  uint32_t round_deadline_ms = 5000;
  // Strategies with "+adacomm" (local-update training): AdaComm's first and largest
  // period (TrainerConfig::tau0, tau_max).
  uint32_t tau0 = 8;
  uint32_t tau_max = 32;
  // The shards' --suspicion-window (rounds; docs/metrics.md, "Suspicion").
  uint32_t suspicion_window = 50;
  // Elastic membership (ClusterConfig::Elastic): `elastic_workers` of the n workers join
  // at step elastic_join and leave at step elastic_leave (0: stay); 0 workers: static.
  uint32_t elastic_workers = 0;
  uint64_t elastic_join = 0;
  uint64_t elastic_leave = 0;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
};

// Parses the config text; unknown keys, bad values and empty lists are refused with
// the line number: "config line 3: byzantine: '-1' is not an unsigned integer".
// `overrides` are further "key = value" lines (ps-experiment's --set) that replace the
// text's line of the same key, so one grid file can run a slice at a time
// (`--set 'splits = ["iid"]'`); refused as "--set 2: ..." and when a key is set twice.
absl::StatusOr<ExperimentConfig> ParseExperimentConfig(std::string_view text,
                                                       std::span<const std::string> overrides = {});

// One combination of the grid. With f = 0 the attack is "none" (one baseline per
// combination of the other dimensions, however many attacks are listed); the attack
// "none" with f > 0 runs the rule configured for f with every worker honest.
struct Cell {
  std::string rule;
  std::string attack;
  uint32_t byzantine = 0;
  std::string split;
  std::string codec;
  double worker_momentum = 0;
  std::string lr_schedule = "constant";
  uint64_t seed = 1;
  double bandwidth_mbps = 0;  // 0: unshaped
  // "rule | attack | f | split | codec | wm[ | lr schedule] | seed[ | B Mbit/s]", for
  // progress lines.
  std::string Label() const;
  // The cell's columns in summary.csv and results.csv: what identifies a cell when runs
  // are read back, merged and resumed.
  std::string Columns() const;
};
std::vector<Cell> ExpandGrid(const ExperimentConfig& config);

// Local-update training: worker 0's AdaComm period from `step` (round `round`) on.
struct PeriodChange {
  uint64_t step = 0;
  uint64_t round = 0;
  uint32_t tau = 0;
};

// Espresso (--codec auto): worker 0's plan made at `step`.
struct PlanChange {
  uint64_t step = 0;
  std::string codecs;  // "tensor=codec, ..."
  // The round seconds the plan predicts, those of fp32 everywhere, and the measured ones
  // when it was made.
  double predicted_seconds = 0, baseline_seconds = 0, measured_seconds = 0;
};

// One shard's suspicion scores over one window of rounds (server/suspicion.h): one per
// worker id, NaN where no push of that worker was aggregated in the window.
struct SuspicionWindow {
  uint32_t shard = 0;
  uint64_t first_round = 0;
  std::vector<double> scores;
  // The scores' parts: how far the rule set the worker aside, and its mean cosine with
  // the aggregate.
  std::vector<double> set_aside;
  std::vector<double> alignment;
};

// What a cell's run produced.
struct CellResult {
  Cell cell;
  std::vector<std::pair<uint64_t, double>> evals;  // (step, test accuracy)
  // Per evaluation: the run's training seconds when it was taken (the time spent
  // evaluating, which stalls the cluster, excluded).
  std::vector<double> eval_seconds;
  std::optional<double> final_accuracy;
  uint64_t bytes_sent = 0;            // payload bytes of every worker's accepted pushes
  std::vector<PeriodChange> periods;  // as they changed
  std::vector<PlanChange> plans;      // as they came
  bool diverged = false;
  double wall_seconds = 0;
  // Pushes the shards refused (late ones when a worker missed the round deadline): a
  // cell whose attackers' pushes came late ran a weaker attack.
  // Unknown (nullopt, an empty CSV field) in rows read back from a summary.csv written
  // before the column existed.
  std::optional<uint64_t> refused_pushes;
  // Every shard's windows, shard by shard (not read back from the CSV files).
  std::vector<SuspicionWindow> suspicion;
  std::string error;  // non-empty when the run failed
};

// How the suspicion scores of a cell ranked its Byzantine workers (the last f ids).
struct SuspectRanking {
  size_t windows = 0;  // windows with a score for every worker
  // Windows where every Byzantine worker scored above every honest one.
  size_t ranked = 0;
  double honest_max = 0;      // the highest honest score of any window
  double honest_mean = 0;     // over windows and honest workers
  double byzantine_mean = 0;  // over windows and Byzantine workers (0 when f = 0)
};
SuspectRanking RankSuspects(const CellResult& r);
// suspicion.csv: one row per cell, shard, window and worker:
// <cell columns>,shard,first_round,worker,byzantine_worker,score,set_aside,alignment
std::string SuspicionCsv(const std::vector<CellResult>& results);
// suspicion.md: per cell with windows, the share of windows where the Byzantine workers
// ranked highest, the honest workers' highest and mean score and the Byzantine ones'
// mean, against `threshold` (the shards' --suspicion-threshold).
std::string SuspicionTable(const std::vector<CellResult>& results, double threshold);

// A cell's codec is a strategy: "PUSH" or "PUSH|PULL", the push codec and the shards'
// pull codec (--pull-codec; without "|" the config's pull_codec). PUSH is a codec spec
// or a strategy of adaptive communication (docs/adaptive.md): "cat" is top-k whose
// level CAT chooses per push. PUSH ending in "+adacomm" ("fp16+adacomm|fp16") trains
// with local updates (TrainerConfig::comm "adacomm"): the workers run the config's
// optimizer (lr, momentum), the shards apply the aggregated change (lr 1, momentum 0).
// PUSH "espresso" or "espresso+cat" lets each worker plan its tensors' codecs.
struct Strategy {
  std::string name;        // PUSH as written ("cat", "fp32", "topk(0.01)", "fp16+adacomm")
  std::string push_codec;  // its codec spec
  std::string pull_codec;  // "" = dense pulls
  std::string comm = "sync";
  // push_codec "auto" (the strategies "espresso": fp32, fp16, top-k 1 %, 3LC, and
  // "espresso+cat": fp32, fp16, CAT): Espresso's plan chooses among these per tensor.
  std::vector<std::string> candidates;
};
Strategy ParseStrategy(std::string_view codec, const ExperimentConfig& config);
// CAT's top-k (docs/adaptive.md, "CAT"): between 0.1 % and 10 % of each slice, the
// level chosen per push; varint indices and fp16 values, as error feedback's usual
// companions. The strategy "cat" and one of --comm auto's candidates.
inline constexpr char kCatSpec[] = "topk(0.1, level=cat, min=0.001)+varint+fp16";
// The codec spec of a push strategy name ("cat" -> "topk(0.1, level=cat, ...)").
std::string StrategyCodec(std::string_view push);

// The training seconds at which `r` first reached `target` (nullopt: never).
std::optional<double> SecondsToTarget(const CellResult& r, double target);

// results.csv: one row per evaluation, with the cell's columns:
// rule,attack,byzantine,split,codec,worker_momentum,lr_schedule,seed,bandwidth_mbps,step,
// test_accuracy
std::string ResultsCsv(const std::vector<CellResult>& results);
// summary.csv: one row per cell: ...,final_accuracy,diverged,wall_seconds,refused_pushes,error
std::string SummaryCsv(const std::vector<CellResult>& results);
// table.md: per (rule, worker momentum, lr schedule, split, codec) and f > 0, the final
// accuracy under each attack (mean over seeds, with the seeds' standard deviation when
// there are several), the worst case over attacks, the no-attack baseline (attack
// "none" at the same f, else f = 0) and the drop from it; then the run's settings.
// Where the grid has `mean`, an attack that costs `mean` less than kBiteThreshold of
// its own no-attack accuracy (same wm, schedule, split, codec, f) is marked in every
// row: it does not bite there, so holding against it shows nothing about robustness.
inline constexpr double kBiteThreshold = 0.02;
std::string MarkdownTable(const ExperimentConfig& config, const std::vector<CellResult>& results);
// runs.json: a JSON array, one object per run: model, bandwidth_mbps, latency_ms,
// strategy (the push strategy's name), codec (its spec), pull_codec ("" = dense), rule,
// attack, byzantine, split, seed,
// target_accuracy, seconds_to_target (null if never reached), final_accuracy,
// bytes_sent, train_seconds, wall_seconds, and curve: [[seconds, step, accuracy], ...].
std::string RunsJson(const ExperimentConfig& config, const std::vector<CellResult>& results);

// The rows of a run read back from the CSV files it wrote: one CellResult per row of
// `summary_csv` (cell, final accuracy, diverged, wall seconds, refused pushes, error),
// with its evaluations from the rows of `results_csv`. What the CSV files do not hold
// (evaluation seconds, bytes, plans, periods) stays empty. A summary.csv from before
// the refused_pushes column reads as unknown refusals. Refused with the file's name and line:
// a header that is not ps-experiment's, a field that does not parse, an evaluation of
// a cell the summary lacks; unless `interrupted`: a run cut off between writing its two
// files has the last cell's evaluations and not its summary row, and those evaluations
// are dropped (the cell runs again on --resume).
absl::StatusOr<std::vector<CellResult>> ParseRunRows(std::string_view summary_csv,
                                                     std::string_view results_csv,
                                                     std::string_view source,
                                                     bool interrupted = false);
// ParseRunRows on DIR/summary.csv and DIR/results.csv.
absl::StatusOr<std::vector<CellResult>> ReadRunRows(const std::string& dir,
                                                    bool interrupted = false);
// The rows of several runs of one grid as one result list, in the grid's order (so a
// slice run a seed at a time reports as if run at once: ps-experiment --merge). Refuses
// a row whose cell is not in `config`'s grid (another config or other --set lines) and
// a cell that two rows hold, naming both. Cells of the grid that no run holds are left
// out (the table shows "-").
absl::StatusOr<std::vector<CellResult>> MergeRunRows(
    const ExperimentConfig& config,
    const std::vector<std::pair<std::string, std::vector<CellResult>>>& runs);
// Removes from `rows` those whose cell is not in `config`'s grid and returns how many
// (ps-experiment --merge --select: the --set lines pick part of larger runs).
size_t KeepGridRows(const ExperimentConfig& config, std::vector<CellResult>& rows);
// MergeRunRows's rows at their cells' positions in ExpandGrid(config): element i holds
// the row of grid cell i, or nothing where no run holds it (ps-experiment --resume).
absl::StatusOr<std::vector<std::optional<CellResult>>> PlaceRunRows(
    const ExperimentConfig& config,
    const std::vector<std::pair<std::string, std::vector<CellResult>>>& runs);

}  // namespace ps::fashion_mnist
