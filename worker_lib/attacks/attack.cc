#include "worker_lib/attacks/attack.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregators/aggregator.h"
#include "core/spec.h"
#include "core/status.h"

namespace ps::attacks {
namespace {

std::string Number(double v) { return absl::StrCat(v); }

// Checks the honest vectors' sizes against out.
absl::Status CheckSizes(std::string_view name, const AttackContext& ctx, std::span<float> out) {
  if (ctx.own.size() != out.size()) {
    return absl::InvalidArgumentError(absl::StrCat(core::AsAbsl(name), ": own gradient has ", ctx.own.size(),
                                                   " values, the output ", out.size()));
  }
  for (size_t i = 0; i < ctx.honest.size(); ++i) {
    if (ctx.honest[i].size() != out.size()) {
      return absl::InvalidArgumentError(absl::StrCat(core::AsAbsl(name), ": honest gradient ", i, " has ",
                                                     ctx.honest[i].size(), " values, expected ",
                                                     out.size()));
    }
  }
  return absl::OkStatus();
}

// The honest vectors an omniscient attack works from: ctx.honest, or the attacker's own
// gradient as the only sample when it cannot see them.
std::vector<std::span<const float>> Samples(const AttackContext& ctx) {
  if (!ctx.honest.empty()) return {ctx.honest.begin(), ctx.honest.end()};
  return {ctx.own};
}

// Coordinate-wise mean and (for std != nullptr) sample standard deviation (n - 1 in the
// denominator, 0 for one sample), accumulated in double.
void MeanAndStd(const std::vector<std::span<const float>>& rows, std::vector<double>* mean,
                std::vector<double>* std) {
  const size_t d = rows.front().size();
  const auto k = static_cast<double>(rows.size());
  mean->assign(d, 0.0);
  for (const auto& r : rows) {
    for (size_t j = 0; j < d; ++j) (*mean)[j] += r[j];
  }
  for (double& m : *mean) m /= k;
  if (std == nullptr) return;
  std->assign(d, 0.0);
  if (rows.size() < 2) return;
  for (const auto& r : rows) {
    for (size_t j = 0; j < d; ++j) {
      const double e = r[j] - (*mean)[j];
      (*std)[j] += e * e;
    }
  }
  for (double& s : *std) s = std::sqrt(s / (k - 1));
}

// ---- simple attacks ----

class SignFlip final : public Attack {
 public:
  explicit SignFlip(double scale) : scale_(scale), spec_(absl::StrCat("signflip(scale=", Number(scale), ")")) {}
  std::string_view spec() const override { return spec_; }
  absl::Status Apply(const AttackContext& ctx, std::span<float> out) const override {
    PS_RETURN_IF_ERROR(CheckSizes("signflip", ctx, out));
    for (size_t j = 0; j < out.size(); ++j) out[j] = static_cast<float>(-scale_ * ctx.own[j]);
    return absl::OkStatus();
  }

 private:
  double scale_;
  std::string spec_;
};

class Gaussian final : public Attack {
 public:
  Gaussian(double mu, double sigma)
      : mu_(mu), sigma_(sigma),
        spec_(absl::StrCat("gaussian(mu=", Number(mu), ", sigma=", Number(sigma), ")")) {}
  std::string_view spec() const override { return spec_; }
  absl::Status Apply(const AttackContext& ctx, std::span<float> out) const override {
    PS_RETURN_IF_ERROR(CheckSizes("gaussian", ctx, out));
    // Box-Muller over mt19937_64 (specified bit for bit), seeded per (seed, worker, round).
    std::seed_seq seq{static_cast<uint32_t>(ctx.seed), static_cast<uint32_t>(ctx.seed >> 32),
                      ctx.worker_id, static_cast<uint32_t>(ctx.round),
                      static_cast<uint32_t>(ctx.round >> 32)};
    std::mt19937_64 rng(seq);
    constexpr double kTwoPi = 6.283185307179586;
    for (size_t j = 0; j < out.size(); j += 2) {
      const double u1 = (static_cast<double>(rng() >> 11) + 1.0) * 0x1p-53;  // (0, 1]
      const double u2 = static_cast<double>(rng() >> 11) * 0x1p-53;
      const double r = std::sqrt(-2.0 * std::log(u1));
      out[j] = static_cast<float>(mu_ + sigma_ * r * std::cos(kTwoPi * u2));
      if (j + 1 < out.size()) out[j + 1] = static_cast<float>(mu_ + sigma_ * r * std::sin(kTwoPi * u2));
    }
    return absl::OkStatus();
  }

