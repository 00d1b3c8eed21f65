// The reports of ps-experiment (docs/evaluation.md): results.csv, summary.csv
// and runs.json from a grid's results (table.md: experiment_table.cc), and the rows of
// earlier runs read back from their CSV files and merged into one grid (--merge).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "examples/fashion_mnist/experiment.h"

namespace ps::fashion_mnist {
namespace {

std::string Num(double v) { return absl::StrFormat("%g", v); }

// A CSV field: quoted when it holds a comma, quote or newline.
std::string Csv(std::string_view s) {
  if (s.find_first_of(",\"\n") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

constexpr char kCellHeader[] =
    "rule,attack,byzantine,split,codec,worker_momentum,lr_schedule,seed,bandwidth_mbps";

// A JSON string literal.
std::string Json(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonNumber(std::optional<double> v) {
  return v && std::isfinite(*v) ? absl::StrFormat("%.6g", *v) : "null";
}

// A CSV file's records (RFC 4180: quoted fields may hold commas, doubled quotes and
// newlines), each with the line it starts on.
struct CsvRecord {
  size_t line = 0;
  std::vector<std::string> fields;
};

absl::StatusOr<std::vector<CsvRecord>> CsvRecords(std::string_view text, const std::string& name) {
  std::vector<CsvRecord> out;
  CsvRecord record{1, {}};
  std::string field;
  bool quoted = false, closed = false, any = false;
  size_t line = 1;
  auto end_field = [&] {
    record.fields.push_back(std::move(field));
    field.clear();
    closed = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '\n') ++line;
      if (c != '"') {
        field += c;
      } else if (i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
        closed = true;
      }
      continue;
    }
    if (c == '\r') continue;
    if (c == ',' || c == '\n') {
      end_field();
      if (c == '\n') {
        out.push_back(std::move(record));
        record = CsvRecord{++line, {}};
        any = false;
      }
      continue;
    }
    if (closed) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " line ", line, ": text after a closing quote"));
    }
    any = true;
    if (c == '"' && field.empty()) {
      quoted = true;
      continue;
    }
    field += c;
  }
  if (quoted) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " line ", record.line, ": a quoted field is not closed"));
  }
  if (any || closed || !record.fields.empty()) {
    end_field();
    out.push_back(std::move(record));
  }
  return out;
}

// A record's fields by its file's header names.
class CsvColumns {
 public:
  static absl::StatusOr<CsvColumns> Of(const CsvRecord& header, const std::string& name,
                                       std::span<const std::string_view> required) {
    CsvColumns c;
    c.name_ = name;
    for (size_t i = 0; i < header.fields.size(); ++i) c.index_[header.fields[i]] = i;
    c.width_ = header.fields.size();
    for (std::string_view column : required) {
      if (!c.index_.contains(std::string(column))) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": the header has no '",
                                                       core::AsAbsl(column),
                                                       "' column; not a file ps-experiment wrote"));
      }
    }
    return c;
  }
  bool Has(const std::string& column) const { return index_.contains(column); }
  absl::StatusOr<std::string> Text(const CsvRecord& r, const std::string& column) const {
    if (r.fields.size() != width_) {
      return absl::InvalidArgumentError(absl::StrCat(name_, " line ", r.line, ": ", r.fields.size(),
                                                     " fields, the header has ", width_));
    }
    return r.fields[index_.at(column)];
  }
  template <typename T>
  absl::StatusOr<T> Number(const CsvRecord& r, const std::string& column) const {
    PS_ASSIGN_OR_RETURN(const std::string text, Text(r, column));
    T v{};
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, " line ", r.line, ": ", column, " '", text, "' is not a number"));
    }
    return v;
  }

 private:
  std::string name_;
  std::map<std::string, size_t, std::less<>> index_;
  size_t width_ = 0;
};

constexpr std::string_view kCellColumnNames[] = {"rule",        "attack", "byzantine",
                                                 "split",       "codec",  "worker_momentum",
                                                 "lr_schedule", "seed",   "bandwidth_mbps"};

