// Sparsifiers: which coordinates a sparse codec keeps (sparse_internal.h).
//
// Magnitudes compare as integers: for a finite float, the bits with the sign cleared
// are ordered like |x|, so selection runs on uint32 keys with no float compares.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>

#include "codecs/codec_internal.h"
#include "codecs/sparse_internal.h"

namespace ps::codecs::internal {
namespace {

inline uint32_t AbsBits(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }

// Sorted indices of every element whose key is >= t (all of them when `all_ties`),
// or whose key is > t plus the first `ties` elements equal to t.
std::vector<uint32_t> CollectAbove(std::span<const float> x, uint32_t t, size_t k,
                                   size_t ties, bool all_ties) {
  std::vector<uint32_t> out(k + 1);
  size_t n = 0;
  if (all_ties) {
    // Exactly k elements have key >= t: a branch-free compaction into k + 1 slots.
    for (size_t i = 0; i < x.size(); ++i) {
      out[n] = static_cast<uint32_t>(i);
      n += AbsBits(x[i]) >= t;
    }
  } else {
    for (size_t i = 0; i < x.size(); ++i) {
      const uint32_t a = AbsBits(x[i]);
      if (a > t || (a == t && ties > 0)) {
        ties -= a == t;
        out[n++] = static_cast<uint32_t>(i);
      }
    }
  }
  out.resize(n);
  return out;
}

}  // namespace

size_t KeepCount(double ratio, size_t numel) {
  if (numel == 0) return 0;
  const double k = std::round(ratio * static_cast<double>(numel));
  if (k < 1) return 1;
  if (k >= static_cast<double>(numel)) return numel;
  return static_cast<size_t>(k);
}

std::vector<uint32_t> TopkExact(std::span<const float> x, size_t k) {
  const size_t n = x.size();
  if (k >= n) {
    std::vector<uint32_t> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = static_cast<uint32_t>(i);
    return all;
  }
  if (k == 0) return {};
  // Pass 1: histogram of the top 11 of the 31 magnitude bits. Four interleaved
  // histograms keep repeated increments of one bin from serializing.
  constexpr int kShift = 20;
  constexpr size_t kBins = size_t{1} << 11;
  std::vector<uint32_t> hist(4 * kBins, 0);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++hist[0 * kBins + (AbsBits(x[i]) >> kShift)];
    ++hist[1 * kBins + (AbsBits(x[i + 1]) >> kShift)];
    ++hist[2 * kBins + (AbsBits(x[i + 2]) >> kShift)];
    ++hist[3 * kBins + (AbsBits(x[i + 3]) >> kShift)];
  }
  for (; i < n; ++i) ++hist[AbsBits(x[i]) >> kShift];
  // The bin holding the k-th largest key, and how many keys lie above it.
  size_t above = 0;
  uint32_t bin = kBins - 1;
  for (;; --bin) {
    const size_t c = size_t{hist[bin]} + hist[kBins + bin] + hist[2 * kBins + bin] +
                     hist[3 * kBins + bin];
    if (above + c >= k) break;
    above += c;
  }
  // Pass 2: the keys of that bin (branch-free compaction), then the exact threshold
  // among them.
  const size_t in_bin = size_t{hist[bin]} + hist[kBins + bin] + hist[2 * kBins + bin] +
                        hist[3 * kBins + bin];
  std::vector<uint32_t> cand(in_bin + 1);
  size_t c = 0;
  for (size_t j = 0; j < n; ++j) {
    const uint32_t a = AbsBits(x[j]);
    cand[c] = a;
    c += (a >> kShift) == bin;
  }
  cand.resize(in_bin);
  const size_t need = k - above;  // 1..in_bin
  std::nth_element(cand.begin(), cand.begin() + static_cast<ptrdiff_t>(need - 1), cand.end(),
                   std::greater<uint32_t>());
  const uint32_t t = cand[need - 1];
  size_t greater = above;
  size_t equal = 0;
  for (uint32_t a : cand) {
    greater += a > t;
    equal += a == t;
  }
  const size_t ties = k - greater;
  return CollectAbove(x, t, k, ties, ties == equal);
}

std::vector<uint32_t> TopkSampled(std::span<const float> x, size_t k, uint64_t seed) {
  const size_t n = x.size();
  if (k == 0 || k >= n) return TopkExact(x, k);
  // About 64 sampled keys above the threshold: its rank error is then ~1/8 of k.
  const double ratio = static_cast<double>(k) / static_cast<double>(n);
  const size_t samples = std::max<size_t>(1024, static_cast<size_t>(std::ceil(64 / ratio)));
  if (2 * samples >= n) return TopkExact(x, k);
  std::vector<uint32_t> keys(samples);
  for (size_t j = 0; j < samples; ++j) {
    keys[j] = AbsBits(x[BoundedRandom(Mix64(seed + j), n)]);
  }
  const size_t rank = std::clamp<size_t>(
      static_cast<size_t>(std::llround(ratio * static_cast<double>(samples))), 1, samples);
  std::nth_element(keys.begin(), keys.begin() + static_cast<ptrdiff_t>(rank - 1), keys.end(),
                   std::greater<uint32_t>());
  const uint32_t t = keys[rank - 1];
  std::vector<uint32_t> kept;
  kept.reserve(k + k / 4 + 16);
  for (size_t i = 0; i < n; ++i) {
    if (AbsBits(x[i]) >= t) kept.push_back(static_cast<uint32_t>(i));
  }
  if (kept.size() <= 2 * k) return kept;
  // Far too many (a sample that missed the tail, or many equal magnitudes): the exact
  // top k of the kept ones.
  std::vector<float> vals(kept.size());
  for (size_t j = 0; j < kept.size(); ++j) vals[j] = x[kept[j]];
  std::vector<uint32_t> best = TopkExact(vals, k);
  for (uint32_t& b : best) b = kept[b];
  return best;
}

std::vector<uint32_t> ThresholdSelect(std::span<const float> x, float tau) {
  const uint32_t t = AbsBits(tau);
  std::vector<uint32_t> kept;
  for (size_t i = 0; i < x.size(); ++i) {
    if (AbsBits(x[i]) >= t) kept.push_back(static_cast<uint32_t>(i));
  }
  return kept;
}

std::vector<uint32_t> SampleSortedIndices(uint64_t seed, size_t k, uint64_t n) {
  std::vector<uint32_t> out;
  if (k == 0 || k > n) return out;
  out.reserve(k);
  // Open addressing over 2k..4k slots; the empty marker cannot be an index (< n < 2^32).
  constexpr uint32_t kEmpty = 0xffffffffu;
  const size_t slots = std::bit_ceil(2 * k);
  const size_t mask = slots - 1;
  std::vector<uint32_t> table(slots, kEmpty);
  // Inserts v unless present; returns whether it was inserted.
  auto insert = [&](uint32_t v) {
    size_t h = static_cast<size_t>(Mix64(v)) & mask;
    while (table[h] != kEmpty) {
      if (table[h] == v) return false;
      h = (h + 1) & mask;
    }
    table[h] = v;
    return true;
  };
  // Floyd: for j = n-k .. n-1 draw t uniform in [0, j]; take t, or j if t was taken.
  for (uint64_t j = n - k; j < n; ++j) {
    const auto t = static_cast<uint32_t>(BoundedRandom(Mix64(seed ^ Mix64(j)), j + 1));
    if (insert(t)) {
      out.push_back(t);
    } else {
      insert(static_cast<uint32_t>(j));
      out.push_back(static_cast<uint32_t>(j));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ps::codecs::internal
