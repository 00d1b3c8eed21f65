// The rule stages (the last stage of a spec): the coordinate-wise rules, which hand a
// CoordinateRule to Apply(), and the distance-based rules, which turn the Gram matrix
// into weights (gram_rules_internal.h). Definitions: docs/aggregators.md, "Rules".
#include <algorithm>
#include <functional>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregators/krum_internal.h"
#include "aggregators/spectral_internal.h"
#include "aggregators/stage_internal.h"
#include "core/status.h"

namespace ps::aggregators::internal {
namespace {

using Kind = CoordinateRule::Kind;

std::string Indices(const std::vector<size_t>& v) {
  return absl::StrCat("inputs {", absl::StrJoin(v, ", "), "}");
}

// A 1 x m row averaging the given rows.
Mixing AverageOf(std::vector<size_t> chosen, size_t cols) {
  Mixing m(1, cols);
  for (size_t i : chosen) m.at(0, i) = 1.0 / static_cast<double>(chosen.size());
  return m;
}

class CoordinateStage final : public RuleStage {
 public:
  CoordinateStage(std::string spec, CoordinateRule rule, size_t min_inputs, std::string bound)
      : spec_(std::move(spec)), rule_(rule), min_(min_inputs), bound_(std::move(bound)) {}
  const std::string& spec() const override { return spec_; }
  bool NeedsGram() const override { return false; }
  // The sign vote's scale is a mean over all coordinates, zeros included.
  bool ZeroPreserving() const override { return rule_.kind != CoordinateRule::Kind::kSignVote; }
  size_t MinInputs() const override { return min_; }
  std::string Bound() const override { return bound_; }
  absl::StatusOr<Tail> Finish(size_t, const SquareMatrix*, uint64_t) const override {
    Tail tail;
    tail.coordinate = rule_;
    tail.description = "coordinate-wise";
    return tail;
  }

 private:
  const std::string spec_;
  const CoordinateRule rule_;
  const size_t min_;
  const std::string bound_;
};

// Krum, Multi-Krum and Bulyan share the neighbour variant and the 2f + 3 style bound.
class KrumFamily : public RuleStage {
 public:
  KrumFamily(std::string spec, size_t f, KrumNeighbours variant)
      : spec_(std::move(spec)), f_(f), variant_(variant) {}
  const std::string& spec() const override { return spec_; }
  bool NeedsGram() const override { return true; }

 protected:
  std::vector<size_t> Ranking(const SquareMatrix& gram, size_t m) const {
    const SquareMatrix dist = SquaredDistancesFromGram(gram);
    return RankByScore(KrumScores(dist, KrumNeighbourCount(m, f_, variant_)));
  }
  const std::string spec_;
  const size_t f_;
  const KrumNeighbours variant_;
};

class Krum final : public KrumFamily {
 public:
  using KrumFamily::KrumFamily;
  size_t MinInputs() const override { return LinearBound(2, f_, 3); }
  std::string Bound() const override { return "n >= 2f + 3"; }
  absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t) const override {
    const size_t best = Ranking(*gram, m).front();
    Tail tail;
    tail.mixing = Mixing(1, m);
    tail.mixing.at(0, best) = 1.0;
    tail.description = absl::StrCat("input ", best);
    return tail;
  }
};

class MultiKrum final : public KrumFamily {
 public:
  MultiKrum(std::string spec, size_t f, KrumNeighbours variant, size_t m)
      : KrumFamily(std::move(spec), f, variant), m_(m) {}
  size_t MinInputs() const override { return LinearBound(2, f_, 3); }
  std::string Bound() const override { return "n >= 2f + 3"; }
  absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t) const override {
    const size_t keep = m_ == 0 ? m - f_ : m_;
    if (keep > m) {
      return absl::InvalidArgumentError(absl::StrCat(
          "multi_krum: m = ", keep, " inputs to average but only ", m, " inputs given"));
    }
    std::vector<size_t> chosen = Ranking(*gram, m);
    chosen.resize(keep);
    std::sort(chosen.begin(), chosen.end());
    Tail tail;
    tail.mixing = AverageOf(chosen, m);
    tail.description = Indices(chosen);
    return tail;
  }

 private:
  const size_t m_;
};

