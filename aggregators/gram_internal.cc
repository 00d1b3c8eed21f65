#include "aggregators/gram_internal.h"

#include <algorithm>
#include <array>

#include "aggregators/simd_internal.h"

namespace ps::aggregators::internal {
namespace {

// Lanes of independent double accumulators per dot product: enough for the compiler to
// vectorize without reassociating, and a fixed summation order.
constexpr size_t kLanes = 8;

// Rows of the other operand handled together, so each load of x is used kRows times.
constexpr size_t kRows = 4;

inline double SumLanes(const std::array<double, kLanes>& acc) {
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// out[r] = x . y[r] over n floats, for r < kRows.
void DotRows(const float* x, const std::array<const float*, kRows>& y, size_t n,
             std::array<double, kRows>& out) {
  std::array<std::array<double, kLanes>, kRows> acc{};
  size_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    std::array<double, kLanes> xv;
    for (size_t l = 0; l < kLanes; ++l) xv[l] = static_cast<double>(x[c + l]);
    for (size_t r = 0; r < kRows; ++r) {
      for (size_t l = 0; l < kLanes; ++l) {
        acc[r][l] += xv[l] * static_cast<double>(y[r][c + l]);
      }
    }
  }
  for (size_t l = 0; c < n; ++c, ++l) {
    for (size_t r = 0; r < kRows; ++r) {
      acc[r][l] += static_cast<double>(x[c]) * static_cast<double>(y[r][c]);
    }
  }
  for (size_t r = 0; r < kRows; ++r) out[r] = SumLanes(acc[r]);
}

// x . y over n floats.
double Dot(const float* x, const float* y, size_t n) {
  std::array<double, kLanes> acc{};
  size_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      acc[l] += static_cast<double>(x[c + l]) * static_cast<double>(y[c + l]);
    }
  }
  for (size_t l = 0; c < n; ++c, ++l)
    acc[l] += static_cast<double>(x[c]) * static_cast<double>(y[c]);
  return SumLanes(acc);
}

// Adds the upper triangle (j >= i) of the Gram of [begin, end) into `partial`.
PS_VECTOR_CLONES void AccumulateChunk(std::span<const float* const> inputs, size_t begin,
                                      size_t end, SquareMatrix& partial) {
  const size_t k = inputs.size();
  for (size_t base = begin; base < end; base += kGramBlock) {
    const size_t n = std::min(kGramBlock, end - base);
    for (size_t i = 0; i < k; ++i) {
      const float* x = inputs[i] + base;
      size_t j = i;
      for (; j + kRows <= k; j += kRows) {
        std::array<const float*, kRows> y;
        for (size_t r = 0; r < kRows; ++r) y[r] = inputs[j + r] + base;
        std::array<double, kRows> dots;
        DotRows(x, y, n, dots);
        for (size_t r = 0; r < kRows; ++r) partial.at(i, j + r) += dots[r];
      }
      for (; j < k; ++j) partial.at(i, j) += Dot(x, inputs[j] + base, n);
    }
  }
}

}  // namespace

SquareMatrix GramMatrix(std::span<const float* const> inputs, size_t d, core::ThreadPool* pool) {
  const size_t k = inputs.size();
  SquareMatrix gram(k);
  const size_t chunks = (d + kGramChunk - 1) / kGramChunk;
  std::vector<SquareMatrix> partials(std::min(chunks, kGramChunksPerWave), SquareMatrix(k));
  for (size_t first = 0; first < chunks; first += kGramChunksPerWave) {
    const size_t wave = std::min(kGramChunksPerWave, chunks - first);
    auto run = [&](size_t t) {
      SquareMatrix& partial = partials[t];
      std::fill(partial.values.begin(), partial.values.end(), 0.0);
      const size_t begin = (first + t) * kGramChunk;
      AccumulateChunk(inputs, begin, std::min(d, begin + kGramChunk), partial);
    };
    if (pool == nullptr || wave <= 1) {
      for (size_t t = 0; t < wave; ++t) run(t);
    } else {
      pool->ParallelFor(wave, run);
    }
    // Chunk order, whatever thread computed which chunk.
    for (size_t t = 0; t < wave; ++t) {
      for (size_t i = 0; i < k; ++i) {
        for (size_t j = i; j < k; ++j) gram.at(i, j) += partials[t].at(i, j);
      }
    }
  }
  for (size_t i = 0; i < k; ++i) {
    for (size_t j = 0; j < i; ++j) gram.at(i, j) = gram.at(j, i);
  }
  return gram;
}

SquareMatrix SquaredDistancesFromGram(const SquareMatrix& gram) {
  const size_t k = gram.k;
  SquareMatrix dist(k);
  for (size_t i = 0; i < k; ++i) {
    for (size_t j = i + 1; j < k; ++j) {
      const double v = std::max(0.0, gram.at(i, i) + gram.at(j, j) - 2.0 * gram.at(i, j));
      dist.at(i, j) = v;
      dist.at(j, i) = v;
    }
  }
  return dist;
}

SquareMatrix SquaredDistances(std::span<const float* const> inputs, size_t d,
                              core::ThreadPool* pool) {
  return SquaredDistancesFromGram(GramMatrix(inputs, d, pool));
}

}  // namespace ps::aggregators::internal
