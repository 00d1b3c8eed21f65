#include "aggregators/coordinate_internal.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "core/simd.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(PS_NO_VECTOR_CLONES)
#include <immintrin.h>
#define PS_REGISTER_NETWORKS 1
#endif

namespace ps::aggregators::internal {
namespace {

// Coordinates per tile of AverageInputs. Few inputs: 1024, a 4 KiB accumulator that
// stays in L1 while each input's 4 KiB streams past it. From kWideTileInputs inputs on,
// whose rows are mostly in memory rather than in cache (16 or more rows of a slice),
// 4096: each visit to an input then reads 16 KiB in a row instead of a single page,
// which the memory's prefetchers serve 1.3-1.8x as fast at 16-64 inputs out of cache,
// while the accumulator, in L2 now, costs a few per cent where the rows are cached
// (docs/bench.md, "The mean's tile by input count"). The sums are the same either way.
constexpr size_t kAverageTile = 1024;
constexpr size_t kAverageWideTile = 4096;
constexpr size_t kWideTileInputs = 16;

// Puts the column-wise minimum of rows a and b into a and the maximum into b. The
// rows never overlap; saying so lets the loop vectorize.
inline void CompareExchange(float* __restrict a, float* __restrict b) {
  for (size_t c = 0; c < kNetworkTile; ++c) {
    const float x = a[c];
    const float y = b[c];
    a[c] = std::min(x, y);
    b[c] = std::max(x, y);
  }
}

// Calls emit(a, b) for the comparators of Batcher's odd-even merge sort on k elements,
// in order: the network for the next power of two, keeping only comparators inside
// [0, k) (padding with +inf at the end, the dropped ones would never move anything).
// constexpr so that the register networks below are the same comparators.
template <typename Emit>
constexpr void ForEachBatcherComparator(size_t k, Emit&& emit) {
  for (size_t p = 1; p < k; p <<= 1) {
    for (size_t s = p; s >= 1; s >>= 1) {
      for (size_t j = s % p; j + s < k; j += 2 * s) {
        for (size_t i = 0; i < std::min(s, k - j - s); ++i) {
          if ((i + j) / (2 * p) == (i + j + s) / (2 * p)) {
            emit(static_cast<uint32_t>(i + j), static_cast<uint32_t>(i + j + s));
          }
        }
      }
    }
  }
}

#ifdef PS_REGISTER_NETWORKS
// The network run by the streaming loop below costs about 4 cycles per 8-wide
// compare-exchange (each one a round trip through L1). For small k a strip of the tile
// fits in registers: load 8 coordinates of all k rows, apply the network with its
// comparators fixed at compile time, store them back; about 1.6x to 2x faster (measured
// at k = 16 to 32, AVX2). AVX2 only; the same comparators, in the same order, with the
// same min/max as CompareExchange, so the same bits. The cap bounds the code (about
// 70 KB for all k <= 32; it grows to 500 KB at 64, with spills that eat the gain).
constexpr size_t kMaxRegisterNetworkInputs = 32;

template <size_t K>
constexpr size_t BatcherSize() {
  size_t n = 0;
  ForEachBatcherComparator(K, [&n](uint32_t, uint32_t) { ++n; });
  return n;
}

template <size_t K>
constexpr std::array<std::pair<uint32_t, uint32_t>, BatcherSize<K>()> BatcherNetwork() {
  std::array<std::pair<uint32_t, uint32_t>, BatcherSize<K>()> network{};
  size_t n = 0;
  ForEachBatcherComparator(K, [&](uint32_t a, uint32_t b) { network[n++] = {a, b}; });
  return network;
}

// Not instrumented by ASan or UBSan: with the instrumentation v[] stays in memory and
// compiling the 31 fully unrolled networks took 14 minutes (clang's fuzzing build: 2);
// without it, 10 s. The loads and stores are fixed offsets inside the k x kNetworkTile
// tile that SortRows' callers allocate, and SortTileColumnsTest checks every k <= 70
// against std::sort (the streamed network beyond 32 stays instrumented).
template <size_t K>
__attribute__((target("avx2"), no_sanitize("address", "undefined"))) void SortRowsInRegisters(
    float* rows) {
  static constexpr auto kNetwork = BatcherNetwork<K>();
  // The comparator loop is unrolled completely: every index is a constant and v lives in
  // registers.
#pragma GCC unroll 1
  for (size_t s = 0; s < kNetworkTile; s += 8) {
    __m256 v[K];
#pragma GCC unroll 64
    for (size_t r = 0; r < K; ++r) v[r] = _mm256_loadu_ps(rows + r * kNetworkTile + s);
#pragma GCC unroll 1024
    for (size_t i = 0; i < kNetwork.size(); ++i) {
      const __m256 x = v[kNetwork[i].first];
      const __m256 y = v[kNetwork[i].second];
      v[kNetwork[i].first] = _mm256_min_ps(y, x);   // y < x ? y : x, as std::min(x, y)
      v[kNetwork[i].second] = _mm256_max_ps(y, x);  // y > x ? y : x, as std::max(x, y)
    }
#pragma GCC unroll 64
    for (size_t r = 0; r < K; ++r) _mm256_storeu_ps(rows + r * kNetworkTile + s, v[r]);
  }
}

using RegisterSort = void (*)(float*);

// MeanOfRanks on [begin, end), (end - begin) a multiple of 8, for K inputs, straight from
// the inputs: 8 coordinates of every input loaded into registers, sorted by the network
// above, the ranks lo..hi summed in double (0.0 + the lowest, then the rest in rank
// order), scaled, rounded to float and stored. MeanOfRanksNetwork copies a tile of every
// input, sorts it through memory, sums the ranks from the tile and copies the result out;
// this does the same arithmetic in the same order (so the same bits) with none of those
// passes, 1.5x to 2.9x faster at 4 to 16 inputs (docs/bench.md, "Order statistics in
// registers"). All K rows are loaded before the store, so `out` may be an input.
template <size_t K>
__attribute__((target("avx2"), no_sanitize("address", "undefined"))) void MeanOfRanksInRegisters(
    const float* const* inputs, size_t lo, size_t hi, double count, double reciprocal,
    float* out, size_t begin, size_t end) {
  static constexpr auto kNetwork = BatcherNetwork<K>();
  const float* in[K];
#pragma GCC unroll 64
  for (size_t r = 0; r < K; ++r) in[r] = inputs[r];
  const __m256d scale = _mm256_set1_pd(reciprocal);
  const __m256d divisor = _mm256_set1_pd(count);
#pragma GCC unroll 1
  for (size_t c = begin; c < end; c += 8) {
    __m256 v[K];
#pragma GCC unroll 64
    for (size_t r = 0; r < K; ++r) v[r] = _mm256_loadu_ps(in[r] + c);
#pragma GCC unroll 1024
    for (size_t i = 0; i < kNetwork.size(); ++i) {
      const __m256 x = v[kNetwork[i].first];
      const __m256 y = v[kNetwork[i].second];
      v[kNetwork[i].first] = _mm256_min_ps(y, x);
      v[kNetwork[i].second] = _mm256_max_ps(y, x);
    }
    __m256d low = _mm256_setzero_pd();
    __m256d high = _mm256_setzero_pd();
#pragma GCC unroll 64
    for (size_t r = 0; r < K; ++r) {
      if (r < lo || r > hi) continue;
      low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(v[r])));
      high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(v[r], 1)));
    }
    if (reciprocal != 0.0) {
      low = _mm256_mul_pd(low, scale);
      high = _mm256_mul_pd(high, scale);
    } else {
      low = _mm256_div_pd(low, divisor);
      high = _mm256_div_pd(high, divisor);
    }
    _mm256_storeu_ps(out + c, _mm256_set_m128(_mm256_cvtpd_ps(high), _mm256_cvtpd_ps(low)));
  }
}

