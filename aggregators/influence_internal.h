// Influence: how much each input weighed in what a round's plan made of it
// (AggregationContext::influence; docs/aggregators.md, "Influence"). Not part of the
// public interface.
//
// A plan is a mixing of the raw rows followed, for coordinate-wise rules, by a rule that
// keeps some rows per coordinate. Input j's weight in output coordinate c is
// sum_r u_r(c) M[r][j]: u_r(c) the weight the coordinate rule gives row r at c (1 / kept
// for the ranks a trimmed mean or median keeps, 1 / (c - drop) for the window meamed and
// phocas keep, 1 / c for the mean, 1 / agreeing for the signs that win a sign vote) and M
// the mixing (the identity without one). Without a coordinate rule the single mixing row
// is the weight itself, exact. With one, u is read on at most kInfluenceSamples evenly
// spaced coordinates (offset by round and slice) and scaled to d, so the cost is
// O(samples x rows x (k + state rows)) however large d is; but for the mean with every
// row present everywhere (no masks), where u is 1 / rows at every coordinate, the sum is
// taken exactly, without samples.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "aggregators/stage_internal.h"

namespace ps::aggregators::internal {

inline constexpr size_t kInfluenceSamples = 128;

// Adds to influence[j] (j < data.k) input j's weight in the output summed over the d
// coordinates. `rows`: the k raw inputs then the data.state_rows state rows, missing
// coordinates filled, unless `masks` is non-empty: then the plan has no mixing, rows are
// the k inputs and masks[j] (null: complete) says where input j is present.
void AddInfluence(const PlanData& data, std::span<const float* const> rows,
                  std::span<const uint8_t* const> masks, size_t d, uint64_t round,
                  uint32_t slice_id, std::span<double> influence);
// The plain mean's part of it, unmasked: each of the influence.size() inputs is present
// at every coordinate and weighs 1 / k there, so d / k is added to each, exactly.
void AddMeanInfluence(size_t d, std::span<double> influence);

}  // namespace ps::aggregators::internal
