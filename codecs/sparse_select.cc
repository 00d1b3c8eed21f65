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

// Appends to *out (in order) every i with |x_i| >= the magnitude whose bits are t;
// returns false, leaving *out partial, once it holds more than `limit`. Blocks of 16
// are tested with a branch-free OR that the compiler vectorizes, so a sparse
// selection costs little more than reading x.
bool CollectAtLeast(std::span<const float> x, uint32_t t, size_t limit,
                    std::vector<uint32_t>* out) {
  constexpr size_t kBlock = 16;
  const size_t n = x.size();
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    uint32_t any = 0;
    for (size_t l = 0; l < kBlock; ++l) any |= static_cast<uint32_t>(AbsBits(x[i + l]) >= t);
    if (any == 0) continue;
    for (size_t l = 0; l < kBlock; ++l) {
      if (AbsBits(x[i + l]) >= t) out->push_back(static_cast<uint32_t>(i + l));
    }
    if (out->size() > limit) return false;
  }
  for (; i < n; ++i) {
    if (AbsBits(x[i]) >= t) out->push_back(static_cast<uint32_t>(i));
  }
  return out->size() <= limit;
}

}  // namespace

size_t KeepCount(double ratio, size_t numel) {
  if (numel == 0) return 0;
  const double k = std::round(ratio * static_cast<double>(numel));
  if (k < 1) return 1;
  if (k >= static_cast<double>(numel)) return numel;
  return static_cast<size_t>(k);
}

namespace {

// The `k` best of `cand` (sorted coordinates) by magnitude, ties to the lower index,
// in increasing order. Keys are unique (the index is in the low bits), so exactly k
// keys are >= the k-th largest.
std::vector<uint32_t> BestOf(std::span<const float> x, std::span<const uint32_t> cand, size_t k) {
  std::vector<uint64_t> keys(cand.size());
  for (size_t j = 0; j < cand.size(); ++j) {
    keys[j] = (uint64_t{AbsBits(x[cand[j]])} << 32) | (0xffffffffu - cand[j]);
  }
  // The k-th largest key; filtering in candidate order keeps the output sorted.
  std::vector<uint64_t> order = keys;
  std::nth_element(order.begin(), order.begin() + static_cast<ptrdiff_t>(k - 1), order.end(),
                   std::greater<uint64_t>());
  const uint64_t kth = order[k - 1];
  std::vector<uint32_t> out(k + 1);
  size_t n = 0;
  for (size_t j = 0; j < cand.size(); ++j) {
    out[n] = cand[j];
    n += keys[j] >= kth;
  }
  out.resize(k);
  return out;
}

// Exact top-k in one pass when a sample predicts the k-th magnitude well: a
// threshold a little below it (from a fixed-seed sample) keeps about 1.3-1.7k
// candidates, and the exact top k are chosen among them. Returns false (and nothing)
// when the candidates are fewer than k or far more (ties, odd distributions); the
// caller then runs the histogram select. Either way the result is the exact top k.
bool TopkByPrefilter(std::span<const float> x, size_t k, std::vector<uint32_t>* out) {
  const size_t n = x.size();
  const double p = static_cast<double>(k) / static_cast<double>(n);
  // m sampled keys are expected above the k-th largest; the sample stays within n / 16
  // (m = 256 on large slices, down to 32 on small ones such as 2^16 values at 1%), so
  // that sampling and selecting in it cost a fraction of the pass over x.
  size_t m = 256;
  while (m > 32 && std::ceil(static_cast<double>(m) / p) > static_cast<double>(n / 16)) m /= 2;
  const auto samples = static_cast<size_t>(std::ceil(static_cast<double>(m) / p));
  if (samples > n / 16) return false;
  std::vector<uint32_t> keys(samples);
  const uint64_t seed = Mix64(n ^ 0x70706b);
  for (size_t j = 0; j < samples; ++j) keys[j] = AbsBits(x[BoundedRandom(Mix64(seed + j), n)]);
  // Four standard deviations (4 sqrt(m)) more make missing the k-th largest unlikely.
  const size_t rank = m + 4 * static_cast<size_t>(std::sqrt(static_cast<double>(m)));
  std::nth_element(keys.begin(), keys.begin() + static_cast<ptrdiff_t>(rank - 1), keys.end(),
                   std::greater<uint32_t>());
  const uint32_t t = keys[rank - 1];
  const size_t limit = 2 * k + 64;
  std::vector<uint32_t> cand;
  cand.reserve(k + k / 2 + 64);
  if (!CollectAtLeast(x, t, limit, &cand) || cand.size() < k) return false;
  *out = BestOf(x, cand, k);
  return true;
}

}  // namespace

