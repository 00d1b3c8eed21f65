// Pieces shared by the rule implementations and the factory: argument checks and one
// Make function per rule. Not part of the public interface.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "aggregators/aggregator.h"

namespace ps::aggregators::internal {

// What every Aggregate() checks first: at least rule.MinInputs() inputs, none null,
// and a non-empty output. INVALID_ARGUMENT names the rule and the counts.
absl::Status CheckAggregateArgs(const Aggregator& rule, std::span<const float* const> inputs,
                                std::span<float> out);

// Debian's abseil keeps its own string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0), so
// absl::StrCat does not take a std::string_view directly.
inline absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }

// a * f + b, computed in 64 bits: MakeAggregator() caps f so that every bound fits in
// an int, and the clamp keeps a directly constructed rule from overflowing anyway.
inline int LinearBound(int a, int f, int b) {
  const int64_t v = int64_t{a} * f + b;
  return static_cast<int>(std::clamp<int64_t>(v, 1, INT_MAX));
}

// The factories behind MakeAggregator(). Options have passed the common checks
// (num_workers >= 1, num_byzantine >= 0); MakeAggregator() checks the bound after.
absl::StatusOr<std::unique_ptr<Aggregator>> MakeMean(const AggregatorOptions& options);
absl::StatusOr<std::unique_ptr<Aggregator>> MakeMedian(const AggregatorOptions& options);
absl::StatusOr<std::unique_ptr<Aggregator>> MakeTrimmedMean(const AggregatorOptions& options);
absl::StatusOr<std::unique_ptr<Aggregator>> MakeKrum(const AggregatorOptions& options);
absl::StatusOr<std::unique_ptr<Aggregator>> MakeMultiKrum(const AggregatorOptions& options);

}  // namespace ps::aggregators::internal
