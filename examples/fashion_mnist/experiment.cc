#include "examples/fashion_mnist/experiment.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace ps::fashion_mnist {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// Splits a value into tokens: a one-line array "[a, "b, c"]" or a single value. Quotes
// are removed; commas inside quotes stay.
absl::StatusOr<std::vector<std::string>> Tokens(std::string_view value) {
  value = Trim(value);
  const bool array = !value.empty() && value.front() == '[';
  if (array) {
    if (value.back() != ']') return absl::InvalidArgumentError("array without a closing ']'");
    value = value.substr(1, value.size() - 2);
  }
  std::vector<std::string> out;
  std::string current;
  bool quoted = false, was_quoted = false;
  auto finish = [&]() -> absl::Status {
    const std::string_view t = was_quoted ? std::string_view(current) : Trim(current);
    if (t.empty() && !was_quoted) return absl::InvalidArgumentError("empty value");
    out.emplace_back(t);
    current.clear();
    was_quoted = false;
    return absl::OkStatus();
  };
  for (char c : value) {
    if (c == '"') {
      if (!quoted && !Trim(current).empty())
        return absl::InvalidArgumentError("a quote inside a bare value");
      if (!quoted) current.clear();
      quoted = !quoted;
      was_quoted = true;
      continue;
    }
    if (c == ',' && !quoted && array) {
      PS_RETURN_IF_ERROR(finish());
      continue;
    }
    if (!quoted && was_quoted && c != ' ' && c != '\t') {
      return absl::InvalidArgumentError("text after a closing quote");
    }
    if (quoted || !was_quoted) current += c;
  }
  if (quoted) return absl::InvalidArgumentError("unterminated string");
  if (!(array && Trim(value).empty())) PS_RETURN_IF_ERROR(finish());
  if (out.empty()) return absl::InvalidArgumentError("empty list");
  if (!array && out.size() != 1) return absl::InvalidArgumentError("one value expected");
  return out;
}

template <typename T>
absl::StatusOr<T> ParseNumber(const std::string& token, std::string_view kind) {
  T v{};
  const auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), v);
  if (ec != std::errc() || ptr != token.data() + token.size()) {
    return absl::InvalidArgumentError(absl::StrCat("'", token, "' is not ", core::AsAbsl(kind)));
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(v))
      return absl::InvalidArgumentError(absl::StrCat("'", token, "' is not finite"));
  }
  return v;
}

using Setter = std::function<absl::Status(const std::vector<std::string>&)>;

template <typename T>
Setter List(std::vector<T>* field, std::string_view kind) {
  return [field, kind](const std::vector<std::string>& tokens) -> absl::Status {
    std::vector<T> values;
    for (const std::string& t : tokens) {
      if constexpr (std::is_same_v<T, std::string>) {
        values.push_back(t);
      } else {
        PS_ASSIGN_OR_RETURN(T v, ParseNumber<T>(t, kind));
        values.push_back(v);
      }
    }
    *field = std::move(values);
    return absl::OkStatus();
  };
}

template <typename T>
Setter Scalar(T* field, std::string_view kind) {
  return [field, kind](const std::vector<std::string>& tokens) -> absl::Status {
    if (tokens.size() != 1) return absl::InvalidArgumentError("one value expected, not a list");
    if constexpr (std::is_same_v<T, std::string>) {
      *field = tokens[0];
    } else if constexpr (std::is_same_v<T, bool>) {
      if (tokens[0] != "true" && tokens[0] != "false") {
        return absl::InvalidArgumentError(absl::StrCat("'", tokens[0], "' is not true or false"));
      }
      *field = tokens[0] == "true";
    } else {
      PS_ASSIGN_OR_RETURN(*field, ParseNumber<T>(tokens[0], kind));
    }
    return absl::OkStatus();
  };
}

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

std::string CellColumns(const Cell& c) {
  return absl::StrCat(Csv(c.rule), ",", Csv(c.attack), ",", c.byzantine, ",", Csv(c.split), ",",
                      Csv(c.codec), ",", Num(c.worker_momentum), ",", Csv(c.lr_schedule), ",",
                      c.seed, ",", Num(c.bandwidth_mbps));
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

}  // namespace

