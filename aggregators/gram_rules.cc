// The distance-based rules and pre-aggregators on a Gram matrix (gram_rules_internal.h):
// Bulyan's selection, geometric median, centered clipping, MDA, NNM, static clipping,
// ARC and bucketing. Only k x k arithmetic here; the coordinates are touched elsewhere.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "aggregators/gram_rules_internal.h"
#include "aggregators/krum_internal.h"
#include "core/status.h"

namespace ps::aggregators::internal {
namespace {

// (G beta)_i for every i.
std::vector<double> GramTimes(const SquareMatrix& gram, const std::vector<double>& beta) {
  const size_t k = gram.k;
  std::vector<double> out(k, 0.0);
  for (size_t i = 0; i < k; ++i) {
    double sum = 0.0;
    for (size_t j = 0; j < k; ++j) sum += gram.at(i, j) * beta[j];
    out[i] = sum;
  }
  return out;
}

// ||z - x_i|| for the first `rows` rows, z = sum_j beta_j x_j:
// G_ii - 2 (G beta)_i + beta' G beta, clamped at 0 against cancellation.
std::vector<double> DistancesTo(const SquareMatrix& gram, const std::vector<double>& beta,
                                size_t rows) {
  const std::vector<double> g_beta = GramTimes(gram, beta);
  double bgb = 0.0;
  for (size_t j = 0; j < gram.k; ++j) bgb += beta[j] * g_beta[j];
  std::vector<double> out(rows);
  for (size_t i = 0; i < rows; ++i) {
    out[i] = std::sqrt(std::max(0.0, gram.at(i, i) - 2.0 * g_beta[i] + bgb));
  }
  return out;
}

// The SplitMix64 output function (Steele, Lea and Flood, 2014).
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// SplitMix64: a Weyl sequence through Mix64. Fixed arithmetic, so the same stream on
// every platform and compiler.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() {
    state_ += kGolden;
    return Mix64(state_);
  }
  // Uniform in [0, bound), bound >= 1, without modulo bias: draws below 2^64 mod bound
  // are rejected, leaving a multiple of bound equally likely values.
  uint64_t Below(uint64_t bound) {
    const uint64_t reject_below = (0 - bound) % bound;  // 2^64 mod bound
    uint64_t r = Next();
    while (r < reject_below) r = Next();
    return r % bound;
  }

 private:
  uint64_t state_;
};

}  // namespace

std::vector<size_t> BulyanSelection(const SquareMatrix& dist, size_t f, KrumNeighbours variant) {
  const size_t k = dist.k;
  const size_t theta = k > 2 * f ? k - 2 * f : 0;
  std::vector<size_t> remaining(k);
  std::iota(remaining.begin(), remaining.end(), size_t{0});
  std::vector<size_t> picks;
  picks.reserve(theta);
  while (picks.size() < theta) {
    const size_t r = remaining.size();
    size_t pick = 0;  // position in `remaining`
    if (r > 1) {
      // The formula reaches 0 only in the last steps with f <= 1 (kPaper) or at r = 1
      // (f = 0); one neighbour keeps the score meaningful there.
      size_t neighbours = r >= f + 2 ? KrumNeighbourCount(r, f, variant) : 1;
      neighbours = std::clamp<size_t>(neighbours, 1, r - 1);
      SquareMatrix sub(r);
      for (size_t a = 0; a < r; ++a) {
        for (size_t b = 0; b < r; ++b) sub.at(a, b) = dist.at(remaining[a], remaining[b]);
      }
      // `remaining` stays in increasing order, so RankByScore's tie rule (lowest
      // position) is the lowest original index.
      pick = RankByScore(KrumScores(sub, neighbours)).front();
    }
    picks.push_back(remaining[pick]);
    remaining.erase(remaining.begin() + static_cast<ptrdiff_t>(pick));
  }
  return picks;
}

