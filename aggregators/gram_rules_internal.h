// The distance-based rules and pre-aggregators as pure functions of a Gram matrix.
//
// Every such rule outputs a linear combination of its input rows (a selection, an
// average of a subset, a Weiszfeld iterate, a clipped step), and every distance or norm
// it needs is a function of the Gram matrix G[i][j] = <x_i, x_j>. So a rule is computed
// in two steps: the Gram matrix (which adds up over disjoint coordinate ranges, hence
// over slices and shards), then the weights below (O(k^2) or so, no coordinates). This
// is what makes model scope exact on a sharded model (docs/aggregators.md).
//
// Conventions: k rows; dist is SquaredDistancesFromGram(gram); ties go to the lowest
// index; every function is deterministic and takes no pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "aggregators/aggregator.h"
#include "aggregators/gram_internal.h"

namespace ps::aggregators::internal {

// A k_out x k_in matrix of doubles, row-major: output row r is
// sum_j at(r, j) * input_j.
struct Mixing {
  size_t rows = 0;
  size_t cols = 0;
  std::vector<double> values;

  Mixing() = default;
  Mixing(size_t r, size_t c) : rows(r), cols(c), values(r * c, 0.0) {}
  double& at(size_t r, size_t c) { return values[r * cols + c]; }
  double at(size_t r, size_t c) const { return values[r * cols + c]; }
};

// True when row r of m has a single non-zero entry equal to 1 (the row is that input as
// it is); sets `index` to it.
inline bool IsUnitRow(const Mixing& m, size_t r, size_t* index) {
  size_t found = m.cols;
  for (size_t c = 0; c < m.cols; ++c) {
    const double w = m.at(r, c);
    if (w == 0.0) continue;
    if (w != 1.0 || found != m.cols) return false;
    found = c;
  }
  if (found == m.cols) return false;
  *index = found;
  return true;
}

// Bulyan's selection (El Mhamdi et al., 2018): theta = k - 2f rows picked by repeated
// Krum. Each step scores the r rows still in play against each other with
// KrumNeighbourCount(r, f, variant) neighbours, picks the lowest score (lowest index on
// ties), and removes it. Returns the picks in pick order. Requires k >= 4f + 3.
// The last steps run below Krum's own bound 2f + 3 (the last has r = 2f + 1), so the
// neighbour count is clamped to [1, r - 1]; this changes anything only where the formula
// gives 0 or less (kPaper with f <= 1, or r = 1 with f = 0); a single row left is taken.
// The selection may contain Byzantine rows; Bulyan's coordinate step (the theta - 2f
// values nearest the median) is what trims them. E.g. f identical rows score 0 at the
// last kPaper step (f - 1 neighbours) and one of them is picked; rows far from
// everything, each other included, are never picked.
std::vector<size_t> BulyanSelection(const SquareMatrix& dist, size_t f, KrumNeighbours variant);

// Smoothed Weiszfeld (Pillutla et al., RFA): z = sum_j beta_j x_j, starting from the
// mean; each iteration sets w_i = 1 / max(nu, ||z - x_i||) and z = sum w_i x_i / sum w_i,
// with ||z - x_i||^2 = G_ii - 2 (G beta)_i + beta' G beta (clamped at 0). Stops after
// `iterations`, or earlier when the objective sum_i ||z - x_i||, evaluated after each
// update, changes by at most `tolerance` times its new value (RFA's reference code:
// |prev - obj| <= ftol * obj; so tolerance 0 still stops once the objective no longer
// changes, and a negative tolerance runs every iteration). Returns beta (sums to 1).
// Requires nu > 0. (ByzFL's GeometricMedian starts from 0 with T = 3 and no tolerance;
// we follow RFA.)
struct WeiszfeldOptions {
  double nu = 0.1;
  int iterations = 100;
  double tolerance = 1e-6;
};
std::vector<double> GeometricMedianWeights(const SquareMatrix& gram, const WeiszfeldOptions& options);

// Centered clipping (Karimireddy et al., 2021) over rows 0..k-1 with the centre
// v = row k (the previous round's aggregate; gram is (k+1) x (k+1)): `iterations` times
// v <- v + (1/k) sum_i (x_i - v) min(1, tau / ||x_i - v||) (a row at distance 0 has
// factor 1). Returns weights over the k + 1 rows (the last one is v's coefficient) of
// the final v; they sum to 1. Requires tau >= 0. With k = 0 (only v) returns {1}.
std::vector<double> CenteredClippingWeights(const SquareMatrix& gram, double tau, int iterations);

// Number of (k - f)-subsets of k rows, C(k, f), saturating at UINT64_MAX; 0 when f > k.
uint64_t SubsetCount(size_t k, size_t f);

// The checks of an exhaustive (k - f)-subset search (MDA, SMEA): INVALID_ARGUMENT when
// f >= k, and (naming C(k, f) and the limit, then "lower f or raise <raise>") when
// SubsetCount(k, f) > max_subsets.
absl::Status CheckSubsetSearch(const char* rule, size_t k, size_t f, uint64_t max_subsets,
                               const char* raise);

// MDA (minimum diameter averaging, El Mhamdi et al., 2020; as ByzFL): the (k - f)-subset
// whose largest pairwise squared distance is smallest; among equal diameters the
// lexicographically first subset. Exact: depth-first enumeration in lexicographic order,
// cutting every branch whose partial diameter already reaches the best found (diameters
// only grow). Refuses with INVALID_ARGUMENT when f >= k, and (naming C(k, f) and the
// limit) when SubsetCount(k, f) > max_subsets, e.g. "mda: C(30, 10) = 30045015 subsets
// exceeds the limit of 1000000; lower f or raise mda max subsets". Returns the subset's
// indices in increasing order.
absl::StatusOr<std::vector<size_t>> MdaSubset(const SquareMatrix& dist, size_t f,
                                              uint64_t max_subsets);

// NNM (Allouah et al., 2023): row i becomes the mean of the k - f rows nearest to row i,
// itself included: row i itself, then the k - f - 1 nearest other rows (distance ties
// to the lowest index). A k x k mixing; every row has k - f entries 1 / (k - f) and sums
// to 1. Requires f < k (f >= k is taken as k - 1: the identity).
Mixing NnmMixing(const SquareMatrix& dist, size_t f);

// Static clipping: scale_i = min(1, threshold / ||x_i||), ||x_i|| = sqrt(G_ii); a zero
// row keeps scale 1. Requires threshold >= 0.
std::vector<double> ClipScales(const SquareMatrix& gram, double threshold);

// ARC (Allouah et al., 2024, adaptive robust clipping): the floor(2 (f / k) (k - f))
// rows of largest norm are scaled to the norm of the largest remaining row (ties by
// index, larger index clipped first); others keep scale 1. Checked against ByzFL's ARC
// (its docstring, citing the paper: k = floor(2 (f/n) (n - f)), x_i scaled by
// min(1, ||x_pi(k)|| / ||x_i||); its code sorts the norms ascending (stable), clips the
// last nb_clipped to the norm just below them; its example {1,2,3},{4,5,6},{7,8,9},
// f = 1 is a test here). The count is computed in integers, 2 f (k - f) / k; ByzFL's
// float int((2 * f / n) * (n - f)) is one lower in rare cases (n = 242, f = 33 is the
// first with f < n / 2). f = 0 or f >= k: all scales 1.
std::vector<double> ArcScales(const SquareMatrix& gram, size_t f);

// Bucketing (Karimireddy et al., 2022): the k rows shuffled by a permutation seeded from
// (seed, round) only (reproducible on every shard and platform: our own generator, not
// std::shuffle), cut into ceil(k / s) buckets of s consecutive rows (the last may be
// smaller); output row b is its bucket's mean. A ceil(k / s) x k mixing. The generator
// is SplitMix64 seeded by mixing seed and round; Fisher-Yates with unbiased bounded
// draws (rejection). s = 0 is taken as 1.
Mixing BucketingMixing(size_t k, size_t s, uint64_t seed, uint64_t round);

}  // namespace ps::aggregators::internal
