// mean: the coordinate-wise average. Not robust; the baseline every rule is compared to.
#include "absl/status/status.h"
#include "aggregators/aggregator_internal.h"
#include "aggregators/coordinate_internal.h"
#include "core/status.h"

namespace ps::aggregators::internal {
namespace {

class Mean final : public Aggregator {
 public:
  std::string_view name() const override { return "mean"; }
  int MinInputs() const override { return 1; }
  std::string_view Bound() const override { return "n >= 1"; }

  absl::Status Aggregate(std::span<const float* const> inputs, std::span<float> out,
                         const AggregationContext& ctx) const override {
    PS_RETURN_IF_ERROR(CheckAggregateArgs(*this, inputs, out));
    AverageInputs(inputs, out, ctx.pool);
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Aggregator>> MakeMean(const AggregatorOptions& options) {
  return std::make_unique<Mean>();
}

}  // namespace ps::aggregators::internal