absl::StatusOr<ExperimentConfig> ParseExperimentConfig(std::string_view text,
                                                       std::span<const std::string> overrides) {
  ExperimentConfig c;
  const std::map<std::string, Setter, std::less<>> setters = {
      {"rules", List(&c.rules, "")},
      {"attacks", List(&c.attacks, "")},
      {"byzantine", List(&c.byzantine, "an unsigned integer")},
      {"splits", List(&c.splits, "")},
      {"codecs", List(&c.codecs, "")},
      {"worker_momentum", List(&c.worker_momentum, "a number")},
      {"lr_schedules", List(&c.lr_schedules, "")},
      {"seeds", List(&c.seeds, "an unsigned integer")},
      {"bandwidths", List(&c.bandwidths, "a number")},
      {"latency_ms", Scalar(&c.latency_ms, "an unsigned integer")},
      {"target_accuracy", Scalar(&c.target_accuracy, "a number")},
      {"workers", Scalar(&c.workers, "an unsigned integer")},
      {"shards", Scalar(&c.shards, "an unsigned integer")},
      {"steps", Scalar(&c.steps, "an unsigned integer")},
      {"batch_size", Scalar(&c.batch_size, "an unsigned integer")},
      {"model", Scalar(&c.model, "")},
      {"hidden", Scalar(&c.hidden, "an unsigned integer")},
      {"lr", Scalar(&c.lr, "a number")},
      {"momentum", Scalar(&c.momentum, "a number")},
      {"eval_every", Scalar(&c.eval_every, "an unsigned integer")},
      {"error_feedback", Scalar(&c.error_feedback, "")},
      {"pull_codec", Scalar(&c.pull_codec, "")},
      {"round_deadline_ms", Scalar(&c.round_deadline_ms, "an unsigned integer")},
      {"tau0", Scalar(&c.tau0, "an unsigned integer")},
      {"tau_max", Scalar(&c.tau_max, "an unsigned integer")},
      {"data_dir", Scalar(&c.data_dir, "")},
  };
  // Applies one "key = value" line (comments and blank lines skipped); `origin` names it
  // in errors ("config line 3", "--set 1"); keys in `skip` are checked but not applied.
  std::set<std::string, std::less<>> seen;
  const auto apply = [&](std::string_view line, const std::string& origin,
                         const std::set<std::string, std::less<>>& skip) -> absl::Status {
    // A '#' outside quotes starts a comment.
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '"') quoted = !quoted;
      if (line[i] == '#' && !quoted) {
        line = line.substr(0, i);
        break;
      }
    }
    line = Trim(line);
    if (line.empty()) return absl::OkStatus();
    const auto where = [&](std::string_view key, absl::string_view message) {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, ": ", key.empty() ? "" : absl::StrCat(core::AsAbsl(key), ": "), message));
    };
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos)
      return where("", absl::StrCat("expected 'key = value', got '", core::AsAbsl(line), "'"));
    const std::string key(Trim(line.substr(0, eq)));
    const auto setter = setters.find(key);
    if (setter == setters.end()) {
      std::vector<std::string> known;
      for (const auto& [k, unused] : setters) known.push_back(k);
      return where("",
                   absl::StrCat("unknown key '", key, "'; known: ", absl::StrJoin(known, ", ")));
    }
    if (skip.contains(key)) return absl::OkStatus();
    if (!seen.insert(key).second) return where(key, "given twice");
    auto tokens = Tokens(line.substr(eq + 1));
    if (!tokens.ok()) return where(key, tokens.status().message());
    if (absl::Status s = setter->second(*tokens); !s.ok()) return where(key, s.message());
    return absl::OkStatus();
  };
  for (size_t i = 0; i < overrides.size(); ++i) {
    PS_RETURN_IF_ERROR(apply(overrides[i], absl::StrCat("--set ", i + 1), {}));
  }
  const std::set<std::string, std::less<>> overridden = seen;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    PS_RETURN_IF_ERROR(
        apply(text.substr(pos, end - pos), absl::StrCat("config line ", ++line_no), overridden));
    pos = end + 1;
  }
  if (c.workers == 0 || c.shards == 0 || c.steps == 0 || c.batch_size == 0) {
    return absl::InvalidArgumentError(
        "config: workers, shards, steps and batch_size must be positive");
  }
  for (uint32_t f : c.byzantine) {
    if (f >= c.workers) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: byzantine ", f, " must be below workers ", c.workers));
    }
  }
  for (double b : c.bandwidths) {
    if (b < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("config: bandwidth ", b, " Mbit/s is negative"));
  }
  if (c.target_accuracy < 0 || c.target_accuracy > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: target_accuracy ", c.target_accuracy, " is not in [0, 1]"));
  }
  for (double wm : c.worker_momentum) {
    if (wm < 0 || wm >= 1)
      return absl::InvalidArgumentError(
          absl::StrCat("config: worker_momentum ", wm, " is not in [0, 1)"));
  }
  if (c.tau0 < 1 || c.tau0 > c.tau_max) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: tau0 ", c.tau0, " is not in [1, tau_max ", c.tau_max, "]"));
  }
  return c;
}

