// krum and multi_krum (Blanchard et al., 2017). Krum returns the input whose summed
// squared distance to its nearest neighbours is smallest; Multi-Krum averages the m
// inputs of lowest score. Both need k >= 2f + 3.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "aggregators/aggregator_internal.h"
#include "aggregators/coordinate_internal.h"
#include "aggregators/gram_internal.h"
#include "aggregators/krum_internal.h"
#include "core/status.h"

namespace ps::aggregators::internal {

size_t KrumNeighbourCount(size_t k, size_t f, KrumNeighbours variant) {
  return variant == KrumNeighbours::kByzFL ? k - f - 1 : k - f - 2;
}

std::vector<double> KrumScores(const SquareMatrix& dist, size_t neighbours) {
  const size_t k = dist.k;
  std::vector<double> scores(k);
  std::vector<double> row;
  row.reserve(k);
  for (size_t i = 0; i < k; ++i) {
    row.clear();
    for (size_t j = 0; j < k; ++j) {
      if (j != i) row.push_back(dist.at(i, j));
    }
    std::partial_sort(row.begin(), row.begin() + static_cast<ptrdiff_t>(neighbours), row.end());
    double score = 0.0;
    for (size_t r = 0; r < neighbours; ++r) score += row[r];
    scores[i] = score;
  }
  return scores;
}

std::vector<size_t> RankByScore(const std::vector<double>& scores) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  return order;
}

namespace {

constexpr std::string_view kKrumBound = "n >= 2f + 3";

// Scores and ranks the inputs; the common first half of both rules.
std::vector<size_t> KrumRanking(std::span<const float* const> inputs, size_t d, int f,
                                KrumNeighbours variant, core::ThreadPool* pool) {
  const size_t k = inputs.size();
  const SquareMatrix dist = SquaredDistances(inputs, d, pool);
  return RankByScore(KrumScores(dist, KrumNeighbourCount(k, static_cast<size_t>(f), variant)));
}

class Krum final : public Aggregator {
 public:
  Krum(int f, KrumNeighbours variant)
      : f_(f), variant_(variant), min_inputs_(LinearBound(2, f, 3)) {}

  std::string_view name() const override { return "krum"; }
  int MinInputs() const override { return min_inputs_; }
  std::string_view Bound() const override { return kKrumBound; }

  absl::Status Aggregate(std::span<const float* const> inputs, std::span<float> out,
                         const AggregationContext& ctx) const override {
    PS_RETURN_IF_ERROR(CheckAggregateArgs(*this, inputs, out));
    const size_t best = KrumRanking(inputs, out.size(), f_, variant_, ctx.pool).front();
    // memmove: `out` may be the chosen input itself.
    std::memmove(out.data(), inputs[best], out.size() * sizeof(float));
    return absl::OkStatus();
  }

 private:
  const int f_;
  const KrumNeighbours variant_;
  const int min_inputs_;
};

class MultiKrum final : public Aggregator {
 public:
  MultiKrum(int f, int m, KrumNeighbours variant)
      : f_(f), m_(m), variant_(variant), min_inputs_(LinearBound(2, f, 3)) {}

  std::string_view name() const override { return "multi_krum"; }
  int MinInputs() const override { return min_inputs_; }
  std::string_view Bound() const override { return kKrumBound; }

  absl::Status Aggregate(std::span<const float* const> inputs, std::span<float> out,
                         const AggregationContext& ctx) const override {
    PS_RETURN_IF_ERROR(CheckAggregateArgs(*this, inputs, out));
    const size_t k = inputs.size();
    const size_t m = m_ == 0 ? k - static_cast<size_t>(f_) : static_cast<size_t>(m_);
    if (m > k) {
      return absl::InvalidArgumentError(
          absl::StrCat("multi_krum: m = ", m, " inputs to average but only ", k, " inputs given"));
    }
    std::vector<size_t> chosen = KrumRanking(inputs, out.size(), f_, variant_, ctx.pool);
    chosen.resize(m);
    // Average in index order, so the sum does not depend on how the scores tied.
    std::sort(chosen.begin(), chosen.end());
    std::vector<const float*> selected(m);
    for (size_t r = 0; r < m; ++r) selected[r] = inputs[chosen[r]];
    AverageInputs(selected, out, ctx.pool);
    return absl::OkStatus();
  }

 private:
  const int f_;
  const int m_;
  const KrumNeighbours variant_;
  const int min_inputs_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Aggregator>> MakeKrum(const AggregatorOptions& options) {
  return std::make_unique<Krum>(options.num_byzantine, options.krum_neighbours);
}

absl::StatusOr<std::unique_ptr<Aggregator>> MakeMultiKrum(const AggregatorOptions& options) {
  const int m = options.multi_krum_m;
  if (m < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("multi_krum: m (multi_krum_m) must be >= 1, or 0 for n - f; got ", m));
  }
  if (m > options.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("multi_krum: m (multi_krum_m) = ", m,
                                                   " exceeds n = ", options.num_workers,
                                                   "; it must lie in [1, n], or be 0 for n - f"));
  }
  return std::make_unique<MultiKrum>(options.num_byzantine, m, options.krum_neighbours);
}

}  // namespace ps::aggregators::internal
