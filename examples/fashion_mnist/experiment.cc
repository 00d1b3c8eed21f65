#include "examples/fashion_mnist/experiment.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/config_text.h"
#include "core/status.h"

namespace ps::fashion_mnist {
namespace {

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
      {"suspicion_window", Scalar(&c.suspicion_window, "an unsigned integer")},
      {"elastic_workers", Scalar(&c.elastic_workers, "an unsigned integer")},
      {"elastic_join", Scalar(&c.elastic_join, "an unsigned integer")},
      {"elastic_leave", Scalar(&c.elastic_leave, "an unsigned integer")},
      {"data_dir", Scalar(&c.data_dir, "")},
  };
  // Applies the entries of `text` (core/config_text.h); `origin` names an entry's line
  // in errors ("config line 3", "--set 1"); keys in `skip` are checked but not applied.
  std::set<std::string, std::less<>> seen;
  const auto apply = [&](std::string_view text, const std::function<std::string(size_t)>& origin,
                         const std::set<std::string, std::less<>>& skip) -> absl::Status {
    for (const core::ConfigEntry& entry : core::ReadConfigText(text)) {
      const auto where = [&](std::string_view key, absl::string_view message) {
        return absl::InvalidArgumentError(
            absl::StrCat(origin(entry.line), ": ",
                         key.empty() ? "" : absl::StrCat(core::AsAbsl(key), ": "), message));
      };
      const std::string& key = entry.key;
      if (key.empty()) return where("", entry.error);  // a line that is not `key = value`
      const auto setter = setters.find(key);
      if (setter == setters.end()) {
        std::vector<std::string> known;
        for (const auto& [k, unused] : setters) known.push_back(k);
        return where("",
                     absl::StrCat("unknown key '", key, "'; known: ", absl::StrJoin(known, ", ")));
      }
      if (skip.contains(key)) continue;
      if (!seen.insert(key).second) return where(key, "given twice");
      if (!entry.error.empty()) return where(key, entry.error);
      if (entry.values.empty()) return where(key, "empty list");
      if (absl::Status s = setter->second(entry.values); !s.ok()) return where(key, s.message());
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < overrides.size(); ++i) {
    PS_RETURN_IF_ERROR(
        apply(overrides[i], [&](size_t) { return absl::StrCat("--set ", i + 1); }, {}));
  }
  const std::set<std::string, std::less<>> overridden = seen;
  PS_RETURN_IF_ERROR(
      apply(text, [](size_t line) { return absl::StrCat("config line ", line); }, overridden));
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
  if (c.elastic_workers > 0 &&
      (c.elastic_workers >= c.workers || c.elastic_join >= c.steps ||
       (c.elastic_leave != 0 && c.elastic_leave <= c.elastic_join))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: elastic_workers ", c.elastic_workers, " joining at step ", c.elastic_join,
        " and leaving at ", c.elastic_leave, " need fewer than workers ", c.workers,
        ", elastic_join below steps ", c.steps, " and elastic_leave 0 or after elastic_join"));
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
      " | wm=", absl::StrFormat("%g", worker_momentum),
      lr_schedule == "constant" ? "" : absl::StrCat(" | lr ", lr_schedule), " | seed ", seed,
      bandwidth_mbps > 0 ? absl::StrFormat(" | %g Mbit/s", bandwidth_mbps) : "");
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

}  // namespace ps::fashion_mnist