std::string Cell::Label() const {
  return absl::StrCat(
      rule, " | ", attack, " | f=", byzantine, " | ", split, " | ", codec,
      " | wm=", Num(worker_momentum),
      lr_schedule == "constant" ? "" : absl::StrCat(" | lr ", lr_schedule), " | seed ", seed,
      bandwidth_mbps > 0 ? absl::StrCat(" | ", Num(bandwidth_mbps), " Mbit/s") : "");
}

Strategy ParseStrategy(std::string_view codec, const ExperimentConfig& config) {
  Strategy s;
  const size_t bar = codec.find('|');
  s.name = std::string(codec.substr(0, bar));
  std::string_view push = codec.substr(0, bar);
  constexpr std::string_view kAdaComm = "+adacomm";
  if (push.size() > kAdaComm.size() && push.ends_with(kAdaComm)) {
    push.remove_suffix(kAdaComm.size());
    s.comm = "adacomm";
  }
  s.push_codec = StrategyCodec(push);
  if (push == "espresso") {
    s.push_codec = "auto";
    s.candidates = {"fp32", "fp16", "topk(0.01)+varint+fp16", "3lc(s=1.9)"};
  } else if (push == "espresso+cat") {
    s.push_codec = "auto";
    s.candidates = {"fp32", "fp16", StrategyCodec("cat")};
  }
  s.pull_codec =
      bar == std::string_view::npos ? config.pull_codec : std::string(codec.substr(bar + 1));
  return s;
}

std::string StrategyCodec(std::string_view codec) {
  if (codec == "cat") return kCatSpec;
  return std::string(codec);
}

std::optional<double> SecondsToTarget(const CellResult& r, double target) {
  for (size_t i = 0; i < r.evals.size() && i < r.eval_seconds.size(); ++i) {
    if (r.evals[i].second >= target) return r.eval_seconds[i];
  }
  return std::nullopt;
}