 private:
  double mu_;
  double sigma_;
  std::string spec_;
};

class LabelFlip final : public Attack {
 public:
  std::string_view spec() const override { return "labelflip"; }
  bool flips_labels() const override { return true; }
  absl::Status Apply(const AttackContext& ctx, std::span<float> out) const override {
    PS_RETURN_IF_ERROR(CheckSizes("labelflip", ctx, out));
    std::copy(ctx.own.begin(), ctx.own.end(), out.begin());
    return absl::OkStatus();
  }
};

class Mimic final : public Attack {
 public:
  explicit Mimic(int64_t target) : target_(target), spec_(absl::StrCat("mimic(worker=", target, ")")) {}
  std::string_view spec() const override { return spec_; }
  bool omniscient() const override { return true; }
  absl::Status Apply(const AttackContext& ctx, std::span<float> out) const override {
    PS_RETURN_IF_ERROR(CheckSizes("mimic", ctx, out));
    if (ctx.honest.empty()) {
      std::copy(ctx.own.begin(), ctx.own.end(), out.begin());
      return absl::OkStatus();
    }
    if (static_cast<size_t>(target_) >= ctx.honest.size()) {
      return absl::InvalidArgumentError(absl::StrCat("mimic: worker ", target_, " is not among the ",
                                                     ctx.honest.size(), " honest gradients"));
    }
    const auto& src = ctx.honest[static_cast<size_t>(target_)];
    std::copy(src.begin(), src.end(), out.begin());
    return absl::OkStatus();
  }

 private:
  int64_t target_;
  std::string spec_;
};

class NonFinite final : public Attack {
 public:
  explicit NonFinite(bool nan) : nan_(nan) {}
  std::string_view spec() const override { return nan_ ? "nan" : "inf"; }
  absl::Status Apply(const AttackContext& ctx, std::span<float> out) const override {
    PS_RETURN_IF_ERROR(CheckSizes(spec(), ctx, out));
    std::fill(out.begin(), out.end(),
              nan_ ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity());
    return absl::OkStatus();
  }

 private:
  bool nan_;
};

// ---- omniscient attacks with a scale: ipm and alie, fixed or optimized ----

// ipm: -eps * mean(honest) (Xie et al., UAI 2019). alie: mean - z * std (Baruch et al.).
// Both are base + factor * direction with (base, direction) = (0, -mean) and
// (mean, -std); the optimized variants search the factor.
enum class Kind { kIpm, kAlie };

class ScaledAttack final : public Attack {
 public:
  // factor <= 0 for alie means "z from n and f". optimize: search the factor against
  // the rule instead.
  ScaledAttack(Kind kind, double factor, bool optimize)
      : kind_(kind), factor_(factor), optimize_(optimize) {
    const char* base = kind == Kind::kIpm ? "ipm" : "alie";
    if (optimize) {
      spec_ = absl::StrCat(base, "_opt");
    } else if (kind == Kind::kIpm) {
      spec_ = absl::StrCat("ipm(eps=", Number(factor), ")");
    } else {
      spec_ = factor > 0 ? absl::StrCat("alie(z=", Number(factor), ")") : "alie(z=auto)";
    }
  }
  std::string_view spec() const override { return spec_; }
  bool omniscient() const override { return true; }
  bool needs_rule() const override { return optimize_; }