using RegisterRanks = void (*)(const float* const*, size_t, size_t, double, double, float*,
                               size_t, size_t);

// Up to this many inputs MeanOfRanks runs in registers (at 16 the rows, sums and constants
// already spill past AVX2's 16 vector registers and it still ran at 0.6 of the tile's
// time); beyond, the tile with its register sort (kMaxRegisterNetworkInputs) serves.
constexpr size_t kMaxRegisterRankInputs = 16;

template <size_t... I>
constexpr std::array<RegisterRanks, sizeof...(I)> RegisterRankKernels(std::index_sequence<I...>) {
  return {&MeanOfRanksInRegisters<I + 2>...};
}

// The in-register MeanOfRanks for k inputs, or nullptr (k < 2, k too large, no AVX2).
RegisterRanks RegisterRanksFor(size_t k) {
  static constexpr auto kKernels =
      RegisterRankKernels(std::make_index_sequence<kMaxRegisterRankInputs - 1>{});
  return core::CpuHasAvx2() && k >= 2 && k <= kMaxRegisterRankInputs ? kKernels[k - 2] : nullptr;
}

// Entry i sorts i + 2 rows.
template <size_t... I>
constexpr std::array<RegisterSort, sizeof...(I)> RegisterSorts(std::index_sequence<I...>) {
  return {&SortRowsInRegisters<I + 2>...};
}