std::vector<uint32_t> TopkExact(std::span<const float> x, size_t k) {
  const size_t n = x.size();
  if (k >= n) {
    std::vector<uint32_t> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = static_cast<uint32_t>(i);
    return all;
  }
  if (k == 0) return {};
  if (std::vector<uint32_t> best; TopkByPrefilter(x, k, &best)) return best;
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
  for (size_t b = 0; b < kBins; ++b)
    hist[b] += hist[kBins + b] + hist[2 * kBins + b] + hist[3 * kBins + b];
  uint64_t above = 0;
  const uint32_t bin = SelectBin(hist.data(), kBins, k, &above);
  const size_t in_bin = hist[bin];
  // Pass 2: the coordinates above that bin (all kept) and those inside it
  // (candidates), both by branch-free compaction into arrays one slot larger than
  // their known counts.
  std::vector<uint32_t> kept(above + 1);
  std::vector<uint32_t> cand(in_bin + 1);
  size_t na = 0, nc = 0;
  for (size_t j = 0; j < n; ++j) {
    const uint32_t hi = AbsBits(x[j]) >> kShift;
    kept[na] = static_cast<uint32_t>(j);
    na += hi > bin;
    cand[nc] = static_cast<uint32_t>(j);
    nc += hi == bin;
  }
  kept.resize(above);
  cand.resize(in_bin);
  const std::vector<uint32_t> best = BestOf(x, cand, k - above);
  const size_t from = kept.size();
  kept.insert(kept.end(), best.begin(), best.end());
  std::inplace_merge(kept.begin(), kept.begin() + static_cast<ptrdiff_t>(from), kept.end());
  return kept;
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
  if (CollectAtLeast(x, t, x.size(), &kept) && kept.size() <= 2 * k) return kept;
  // Far too many (a sample that missed the tail, or many equal magnitudes): the exact
  // top k of the kept ones.
  return BestOf(x, kept, k);
}

std::vector<uint32_t> ThresholdSelect(std::span<const float> x, float tau) {
  std::vector<uint32_t> kept;
  CollectAtLeast(x, AbsBits(tau), x.size(), &kept);
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

CatChoice TopkCat(std::span<const float> x, size_t k_min, size_t k_max, double fixed_bytes,
                  const std::function<double(size_t)>& bytes) {
  k_max = std::min(k_max, x.size());
  k_min = std::min(k_min, k_max);
  CatChoice choice;
  std::vector<uint32_t> candidates = TopkExact(x, k_max);
  // Largest magnitude first; among equal magnitudes the lower index, as TopkExact
  // breaks ties, so the first k of this order are TopkExact(x, k) for every k.
  std::sort(candidates.begin(), candidates.end(), [x](uint32_t a, uint32_t b) {
    const uint32_t ka = AbsBits(x[a]), kb = AbsBits(x[b]);
    return ka != kb ? ka > kb : a < b;
  });
  double prefix = 0;  // |top_k(x)|^2
  double best = -1;
  size_t best_k = k_min;
  for (size_t k = 1; k <= candidates.size(); ++k) {
    const double v = x[candidates[k - 1]];
    prefix += v * v;
    if (k < k_min) continue;
    // a(k) / C(k) up to the constant |x|^2, which does not move the argmax.
    const double score = prefix / (fixed_bytes + bytes(k));
    if (score > best) {
      best = score;
      best_k = k;
      choice.kept_energy = prefix;
    }
  }
  candidates.resize(best_k);
  std::sort(candidates.begin(), candidates.end());
  choice.kept = std::move(candidates);
  return choice;
}

}  // namespace ps::codecs::internal
