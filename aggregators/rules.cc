// The rule stages (the last stage of a spec): the coordinate-wise rules, which hand a
// CoordinateRule to Apply(), and the distance-based rules, which turn the Gram matrix
// into weights (gram_rules_internal.h). Definitions: docs/aggregators.md, "Rules".
#include <algorithm>
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

class GeometricMedian final : public RuleStage {
 public:
  GeometricMedian(std::string spec, WeiszfeldOptions options)
      : spec_(std::move(spec)), options_(options) {}
  const std::string& spec() const override { return spec_; }
  bool NeedsGram() const override { return true; }
  size_t MinInputs() const override { return 1; }
  std::string Bound() const override { return "n >= 1"; }
  absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t) const override {
    const std::vector<double> beta = GeometricMedianWeights(*gram, options_);
    Tail tail;
    tail.mixing = Mixing(1, m);
    std::copy(beta.begin(), beta.end(), tail.mixing.values.begin());
    tail.description = "Weiszfeld weights";
    return tail;
  }

 private:
  const std::string spec_;
  const WeiszfeldOptions options_;
};

class CenteredClipping final : public RuleStage {
 public:
  CenteredClipping(std::string spec, double tau, int iterations)
      : spec_(std::move(spec)), tau_(tau), iterations_(iterations) {}
  const std::string& spec() const override { return spec_; }
  bool NeedsGram() const override { return true; }
  size_t StateRows() const override { return 1; }
  size_t MinInputs() const override { return 1; }
  std::string Bound() const override { return "n >= 1"; }
  absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t) const override {
    const std::vector<double> w = CenteredClippingWeights(*gram, tau_, iterations_);
    Tail tail;
    tail.mixing = Mixing(1, m + 1);
    std::copy(w.begin(), w.end(), tail.mixing.values.begin());
    tail.description = "clipped steps from the previous centre";
    return tail;
  }

 private:
  const std::string spec_;
  const double tau_;
  const int iterations_;
};

class Mda final : public RuleStage {
 public:
  Mda(std::string spec, size_t f, uint64_t max_subsets)
      : spec_(std::move(spec)), f_(f), max_subsets_(max_subsets) {}
  const std::string& spec() const override { return spec_; }
  bool NeedsGram() const override { return true; }
  size_t MinInputs() const override { return LinearBound(2, f_, 1); }
  std::string Bound() const override { return "n >= 2f + 1"; }
  absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t) const override {
    PS_ASSIGN_OR_RETURN(std::vector<size_t> chosen,
                        MdaSubset(SquaredDistancesFromGram(*gram), f_, max_subsets_));
    Tail tail;
    tail.mixing = AverageOf(chosen, m);
    tail.description = Indices(chosen);
    return tail;
  }

 private:
  const std::string spec_;
  const size_t f_;
  const uint64_t max_subsets_;
};

absl::StatusOr<KrumNeighbours> Neighbours(const StageArgs& args, KrumNeighbours fallback) {
  PS_ASSIGN_OR_RETURN(size_t i, args.Choice("neighbours", {"paper", "byzfl"},
                                            fallback == KrumNeighbours::kByzFL ? 1 : 0));
  return i == 1 ? KrumNeighbours::kByzFL : KrumNeighbours::kPaper;
}

// MoNNA (Farhadkhani et al., ICML 2023): the mean of the m - f inputs nearest to input
// `idx` (itself included), the input trusted to be honest.
class Monna final : public RuleStage {
 public:
  Monna(std::string spec, size_t f, size_t idx) : spec_(std::move(spec)), f_(f), idx_(idx) {}
  const std::string& spec() const override { return spec_; }
  bool NeedsGram() const override { return true; }
  size_t MinInputs() const override { return std::max(LinearBound(2, f_, 1), idx_ + 1); }
  std::string Bound() const override {
    return idx_ == 0 ? "n >= 2f + 1" : absl::StrCat("n >= 2f + 1 and n > idx = ", idx_);
  }
  absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t) const override {
    if (idx_ >= m) {
      return absl::FailedPreconditionError(
          absl::StrCat("monna: the trusted input idx = ", idx_, " is not among the ", m, " inputs"));
    }
    const Mixing all = NnmMixing(SquaredDistancesFromGram(*gram), f_);
    std::vector<size_t> chosen;
    for (size_t j = 0; j < m; ++j) {
      if (all.at(idx_, j) != 0.0) chosen.push_back(j);
    }
    Tail tail;
    tail.mixing = AverageOf(chosen, m);
    tail.description = Indices(chosen);
    return tail;
  }

 private:
  const std::string spec_;
  const size_t f_;
  const size_t idx_;
};