  absl::Status Apply(const AttackContext& ctx, std::span<float> out) const override {
    const std::string name = spec_.substr(0, spec_.find('('));
    PS_RETURN_IF_ERROR(CheckSizes(name, ctx, out));
    const std::vector<std::span<const float>> rows = Samples(ctx);
    std::vector<double> mean, std;
    MeanAndStd(rows, &mean, kind_ == Kind::kAlie ? &std : nullptr);
    std::vector<double> base(out.size(), 0.0), direction(out.size());
    for (size_t j = 0; j < out.size(); ++j) {
      if (kind_ == Kind::kIpm) {
        direction[j] = -mean[j];
      } else {
        base[j] = mean[j];
        direction[j] = -std[j];
      }
    }
    double factor = factor_;
    if (optimize_) {
      PS_ASSIGN_OR_RETURN(factor, Optimize(name, ctx, mean, base, direction));
    } else if (kind_ == Kind::kAlie && factor <= 0) {
      PS_ASSIGN_OR_RETURN(factor, AlieZ(ctx.num_workers, ctx.num_byzantine));
    }
    Fill(base, direction, factor, out);
    return absl::OkStatus();
  }

 private:
  static void Fill(const std::vector<double>& base, const std::vector<double>& direction,
                   double factor, std::span<float> out) {
    for (size_t j = 0; j < out.size(); ++j) out[j] = static_cast<float>(base[j] + factor * direction[j]);
  }

  // The factor in [2^-4, 2^8] that maximizes |rule(honest + f copies) - mean(honest)|:
  // a grid of powers of four, then a golden-section search between the best point's
  // neighbours; 19 evaluations of the rule (ByzFL's objective; its line search takes
  // 16). Deterministic, so attackers that share the search push what each would find.
  absl::StatusOr<double> Optimize(const std::string& name, const AttackContext& ctx,
                                  const std::vector<double>& mean, const std::vector<double>& base,
                                  const std::vector<double>& direction) const {
    if (ctx.rule == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(name, " needs the configured rule"));
    }
    if (ctx.honest.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(name, " needs the honest gradients"));
    }
    if (ctx.num_byzantine < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, " needs f >= 1"));
    }
    if (ctx.shared_search != nullptr) {
      // Everything the search depends on: the inputs, the rule, n, f and the round.
      const std::vector<std::span<const float>> rows = Samples(ctx);
      uint64_t digest = rows.size();
      for (const auto& r : rows) {
        digest = absl::HashOf(digest, std::string_view(reinterpret_cast<const char*>(r.data()),
                                                       r.size() * sizeof(float)));
      }
      const std::string key = absl::StrCat(spec_, "|", core::AsAbsl(ctx.rule->name()), "|", ctx.num_workers, "|",
                                           ctx.num_byzantine, "|", ctx.round, "|", digest);
      return ctx.shared_search->Get(key, [&] { return Search(name, ctx, mean, base, direction); });
    }
    return Search(name, ctx, mean, base, direction);
  }

  absl::StatusOr<double> Search(const std::string& name, const AttackContext& ctx,
                                const std::vector<double>& mean, const std::vector<double>& base,
                                const std::vector<double>& direction) const {
    const size_t d = mean.size();
    std::vector<float> attack(d), aggregate(d);
    std::vector<const float*> inputs;
    for (const auto& h : ctx.honest) inputs.push_back(h.data());
    for (int i = 0; i < ctx.num_byzantine; ++i) inputs.push_back(attack.data());
    aggregators::AggregationContext agg_ctx;
    agg_ctx.round = ctx.round;
    agg_ctx.pool = ctx.pool;
    absl::Status failure;
    auto objective = [&](double factor) -> double {
      Fill(base, direction, factor, attack);
      absl::Status st = ctx.rule->Aggregate(inputs, aggregate, agg_ctx);
      if (!st.ok()) {
        if (failure.ok()) failure = st;
        return -1;
      }
      double dist = 0;
      for (size_t j = 0; j < d; ++j) {
        const double e = aggregate[j] - mean[j];
        dist += e * e;
      }
      return std::isfinite(dist) ? dist : -1;
    };
    constexpr int kLow = -4, kHigh = 8, kStep = 2, kGoldenSteps = 10;
    std::vector<double> grid, value;
    for (int e = kLow; e <= kHigh; e += kStep) {
      grid.push_back(std::ldexp(1.0, e));
      value.push_back(objective(grid.back()));
    }
    if (!failure.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": the rule refused the inputs: ", failure.message()));
    }
    const size_t best = static_cast<size_t>(std::max_element(value.begin(), value.end()) - value.begin());
    double lo = grid[best == 0 ? 0 : best - 1];
    double hi = grid[std::min(best + 1, grid.size() - 1)];
    double best_x = grid[best];
    double best_v = value[best];
    constexpr double kInvPhi = 0.6180339887498949;
    double a = hi - kInvPhi * (hi - lo), b = lo + kInvPhi * (hi - lo);
    double fa = objective(a), fb = objective(b);
    for (int it = 0; it < kGoldenSteps; ++it) {
      if (fa >= fb) {
        hi = b;
        b = a;
        fb = fa;
        a = hi - kInvPhi * (hi - lo);
        fa = objective(a);
      } else {
        lo = a;
        a = b;
        fa = fb;
        b = lo + kInvPhi * (hi - lo);
        fb = objective(b);
      }
    }
    for (const auto& [x, v] : {std::pair{a, fa}, std::pair{b, fb}}) {
      if (v > best_v) {
        best_v = v;
        best_x = x;
      }
    }
    return best_x;
  }

  Kind kind_;
  double factor_;
  bool optimize_;
  std::string spec_;
};