std::vector<double> GeometricMedianWeights(const SquareMatrix& gram,
                                           const WeiszfeldOptions& options) {
  const size_t k = gram.k;
  if (k == 0) return {};
  std::vector<double> beta(k, 1.0 / static_cast<double>(k));
  std::vector<double> distances = DistancesTo(gram, beta, k);
  double objective = 0.0;
  for (double d : distances) objective += d;
  std::vector<double> w(k);
  for (int it = 0; it < options.iterations; ++it) {
    double total = 0.0;
    for (size_t i = 0; i < k; ++i) {
      w[i] = 1.0 / std::max(options.nu, distances[i]);
      total += w[i];
    }
    for (size_t i = 0; i < k; ++i) beta[i] = w[i] / total;
    distances = DistancesTo(gram, beta, k);
    const double previous = objective;
    objective = 0.0;
    for (double d : distances) objective += d;
    if (std::abs(previous - objective) <= options.tolerance * objective) break;
  }
  return beta;
}

std::vector<double> CenteredClippingWeights(const SquareMatrix& gram, double tau, int iterations) {
  const size_t total = gram.k;
  if (total == 0) return {};
  const size_t k = total - 1;
  std::vector<double> beta(total, 0.0);
  beta[k] = 1.0;
  if (k == 0) return beta;
  const double inv_k = 1.0 / static_cast<double>(k);
  std::vector<double> scale(k);
  for (int it = 0; it < iterations; ++it) {
    const std::vector<double> distances = DistancesTo(gram, beta, k);
    double scale_sum = 0.0;
    for (size_t i = 0; i < k; ++i) {
      scale[i] = distances[i] > tau ? tau / distances[i] : 1.0;
      scale_sum += scale[i];
    }
    // v's own coefficient, 1 - (1/k) sum_i scale_i: exactly 0 when nothing is clipped.
    const double kept = (static_cast<double>(k) - scale_sum) * inv_k;
    // v + (1/k) sum_i scale_i (x_i - v) = kept v + (1/k) sum_i scale_i x_i.
    for (double& b : beta) b *= kept;
    for (size_t i = 0; i < k; ++i) beta[i] += inv_k * scale[i];
  }
  return beta;
}

uint64_t SubsetCount(size_t k, size_t f) {
  if (f > k) return 0;
  // C(k, f) = C(k, k - f); build C(k - m + i, i) for i = 1..m, m = min(f, k - f). Each
  // partial value is at most the result, so saturating early is exact.
  const uint64_t m = std::min(f, k - f);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  uint64_t c = 1;
  for (uint64_t i = 1; i <= m; ++i) {
    // c * a / i is an integer; divide out gcd(c, i) first, then i / g divides a.
    const uint64_t a = k - m + i;
    const uint64_t g = std::gcd(c, i);
    const uint64_t factor = a / (i / g);
    const uint64_t base = c / g;
    if (base > kMax / factor) return kMax;
    c = base * factor;
  }
  return c;
}