class Caf final : public RuleStage {
 public:
  Caf(std::string spec, size_t f) : spec_(std::move(spec)), f_(f) {}
  const std::string& spec() const override { return spec_; }
  bool NeedsGram() const override { return true; }
  size_t MinInputs() const override { return LinearBound(2, f_, 1); }
  std::string Bound() const override { return "n >= 2f + 1"; }
  absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t) const override {
    const std::vector<double> w = CafWeights(*gram, f_);
    Tail tail;
    tail.mixing = Mixing(1, m);
    std::copy(w.begin(), w.end(), tail.mixing.values.begin());
    tail.description = "filtered weights";
    return tail;
  }

 private:
  const std::string spec_;
  const size_t f_;
};

class Smea final : public RuleStage {
 public:
  Smea(std::string spec, size_t f, uint64_t max_subsets)
      : spec_(std::move(spec)), f_(f), max_subsets_(max_subsets) {}
  const std::string& spec() const override { return spec_; }
  bool NeedsGram() const override { return true; }
  size_t MinInputs() const override { return LinearBound(2, f_, 1); }
  std::string Bound() const override { return "n >= 2f + 1"; }
  absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t) const override {
    PS_ASSIGN_OR_RETURN(std::vector<size_t> chosen, SmeaSubset(*gram, f_, max_subsets_));
    Tail tail;
    tail.mixing = AverageOf(chosen, m);
    tail.description = Indices(chosen);
    return tail;
  }

 private:
  const std::string spec_;
  const size_t f_;
  const uint64_t max_subsets_;
};

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
    return std::make_unique<GeometricMedian>(args.Canonical(), w);
  }
  if (name == "centered_clipping") {
    PS_ASSIGN_OR_RETURN(StageArgs args, StageArgs::Bind(spec, {"tau", "iterations"}));
    PS_ASSIGN_OR_RETURN(double tau, args.Double("tau", options.clipping_tau, 0.0));
    PS_ASSIGN_OR_RETURN(int64_t it, args.Int("iterations", options.clipping_iterations, 1, 100000));
    if (!(tau > 0.0) || it < 1) {
      return absl::InvalidArgumentError("centered_clipping: needs tau > 0 and iterations >= 1");
    }
    return std::make_unique<CenteredClipping>(args.Canonical(), tau, static_cast<int>(it));
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
    if (name == "smea") return std::make_unique<Smea>(args.Canonical(), f, static_cast<uint64_t>(max));
    return std::make_unique<Mda>(args.Canonical(), f, static_cast<uint64_t>(max));
  }
  if (name == "caf") {
    PS_ASSIGN_OR_RETURN(StageArgs args, StageArgs::Bind(spec, {}));
    return std::make_unique<Caf>(args.Canonical(), f);
  }
  if (name == "monna") {
    PS_ASSIGN_OR_RETURN(StageArgs args, StageArgs::Bind(spec, {"idx"}));
    PS_ASSIGN_OR_RETURN(int64_t idx, args.Int("idx", 0, 0, INT32_MAX));
    if (idx >= options.num_workers) {
      return absl::InvalidArgumentError(absl::StrCat("monna: idx = ", idx,
                                                     " must name one of the n = ",
                                                     options.num_workers, " inputs (0 to n - 1)"));
    }
    return std::make_unique<Monna>(args.Canonical(), f, static_cast<size_t>(idx));
  }
  return absl::NotFoundError(name);
}

}  // namespace ps::aggregators::internal