std::vector<Cell> ExpandGrid(const ExperimentConfig& c) {
  std::vector<Cell> cells;
  for (const std::string& rule : c.rules) {
    for (double wm : c.worker_momentum) {
      for (const std::string& schedule : c.lr_schedules) {
        for (const std::string& split : c.splits) {
          for (const std::string& codec : c.codecs) {
            for (uint32_t f : c.byzantine) {
              const std::vector<std::string> attacks =
                  f == 0 ? std::vector<std::string>{"none"} : c.attacks;
              for (const std::string& attack : attacks) {
                for (uint64_t seed : c.seeds) {
                  for (double bandwidth : c.bandwidths) {
                    cells.push_back({rule, attack, f, split, codec, wm, schedule, seed, bandwidth});
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return cells;
}

std::string ResultsCsv(const std::vector<CellResult>& results) {
  std::string out = absl::StrCat(kCellHeader, ",step,test_accuracy\n");
  for (const CellResult& r : results) {
    for (const auto& [step, accuracy] : r.evals) {
      absl::StrAppend(&out, CellColumns(r.cell), ",", step, ",", absl::StrFormat("%.4f", accuracy),
                      "\n");
    }
  }
  return out;
}

std::string SummaryCsv(const std::vector<CellResult>& results) {
  std::string out =
      absl::StrCat(kCellHeader, ",final_accuracy,diverged,wall_seconds,refused_pushes,error\n");
  for (const CellResult& r : results) {
    absl::StrAppend(&out, CellColumns(r.cell), ",",
                    r.final_accuracy ? absl::StrFormat("%.4f", *r.final_accuracy) : "", ",",
                    r.diverged ? "true" : "false", ",", absl::StrFormat("%.1f", r.wall_seconds),
                    ",", r.refused_pushes, ",", Csv(r.error), "\n");
  }
  return out;
}

std::string MarkdownTable(const ExperimentConfig& config, const std::vector<CellResult>& results) {
  // Final accuracy over seeds per (rule, wm, schedule, split, codec, link) x f x attack;
  // a diverged or failed run counts as its accuracy (diverged runs evaluate what they
  // have) or 0.
  using Setting = std::tuple<double, std::string, std::string, std::string, double>;
  using Row = std::pair<std::string, Setting>;  // (rule, setting)
  struct Stats {
    double sum = 0, squares = 0;
    int count = 0;
  };
  std::map<std::tuple<Row, uint32_t, std::string>, Stats> stats;
  std::vector<Row> rows;
  std::vector<uint32_t> fs;
  for (const CellResult& r : results) {
    const Row row{r.cell.rule, Setting{r.cell.worker_momentum, r.cell.lr_schedule, r.cell.split,
                                       r.cell.codec, r.cell.bandwidth_mbps}};
    if (std::find(rows.begin(), rows.end(), row) == rows.end()) rows.push_back(row);
    if (r.cell.byzantine > 0 && std::find(fs.begin(), fs.end(), r.cell.byzantine) == fs.end()) {
      fs.push_back(r.cell.byzantine);
    }
    Stats& st = stats[{row, r.cell.byzantine, r.cell.attack}];
    const double v = r.final_accuracy.value_or(0.0);
    st.sum += v;
    st.squares += v * v;
    ++st.count;
  }
  auto find = [&](const Row& row, uint32_t f, const std::string& attack) -> const Stats* {
    auto it = stats.find({row, f, attack});
    return it == stats.end() ? nullptr : &it->second;
  };
  auto mean = [&](const Row& row, uint32_t f, const std::string& attack) -> std::optional<double> {
    const Stats* st = find(row, f, attack);
    if (st == nullptr) return std::nullopt;
    return st->sum / st->count;
  };
  // The baseline: the same f with every worker honest when the grid has it, else f = 0.
  auto baseline = [&](const Row& row, uint32_t f) {
    std::optional<double> base = mean(row, f, "none");
    return base ? base : mean(row, 0, "none");
  };
  // "0.8432", or "0.8432 ± 0.0123" (the seeds' sample standard deviation).
  auto cell = [&](const Row& row, uint32_t f, const std::string& attack) {
    const Stats* st = find(row, f, attack);
    if (st == nullptr) return std::string("-");
    const double m = st->sum / st->count;
    if (st->count < 2) return absl::StrFormat("%.4f", m);
    const double var = std::max(0.0, (st->squares - st->count * m * m) / (st->count - 1));
    return absl::StrFormat("%.4f ± %.4f", m, std::sqrt(var));
  };
  std::vector<std::string> attacks;  // the attack columns: every listed one but "none"
  for (const std::string& a : config.attacks) {
    if (a != "none") attacks.push_back(a);
  }
  const bool have_mean =
      std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.first == "mean"; });
  std::string out;
  for (uint32_t f : fs) {
    absl::StrAppend(
        &out, "Final test accuracy with f = ", f, " of n = ", config.workers,
        " Byzantine workers (mean over ", config.seeds.size(), " seed(s)",
        config.seeds.size() > 1 ? " ± their standard deviation" : "",
        "); no attack = the same rule and f with every worker honest (or f = 0 when the grid "
        "has no 'none' attack); worst = the lowest over the attacks; drop = no attack - worst, "
        "in points.",
        have_mean ? absl::StrFormat(" † = the attack costs `mean` less than %.0f points here (it "
                                    "does not bite: no robustness result).",
                                    100 * kBiteThreshold)
                  : " (No `mean` row: whether an attack bites is not measured.)",
        "\n\n");
    absl::StrAppend(&out, "| rule | worker momentum | lr schedule | split | codec | no attack | ",
                    absl::StrJoin(attacks, " | "), " | worst | drop |\n|---|---|---|---|---|---|");
    for (size_t i = 0; i < attacks.size() + 2; ++i) out += "---|";
    out += "\n";
    for (const Row& row : rows) {
      const auto& [wm, schedule, split, codec, bandwidth] = row.second;
      const std::optional<double> base = baseline(row, f);
      const Row mean_row{"mean", row.second};
      const std::optional<double> mean_base = baseline(mean_row, f);
      std::optional<double> worst;
      std::vector<std::string> columns;
      for (const std::string& attack : attacks) {
        const std::optional<double> v = mean(row, f, attack);
        const std::optional<double> mean_attacked = mean(mean_row, f, attack);
        const bool no_bite =
            v && mean_base && mean_attacked && *mean_base - *mean_attacked < kBiteThreshold;
        columns.push_back(cell(row, f, attack) + (no_bite ? " †" : ""));
        if (v && (!worst || *v < *worst)) worst = v;
      }
      const std::string drop =
          base && worst ? absl::StrFormat("%.2f", 100 * (*base - *worst)) : "-";
      const std::string link = bandwidth > 0 ? absl::StrCat(" (", Num(bandwidth), " Mbit/s)") : "";
      const std::string base_cell =
          find(row, f, "none") ? cell(row, f, "none") : cell(row, 0, "none");
      absl::StrAppend(&out, "| `", row.first, "` | ", Num(wm), " | ", schedule, " | ", split, " | ",
                      codec, link, " | ", base_cell, " | ", absl::StrJoin(columns, " | "), " | ",
                      worst ? absl::StrFormat("%.4f", *worst) : "-", " | ", drop, " |\n");
    }
    out += "\n";
  }
  absl::StrAppend(&out, "Settings: n = ", config.workers, ", ", config.shards, " shards, ",
                  config.steps, " steps, batch ", config.batch_size, ", model ", config.model,
                  config.model == "mlp" ? absl::StrCat(" (hidden ", config.hidden, ")") : "",
                  ", lr ", Num(config.lr), " momentum ", Num(config.momentum));
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

}  // namespace ps::fashion_mnist