// The register network for k rows, or nullptr (k < 2 needs none; k too large; no AVX2).
RegisterSort RegisterSortFor(size_t k) {
  static constexpr auto kSorts =
      RegisterSorts(std::make_index_sequence<kMaxRegisterNetworkInputs - 1>{});
  return core::CpuHasAvx2() && k >= 2 && k <= kMaxRegisterNetworkInputs ? kSorts[k - 2] : nullptr;
}
#endif

// Sorts the rows of a k x kNetworkTile tile column by column, with `network`
// (SortingNetwork(k)). Full fixed-width rows keep the loop free of remainders so it
// vectorizes; columns past the tile's end hold stale but finite values and are ignored
// by the caller.
inline void SortRows(float* rows, size_t k,
                     std::span<const std::pair<uint32_t, uint32_t>> network) {
#ifdef PS_REGISTER_NETWORKS
  if (const RegisterSort sort = RegisterSortFor(k)) {
    sort(rows);
    return;
  }
#endif
  for (const auto& [a, b] : network) {
    CompareExchange(rows + a * kNetworkTile, rows + b * kNetworkTile);
  }
}

// sum / count, as a product when count is a power of two: then both are the correctly
// rounded value of the same real number, so the bits agree, and the product is several
// times cheaper than a vector division.
inline double Reciprocal(size_t count) {
  return (count & (count - 1)) == 0 ? 1.0 / static_cast<double>(count) : 0.0;
}

// acc[c] = sum of x_i[c] in input order, then out[c] = acc[c] / k, for c < w. W is the
// tile width when known at compile time (0 otherwise), so full tiles vectorize at -O2;
// per element the arithmetic is the same either way.
template <size_t W>
inline void AverageTile(std::span<const float* const> inputs, size_t base, size_t w, float* acc,
                        float* out) {
  const size_t n = W == 0 ? w : W;
  const float divisor = static_cast<float>(inputs.size());
  // acc = x_0 + x_1 in one pass: the same sums as a copy and an add, one pass fewer. (One
  // input is copied whole: measured, that stays as fast as any other way of doing it.)
  const float* x0 = inputs[0] + base;
  if (inputs.size() == 1) {
    std::memcpy(acc, x0, n * sizeof(float));
  } else {
    const float* x1 = inputs[1] + base;
    for (size_t c = 0; c < n; ++c) acc[c] = x0[c] + x1[c];
  }
  for (size_t i = 2; i < inputs.size(); ++i) {
    const float* x = inputs[i] + base;
    for (size_t c = 0; c < n; ++c) acc[c] += x[c];
  }
  const size_t k = inputs.size();
  if ((k & (k - 1)) == 0) {
    // x / k as x * (1 / k): both the correctly rounded x 2^-j, so the same bits, and a
    // vector product is several times cheaper than a vector division.
    const float reciprocal = 1.0f / divisor;
    for (size_t c = 0; c < n; ++c) out[base + c] = acc[c] * reciprocal;
  } else {
    for (size_t c = 0; c < n; ++c) out[base + c] = acc[c] / divisor;
  }
}

