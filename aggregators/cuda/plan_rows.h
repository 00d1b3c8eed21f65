// A plan (PlanData) as the CUDA Apply kernels read it: which inputs form each row and
// how, and what becomes of the rows per coordinate (apply_kernel.h). Host code.
#pragma once

#include <vector>

#include "aggregators/cuda/apply_kernel.h"
#include "aggregators/stage_internal.h"

namespace ps::aggregators::cuda {

// The rows and terms of ApplyArgs for a plan, on the host.
struct RowPlan {
  std::vector<RowSpec> rows;
  std::vector<RowTerm> terms;
  CoordinateOp op = CoordinateOp::kRow0;
  SortedPlan sorted;
  bool sign_vote = false;
  bool unit = false;  // every row is a unit row (ApplyArgs::unit_rows applies)
};

// Mirrors Aggregator::Apply's cases (aggregator.cc): unit rows read in place, averages
// (every non-zero weight 1/q) and weighted sums with float weights; without a
// coordinate rule only row 0.
RowPlan PlanRows(const internal::PlanData& plan);

}  // namespace ps::aggregators::cuda
