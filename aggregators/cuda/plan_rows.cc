#include "aggregators/cuda/plan_rows.h"

#include <cmath>
#include <cstddef>

namespace ps::aggregators::cuda {

RowPlan PlanRows(const internal::PlanData& plan) {
  RowPlan out;
  auto add_row = [&out](RowSpec::Kind kind, std::vector<RowTerm> terms) {
    out.rows.push_back({kind, static_cast<uint32_t>(out.terms.size()),
                        static_cast<uint32_t>(terms.size())});
    out.terms.insert(out.terms.end(), terms.begin(), terms.end());
  };
  if (plan.mixing.rows == 0) {
    for (uint32_t i = 0; i < plan.k; ++i) add_row(RowSpec::Kind::kUnit, {{i, 1.0f}});
  } else {
    const size_t used_rows = plan.coordinate.has_value() ? plan.mixing.rows : 1;
    for (size_t r = 0; r < used_rows; ++r) {
      size_t unit = 0;
      if (internal::IsUnitRow(plan.mixing, r, &unit)) {
        add_row(RowSpec::Kind::kUnit, {{static_cast<uint32_t>(unit), 1.0f}});
        continue;
      }
      std::vector<RowTerm> terms;
      std::vector<double> weights;
      for (size_t c = 0; c < plan.mixing.cols; ++c) {
        const double w = plan.mixing.at(r, c);
        if (w == 0.0) continue;
        terms.push_back({static_cast<uint32_t>(c), static_cast<float>(w)});
        weights.push_back(w);
      }
      bool average = !terms.empty();
      for (double w : weights) {
        average = average && std::abs(w * static_cast<double>(weights.size()) - 1.0) < 1e-12;
      }
      add_row(average ? RowSpec::Kind::kAverage : RowSpec::Kind::kWeighted,
              std::move(terms));
    }
  }
  out.unit = true;
  for (const RowSpec& row : out.rows) out.unit = out.unit && row.kind == RowSpec::Kind::kUnit;
  if (!plan.coordinate.has_value()) {
    out.op = CoordinateOp::kRow0;
  } else if (plan.coordinate->kind == internal::CoordinateRule::Kind::kMean) {
    out.op = CoordinateOp::kMean;
  } else if (plan.coordinate->kind == internal::CoordinateRule::Kind::kSignVote) {
    out.sign_vote = true;
  } else {
    out.op = CoordinateOp::kSorted;
    out.sorted = internal::PlanFor(*plan.coordinate, out.rows.size());
  }
  return out;
}

}  // namespace ps::aggregators::cuda
