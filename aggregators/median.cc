// median: the coordinate-wise median. For an even count the two middle values are
// averaged (EvenMedian::kMidpoint) or one of them is taken (kLower, kUpper).
#include "absl/status/status.h"
#include "aggregators/aggregator_internal.h"
#include "aggregators/coordinate_internal.h"
#include "core/status.h"

namespace ps::aggregators::internal {
namespace {

class Median final : public Aggregator {
 public:
  explicit Median(EvenMedian even) : even_(even) {}

  std::string_view name() const override { return "median"; }
  int MinInputs() const override { return 1; }
  std::string_view Bound() const override { return "n >= 1"; }

  absl::Status Aggregate(std::span<const float* const> inputs, std::span<float> out,
                         const AggregationContext& ctx) const override {
    PS_RETURN_IF_ERROR(CheckAggregateArgs(*this, inputs, out));
    const size_t k = inputs.size();
    size_t lo = k / 2;
    size_t hi = k / 2;
    if (k % 2 == 0) {
      switch (even_) {
        case EvenMedian::kMidpoint:
          lo = k / 2 - 1;
          break;
        case EvenMedian::kLower:
          lo = hi = k / 2 - 1;
          break;
        case EvenMedian::kUpper:
          break;
      }
    }
    MeanOfRanks(inputs, lo, hi, out, ctx.pool);
    return absl::OkStatus();
  }

 private:
  const EvenMedian even_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Aggregator>> MakeMedian(const AggregatorOptions& options) {
  return std::make_unique<Median>(options.even_median);
}

}  // namespace ps::aggregators::internal
