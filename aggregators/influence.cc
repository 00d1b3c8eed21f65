#include "aggregators/influence_internal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "aggregators/coordinate_rules_internal.h"
#include "aggregators/mask_internal.h"
#include "aggregators/sorted_plan_internal.h"

namespace ps::aggregators::internal {

namespace {

// Whether `row` is present at c (no masks, or no mask for it: complete).
bool PresentIn(std::span<const uint8_t* const> masks, size_t row, size_t c) {
  return masks.empty() || masks[row] == nullptr || Present(masks[row], c);
}

// Whether no row has a mask: every row is present at every coordinate.
bool NoMasks(std::span<const uint8_t* const> masks) {
  return std::all_of(masks.begin(), masks.end(), [](const uint8_t* m) { return m == nullptr; });
}

// Adds to u[order[i]] the weight the coordinate rule gives the i-th smallest of the
// present values `sorted` (ascending, one per entry of `order`).
void AddRuleWeights(const CoordinateRule& rule, const std::vector<float>& sorted,
                    const std::vector<size_t>& order, std::vector<double>& u) {
  const size_t c = sorted.size();
  if (c == 0) return;
  auto spread = [&](size_t lo, size_t hi) {  // ranks lo..hi, equally
    const double w = 1.0 / static_cast<double>(hi - lo + 1);
    for (size_t r = lo; r <= hi; ++r) u[order[r]] += w;
  };
  switch (rule.kind) {
    case CoordinateRule::Kind::kMean:
      spread(0, c - 1);
      return;
    case CoordinateRule::Kind::kSignVote: {
      const size_t negative = static_cast<size_t>(
          std::lower_bound(sorted.begin(), sorted.end(), 0.0f) - sorted.begin());
      const size_t positive = static_cast<size_t>(
          sorted.end() - std::upper_bound(sorted.begin(), sorted.end(), 0.0f));
      if (positive > negative) spread(c - positive, c - 1);
      if (negative > positive) spread(0, negative - 1);
      return;  // a tie outputs 0: no input weighs
    }
    default:
      break;
  }
  const SortedPlan plan = PlanFor(rule, c);
  switch (plan.op) {
    case SortedPlan::Op::kZero:
      return;
    case SortedPlan::Op::kRanks:
      spread(plan.lo, plan.hi);
      return;
    case SortedPlan::Op::kNearest: {
      const size_t first = NearestFirst(plan, sorted.data(), c, 1);
      spread(first, first + (c - plan.drop) - 1);
      return;
    }
  }
}

// Orders `order` by values[order[i]], equal values kept in their order. Up to 32 entries
// by insertion (stable, no allocation: std::stable_sort takes a temporary buffer from the
// heap on every call, here once per sample), else std::stable_sort; the same order
// either way.
void StableSortByValue(std::vector<size_t>& order, const std::vector<float>& values) {
  if (order.size() > 32) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return values[a] < values[b]; });
    return;
  }
  for (size_t i = 1; i < order.size(); ++i) {
    const size_t moving = order[i];
    size_t j = i;
    for (; j > 0 && values[moving] < values[order[j - 1]]; --j) order[j] = order[j - 1];
    order[j] = moving;
  }
}

}  // namespace

void AddMeanInfluence(size_t d, std::span<double> influence) {
  const double each = static_cast<double>(d) / static_cast<double>(influence.size());
  for (double& w : influence) w += each;
}

