// MakeAggregator: parses a spec into its stage chain, checks f and n against the
// chain's bound (walked back from the rule through the pre-aggregators) and picks the
// device; with the names and option parsers the flags and config use.
#include <algorithm>
#include <climits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "aggregators/aggregator.h"
#include "aggregators/device_internal.h"
#include "aggregators/stage_internal.h"
#include "core/status.h"

namespace ps::aggregators {
namespace {

using core::AsAbsl;

// Keeps every bound (up to 4f + 3, Bulyan's, times a bucket size) within int.
constexpr int kMaxByzantine = (INT_MAX - 3) / 4;

}  // namespace

absl::StatusOr<std::unique_ptr<Aggregator>> MakeAggregator(std::string_view spec,
                                                           const AggregatorOptions& options) {
  const std::string known =
      absl::StrCat("known rules: ", absl::StrJoin(AggregatorNames(), ", "),
                   "; pre-aggregators: ", absl::StrJoin(PreAggregatorNames(), ", "));
  PS_ASSIGN_OR_RETURN(std::vector<internal::StageSpec> stages,
                      core::ParseSpec(spec, "aggregator spec"));
  const std::string& last = stages.back().name;
  if (options.num_byzantine < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(last, ": f (num_byzantine) must be >= 0, got ", options.num_byzantine));
  }
  if (options.num_byzantine > kMaxByzantine) {
    return absl::InvalidArgumentError(absl::StrCat(last,
                                                   ": f (num_byzantine) = ", options.num_byzantine,
                                                   " is too large (at most ", kMaxByzantine, ")"));
  }
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(last, ": n (num_workers) must be >= 1, got ", options.num_workers));
  }
  if (last == "sign_majority" && stages.size() > 1) {
    // The vote counts the signs workers pushed; mixed rows have no such signs.
    return absl::InvalidArgumentError(absl::StrCat(
        "sign_majority votes on the pushes as they are; it cannot follow pre-aggregators ('",
        AsAbsl(spec), "')"));
  }
  auto p = std::make_unique<internal::Pipeline>();
  std::vector<std::string> canonical;
  for (size_t i = 0; i + 1 < stages.size(); ++i) {
    absl::StatusOr<std::unique_ptr<internal::PreStage>> pre =
        internal::MakePreStage(stages[i], options);
    if (!pre.ok()) {
      if (pre.status().code() == absl::StatusCode::kNotFound) {
        return absl::InvalidArgumentError(absl::StrCat("unknown pre-aggregator '", stages[i].name,
                                                       "' in '", AsAbsl(spec), "'; ", known));
      }
      return pre.status();
    }
    canonical.push_back((*pre)->spec());
    p->pre.push_back(*std::move(pre));
  }
  absl::StatusOr<std::unique_ptr<internal::RuleStage>> rule =
      internal::MakeRuleStage(stages.back(), options);
  if (!rule.ok()) {
    if (rule.status().code() == absl::StatusCode::kNotFound) {
      const std::vector<std::string> pre_names = PreAggregatorNames();
      const bool is_pre = std::find(pre_names.begin(), pre_names.end(), last) != pre_names.end();
      return absl::InvalidArgumentError(
          is_pre ? absl::StrCat("'", AsAbsl(spec), "' ends with the pre-aggregator '", last,
                                "'; a spec ends with a rule (",
                                absl::StrJoin(AggregatorNames(), ", "), ")")
                 : absl::StrCat("unknown aggregation rule '", last, "'; ", known));
    }
    return rule.status();
  }
  canonical.push_back((*rule)->spec());
  p->rule = *std::move(rule);
  p->spec = absl::StrJoin(canonical, "+");
  p->needs_gram = p->rule->NeedsGram();
  for (const auto& pre : p->pre) p->needs_gram |= pre->NeedsGram();
  // Refused above after pre-aggregators, so the vote is on the pushes themselves.
  p->votes_on_signs = last == "sign_majority";
  p->averages_inputs = p->pre.empty() && p->rule->spec() == "mean" && p->rule->StateRows() == 0;

  // The least n, walking back from the rule; the bound text follows the binding stage.
  size_t need = p->rule->MinInputs();
  std::string bound = p->rule->Bound();
  for (size_t i = p->pre.size(); i-- > 0;) {
    const internal::PreStage& stage = *p->pre[i];
    const size_t in = stage.InputsFor(need);
    if (in != need) {
      // "n >= 2f + 3" becomes "ceil(n / 2) >= 2f + 3" behind bucketing(2).
      bound = absl::StrReplaceAll(bound, {{"n ", absl::StrCat(stage.RowsExpression(), " ")}});
    }
    need = in;
    if (stage.MinInputs() > need) {
      need = stage.MinInputs();
      bound = stage.Bound();
    }
  }
  p->min_inputs = need;
  p->bound = bound;
  if (options.device == core::Device::kCuda) {
    absl::StatusOr<std::shared_ptr<const internal::DeviceBackend>> device =
        internal::MakeCudaBackend();
    if (device.ok()) {
      p->device = *std::move(device);
    } else {
      p->device_note = absl::StrCat("device=cuda requested but unavailable (",
                                    device.status().message(), "); aggregating on the CPU");
    }
  }
  if (static_cast<size_t>(options.num_workers) < p->min_inputs) {
    return absl::InvalidArgumentError(absl::StrCat(p->spec, " needs ", p->bound, " = ",
                                                   p->min_inputs, ", got n = ", options.num_workers,
                                                   " (f = ", options.num_byzantine, ")"));
  }
  return internal::Pipeline::Wrap(std::move(p));
}

std::vector<std::string> AggregatorNames() { return internal::RuleStageNames(); }

std::string_view KrumNeighboursName(KrumNeighbours k) {
  return k == KrumNeighbours::kByzFL ? "byzfl" : "paper";
}

std::string_view EvenMedianName(EvenMedian m) {
  switch (m) {
    case EvenMedian::kLower:
      return "lower";
    case EvenMedian::kUpper:
      return "upper";
    case EvenMedian::kMidpoint:
      break;
  }
  return "midpoint";
}

absl::StatusOr<KrumNeighbours> ParseKrumNeighbours(std::string_view text) {
  if (text == "paper") return KrumNeighbours::kPaper;
  if (text == "byzfl") return KrumNeighbours::kByzFL;
  return absl::InvalidArgumentError(absl::StrCat("krum neighbours '", AsAbsl(text),
                                                 "': want paper (n - f - 2) or byzfl (n - f - 1)"));
}

absl::StatusOr<EvenMedian> ParseEvenMedian(std::string_view text) {
  for (EvenMedian m : {EvenMedian::kMidpoint, EvenMedian::kLower, EvenMedian::kUpper}) {
    if (text == EvenMedianName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("even median '", AsAbsl(text), "': want midpoint, lower or upper"));
}
std::vector<std::string> PreAggregatorNames() { return internal::PreStageNames(); }

}  // namespace ps::aggregators
