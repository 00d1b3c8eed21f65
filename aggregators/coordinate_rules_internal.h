// The separable (coordinate-wise) rules as one kernel entry point: mean, median, trimmed
// mean, meamed, phocas and Bulyan's coordinate step, each with or without a mask of
// missing coordinates. Every output coordinate is a function of that coordinate's
// present input values only, so results do not depend on the pool or its size.
//
// How (coordinate_rules.cc): tiles of 128 coordinates are sorted across the inputs by a
// sorting network (up to 256 present inputs; vectorized across coordinates) and each
// rule is read off the sorted rows; for kNearestMean the kept values are a window of
// the sorted column, found with drop comparisons per coordinate. The unmasked mean goes
// through AverageInputs, the unmasked median and trimmed mean through MeanOfRanks
// (coordinate_internal.h) except from 65 to 256 inputs, where the network here is
// several times faster than MeanOfRanks' nth_element.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "aggregators/aggregator.h"
#include "aggregators/sorted_plan_internal.h"
#include "core/thread_pool.h"

namespace ps::aggregators::internal {

// What to compute per coordinate from its c present values v_(0) <= ... <= v_(c-1).
struct CoordinateRule {
  enum class Kind {
    kMean,          // the average of the c values, summed in float in input order
    kMedian,        // the median; even c as `even_median` says
    kTrimmedMean,   // drop the `trim` largest and `trim` smallest, average the rest
    kNearestMean,   // average the c - `drop` values nearest a centre (see `centre`)
    kSignVote,      // sign of (#positive - #negative) times one scale for the whole call
  };
  enum class Centre {
    kMedian,       // the median, midpoint for even c whatever `even_median`: meamed, Bulyan
    kTrimmedMean,  // the trimmed mean with `trim`: phocas
  };
  Kind kind = Kind::kMean;
  EvenMedian even_median = EvenMedian::kMidpoint;
  size_t trim = 0;  // kTrimmedMean, and kNearestMean with Centre::kTrimmedMean
  size_t drop = 0;  // kNearestMean
  Centre centre = Centre::kMedian;
};

// Smallest present count c for which `rule` is defined as written: 1 for mean and
// median, 2 trim + 1 for the trimmed mean; for kNearestMean drop + 1 with the median
// centre and max(drop + 1, 2 trim + 1) with the trimmed-mean centre (`trim` is ignored
// with the median centre).
inline size_t CoordinateRuleMinCount(const CoordinateRule& rule) {
  switch (rule.kind) {
    case CoordinateRule::Kind::kMean:
    case CoordinateRule::Kind::kMedian:
    case CoordinateRule::Kind::kSignVote:
      return 1;
    case CoordinateRule::Kind::kTrimmedMean:
      return 2 * rule.trim + 1;
    case CoordinateRule::Kind::kNearestMean:
      return std::max(rule.drop + 1,
                      rule.centre == CoordinateRule::Centre::kTrimmedMean ? 2 * rule.trim + 1 : 1);
  }
  return 1;
}

// The median of c values (midpoint for even c) as a SortedPlan.
inline SortedPlan MidpointPlan(size_t c) { return {SortedPlan::Op::kRanks, (c - 1) / 2, c / 2, 0}; }

// The SortedPlan of `rule` (not kMean or kSignVote) for c present values, the
// fallbacks below included. Shared by the CPU kernels and the CUDA backend.
inline SortedPlan PlanFor(const CoordinateRule& rule, size_t c) {
  if (c == 0) return {};
  if (c < CoordinateRuleMinCount(rule)) return MidpointPlan(c);
  switch (rule.kind) {
    case CoordinateRule::Kind::kMedian:
      switch (rule.even_median) {
        case EvenMedian::kLower:
          return {SortedPlan::Op::kRanks, (c - 1) / 2, (c - 1) / 2, 0};
        case EvenMedian::kUpper:
          return {SortedPlan::Op::kRanks, c / 2, c / 2, 0};
        case EvenMedian::kMidpoint:
          break;
      }
      return MidpointPlan(c);
    case CoordinateRule::Kind::kTrimmedMean:
      return {SortedPlan::Op::kRanks, rule.trim, c - rule.trim - 1, 0};
    case CoordinateRule::Kind::kNearestMean:
      if (rule.centre == CoordinateRule::Centre::kTrimmedMean) {
        return {SortedPlan::Op::kNearest, rule.trim, c - rule.trim - 1, rule.drop};
      }
      return {SortedPlan::Op::kNearest, (c - 1) / 2, c / 2, rule.drop};
    case CoordinateRule::Kind::kMean:
    case CoordinateRule::Kind::kSignVote:
      break;
  }
  return MidpointPlan(c);  // kMean and kSignVote never get here
}

// sign_majority's scale from the per-input means of |x| over their present coordinates
// (inputs with none left out): their median, the midpoint of the two middle ones for an
// even count, 0 when there are none. Shared by the CPU rule and the CUDA backend.
inline double SignVoteScale(std::vector<double> means) {
  if (means.empty()) return 0.0;
  std::sort(means.begin(), means.end());
  const size_t m = means.size();
  return m % 2 == 1 ? means[m / 2] : (means[m / 2 - 1] + means[m / 2]) / 2;
}

// out[c] = rule applied to {inputs[i][c] : i present at c}.
//
// masks is empty (every coordinate of every input present) or has one entry per input:
// nullptr when that input is complete, else a bitmap over out.size() coordinates, bit c
// (byte c / 8, bit c % 8, least significant first) set when coordinate c is present.
// Where fewer than CoordinateRuleMinCount(rule) values are present the coordinate falls
// back to the median (midpoint) of those present; where none is, out[c] = 0.
//
// kNearestMean: the c - drop values v with the smallest |v - centre|; on equal distance
// the smaller value is taken first. The centre is kept in double (the midpoint, or the
// trimmed mean's double sum over its count, not rounded to float); of two values a < b,
// a is the nearer or tied when a + b >= 2 centre, the sum computed in double (exact
// unless a and b differ in magnitude by more than about 2^29).
//
// Averages are summed in double in ascending order of value and rounded once (kMean
// excepted, see above; past 256 inputs the unmasked median and trimmed mean sum their
// ranks in nth_element's order, which can differ in the last bit in rare cases).
//
// kSignVote (sign_majority): scale = median over inputs of the mean |x| of their present
// coordinates (midpoint of the two middle ones for an even count, in double, then
// rounded to float; inputs with no present coordinate do not count), and out[c] =
// scale * sign(#{present v > 0} - #{present v < 0}), 0 on a tie. The scale is taken
// over everything passed in one call, so callers must not split a slice into blocks.
// codecs::SignMajorityVote computes the same on packed sign payloads.
//
// `out` may be one of the inputs (same pointer) but must not partially overlap one.
// Inputs must be finite where present. Requires inputs non-empty.
void ApplyCoordinateRule(const CoordinateRule& rule, std::span<const float* const> inputs,
                         std::span<const uint8_t* const> masks, std::span<float> out,
                         core::ThreadPool* pool);

}  // namespace ps::aggregators::internal