// MeanOfRanks on [begin, end) for k <= kMaxNetworkInputs.
PS_VECTOR_CLONES void MeanOfRanksNetwork(std::span<const float* const> inputs, size_t lo, size_t hi,
                                         std::span<const std::pair<uint32_t, uint32_t>> network,
                                         float* out, size_t begin, size_t end) {
  const size_t k = inputs.size();
  std::vector<float> rows(k * kNetworkTile, 0.0f);
  std::array<double, kNetworkTile> sum;
  std::array<float, kNetworkTile> result;
  const double count = static_cast<double>(hi - lo + 1);
  const double reciprocal = Reciprocal(hi - lo + 1);
  for (size_t base = begin; base < end; base += kNetworkTile) {
    const size_t w = std::min(kNetworkTile, end - base);
    for (size_t i = 0; i < k; ++i) {
      CopyTileRow(inputs[i] + base, w, rows.data() + i * kNetworkTile);
    }
    SortRows(rows.data(), k, network);
    // 0.0 + the first rank, then the rest: the bits of a sum started at 0.0 (-0.0 too),
    // without the zeroing pass GCC made a `rep stos`.
    const float* first = rows.data() + lo * kNetworkTile;
    for (size_t c = 0; c < kNetworkTile; ++c) sum[c] = 0.0 + static_cast<double>(first[c]);
    for (size_t r = lo + 1; r <= hi; ++r) {
      const float* row = rows.data() + r * kNetworkTile;
      for (size_t c = 0; c < kNetworkTile; ++c) sum[c] += static_cast<double>(row[c]);
    }
    if (reciprocal != 0.0) {
      for (size_t c = 0; c < kNetworkTile; ++c) result[c] = static_cast<float>(sum[c] * reciprocal);
    } else {
      for (size_t c = 0; c < kNetworkTile; ++c) result[c] = static_cast<float>(sum[c] / count);
    }
    CopyTileRow(result.data(), w, out + base);
  }
}

// MeanOfRanks on [begin, end) for any k: each coordinate's k values are gathered
// contiguously and the wanted ranks moved into place with nth_element.
void MeanOfRanksSelect(std::span<const float* const> inputs, size_t lo, size_t hi, float* out,
                       size_t begin, size_t end) {
  const size_t k = inputs.size();
  // Keep the transposed tile near 32 KiB.
  const size_t tile = std::clamp<size_t>(8192 / k, 16, 256);
  std::vector<float> values(k * tile);
  const double count = static_cast<double>(hi - lo + 1);
  for (size_t base = begin; base < end; base += tile) {
    const size_t w = std::min(tile, end - base);
    for (size_t i = 0; i < k; ++i) {
      const float* src = inputs[i] + base;
      for (size_t c = 0; c < w; ++c) values[c * k + i] = src[c];
    }
    for (size_t c = 0; c < w; ++c) {
      float* v = values.data() + c * k;
      std::nth_element(v, v + lo, v + k);
      if (hi > lo) std::nth_element(v + lo + 1, v + hi, v + k);
      double sum = 0.0;
      for (size_t r = lo; r <= hi; ++r) sum += static_cast<double>(v[r]);
      out[base + c] = static_cast<float>(sum / count);
    }
  }
}

