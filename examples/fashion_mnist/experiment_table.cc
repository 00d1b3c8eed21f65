// ps-experiment's table.md (docs/evaluation.md, "The runner"): the final accuracies of a
// grid's cells, first per f with one column per attack, then the worst case per rule and
// f. Both tables read the accuracies through one index, Accuracies, which holds every
// seed's value and answers the questions the tables ask: the mean over seeds, one seed's
// value, the no-attack baseline, and whether an attack bites `mean`.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "examples/fashion_mnist/experiment.h"

namespace ps::fashion_mnist {
namespace {

std::string TableNum(double v) { return absl::StrFormat("%g", v); }

// What a table row holds fixed besides the rule: worker momentum, lr schedule, split,
// codec, link bandwidth.
using Setting = std::tuple<double, std::string, std::string, std::string, double>;
struct Row {
  std::string rule;
  Setting setting;
  auto operator<=>(const Row&) const = default;
  // The `mean` row of the same setting: whether an attack bites is measured there.
  Row Mean() const { return Row{"mean", setting}; }
};

// The final accuracy of every cell (a diverged run counts as what it evaluated last, a
// failed one as 0), by row, f, attack and seed.
class Accuracies {
 public:
  explicit Accuracies(const std::vector<CellResult>& results) {
    for (const CellResult& r : results) {
      const Row row{r.cell.rule, Setting{r.cell.worker_momentum, r.cell.lr_schedule, r.cell.split,
                                         r.cell.codec, r.cell.bandwidth_mbps}};
      if (std::find(rows_.begin(), rows_.end(), row) == rows_.end()) rows_.push_back(row);
      const uint32_t f = r.cell.byzantine;
      if (f > 0 && std::find(fs_.begin(), fs_.end(), f) == fs_.end()) fs_.push_back(f);
      values_[{row, f, r.cell.attack}].emplace_back(r.cell.seed, r.final_accuracy.value_or(0.0));
      seeds_.insert(r.cell.seed);
    }
    has_mean_ =
        std::any_of(rows_.begin(), rows_.end(), [](const Row& r) { return r.rule == "mean"; });
  }

  // In the order of the results.
  const std::vector<Row>& rows() const { return rows_; }
  const std::vector<uint32_t>& fs() const { return fs_; }  // the f > 0
  const std::set<uint64_t>& seeds() const { return seeds_; }
  bool has_mean() const { return has_mean_; }

  // The mean over the seeds that ran the cell, or `seed`'s own value.
  std::optional<double> Value(const Row& row, uint32_t f, const std::string& attack,
                              std::optional<uint64_t> seed = std::nullopt) const {
    const std::vector<std::pair<uint64_t, double>>* v = Find(row, f, attack);
    if (v == nullptr) return std::nullopt;
    if (seed) {
      for (const auto& [s, accuracy] : *v) {
        if (s == *seed) return accuracy;
      }
      return std::nullopt;
    }
    double sum = 0;
    for (const auto& [s, accuracy] : *v) sum += accuracy;
    return sum / v->size();
  }

  // The f of (row, f)'s no-attack cell: f itself when the grid ran `none` with every
  // worker honest at that f, else the f = 0 baseline.
  uint32_t BaselineF(const Row& row, uint32_t f) const {
    return Find(row, f, "none") != nullptr ? f : 0;
  }
  std::optional<double> Baseline(const Row& row, uint32_t f,
                                 std::optional<uint64_t> seed = std::nullopt) const {
    const std::optional<double> at_f = Value(row, f, "none", seed);
    return at_f ? at_f : Value(row, 0, "none", seed);
  }

  // True when the grid shows `attack` costing the same setting's `mean` less than
  // kBiteThreshold at f (unknown: false).
  bool DoesNotBite(const Row& row, uint32_t f, const std::string& attack) const {
    const std::optional<double> base = Baseline(row.Mean(), f);
    const std::optional<double> attacked = Value(row.Mean(), f, attack);
    return base && attacked && *base - *attacked < kBiteThreshold;
  }

