// The arithmetic of a round's plan (mixing_internal.h).
#include "aggregators/mixing_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "aggregators/coordinate_internal.h"
#include "core/simd.h"

namespace ps::aggregators::internal {
namespace {

// out[begin, end) = sum_j w[j] rows[j][c], in float: four rows per pass over a tile
// (fixed grouping, so the same bits on every clone and thread count; no contraction
// into fused multiply-adds under -std=c++20).
PS_VECTOR_CLONES void MixBlock(const std::vector<const float*>& rows, const std::vector<float>& w,
                               size_t begin, size_t end, float* out) {
  constexpr size_t kTile = 512;
  float acc[kTile];
  for (size_t t = begin; t < end; t += kTile) {
    const size_t len = std::min(kTile, end - t);
    std::fill(acc, acc + len, 0.0f);
    size_t j = 0;
    for (; j + 4 <= rows.size(); j += 4) {
      const float* x0 = rows[j] + t;
      const float* x1 = rows[j + 1] + t;
      const float* x2 = rows[j + 2] + t;
      const float* x3 = rows[j + 3] + t;
      const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
      for (size_t c = 0; c < len; ++c) {
        acc[c] += ((w0 * x0[c] + w1 * x1[c]) + (w2 * x2[c] + w3 * x3[c]));
      }
    }
    for (; j < rows.size(); ++j) {
      const float* x = rows[j] + t;
      const float wj = w[j];
      for (size_t c = 0; c < len; ++c) acc[c] += wj * x[c];
    }
    std::memcpy(out + t, acc, len * sizeof(float));
  }
}

}  // namespace

SquareMatrix TopLeftBlock(const SquareMatrix& g, size_t m) {
  SquareMatrix b(m);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < m; ++j) b.at(i, j) = g.at(i, j);
  }
  return b;
}

Mixing WithState(const Mixing& m, size_t s) {
  Mixing out(m.rows + s, m.cols + s);
  for (size_t r = 0; r < m.rows; ++r) {
    for (size_t c = 0; c < m.cols; ++c) out.at(r, c) = m.at(r, c);
  }
  for (size_t i = 0; i < s; ++i) out.at(m.rows + i, m.cols + i) = 1.0;
  return out;
}

Mixing Multiply(const Mixing& a, const Mixing& b) {
  Mixing out(a.rows, b.cols);
  for (size_t r = 0; r < a.rows; ++r) {
    for (size_t j = 0; j < a.cols; ++j) {
      const double w = a.at(r, j);
      if (w == 0.0) continue;
      for (size_t c = 0; c < b.cols; ++c) out.at(r, c) += w * b.at(j, c);
    }
  }
  return out;
}

SquareMatrix Congruence(const Mixing& m, const SquareMatrix& g) {
  Mixing gm(g.k, g.k);
  for (size_t i = 0; i < g.k; ++i) {
    for (size_t j = 0; j < g.k; ++j) gm.at(i, j) = g.at(i, j);
  }
  const Mixing mg = Multiply(m, gm);
  SquareMatrix out(m.rows);
  for (size_t r = 0; r < m.rows; ++r) {
    for (size_t q = r; q < m.rows; ++q) {
      double sum = 0.0;
      for (size_t c = 0; c < m.cols; ++c) sum += mg.at(r, c) * m.at(q, c);
      out.at(r, q) = sum;
      out.at(q, r) = sum;
    }
  }
  return out;
}

// MixRow: see mixing_internal.h.
void MixRow(const std::vector<double>& weights, std::span<const float* const> rows,
            std::span<float> out, core::ThreadPool* pool) {
  std::vector<const float*> used;
  std::vector<double> wd;
  for (size_t j = 0; j < weights.size(); ++j) {
    if (weights[j] != 0.0) {
      used.push_back(rows[j]);
      wd.push_back(weights[j]);
    }
  }
  bool average = !used.empty();
  for (double v : wd) {
    average = average && std::abs(v * static_cast<double>(used.size()) - 1.0) < 1e-12;
  }
  std::vector<float> w(wd.begin(), wd.end());
  if (average) {
    internal::AverageInputs(used, out, pool);
    return;
  }
  internal::ForEachCoordinateBlock(out.size(), pool, [&](size_t begin, size_t end) {
    MixBlock(used, w, begin, end, out.data());
  });
}


}  // namespace ps::aggregators::internal