// AverageInputs on [begin, end) in tiles of kTile coordinates (inlined into each clone
// of AverageBlock, so that the AVX2 one vectorizes it for AVX2).
template <size_t kTile>
[[gnu::always_inline]] inline void AverageTiles(std::span<const float* const> inputs, size_t begin,
                                                size_t end, float* out) {
  std::array<float, kTile> acc;
  for (size_t base = begin; base < end; base += kTile) {
    const size_t w = std::min(kTile, end - base);
    if (w == kTile) {
      AverageTile<kTile>(inputs, base, w, acc.data(), out);
    } else {
      AverageTile<0>(inputs, base, w, acc.data(), out);
    }
  }
}

// AverageInputs on [begin, end).
PS_VECTOR_CLONES void AverageBlock(std::span<const float* const> inputs, size_t begin, size_t end,
                                   float* out) {
  if (inputs.size() >= kWideTileInputs) {
    AverageTiles<kAverageWideTile>(inputs, begin, end, out);
  } else {
    AverageTiles<kAverageTile>(inputs, begin, end, out);
  }
}

}  // namespace

void ForEachCoordinateBlock(size_t d, core::ThreadPool* pool,
                            const std::function<void(size_t begin, size_t end)>& fn) {
  const size_t blocks = (d + kCoordinateBlock - 1) / kCoordinateBlock;
  auto run = [&](size_t b) {
    const size_t begin = b * kCoordinateBlock;
    fn(begin, std::min(d, begin + kCoordinateBlock));
  };
  if (pool == nullptr || blocks <= 1) {
    for (size_t b = 0; b < blocks; ++b) run(b);
  } else {
    pool->ParallelFor(blocks, run);
  }
}

void AverageInputs(std::span<const float* const> inputs, std::span<float> out,
                   core::ThreadPool* pool) {
  ForEachCoordinateBlock(out.size(), pool, [&](size_t begin, size_t end) {
    AverageBlock(inputs, begin, end, out.data());
  });
}

void MeanOfRanks(std::span<const float* const> inputs, size_t lo, size_t hi, std::span<float> out,
                 core::ThreadPool* pool) {
  const size_t k = inputs.size();
  if (k <= kMaxNetworkInputs) {
    const std::vector<std::pair<uint32_t, uint32_t>> network = SortingNetwork(k);
#ifdef PS_REGISTER_NETWORKS
    if (const RegisterRanks ranks = RegisterRanksFor(k)) {
      const size_t count = hi - lo + 1;
      ForEachCoordinateBlock(out.size(), pool, [&](size_t begin, size_t end) {
        // Groups of 8 in registers, the rest (fewer than 8) through the tile.
        const size_t split = begin + (end - begin) / 8 * 8;
        ranks(inputs.data(), lo, hi, static_cast<double>(count), Reciprocal(count), out.data(),
              begin, split);
        if (split < end) MeanOfRanksNetwork(inputs, lo, hi, network, out.data(), split, end);
      });
      return;
    }
#endif
    ForEachCoordinateBlock(out.size(), pool, [&](size_t begin, size_t end) {
      MeanOfRanksNetwork(inputs, lo, hi, network, out.data(), begin, end);
    });
  } else {
    ForEachCoordinateBlock(out.size(), pool, [&](size_t begin, size_t end) {
      MeanOfRanksSelect(inputs, lo, hi, out.data(), begin, end);
    });
  }
}

PS_VECTOR_CLONES void SortTileColumns(float* tile, size_t rows,
                                      std::span<const std::pair<uint32_t, uint32_t>> network) {
  SortRows(tile, rows, network);
}

std::vector<std::pair<uint32_t, uint32_t>> SortingNetwork(size_t k) {
  std::vector<std::pair<uint32_t, uint32_t>> network;
  ForEachBatcherComparator(k, [&network](uint32_t a, uint32_t b) { network.emplace_back(a, b); });
  return network;
}

}  // namespace ps::aggregators::internal