  // "0.8432", "0.8432 ± 0.0123" (the seeds' sample standard deviation) or "-".
  std::string Text(const Row& row, uint32_t f, const std::string& attack) const {
    const std::vector<std::pair<uint64_t, double>>* v = Find(row, f, attack);
    if (v == nullptr) return "-";
    double sum = 0, squares = 0;
    for (const auto& [s, accuracy] : *v) {
      sum += accuracy;
      squares += accuracy * accuracy;
    }
    const double n = static_cast<double>(v->size());
    const double m = sum / n;
    if (v->size() < 2) return absl::StrFormat("%.4f", m);
    const double var = std::max(0.0, (squares - n * m * m) / (n - 1));
    return absl::StrFormat("%.4f ± %.4f", m, std::sqrt(var));
  }
  std::string BaselineText(const Row& row, uint32_t f) const {
    return Text(row, BaselineF(row, f), "none");
  }

 private:
  const std::vector<std::pair<uint64_t, double>>* Find(const Row& row, uint32_t f,
                                                       const std::string& attack) const {
    const auto it = values_.find({row, f, attack});
    return it == values_.end() ? nullptr : &it->second;
  }

  std::vector<Row> rows_;
  std::vector<uint32_t> fs_;
  std::set<uint64_t> seeds_;
  bool has_mean_ = false;
  // (seed, accuracy) in the order of the results.
  std::map<std::tuple<Row, uint32_t, std::string>, std::vector<std::pair<uint64_t, double>>>
      values_;
};

std::string Points(std::optional<double> base, std::optional<double> worst) {
  return base && worst ? absl::StrFormat("%.2f", 100 * (*base - *worst)) : "-";
}

std::string Link(double bandwidth) {
  return bandwidth > 0 ? absl::StrCat(" (", TableNum(bandwidth), " Mbit/s)") : "";
}

// Per f > 0: one row per rule and setting, one column per attack, worst and drop.
std::string PerFTables(const ExperimentConfig& config, const Accuracies& acc,
                       const std::vector<std::string>& attacks) {
  std::string out;
  for (uint32_t f : acc.fs()) {
    absl::StrAppend(
        &out, "Final test accuracy with f = ", f, " of n = ", config.workers,
        " Byzantine workers (mean over ", config.seeds.size(), " seed(s)",
        config.seeds.size() > 1 ? " ± their standard deviation" : "",
        "); no attack = the same rule and f with every worker honest (or f = 0 when the grid "
        "has no 'none' attack); worst = the lowest over the attacks; drop = no attack - worst, "
        "in points.",
        acc.has_mean() ? absl::StrFormat(" † = the attack costs `mean` less than %.0f points here "
                                         "(it does not bite: no robustness result).",
                                         100 * kBiteThreshold)
                       : " (No `mean` row: whether an attack bites is not measured.)",
        "\n\n");
    absl::StrAppend(&out, "| rule | worker momentum | lr schedule | split | codec | no attack | ",
                    absl::StrJoin(attacks, " | "), " | worst | drop |\n|---|---|---|---|---|---|");
    for (size_t i = 0; i < attacks.size() + 2; ++i) out += "---|";
    out += "\n";
    for (const Row& row : acc.rows()) {
      const auto& [wm, schedule, split, codec, bandwidth] = row.setting;
      std::optional<double> worst;
      std::vector<std::string> columns;
      for (const std::string& attack : attacks) {
        const std::optional<double> v = acc.Value(row, f, attack);
        columns.push_back(acc.Text(row, f, attack) +
                          (v && acc.DoesNotBite(row, f, attack) ? " †" : ""));
        if (v && (!worst || *v < *worst)) worst = v;
      }
      absl::StrAppend(&out, "| `", row.rule, "` | ", TableNum(wm), " | ", schedule, " | ", split,
                      " | ", codec, Link(bandwidth), " | ", acc.BaselineText(row, f), " | ",
                      absl::StrJoin(columns, " | "), " | ",
                      worst ? absl::StrFormat("%.4f", *worst) : "-", " | ",
                      Points(acc.Baseline(row, f), worst), " |\n");
    }
    out += "\n";
  }
  return out;
}

// `seed`'s lowest final accuracy over the attacks (none where it ran no attacked cell).
std::optional<double> SeedWorst(const Accuracies& acc, const Row& row, uint32_t f, uint64_t seed,
                                const std::vector<std::string>& attacks) {
  std::optional<double> worst;
  for (const std::string& attack : attacks) {
    const std::optional<double> v = acc.Value(row, f, attack, seed);
    if (v && (!worst || *v < *worst)) worst = v;
  }
  return worst;
}

// "1.86": each seed's no-attack accuracy minus its own lowest over the attacks, averaged
// over the seeds that have both; "-" where none has.
std::string SeedsDrop(const Accuracies& acc, const Row& row, uint32_t f,
                      const std::vector<std::string>& attacks) {
  double sum = 0;
  int count = 0;
  for (uint64_t seed : acc.seeds()) {
    const std::optional<double> base = acc.Baseline(row, f, seed);
    const std::optional<double> worst = SeedWorst(acc, row, f, seed, attacks);
    if (!base || !worst) continue;
    sum += *base - *worst;
    ++count;
  }
  return count == 0 ? std::string("-") : absl::StrFormat("%.2f", 100 * sum / count);
}

// "0.611": the lowest final accuracy any one seed reached under any of the attacks; "-"
// where no attacked cell ran.
std::string LowestSeed(const Accuracies& acc, const Row& row, uint32_t f,
                       const std::vector<std::string>& attacks) {
  std::optional<double> lowest;
  for (uint64_t seed : acc.seeds()) {
    const std::optional<double> worst = SeedWorst(acc, row, f, seed, attacks);
    if (worst && (!lowest || *worst < *lowest)) lowest = worst;
  }
  return lowest ? absl::StrFormat("%.3f", *lowest) : std::string("-");
}

// One line per rule, setting and f: the worst case over the attacks and over those that
// bite, with the attacks that reached it (the heatmap's numbers, with names). Only the
// settings that vary get a column.
std::string WorstCaseTable(const Accuracies& acc, const std::vector<std::string>& attacks) {
  const bool per_seed = acc.seeds().size() > 1;
  std::set<double> wms, links;
  std::set<std::string> schedules, splits, codecs;
  for (const Row& row : acc.rows()) {
    const auto& [wm, schedule, split, codec, bandwidth] = row.setting;
    wms.insert(wm);
    schedules.insert(schedule);
    splits.insert(split);
    codecs.insert(codec);
    links.insert(bandwidth);
  }
  std::string out;
  absl::StrAppend(&out, "Worst case per rule and f: the lowest final accuracy over the attacks ",
                  "(means over seeds) and the attacks that reached it; then the lowest over ",
                  "the attacks that bite",
                  acc.has_mean() ? " (those that cost `mean` at least 2 points there)"
                                 : " (every attack: the grid has no `mean` row)",
                  ". Drops are from the no-attack run, in points.",
                  per_seed ? " Seeds' drop: each seed's no-attack accuracy minus its own "
                             "lowest over the attacks, averaged over the seeds (a seed "
                             "counts where it has the no-attack cell and an attacked one; "
                             "at least the drop, since each seed takes its own worst). "
                             "Lowest seed: the lowest final accuracy any one seed reached "
                             "under any attack."
                           : "",
                  "\n\n| rule | ");
  if (wms.size() > 1) out += "worker momentum | ";
  if (schedules.size() > 1) out += "lr schedule | ";
  if (splits.size() > 1) out += "split | ";
  if (codecs.size() > 1 || links.size() > 1) out += "codec | ";
  const size_t setting_columns = (wms.size() > 1) + (schedules.size() > 1) + (splits.size() > 1) +
                                 (codecs.size() > 1 || links.size() > 1);
  out += absl::StrCat("f | no attack | worst | drop | ",
                      per_seed ? "seeds' drop | lowest seed | " : "",
                      "worst attack | worst that bites | drop | attack |\n|");
  for (size_t i = 0; i < setting_columns + 9 + 2 * per_seed; ++i) out += "---|";
  out += "\n";
  for (const Row& row : acc.rows()) {
    const auto& [wm, schedule, split, codec, bandwidth] = row.setting;
    std::string settings;
    if (wms.size() > 1) absl::StrAppend(&settings, TableNum(wm), " | ");
    if (schedules.size() > 1) absl::StrAppend(&settings, schedule, " | ");
    if (splits.size() > 1) absl::StrAppend(&settings, split, " | ");
    if (codecs.size() > 1 || links.size() > 1)
      absl::StrAppend(&settings, codec, Link(bandwidth), " | ");
    for (uint32_t f : acc.fs()) {
      // (worst, its attacks) over every attack, then over those that bite.
      std::optional<double> worst[2];
      std::vector<std::string> names[2];
      for (const std::string& attack : attacks) {
        const std::optional<double> v = acc.Value(row, f, attack);
        if (!v) continue;
        const int kinds = acc.DoesNotBite(row, f, attack) ? 1 : 2;
        for (int k = 0; k < kinds; ++k) {
          // Ties at the table's precision share the place.
          if (worst[k] && std::abs(*v - *worst[k]) < 5e-5) {
            names[k].push_back(attack);
          } else if (!worst[k] || *v < *worst[k]) {
            worst[k] = v;
            names[k] = {attack};
          }
        }
      }
      const std::optional<double> base = acc.Baseline(row, f);
      std::string columns;
      for (int k = 0; k < 2; ++k) {
        absl::StrAppend(&columns, " | ", worst[k] ? acc.Text(row, f, names[k].front()) : "-",
                        " | ", Points(base, worst[k]));
        if (k == 0 && per_seed) {
          absl::StrAppend(&columns, " | ", SeedsDrop(acc, row, f, attacks), " | ",
                          LowestSeed(acc, row, f, attacks));
        }
        absl::StrAppend(&columns, " | ", names[k].empty() ? "-" : absl::StrJoin(names[k], ", "));
      }
      absl::StrAppend(&out, "| `", row.rule, "` | ", settings, f, " | ", acc.BaselineText(row, f),
                      columns, " |\n");
    }
  }
  out += "\n";
  return out;
}

}  // namespace

std::string MarkdownTable(const ExperimentConfig& config, const std::vector<CellResult>& results) {
  const Accuracies acc(results);
  std::vector<std::string> attacks;  // the attack columns: every listed one but "none"
  for (const std::string& a : config.attacks) {
    if (a != "none") attacks.push_back(a);
  }
  std::string out = PerFTables(config, acc, attacks);
  if (!acc.fs().empty()) out += WorstCaseTable(acc, attacks);
  absl::StrAppend(
      &out, "Settings: n = ", config.workers, ", ", config.shards, " shards, ", config.steps,
      " steps, batch ", config.batch_size, ", model ", config.model,
      config.model == "mlp" ? absl::StrCat(" (hidden ", config.hidden, ")") : "", ", lr ",
      TableNum(config.lr), " momentum ", TableNum(config.momentum),
      config.elastic_workers == 0
          ? std::string()
          : absl::StrCat(", ", config.elastic_workers, " of the workers elastic (from step ",
                         config.elastic_join,
                         config.elastic_leave == 0 ? std::string(" on")
                                                   : absl::StrCat(" to ", config.elastic_leave),
                         ")"));
  const bool local_updates = std::any_of(results.begin(), results.end(), [&](const CellResult& r) {
    return ParseStrategy(r.cell.codec, config).comm == "adacomm";
  });
  absl::StrAppend(&out,
                  local_updates ? absl::StrCat(" (on the shards; in `+adacomm` cells on "
                                               "the workers, tau0 ",
                                               config.tau0, ", tau_max ", config.tau_max,
                                               ", and the shards apply the aggregated "
                                               "change with lr 1, momentum 0)")
                                : std::string(" on the shards"),
                  ".\n");
  return out;
}

}  // namespace ps::fashion_mnist