void AddInfluence(const PlanData& data, std::span<const float* const> rows,
                  std::span<const uint8_t* const> masks, size_t d, uint64_t round,
                  uint32_t slice_id, std::span<double> influence) {
  const size_t k = std::min(data.k, influence.size());
  const Mixing& m = data.mixing;
  if (d == 0) return;
  if (!data.coordinate.has_value()) {
    // One output row, linear in the inputs: its weights are the influence, exactly.
    if (m.rows == 0) return;
    for (size_t j = 0; j < k; ++j) influence[j] += static_cast<double>(d) * m.at(0, j);
    return;
  }
  const size_t r_count = m.rows == 0 ? data.k : m.rows;
  if (data.coordinate->kind == CoordinateRule::Kind::kMean && (m.rows != 0 || NoMasks(masks))) {
    // Every row is present at every coordinate and weighs 1 / r_count there: the sum over
    // the d coordinates is exact without sampling (the samples read rows at scattered
    // coordinates, a cache miss each: 4% of a 3lc round at 4 x 2 went there).
    if (m.rows == 0 && k == r_count) return AddMeanInfluence(d, influence.first(k));
    const double each = static_cast<double>(d) / static_cast<double>(r_count);
    for (size_t j = 0; j < k; ++j) {
      double w = 1.0;
      if (m.rows != 0) {
        w = 0.0;
        for (size_t r = 0; r < r_count; ++r) w += m.at(r, j);
      }
      influence[j] += each * w;
    }
    return;
  }
  const size_t samples = std::min(d, kInfluenceSamples);
  const size_t stride = d / samples;
  // A different sample each round and slice, the same on every run.
  const uint64_t mix =
      ((round + 1) * 0x9E3779B97F4A7C15ull) ^ ((slice_id + 1) * 0xBF58476D1CE4E5B9ull);
  const size_t offset = static_cast<size_t>((mix >> 17) % stride);
  // Every sampled value is read first, in a loop of independent loads: the rows are
  // usually out of the cache here (the rule runs after this, since `out` may be an
  // input), and a load per row between two sorts left one miss in flight at a time
  // (measured: 2% of a trimmed-mean round at 4 x 2, almost all of it waiting on memory).
  const size_t width = m.rows == 0 ? r_count : m.cols;
  std::vector<float> gathered(samples * width);
  for (size_t t = 0; t < samples; ++t) {
    const size_t c = offset + t * stride;
    float* at = gathered.data() + t * width;
    for (size_t j = 0; j < width; ++j) {
      at[j] = m.rows != 0 || PresentIn(masks, j, c) ? rows[j][c] : 0.0f;
    }
  }
  std::vector<double> u(r_count, 0.0);
  std::vector<float> values(r_count);
  std::vector<size_t> order;
  std::vector<float> sorted;
  for (size_t t = 0; t < samples; ++t) {
    const size_t c = offset + t * stride;
    const float* at = gathered.data() + t * width;
    order.clear();
    for (size_t r = 0; r < r_count; ++r) {
      if (m.rows == 0) {
        if (!PresentIn(masks, r, c)) continue;
        values[r] = at[r];
      } else {
        double v = 0.0;
        for (size_t j = 0; j < m.cols; ++j) v += m.at(r, j) * static_cast<double>(at[j]);
        values[r] = static_cast<float>(v);
      }
      order.push_back(r);
    }
    StableSortByValue(order, values);
    sorted.resize(order.size());
    for (size_t i = 0; i < order.size(); ++i) sorted[i] = values[order[i]];
    AddRuleWeights(*data.coordinate, sorted, order, u);
  }
  const double scale = static_cast<double>(d) / static_cast<double>(samples);
  for (size_t j = 0; j < k; ++j) {
    double w = 0.0;
    if (m.rows == 0) {
      w = u[j];
    } else {
      for (size_t r = 0; r < r_count; ++r) w += u[r] * m.at(r, j);
    }
    influence[j] += scale * w;
  }
}

}  // namespace ps::aggregators::internal

namespace ps::aggregators {

AlignmentSampling AlignmentSamplingOf(size_t d) {
  const size_t count = std::min(d, kAlignmentSamples);
  return {.count = count, .stride = count == 0 ? 0 : d / count};
}

std::vector<double> Alignment(std::span<const float* const> inputs,
                              std::span<const uint8_t* const> masks, std::span<const float> out) {
  const size_t d = out.size();
  const size_t n = inputs.size();
  std::vector<double> cosines(n, std::numeric_limits<double>::quiet_NaN());
  if (d == 0) return cosines;
  const auto [samples, stride] = AlignmentSamplingOf(d);
  // Sample by sample, every input at it: the n + 1 cache lines of a sample are fetched
  // together, and those kAhead samples on are asked for, where input by input each
  // sample waited for its line (model-scope rounds align rows long out of the cache).
  // Each input's sums still add its samples in order: the same bits.
  struct Sums {
    double dot = 0, xx = 0, oo = 0;
  };
  std::vector<Sums> sums(n);
  constexpr size_t kAhead = 16;
  for (size_t t = 0; t < samples; ++t) {
    const size_t c = t * stride;
    if (t + kAhead < samples) {
      const size_t ahead = c + kAhead * stride;
      __builtin_prefetch(out.data() + ahead);
      for (size_t j = 0; j < n; ++j) __builtin_prefetch(inputs[j] + ahead);
    }
    const double o = out[c];
    for (size_t j = 0; j < n; ++j) {
      if (!internal::PresentIn(masks, j, c)) continue;
      const double x = inputs[j][c];
      sums[j].dot += x * o;
      sums[j].xx += x * x;
      sums[j].oo += o * o;
    }
  }
  for (size_t j = 0; j < n; ++j) {
    if (sums[j].xx > 0 && sums[j].oo > 0) cosines[j] = sums[j].dot / std::sqrt(sums[j].xx * sums[j].oo);
  }
  return cosines;
}

}  // namespace ps::aggregators