class Bulyan final : public KrumFamily {
 public:
  using KrumFamily::KrumFamily;
  size_t MinInputs() const override { return LinearBound(4, f_, 3); }
  std::string Bound() const override { return "n >= 4f + 3"; }
  absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t) const override {
    std::vector<size_t> chosen = BulyanSelection(SquaredDistancesFromGram(*gram), f_, variant_);
    std::sort(chosen.begin(), chosen.end());
    Tail tail;
    tail.mixing = Mixing(chosen.size(), m);
    for (size_t r = 0; r < chosen.size(); ++r) tail.mixing.at(r, chosen[r]) = 1.0;
    CoordinateRule rule;
    rule.kind = Kind::kNearestMean;
    rule.centre = CoordinateRule::Centre::kMedian;
    rule.drop = 2 * f_;
    tail.coordinate = rule;
    tail.description = Indices(chosen);
    return tail;
  }
};

// A rule that turns the Gram matrix of the m inputs and its state rows into one row of
// weights over both (geometric median, centered clipping, CAF).
class WeightsRule final : public RuleStage {
 public:
  using Weights = std::function<std::vector<double>(const SquareMatrix& gram)>;
  WeightsRule(std::string spec, size_t min_inputs, std::string bound, size_t state_rows,
              std::string description, Weights weights)
      : spec_(std::move(spec)),
        min_(min_inputs),
        bound_(std::move(bound)),
        state_rows_(state_rows),
        description_(std::move(description)),
        weights_(std::move(weights)) {}
  const std::string& spec() const override { return spec_; }
  bool NeedsGram() const override { return true; }
  size_t StateRows() const override { return state_rows_; }
  size_t MinInputs() const override { return min_; }
  std::string Bound() const override { return bound_; }
  absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t) const override {
    const std::vector<double> w = weights_(*gram);
    Tail tail;
    tail.mixing = Mixing(1, m + state_rows_);
    std::copy(w.begin(), w.end(), tail.mixing.values.begin());
    tail.description = description_;
    return tail;
  }

 private:
  const std::string spec_;
  const size_t min_;
  const std::string bound_;
  const size_t state_rows_;
  const std::string description_;
  const Weights weights_;
};

// A rule that averages the inputs it chooses from their Gram matrix (MDA, SMEA, MoNNA).
class SubsetRule final : public RuleStage {
 public:
  using Choose =
      std::function<absl::StatusOr<std::vector<size_t>>(size_t m, const SquareMatrix& gram)>;
  SubsetRule(std::string spec, size_t min_inputs, std::string bound, Choose choose)
      : spec_(std::move(spec)), min_(min_inputs), bound_(std::move(bound)), choose_(std::move(choose)) {}
  const std::string& spec() const override { return spec_; }
  bool NeedsGram() const override { return true; }
  size_t MinInputs() const override { return min_; }
  std::string Bound() const override { return bound_; }
  absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t) const override {
    PS_ASSIGN_OR_RETURN(std::vector<size_t> chosen, choose_(m, *gram));
    Tail tail;
    tail.mixing = AverageOf(chosen, m);
    tail.description = Indices(chosen);
    return tail;
  }

 private:
  const std::string spec_;
  const size_t min_;
  const std::string bound_;
  const Choose choose_;
};

absl::StatusOr<KrumNeighbours> Neighbours(const StageArgs& args, KrumNeighbours fallback) {
  PS_ASSIGN_OR_RETURN(size_t i, args.Choice("neighbours", {"paper", "byzfl"},
                                            fallback == KrumNeighbours::kByzFL ? 1 : 0));
  return i == 1 ? KrumNeighbours::kByzFL : KrumNeighbours::kPaper;
}

}  // namespace

std::vector<std::string> RuleStageNames() {
  return {"mean",      "median", "trimmed_mean", "meamed",           "phocas",           "krum",
          "multi_krum", "bulyan", "geometric_median", "centered_clipping", "mda", "sign_majority",
          "monna",     "caf",    "smea"};
}