absl::Status CheckSubsetSearch(const char* rule, size_t k, size_t f, uint64_t max_subsets,
                               const char* raise) {
  if (f >= k) {
    return absl::InvalidArgumentError(
        absl::StrCat(rule, ": f = ", f, " leaves no input to average out of k = ", k));
  }
  const uint64_t count = SubsetCount(k, f);
  if (count > max_subsets) {
    const std::string value = count == std::numeric_limits<uint64_t>::max()
                                  ? absl::StrCat(">= ", count)
                                  : absl::StrCat("= ", count);
    return absl::InvalidArgumentError(absl::StrCat(rule, ": C(", k, ", ", f, ") ", value,
                                                   " subsets exceeds the limit of ", max_subsets,
                                                   "; lower f or raise ", raise));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<size_t>> MdaSubset(const SquareMatrix& dist, size_t f,
                                              uint64_t max_subsets) {
  const size_t k = dist.k;
  PS_RETURN_IF_ERROR(CheckSubsetSearch("mda", k, f, max_subsets, "mda max subsets"));
  const size_t m = k - f;
  // Depth-first in lexicographic order. A partial subset's diameter only grows as rows
  // are added, so a branch whose diameter already reaches the best one found is cut: it
  // cannot do better, and on a tie the subset found earlier (lexicographically first)
  // wins anyway.
  std::vector<size_t> best;
  double best_diameter = std::numeric_limits<double>::infinity();
  bool found = false;
  std::vector<size_t> current;
  current.reserve(m);
  std::vector<double> diameter;  // diameter[d]: of the first d + 1 rows of `current`
  diameter.reserve(m);
  // Explicit stack: next[d] is the next candidate index at depth d.
  std::vector<size_t> next(m + 1, 0);
  size_t depth = 0;
  next[0] = 0;
  while (true) {
    // Candidates at this depth: up to k - (m - depth), leaving room for the rest.
    const size_t last = k - (m - depth);
    if (next[depth] > last) {
      if (depth == 0) break;
      --depth;
      current.pop_back();
      diameter.pop_back();
      continue;
    }
    const size_t j = next[depth]++;
    double d = depth == 0 ? 0.0 : diameter.back();
    for (size_t i : current) d = std::max(d, dist.at(i, j));
    if (found && d >= best_diameter) continue;
    if (depth + 1 == m) {
      best = current;
      best.push_back(j);
      best_diameter = d;
      found = true;
      continue;
    }
    current.push_back(j);
    diameter.push_back(d);
    ++depth;
    next[depth] = j + 1;
  }
  return best;
}

Mixing NnmMixing(const SquareMatrix& dist, size_t f) {
  const size_t k = dist.k;
  Mixing mixing(k, k);
  if (k == 0) return mixing;
  const size_t m = f < k ? k - f : 1;
  const double weight = 1.0 / static_cast<double>(m);
  std::vector<size_t> others;
  others.reserve(k);
  for (size_t i = 0; i < k; ++i) {
    others.clear();
    for (size_t j = 0; j < k; ++j) {
      if (j != i) others.push_back(j);
    }
    const auto nearer = [&](size_t a, size_t b) {
      const double da = dist.at(i, a);
      const double db = dist.at(i, b);
      return da < db || (da == db && a < b);
    };
    std::partial_sort(others.begin(), others.begin() + static_cast<ptrdiff_t>(m - 1), others.end(),
                      nearer);
    mixing.at(i, i) = weight;
    for (size_t r = 0; r + 1 < m; ++r) mixing.at(i, others[r]) = weight;
  }
  return mixing;
}

std::vector<double> ClipScales(const SquareMatrix& gram, double threshold) {
  const size_t k = gram.k;
  std::vector<double> scales(k, 1.0);
  for (size_t i = 0; i < k; ++i) {
    const double norm = std::sqrt(std::max(0.0, gram.at(i, i)));
    if (norm > threshold) scales[i] = threshold / norm;
  }
  return scales;
}

std::vector<double> ArcScales(const SquareMatrix& gram, size_t f) {
  const size_t k = gram.k;
  std::vector<double> scales(k, 1.0);
  if (k == 0 || f >= k) return scales;
  // floor(2 (f / k) (k - f)) in integers; it is at most k / 2.
  const size_t clipped = 2 * f * (k - f) / k;
  if (clipped == 0) return scales;
  std::vector<double> norms(k);
  for (size_t i = 0; i < k; ++i) norms[i] = std::sqrt(std::max(0.0, gram.at(i, i)));
  std::vector<size_t> order(k);
  std::iota(order.begin(), order.end(), size_t{0});
  // Ascending by (norm, index): the last `clipped` are clipped, so among equal norms the
  // larger index goes first.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return norms[a] < norms[b] || (norms[a] == norms[b] && a < b);
  });
  const double threshold = norms[order[k - clipped - 1]];
  for (size_t r = k - clipped; r < k; ++r) {
    const size_t i = order[r];
    if (norms[i] > threshold) scales[i] = threshold / norms[i];
  }
  return scales;
}

Mixing BucketingMixing(size_t k, size_t s, uint64_t seed, uint64_t round) {
  if (s == 0) s = 1;
  const size_t buckets = (k + s - 1) / s;
  Mixing mixing(buckets, k);
  if (k == 0) return mixing;
  // Seeded from (seed, round) only; Mix64 decorrelates nearby seeds and rounds.
  SplitMix64 rng(Mix64(seed ^ Mix64(round + kGolden)));
  std::vector<size_t> perm(k);
  std::iota(perm.begin(), perm.end(), size_t{0});
  // Fisher-Yates: position i takes a uniform pick among positions 0..i.
  for (size_t i = k - 1; i > 0; --i) {
    const size_t j = static_cast<size_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = b * s;
    const size_t end = std::min(k, begin + s);
    const double weight = 1.0 / static_cast<double>(end - begin);
    for (size_t p = begin; p < end; ++p) mixing.at(b, perm[p]) = weight;
  }
  return mixing;
}

}  // namespace ps::aggregators::internal