// ---- the registry ----

using Factory = std::function<absl::StatusOr<std::unique_ptr<Attack>>(const core::StageSpec&)>;

absl::StatusOr<double> PositiveArg(const core::StageArgs& args, std::string_view key, double fallback) {
  return args.Double(key, fallback, 0.0);
}

struct Entry {
  std::string_view name;
  Factory make;
};

const std::vector<Entry>& Registry() {
  static const std::vector<Entry> entries = {
      {"signflip", [](const core::StageSpec& s) -> absl::StatusOr<std::unique_ptr<Attack>> {
         PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(s, {"scale"}));
         PS_ASSIGN_OR_RETURN(const double scale, PositiveArg(args, "scale", 1.0));
         return std::make_unique<SignFlip>(scale);
       }},
      {"ipm", [](const core::StageSpec& s) -> absl::StatusOr<std::unique_ptr<Attack>> {
         PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(s, {"eps"}));
         PS_ASSIGN_OR_RETURN(const double eps, PositiveArg(args, "eps", 0.1));
         return std::make_unique<ScaledAttack>(Kind::kIpm, eps, false);
       }},
      {"alie", [](const core::StageSpec& s) -> absl::StatusOr<std::unique_ptr<Attack>> {
         PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(s, {"z"}));
         double z = 0;  // 0: from n and f
         if (args.Has("z") && !args.Choice("z", {"auto"}, 0).ok()) {
           PS_ASSIGN_OR_RETURN(z, PositiveArg(args, "z", 1.0));
         }
         return std::make_unique<ScaledAttack>(Kind::kAlie, z, false);
       }},
      {"ipm_opt", [](const core::StageSpec& s) -> absl::StatusOr<std::unique_ptr<Attack>> {
         PS_RETURN_IF_ERROR(core::StageArgs::Bind(s, {}).status());
         return std::make_unique<ScaledAttack>(Kind::kIpm, 0, true);
       }},
      {"alie_opt", [](const core::StageSpec& s) -> absl::StatusOr<std::unique_ptr<Attack>> {
         PS_RETURN_IF_ERROR(core::StageArgs::Bind(s, {}).status());
         return std::make_unique<ScaledAttack>(Kind::kAlie, 0, true);
       }},
      {"gaussian", [](const core::StageSpec& s) -> absl::StatusOr<std::unique_ptr<Attack>> {
         PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(s, {"sigma", "mu"}));
         PS_ASSIGN_OR_RETURN(const double sigma, PositiveArg(args, "sigma", 200.0));
         PS_ASSIGN_OR_RETURN(const double mu, args.Double("mu", 0.0, -std::numeric_limits<double>::infinity()));
         return std::make_unique<Gaussian>(mu, sigma);
       }},
      {"labelflip", [](const core::StageSpec& s) -> absl::StatusOr<std::unique_ptr<Attack>> {
         PS_RETURN_IF_ERROR(core::StageArgs::Bind(s, {}).status());
         return std::make_unique<LabelFlip>();
       }},
      {"mimic", [](const core::StageSpec& s) -> absl::StatusOr<std::unique_ptr<Attack>> {
         PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(s, {"worker"}));
         PS_ASSIGN_OR_RETURN(const int64_t w, args.Int("worker", 0, 0, 1 << 20));
         return std::make_unique<Mimic>(w);
       }},
      {"nan", [](const core::StageSpec& s) -> absl::StatusOr<std::unique_ptr<Attack>> {
         PS_RETURN_IF_ERROR(core::StageArgs::Bind(s, {}).status());
         return std::make_unique<NonFinite>(true);
       }},
      {"inf", [](const core::StageSpec& s) -> absl::StatusOr<std::unique_ptr<Attack>> {
         PS_RETURN_IF_ERROR(core::StageArgs::Bind(s, {}).status());
         return std::make_unique<NonFinite>(false);
       }},
  };
  return entries;
}

}  // namespace