absl::StatusOr<std::unique_ptr<RuleStage>> MakeRuleStage(const StageSpec& spec,
                                                         const AggregatorOptions& options) {
  const std::string& name = spec.name;
  const size_t f = static_cast<size_t>(options.num_byzantine);
  const auto coordinate = [&](std::vector<std::string> keys,
                              auto configure) -> absl::StatusOr<std::unique_ptr<RuleStage>> {
    PS_ASSIGN_OR_RETURN(StageArgs args, StageArgs::Bind(spec, std::move(keys)));
    CoordinateRule rule;
    size_t min = 1;
    std::string bound = "n >= 1";
    PS_RETURN_IF_ERROR(configure(args, rule, min, bound));
    return std::make_unique<CoordinateStage>(args.Canonical(), rule, min, std::move(bound));
  };
  const auto f_rule = [&](CoordinateRule& rule, size_t& min, std::string& bound) {
    min = LinearBound(2, f, 1);
    bound = "n >= 2f + 1";
    rule.trim = f;
    rule.drop = f;
  };
  if (name == "sign_majority") {
    return coordinate({}, [&](const StageArgs&, CoordinateRule& r, size_t& min, std::string& bound) {
      r.kind = Kind::kSignVote;
      min = LinearBound(2, f, 1);  // the median of the scales
      bound = "n >= 2f + 1";
      return absl::OkStatus();
    });
  }
  if (name == "mean") {
    return coordinate({}, [](const StageArgs&, CoordinateRule& r, size_t&, std::string&) {
      r.kind = Kind::kMean;
      return absl::OkStatus();
    });
  }
  if (name == "median") {
    return coordinate({"even"}, [&](const StageArgs& a, CoordinateRule& r, size_t&, std::string&)
                                    -> absl::Status {
      r.kind = Kind::kMedian;
      PS_ASSIGN_OR_RETURN(size_t even,
                          a.Choice("even", {"midpoint", "lower", "upper"},
                                   static_cast<size_t>(options.even_median)));
      r.even_median = static_cast<EvenMedian>(even);
      return absl::OkStatus();
    });
  }
  if (name == "trimmed_mean" || name == "meamed" || name == "phocas") {
    return coordinate({}, [&](const StageArgs&, CoordinateRule& r, size_t& min, std::string& bound) {
      f_rule(r, min, bound);
      if (name == "trimmed_mean") {
        r.kind = Kind::kTrimmedMean;
      } else {
        r.kind = Kind::kNearestMean;
        r.centre = name == "meamed" ? CoordinateRule::Centre::kMedian
                                    : CoordinateRule::Centre::kTrimmedMean;
      }
      return absl::OkStatus();
    });
  }
  if (name == "krum" || name == "bulyan") {
    PS_ASSIGN_OR_RETURN(StageArgs args, StageArgs::Bind(spec, {"neighbours"}));
    PS_ASSIGN_OR_RETURN(KrumNeighbours variant, Neighbours(args, options.krum_neighbours));
    if (name == "krum") return std::make_unique<Krum>(args.Canonical(), f, variant);
    return std::make_unique<Bulyan>(args.Canonical(), f, variant);
  }
  if (name == "multi_krum") {
    PS_ASSIGN_OR_RETURN(StageArgs args, StageArgs::Bind(spec, {"m", "neighbours"}));
    PS_ASSIGN_OR_RETURN(KrumNeighbours variant, Neighbours(args, options.krum_neighbours));
    if (options.multi_krum_m < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "multi_krum: m (multi_krum_m) must be >= 1, or 0 for n - f; got ", options.multi_krum_m));
    }
    if (options.multi_krum_m > options.num_workers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "multi_krum: m (multi_krum_m) = ", options.multi_krum_m, " exceeds n = ",
          options.num_workers, "; it must lie in [1, n], or be 0 for n - f"));
    }
    PS_ASSIGN_OR_RETURN(int64_t m, args.Int("m", options.multi_krum_m, 0, options.num_workers));
    return std::make_unique<MultiKrum>(args.Canonical(), f, variant, static_cast<size_t>(m));
  }
  if (name == "geometric_median") {
    PS_ASSIGN_OR_RETURN(StageArgs args, StageArgs::Bind(spec, {"nu", "iterations", "tolerance"}));
    WeiszfeldOptions w;
    PS_ASSIGN_OR_RETURN(w.nu, args.Double("nu", options.weiszfeld_nu, 0.0));
    PS_ASSIGN_OR_RETURN(int64_t it, args.Int("iterations", options.weiszfeld_iterations, 1, 100000));
    w.iterations = static_cast<int>(it);
    PS_ASSIGN_OR_RETURN(w.tolerance, args.Double("tolerance", options.weiszfeld_tolerance, -1.0));
    if (!(w.nu > 0.0) || w.iterations < 1 || !(w.tolerance >= 0.0)) {
      return absl::InvalidArgumentError(
          "geometric_median: needs nu > 0, iterations >= 1 and tolerance >= 0");
    }
    return std::make_unique<WeightsRule>(
        args.Canonical(), 1, "n >= 1", 0, "Weiszfeld weights",
        [w](const SquareMatrix& gram) { return GeometricMedianWeights(gram, w); });
  }
  if (name == "centered_clipping") {
    PS_ASSIGN_OR_RETURN(StageArgs args, StageArgs::Bind(spec, {"tau", "iterations"}));
    PS_ASSIGN_OR_RETURN(double tau, args.Double("tau", options.clipping_tau, 0.0));
    PS_ASSIGN_OR_RETURN(int64_t it, args.Int("iterations", options.clipping_iterations, 1, 100000));
    if (!(tau > 0.0) || it < 1) {
      return absl::InvalidArgumentError("centered_clipping: needs tau > 0 and iterations >= 1");
    }
    // One state row: the previous round's centre.
    return std::make_unique<WeightsRule>(
        args.Canonical(), 1, "n >= 1", 1, "clipped steps from the previous centre",
        [tau, it](const SquareMatrix& gram) {
          return CenteredClippingWeights(gram, tau, static_cast<int>(it));
        });
  }
  if (name == "mda" || name == "smea") {
    // Exhaustive searches over the (n - f)-subsets: refused up front when there are more
    // than max_subsets of them.
    PS_ASSIGN_OR_RETURN(StageArgs args, StageArgs::Bind(spec, {"max_subsets"}));
    PS_ASSIGN_OR_RETURN(int64_t max, args.Int("max_subsets",
                                              static_cast<int64_t>(options.mda_max_subsets), 1,
                                              INT64_MAX));
    const uint64_t count = SubsetCount(static_cast<size_t>(options.num_workers), f);
    if (count > static_cast<uint64_t>(max)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": C(", options.num_workers, ", ", f, ") = ", count,
                       " subsets exceeds the limit of ", max, "; lower f or raise max_subsets (",
                       name, "(max_subsets=N))"));
    }
    const uint64_t limit = static_cast<uint64_t>(max);
    SubsetRule::Choose choose;
    if (name == "smea") {
      choose = [f, limit](size_t, const SquareMatrix& gram) { return SmeaSubset(gram, f, limit); };
    } else {
      choose = [f, limit](size_t, const SquareMatrix& gram) {
        return MdaSubset(SquaredDistancesFromGram(gram), f, limit);
      };
    }
    return std::make_unique<SubsetRule>(args.Canonical(), LinearBound(2, f, 1), "n >= 2f + 1",
                                        std::move(choose));
  }
  if (name == "caf") {
    PS_ASSIGN_OR_RETURN(StageArgs args, StageArgs::Bind(spec, {}));
    return std::make_unique<WeightsRule>(
        args.Canonical(), LinearBound(2, f, 1), "n >= 2f + 1", 0, "filtered weights",
        [f](const SquareMatrix& gram) { return CafWeights(gram, f); });
  }
  if (name == "monna") {
    PS_ASSIGN_OR_RETURN(StageArgs args, StageArgs::Bind(spec, {"idx"}));
    PS_ASSIGN_OR_RETURN(int64_t idx, args.Int("idx", 0, 0, INT32_MAX));
    if (idx >= options.num_workers) {
      return absl::InvalidArgumentError(absl::StrCat("monna: idx = ", idx,
                                                     " must name one of the n = ",
                                                     options.num_workers, " inputs (0 to n - 1)"));
    }
    // MoNNA (Farhadkhani et al., ICML 2023): the mean of the m - f inputs nearest to
    // input idx (itself included), the input trusted to be honest.
    const size_t trusted = static_cast<size_t>(idx);
    return std::make_unique<SubsetRule>(
        args.Canonical(), std::max(LinearBound(2, f, 1), trusted + 1),
        trusted == 0 ? "n >= 2f + 1" : absl::StrCat("n >= 2f + 1 and n > idx = ", trusted),
        [f, trusted](size_t m, const SquareMatrix& gram) -> absl::StatusOr<std::vector<size_t>> {
          if (trusted >= m) {
            return absl::FailedPreconditionError(absl::StrCat(
                "monna: the trusted input idx = ", trusted, " is not among the ", m, " inputs"));
          }
          const Mixing all = NnmMixing(SquaredDistancesFromGram(gram), f);
          std::vector<size_t> chosen;
          for (size_t j = 0; j < m; ++j) {
            if (all.at(trusted, j) != 0.0) chosen.push_back(j);
          }
          return chosen;
        });
  }
  return absl::NotFoundError(name);
}

}  // namespace ps::aggregators::internal
