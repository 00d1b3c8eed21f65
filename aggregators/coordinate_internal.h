// Coordinate-wise kernels shared by the separable rules (mean, median, trimmed mean) and
// by Multi-Krum's averaging: fixed coordinate blocks spread over a pool, and selection
// of order statistics across the k inputs of each coordinate.
//
// Every output coordinate is a function of that coordinate's k input values only, and
// blocks never share accumulators, so results do not depend on the pool or its size.
// `out` may be one of the inputs (the same pointer) but must not partially overlap one:
// a tile is read completely before it is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <cstring>
#include <utility>
#include <vector>

#include "core/thread_pool.h"

namespace ps::aggregators::internal {

// Coordinates per parallel task; a constant so the split never depends on the pool.
inline constexpr size_t kCoordinateBlock = 16384;
// Coordinates per tile of the sorting-network path: k rows of this many floats (at most
// 32 KiB) stay in L1.
inline constexpr size_t kNetworkTile = 128;
// Copies the w <= kNetworkTile values at src into a tile row at dst. A full row is a
// fixed-width loop, which the caller's vector clone turns into vector loads and stores:
// GCC expanded memcpy of the run-time size w * 4 into `rep movsq`, which took two
// thirds of the trimmed mean's time over five inputs on the 2-core AMD EPYC
// (docs/bench.md, "Small copies GCC made rep movsq").
inline void CopyTileRow(const float* __restrict src, size_t w, float* __restrict dst) {
  if (w == kNetworkTile) {
    for (size_t c = 0; c < kNetworkTile; ++c) dst[c] = src[c];
    return;
  }
  std::memcpy(dst, src, w * sizeof(float));
}

// Up to this many inputs a tile is sorted by a sorting network applied row against row
// (compare-exchange vectorizes across coordinates, no branches); above it every
// coordinate's values are gathered contiguously and selected with std::nth_element,
// whose data-dependent branches make it several times slower per value at these sizes.
// (Measured on AVX2, the network with its tile in L2 stays 3x to 10x faster than
// nth_element up to k = 1024; coordinate_rules.cc uses it up to 256 inputs.)
inline constexpr size_t kMaxNetworkInputs = 64;

// Runs fn(begin, end) over consecutive blocks of at most kCoordinateBlock coordinates
// covering [0, d): on `pool` and the calling thread when pool is not null, else
// serially. Returns when all blocks are done.
void ForEachCoordinateBlock(size_t d, core::ThreadPool* pool,
                            const std::function<void(size_t begin, size_t end)>& fn);

// out[c] = (x_0[c] + x_1[c] + ... + x_{k-1}[c]) / k, summed in float in input order.
// Requires k >= 1.
void AverageInputs(std::span<const float* const> inputs, std::span<float> out,
                   core::ThreadPool* pool);

// out[c] = the mean of the order statistics of ranks lo..hi (0-based, inclusive) among
// {x_i[c]}: summed in double and rounded to float once, so a midpoint of two values is
// exact and a single rank is copied unchanged. Requires lo <= hi < k.
void MeanOfRanks(std::span<const float* const> inputs, size_t lo, size_t hi, std::span<float> out,
                 core::ThreadPool* pool);

// Sorts each of the kNetworkTile columns of `tile` (rows x kNetworkTile floats, row-major)
// ascending down the rows, by applying `network` (SortingNetwork(rows)) row against row
// (for small `rows`, the same network unrolled in registers). Every column is sorted, so
// columns past the caller's data must hold values that are not NaN.
void SortTileColumns(float* tile, size_t rows,
                     std::span<const std::pair<uint32_t, uint32_t>> network);

// Comparators (a, b), a < b, of Batcher's odd-even merge sort on k elements: applying
// them in order, each putting the smaller value at a, sorts any k values.
std::vector<std::pair<uint32_t, uint32_t>> SortingNetwork(size_t k);

}  // namespace ps::aggregators::internal
