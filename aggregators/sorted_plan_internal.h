// A coordinate rule read off one coordinate's values sorted ascending: shared by the
// CPU rules (coordinate_rules.cc) and the CUDA kernels (aggregators/cuda/), so both
// compute with one definition (PS_HD; docs/gpu.md). No abseil here: nvcc compiles it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/hd.h"

namespace ps::aggregators::internal {

// Every rule but the mean and the sign vote, for c present values, as an operation on
// the c values sorted ascending, v_(0) <= ... <= v_(c-1).
struct SortedPlan {
  enum class Op : uint32_t {
    kZero,     // nothing present: 0
    kRanks,    // the mean of ranks lo..hi
    kNearest,  // centre = the mean of ranks lo..hi; the mean of the c - drop nearest
  };
  Op op = Op::kZero;
  size_t lo = 0;
  size_t hi = 0;
  size_t drop = 0;
};

// The window of the c - drop values nearest `centre` in a sorted column is
// [first, first + keep). Going from window l to l + 1 trades v_(l) for v_(l+keep); v_(l)
// stays when it is no farther, |v_(l) - centre| <= |v_(l+keep) - centre|, which for
// v_(l) <= v_(l+keep) reads v_(l) + v_(l+keep) >= 2 centre (equal values aside, where
// either choice sums the same). That test only turns from false to true as l grows, so
// first = the number of l in [0, drop) that fail it, and an exact tie keeps the smaller
// value. Sums and the centre are in double; 2 centre is exact.
//
// One sorted column of c values v[0], v[stride], ...: sums run in ascending order, as
// the CPU's tile version and the GPU's register version do, so all give the same bits.
PS_HD inline double SumSortedRanks(const float* v, size_t stride, size_t lo, size_t hi) {
  double sum = 0.0;
  for (size_t r = lo; r <= hi; ++r) sum = core::AddRn(sum, static_cast<double>(v[r * stride]));
  return sum;
}

// kNearest: the first rank of the window of the c - drop values nearest the centre.
PS_HD inline size_t NearestFirst(const SortedPlan& plan, const float* v, size_t c, size_t stride) {
  const double centre =
      SumSortedRanks(v, stride, plan.lo, plan.hi) / static_cast<double>(plan.hi - plan.lo + 1);
  const double twice = 2.0 * centre;
  const size_t keep = c - plan.drop;
  size_t first = 0;
  for (size_t l = 0; l < plan.drop; ++l) {
    first += core::AddRn(static_cast<double>(v[l * stride]),
                         static_cast<double>(v[(l + keep) * stride])) < twice
                 ? 1
                 : 0;
  }
  return first;
}

PS_HD inline float ApplySorted(const SortedPlan& plan, const float* v, size_t c, size_t stride) {
  auto sum_ranks = [v, stride](size_t lo, size_t hi) { return SumSortedRanks(v, stride, lo, hi); };
  switch (plan.op) {
    case SortedPlan::Op::kZero:
      return 0.0f;
    case SortedPlan::Op::kRanks:
      return static_cast<float>(sum_ranks(plan.lo, plan.hi) /
                                static_cast<double>(plan.hi - plan.lo + 1));
    case SortedPlan::Op::kNearest: {
      const size_t keep = c - plan.drop;
      const size_t first = NearestFirst(plan, v, c, stride);
      return static_cast<float>(sum_ranks(first, first + keep - 1) / static_cast<double>(keep));
    }
  }
  return 0.0f;
}

}  // namespace ps::aggregators::internal