absl::StatusOr<double> SharedSearch::Get(const std::string& key,
                                         const std::function<absl::StatusOr<double>()>& search) {
  std::promise<absl::StatusOr<double>> mine;
  std::shared_future<absl::StatusOr<double>> answer;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      ++reused_;
      answer = it->second;
    } else {
      ++searches_;
      entries_.emplace(key, mine.get_future().share());
      order_.push_back(key);
      // A waiter holds its own copy of the future: dropping the entry is safe.
      while (order_.size() > capacity_) {
        entries_.erase(order_.front());
        order_.pop_front();
      }
    }
  }
  if (answer.valid()) return answer.get();
  absl::StatusOr<double> found = search();
  mine.set_value(found);
  return found;
}

uint64_t SharedSearch::searches() const {
  absl::MutexLock lock(&mu_);
  return searches_;
}

uint64_t SharedSearch::reused() const {
  absl::MutexLock lock(&mu_);
  return reused_;
}

absl::StatusOr<std::unique_ptr<Attack>> MakeAttack(std::string_view spec) {
  PS_ASSIGN_OR_RETURN(std::vector<core::StageSpec> stages, core::ParseSpec(spec, "attack spec"));
  if (stages.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("attack spec '", core::AsAbsl(spec),
                                                   "': one attack, not ", stages.size(), " stages"));
  }
  for (const Entry& e : Registry()) {
    if (e.name != stages[0].name) continue;
    auto attack = e.make(stages[0]);
    if (!attack.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("attack spec '", core::AsAbsl(spec), "': ", attack.status().message()));
    }
    return attack;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown attack '", stages[0].name,
                                                 "'; known: ", absl::StrJoin(AttackNames(), ", ")));
}

std::vector<std::string> AttackNames() {
  std::vector<std::string> names;
  for (const Entry& e : Registry()) names.emplace_back(e.name);
  return names;
}

absl::StatusOr<double> AlieZ(int num_workers, int num_byzantine) {
  if (num_byzantine < 1 || num_byzantine >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("alie: needs 1 <= f < n, got n = ", num_workers,
                                                   ", f = ", num_byzantine));
  }
  const int s = num_workers / 2 + 1 - num_byzantine;
  if (s < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "alie: with f = ", num_byzantine, " of n = ", num_workers,
        " the attackers are a majority (s = floor(n / 2 + 1) - f < 1): z is unbounded"));
  }
  const double p = static_cast<double>(num_workers - s) / num_workers;
  // Phi^-1(p) by bisection on Phi(x) = erfc(-x / sqrt 2) / 2, to 1e-12.
  double lo = -10, hi = 10;
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

}  // namespace ps::attacks
