// The arithmetic of a round's plan (docs/aggregators.md): mixings composed across the
// stages of a chain, Gram matrices carried through them, and a mixing applied to rows of
// coordinates. Shared by Aggregator's plan and its apply (aggregator.cc).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "aggregators/gram_internal.h"
#include "aggregators/gram_rules_internal.h"
#include "core/thread_pool.h"

namespace ps::aggregators::internal {

// m x m top-left block of a square matrix.
SquareMatrix TopLeftBlock(const SquareMatrix& g, size_t m);

// diag(M, I_s): M is r x m; the result is (r + s) x (m + s).
Mixing WithState(const Mixing& m, size_t s);

// a b: the mixing that applies b, then a.
Mixing Multiply(const Mixing& a, const Mixing& b);

// M G M' for a symmetric G.
SquareMatrix Congruence(const Mixing& m, const SquareMatrix& g);

// out[c] = sum_j w_j rows_j[c] over the non-zero weights, in float, four rows per pass
// over a tile (fixed grouping, so the same bits on every clone and thread count). When
// all non-zero weights are equal to 1/q the sum is divided by q instead, which is what
// an average of q rows computes. `out` may be one of the rows.
void MixRow(const std::vector<double>& weights, std::span<const float* const> rows,
            std::span<float> out, core::ThreadPool* pool);

}  // namespace ps::aggregators::internal
