// trimmed_mean: per coordinate, drop the f largest and f smallest values and average
// the remaining k - 2f. Needs k > 2f.
#include "absl/status/status.h"
#include "aggregators/aggregator_internal.h"
#include "aggregators/coordinate_internal.h"
#include "core/status.h"

namespace ps::aggregators::internal {
namespace {

class TrimmedMean final : public Aggregator {
 public:
  explicit TrimmedMean(int f) : f_(f), min_inputs_(LinearBound(2, f, 1)) {}

  std::string_view name() const override { return "trimmed_mean"; }
  int MinInputs() const override { return min_inputs_; }
  std::string_view Bound() const override { return "n >= 2f + 1"; }

  absl::Status Aggregate(std::span<const float* const> inputs, std::span<float> out,
                         const AggregationContext& ctx) const override {
    PS_RETURN_IF_ERROR(CheckAggregateArgs(*this, inputs, out));
    const size_t f = static_cast<size_t>(f_);
    MeanOfRanks(inputs, f, inputs.size() - f - 1, out, ctx.pool);
    return absl::OkStatus();
  }

 private:
  const int f_;
  const int min_inputs_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Aggregator>> MakeTrimmedMean(const AggregatorOptions& options) {
  return std::make_unique<TrimmedMean>(options.num_byzantine);
}

}  // namespace ps::aggregators::internal
