// Krum scoring, shared by Krum and Multi-Krum (and later Bulyan's selection).
#pragma once

#include <cstddef>
#include <vector>

#include "aggregators/aggregator.h"
#include "aggregators/gram_internal.h"

namespace ps::aggregators::internal {

// Neighbours each input is scored over, for k inputs and f Byzantine: k - f - 2
// (kPaper) or k - f - 1 (kByzFL). With k >= 2f + 3 this lies in [1, k - 1].
size_t KrumNeighbourCount(size_t k, size_t f, KrumNeighbours variant);

// score[i] = sum of the `neighbours` smallest squared distances from input i to the
// others, added in ascending order. Requires 1 <= neighbours <= k - 1.
std::vector<double> KrumScores(const SquareMatrix& dist, size_t neighbours);

// Indices 0..k-1 ordered by (score, index): the first is Krum's pick.
std::vector<size_t> RankByScore(const std::vector<double>& scores);

}  // namespace ps::aggregators::internal
