#include "aggregators/aggregator.h"

#include <array>
#include <climits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregators/aggregator_internal.h"
#include "core/status.h"

namespace ps::aggregators {
namespace {

struct RuleEntry {
  std::string_view name;
  absl::StatusOr<std::unique_ptr<Aggregator>> (*make)(const AggregatorOptions&);
};

// The registry, in the order AggregatorNames() reports.
constexpr std::array<RuleEntry, 5> kRules = {{
    {"mean", &internal::MakeMean},
    {"median", &internal::MakeMedian},
    {"trimmed_mean", &internal::MakeTrimmedMean},
    {"krum", &internal::MakeKrum},
    {"multi_krum", &internal::MakeMultiKrum},
}};

// Keeps every bound (up to 4f + 3, Bulyan's) within int.
constexpr int kMaxByzantine = (INT_MAX - 3) / 4;

}  // namespace

namespace internal {

absl::Status CheckAggregateArgs(const Aggregator& rule, std::span<const float* const> inputs,
                                std::span<float> out) {
  const auto k = static_cast<long long>(inputs.size());
  if (k < rule.MinInputs()) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(rule.name()), " needs ",
                                                   ToAbsl(rule.Bound()), " = ", rule.MinInputs(),
                                                   " inputs, got ", k));
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(rule.name()), ": empty output (0 coordinates) for ", k, " inputs"));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(ToAbsl(rule.name()), ": input ", i, " of ", k, " is null"));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<Aggregator>> MakeAggregator(std::string_view name,
                                                           const AggregatorOptions& options) {
  const RuleEntry* entry = nullptr;
  for (const RuleEntry& e : kRules) {
    if (e.name == name) entry = &e;
  }
  if (entry == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown aggregation rule '", internal::ToAbsl(name),
                     "'; known rules: ", absl::StrJoin(AggregatorNames(), ", ")));
  }
  if (options.num_byzantine < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        internal::ToAbsl(name), ": f (num_byzantine) must be >= 0, got ", options.num_byzantine));
  }
  if (options.num_byzantine > kMaxByzantine) {
    return absl::InvalidArgumentError(absl::StrCat(internal::ToAbsl(name),
                                                   ": f (num_byzantine) = ", options.num_byzantine,
                                                   " is too large (at most ", kMaxByzantine, ")"));
  }
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        internal::ToAbsl(name), ": n (num_workers) must be >= 1, got ", options.num_workers));
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Aggregator> rule, entry->make(options));
  if (options.num_workers < rule->MinInputs()) {
    return absl::InvalidArgumentError(
        absl::StrCat(internal::ToAbsl(name), " needs ", internal::ToAbsl(rule->Bound()), " = ",
                     rule->MinInputs(), ", got n = ", options.num_workers,
                     " (f = ", options.num_byzantine, ")"));
  }
  return rule;
}

std::vector<std::string> AggregatorNames() {
  std::vector<std::string> names;
  names.reserve(kRules.size());
  for (const RuleEntry& e : kRules) names.emplace_back(e.name);
  return names;
}

}  // namespace ps::aggregators