absl::StatusOr<Cell> CellOf(const CsvColumns& columns, const CsvRecord& r) {
  Cell c;
  PS_ASSIGN_OR_RETURN(c.rule, columns.Text(r, "rule"));
  PS_ASSIGN_OR_RETURN(c.attack, columns.Text(r, "attack"));
  PS_ASSIGN_OR_RETURN(c.byzantine, columns.Number<uint32_t>(r, "byzantine"));
  PS_ASSIGN_OR_RETURN(c.split, columns.Text(r, "split"));
  PS_ASSIGN_OR_RETURN(c.codec, columns.Text(r, "codec"));
  PS_ASSIGN_OR_RETURN(c.worker_momentum, columns.Number<double>(r, "worker_momentum"));
  PS_ASSIGN_OR_RETURN(c.lr_schedule, columns.Text(r, "lr_schedule"));
  PS_ASSIGN_OR_RETURN(c.seed, columns.Number<uint64_t>(r, "seed"));
  PS_ASSIGN_OR_RETURN(c.bandwidth_mbps, columns.Number<double>(r, "bandwidth_mbps"));
  return c;
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string Cell::Columns() const {
  return absl::StrCat(Csv(rule), ",", Csv(attack), ",", byzantine, ",", Csv(split), ",", Csv(codec),
                      ",", Num(worker_momentum), ",", Csv(lr_schedule), ",", seed, ",",
                      Num(bandwidth_mbps));
}

std::string ResultsCsv(const std::vector<CellResult>& results) {
  std::string out = absl::StrCat(kCellHeader, ",step,test_accuracy\n");
  for (const CellResult& r : results) {
    for (const auto& [step, accuracy] : r.evals) {
      absl::StrAppend(&out, r.cell.Columns(), ",", step, ",", absl::StrFormat("%.4f", accuracy),
                      "\n");
    }
  }
  return out;
}

std::string SummaryCsv(const std::vector<CellResult>& results) {
  std::string out =
      absl::StrCat(kCellHeader, ",final_accuracy,diverged,wall_seconds,refused_pushes,error\n");
  for (const CellResult& r : results) {
    absl::StrAppend(&out, r.cell.Columns(), ",",
                    r.final_accuracy ? absl::StrFormat("%.4f", *r.final_accuracy) : "", ",",
                    r.diverged ? "true" : "false", ",", absl::StrFormat("%.1f", r.wall_seconds),
                    ",", r.refused_pushes ? absl::StrCat(*r.refused_pushes) : "", ",", Csv(r.error),
                    "\n");
  }
  return out;
}

namespace {

// values[i], NaN past its end (printed "nan").
double At(const std::vector<double>& values, size_t i) {
  return i < values.size() ? values[i] : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

std::string SuspicionCsv(const std::vector<CellResult>& results) {
  std::string out =
      absl::StrCat(kCellHeader,
                   ",shard,first_round,worker,byzantine_worker,score,set_aside,alignment\n");
  for (const CellResult& r : results) {
    for (const SuspicionWindow& w : r.suspicion) {
      const size_t n = w.scores.size();
      for (size_t id = 0; id < n; ++id) {
        if (std::isnan(w.scores[id])) continue;
        absl::StrAppend(&out, r.cell.Columns(), ",", w.shard, ",", w.first_round, ",", id, ",",
                        id + r.cell.byzantine >= n ? "true" : "false", ",",
                        absl::StrFormat("%.4f", w.scores[id]), ",",
                        absl::StrFormat("%.4f", At(w.set_aside, id)), ",",
                        absl::StrFormat("%.4f", At(w.alignment, id)), "\n");
      }
    }
  }
  return out;
}

std::string RunsJson(const ExperimentConfig& config, const std::vector<CellResult>& results) {
  std::string out = "[\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const CellResult& r = results[i];
    const Cell& c = r.cell;
    std::optional<double> to_target;
    if (config.target_accuracy > 0) to_target = SecondsToTarget(r, config.target_accuracy);
    const double train_seconds = r.eval_seconds.empty() ? r.wall_seconds : r.eval_seconds.back();
    std::string curve;
    for (size_t e = 0; e < r.evals.size() && e < r.eval_seconds.size(); ++e) {
      absl::StrAppend(&curve, e == 0 ? "" : ", ", "[", JsonNumber(r.eval_seconds[e]), ", ",
                      r.evals[e].first, ", ", JsonNumber(r.evals[e].second), "]");
    }
    const Strategy strategy = ParseStrategy(c.codec, config);
    std::string periods;
    for (size_t p = 0; p < r.periods.size(); ++p) {
      absl::StrAppend(&periods, p == 0 ? "" : ", ", "[", r.periods[p].step, ", ",
                      r.periods[p].round, ", ", r.periods[p].tau, "]");
    }
    std::string plans;
    for (size_t p = 0; p < r.plans.size(); ++p) {
      absl::StrAppend(&plans, p == 0 ? "" : ", ", "{\"step\": ", r.plans[p].step,
                      ", \"codecs\": ", Json(r.plans[p].codecs),
                      ", \"predicted_seconds\": ", JsonNumber(r.plans[p].predicted_seconds),
                      ", \"measured_seconds\": ", JsonNumber(r.plans[p].measured_seconds), "}");
    }
    const std::string model =
        config.model == "mlp" ? absl::StrCat("mlp(hidden=", config.hidden, ")") : config.model;
    absl::StrAppend(
        &out, "  {\"model\": ", Json(model), ", \"bandwidth_mbps\": ", Num(c.bandwidth_mbps),
        ", \"latency_ms\": ", config.latency_ms, ", \"strategy\": ", Json(strategy.name),
        ", \"codec\": ", Json(strategy.push_codec), ", \"pull_codec\": ", Json(strategy.pull_codec),
        ", \"comm\": ", Json(strategy.comm), ", \"lr_schedule\": ", Json(c.lr_schedule),
        ", \"rule\": ", Json(c.rule), ", \"attack\": ", Json(c.attack),
        ", \"byzantine\": ", c.byzantine, ", \"workers\": ", config.workers,
        ", \"shards\": ", config.shards, ", \"split\": ", Json(c.split), ", \"seed\": ", c.seed,
        ", \"steps\": ", config.steps, ", \"target_accuracy\": ",
        config.target_accuracy > 0 ? JsonNumber(config.target_accuracy) : "null",
        ", \"seconds_to_target\": ", JsonNumber(to_target),
        ", \"final_accuracy\": ", JsonNumber(r.final_accuracy), ", \"bytes_sent\": ", r.bytes_sent,
        ", \"train_seconds\": ", JsonNumber(train_seconds),
        ", \"wall_seconds\": ", JsonNumber(r.wall_seconds),
        ", \"diverged\": ", r.diverged ? "true" : "false", ", \"error\": ", Json(r.error),
        ", \"periods\": [", periods, "]", ", \"plans\": [", plans, "]", ", \"curve\": [", curve,
        "]}", i + 1 < results.size() ? "," : "", "\n");
  }
  return out + "]\n";
}

absl::StatusOr<std::vector<CellResult>> ParseRunRows(std::string_view summary_csv,
                                                     std::string_view results_csv,
                                                     std::string_view source, bool interrupted) {
  const std::string summary_name = absl::StrCat(core::AsAbsl(source), "/summary.csv");
  const std::string results_name = absl::StrCat(core::AsAbsl(source), "/results.csv");
  PS_ASSIGN_OR_RETURN(const std::vector<CsvRecord> summary, CsvRecords(summary_csv, summary_name));
  PS_ASSIGN_OR_RETURN(const std::vector<CsvRecord> evals, CsvRecords(results_csv, results_name));
  if (summary.empty()) return absl::InvalidArgumentError(absl::StrCat(summary_name, " is empty"));
  if (evals.empty()) return absl::InvalidArgumentError(absl::StrCat(results_name, " is empty"));
  std::vector<std::string_view> required(std::begin(kCellColumnNames), std::end(kCellColumnNames));
  std::vector<std::string_view> summary_required = required;
  summary_required.insert(summary_required.end(),
                          {"final_accuracy", "diverged", "wall_seconds", "error"});
  PS_ASSIGN_OR_RETURN(const CsvColumns s,
                      CsvColumns::Of(summary[0], summary_name, summary_required));
  std::vector<CellResult> rows;
  std::map<std::string, size_t> index;  // Cell::Columns -> row
  for (size_t i = 1; i < summary.size(); ++i) {
    const CsvRecord& r = summary[i];
    CellResult x;
    PS_ASSIGN_OR_RETURN(x.cell, CellOf(s, r));
    PS_ASSIGN_OR_RETURN(const std::string accuracy, s.Text(r, "final_accuracy"));
    if (!accuracy.empty()) {
      PS_ASSIGN_OR_RETURN(x.final_accuracy, s.Number<double>(r, "final_accuracy"));
    }
    PS_ASSIGN_OR_RETURN(const std::string diverged, s.Text(r, "diverged"));
    if (diverged != "true" && diverged != "false") {
      return absl::InvalidArgumentError(absl::StrCat(summary_name, " line ", r.line, ": diverged '",
                                                     diverged, "' is not true or false"));
    }
    x.diverged = diverged == "true";
    PS_ASSIGN_OR_RETURN(x.wall_seconds, s.Number<double>(r, "wall_seconds"));
    if (s.Has("refused_pushes")) {
      PS_ASSIGN_OR_RETURN(const std::string refused, s.Text(r, "refused_pushes"));
      if (!refused.empty()) {
        PS_ASSIGN_OR_RETURN(x.refused_pushes, s.Number<uint64_t>(r, "refused_pushes"));
      }
    }
    PS_ASSIGN_OR_RETURN(x.error, s.Text(r, "error"));
    if (!index.emplace(x.cell.Columns(), rows.size()).second) {
      return absl::InvalidArgumentError(absl::StrCat(summary_name, " line ", r.line, ": cell '",
                                                     x.cell.Label(), "' appears twice"));
    }
    rows.push_back(std::move(x));
  }
  required.insert(required.end(), {"step", "test_accuracy"});
  PS_ASSIGN_OR_RETURN(const CsvColumns e, CsvColumns::Of(evals[0], results_name, required));
  for (size_t i = 1; i < evals.size(); ++i) {
    const CsvRecord& r = evals[i];
    PS_ASSIGN_OR_RETURN(const Cell cell, CellOf(e, r));
    const auto it = index.find(cell.Columns());
    if (it == index.end()) {
      if (interrupted) continue;
      return absl::InvalidArgumentError(absl::StrCat(results_name, " line ", r.line,
                                                     ": an evaluation of '", cell.Label(),
                                                     "', which summary.csv lacks"));
    }
    PS_ASSIGN_OR_RETURN(const uint64_t step, e.Number<uint64_t>(r, "step"));
    PS_ASSIGN_OR_RETURN(const double accuracy, e.Number<double>(r, "test_accuracy"));
    rows[it->second].evals.emplace_back(step, accuracy);
  }
  return rows;
}

absl::StatusOr<std::vector<CellResult>> ReadRunRows(const std::string& dir, bool interrupted) {
  PS_ASSIGN_OR_RETURN(const std::string summary, ReadText(dir + "/summary.csv"));
  PS_ASSIGN_OR_RETURN(const std::string results, ReadText(dir + "/results.csv"));
  return ParseRunRows(summary, results, dir, interrupted);
}

size_t KeepGridRows(const ExperimentConfig& config, std::vector<CellResult>& rows) {
  std::set<std::string> grid;
  for (const Cell& cell : ExpandGrid(config)) grid.insert(cell.Columns());
  return std::erase_if(rows, [&](const CellResult& r) { return !grid.contains(r.cell.Columns()); });
}

absl::StatusOr<std::vector<std::optional<CellResult>>> PlaceRunRows(
    const ExperimentConfig& config,
    const std::vector<std::pair<std::string, std::vector<CellResult>>>& runs) {
  const std::vector<Cell> grid = ExpandGrid(config);
  std::map<std::string, size_t> position;  // Cell::Columns -> index in the grid
  for (size_t i = 0; i < grid.size(); ++i) position.emplace(grid[i].Columns(), i);
  std::vector<std::optional<CellResult>> placed(grid.size());
  std::vector<const std::string*> placed_from(grid.size(), nullptr);
  for (const auto& [source, rows] : runs) {
    for (const CellResult& r : rows) {
      const auto it = position.find(r.cell.Columns());
      if (it == position.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": cell '", r.cell.Label(),
            "' is not in this config's grid (another grid file, or other --set lines?)"));
      }
      if (placed[it->second]) {
        return absl::InvalidArgumentError(absl::StrCat("cell '", r.cell.Label(), "' is in both ",
                                                       *placed_from[it->second], " and ", source));
      }
      placed[it->second] = r;
      placed_from[it->second] = &source;
    }
  }
  return placed;
}

absl::StatusOr<std::vector<CellResult>> MergeRunRows(
    const ExperimentConfig& config,
    const std::vector<std::pair<std::string, std::vector<CellResult>>>& runs) {
  PS_ASSIGN_OR_RETURN(std::vector<std::optional<CellResult>> placed, PlaceRunRows(config, runs));
  std::vector<CellResult> out;
  for (std::optional<CellResult>& r : placed) {
    if (r) out.push_back(std::move(*r));
  }
  return out;
}

}  // namespace ps::fashion_mnist
