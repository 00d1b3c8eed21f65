#include "aggregators/coordinate_rules_internal.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "aggregators/coordinate_internal.h"
#include "aggregators/mask_internal.h"
#include "aggregators/sorted_plan_internal.h"
#include "core/simd.h"

namespace ps::aggregators::internal {
namespace {

using Network = std::vector<std::pair<uint32_t, uint32_t>>;

// Up to this many present values a tile is sorted by the network (its k x 128 tile in
// L2 beyond 64 inputs, 128 KiB at most); above, each coordinate's values are gathered and
// sorted on their own. Measured on AVX2 the network stays 3x to 10x faster than
// per-coordinate selection from 65 up to 1024 inputs; the cap bounds the tile buffer.
// (MeanOfRanks, which serves the unmasked median and trimmed mean, switches to
// nth_element above kMaxNetworkInputs = 64.)
constexpr size_t kMaxRuleNetworkInputs = 256;

// x / count, computed as x * (1 / count) when count is a power of two: both are then the
// correctly rounded value of the same real number (the same bits), and a vector product
// is several times cheaper than a vector division.
struct Divider {
  explicit Divider(size_t count)
      : count(static_cast<double>(count)),
        reciprocal((count & (count - 1)) == 0 ? 1.0 / static_cast<double>(count) : 0.0) {}
  double count;
  double reciprocal;  // 0 when count is not a power of two
};

// ApplySorted on every column of a c x kNetworkTile tile sorted column-wise, into
// result[0, kNetworkTile). The loops run over the coordinates innermost, fixed width and
// branch-free, so they vectorize with a full tile of independent sums; per coordinate
// the operations and their order are those of ApplySorted.
PS_VECTOR_CLONES void ApplySortedTile(const SortedPlan& plan, const float* rows, size_t c,
                                      float* result) {
  constexpr size_t W = kNetworkTile;
  if (plan.op == SortedPlan::Op::kZero) {
    std::fill(result, result + W, 0.0f);
    return;
  }
  // 0.0 + the first rank, then the rest: the bits of a sum started at 0.0, without a
  // zeroing pass (MeanOfRanksNetwork).
  std::array<double, W> sum;
  const float* lowest = rows + plan.lo * W;
  for (size_t j = 0; j < W; ++j) sum[j] = 0.0 + static_cast<double>(lowest[j]);
  for (size_t r = plan.lo + 1; r <= plan.hi; ++r) {
    const float* row = rows + r * W;
    for (size_t j = 0; j < W; ++j) sum[j] += static_cast<double>(row[j]);
  }
  const Divider count(plan.hi - plan.lo + 1);
  if (count.reciprocal != 0.0) {
    for (size_t j = 0; j < W; ++j) sum[j] *= count.reciprocal;
  } else {
    for (size_t j = 0; j < W; ++j) sum[j] /= count.count;
  }
  if (plan.op == SortedPlan::Op::kRanks) {
    for (size_t j = 0; j < W; ++j) result[j] = static_cast<float>(sum[j]);
    return;
  }
  // twice = 2 centre; first = how many l in [0, drop) have v_(l) + v_(l+keep) < 2 centre
  // (a small integer, exact in float).
  const size_t keep = c - plan.drop;
  std::array<double, W>& twice = sum;
  for (size_t j = 0; j < W; ++j) twice[j] *= 2.0;
  std::array<double, W> first_count{};
  for (size_t l = 0; l < plan.drop; ++l) {
    const float* low = rows + l * W;
    const float* high = rows + (l + keep) * W;
    for (size_t j = 0; j < W; ++j) {
      const double s = static_cast<double>(low[j]) + static_cast<double>(high[j]);
      first_count[j] += s < twice[j] ? 1.0 : 0.0;
    }
  }
  std::array<float, W> first;
  for (size_t j = 0; j < W; ++j) first[j] = static_cast<float>(first_count[j]);
  // The window [first, first + keep).
  std::array<double, W> acc{};
  for (size_t r = 0; r < c; ++r) {
    const float* row = rows + r * W;
    if (r >= plan.drop && r < keep) {  // in every candidate window
      for (size_t j = 0; j < W; ++j) acc[j] += static_cast<double>(row[j]);
    } else {
      // Adds v * [first <= r < first + keep]: the mask is applied in float, as a product
      // (GCC will not if-convert a select feeding a float-to-double conversion), and
      // v * 0 = +-0 leaves the sum unchanged, so the bits are those of ApplySorted.
      const float rank = static_cast<float>(r);
      const float rank_less_keep = static_cast<float>(r) - static_cast<float>(keep);
      for (size_t j = 0; j < W; ++j) {
        const int in =
            static_cast<int>(first[j] <= rank) & static_cast<int>(first[j] > rank_less_keep);
        acc[j] += static_cast<double>(row[j] * static_cast<float>(in));
      }
    }
  }
  const Divider divide_keep(keep);
  if (divide_keep.reciprocal != 0.0) {
    for (size_t j = 0; j < W; ++j) result[j] = static_cast<float>(acc[j] * divide_keep.reciprocal);
  } else {
    for (size_t j = 0; j < W; ++j) result[j] = static_cast<float>(acc[j] / divide_keep.count);
  }
}

// result[j] = (x_0[j] + ... + x_{c-1}[j]) / c in float, in input order, for j < w: the
// arithmetic of AverageInputs. Requires c >= 1.
PS_VECTOR_CLONES void MeanTile(std::span<const float* const> rows, size_t w, float* result) {
  const float divisor = static_cast<float>(rows.size());
  CopyTileRow(rows[0], w, result);
  for (size_t i = 1; i < rows.size(); ++i) {
    const float* x = rows[i];
    for (size_t j = 0; j < w; ++j) result[j] += x[j];
  }
  for (size_t j = 0; j < w; ++j) result[j] /= divisor;
}

// How one input covers one tile.
enum class Presence : uint8_t { kFull, kEmpty, kPartial };

// Coverage of coordinates [base, base + w) by `mask` (nullptr: complete). base is a
// multiple of 8, so the tile starts on a mask byte.
Presence TilePresence(const uint8_t* mask, size_t base, size_t w) {
  if (mask == nullptr) return Presence::kFull;
  const uint8_t* bytes = mask + base / 8;
  if (w == kNetworkTile) {  // the common case: 16 bytes as two words
    static_assert(kNetworkTile == 128);
    uint64_t a;
    uint64_t b;
    std::memcpy(&a, bytes, 8);
    std::memcpy(&b, bytes + 8, 8);
    if ((a & b) == ~uint64_t{0}) return Presence::kFull;
    return (a | b) == 0 ? Presence::kEmpty : Presence::kPartial;
  }
  bool all = true;
  bool none = true;
  for (size_t b = 0; b < w / 8; ++b) {
    all = all && bytes[b] == 0xFF;
    none = none && bytes[b] == 0;
  }
  if (w % 8 != 0) {
    const unsigned want = (1u << (w % 8)) - 1;
    const unsigned got = bytes[w / 8] & want;
    all = all && got == want;
    none = none && got == 0;
  }
  return all ? Presence::kFull : none ? Presence::kEmpty : Presence::kPartial;
}

// Sorting networks for up to k inputs, each made on first use; one cache per task,
// never shared.
class NetworkCache {
 public:
  explicit NetworkCache(size_t k) : networks_(std::min(k, kMaxRuleNetworkInputs) + 1) {}

  const Network& Get(size_t c) {
    if (networks_[c].empty() && c > 1) networks_[c] = SortingNetwork(c);
    return networks_[c];
  }

 private:
  std::vector<Network> networks_;
};

// ApplyCoordinateRule on [begin, end), tile by tile. A tile where every input is either
// complete or absent has one present count c for all its coordinates and goes through
// the sorting network (c <= kMaxRuleNetworkInputs) or the mean kernel. In any other tile
// the count varies by coordinate: the rules but the mean still sort the tile with the
// network, absent values set to +inf so that each column's c present values come
// first, and apply each column's own plan; the mean, and tiles of more inputs than the
// network takes, gather each coordinate's present values. Every tile is read before
// its output is written, so `out` may alias an input.
class RuleBlock {
 public:
  RuleBlock(const CoordinateRule& rule, std::span<const float* const> inputs,
            std::span<const uint8_t* const> masks)
      : rule_(rule),
        inputs_(inputs),
        masks_(masks),
        presence_(inputs.size()),
        rows_(std::min(inputs.size(), kMaxRuleNetworkInputs) * kNetworkTile, 0.0f),
        networks_(inputs.size()) {
    full_.reserve(inputs.size());
  }

  void Run(float* out, size_t begin, size_t end) {
    for (size_t base = begin; base < end; base += kNetworkTile) {
      const size_t w = std::min(kNetworkTile, end - base);
      full_.clear();
      bool partial = false;
      for (size_t i = 0; i < inputs_.size(); ++i) {
        presence_[i] = masks_.empty() ? Presence::kFull : TilePresence(masks_[i], base, w);
        if (presence_[i] == Presence::kFull) full_.push_back(inputs_[i] + base);
        partial = partial || presence_[i] == Presence::kPartial;
      }
      if (partial) {
        PartialTile(out, base, w);
      } else if (full_.empty()) {
        std::fill(out + base, out + base + w, 0.0f);
      } else if (rule_.kind == CoordinateRule::Kind::kMean) {
        MeanTile(full_, w, result_.data());
        CopyTileRow(result_.data(), w, out + base);
      } else if (full_.size() <= kMaxRuleNetworkInputs) {
        const size_t c = full_.size();
        for (size_t i = 0; i < c; ++i) {
          CopyTileRow(full_[i], w, rows_.data() + i * kNetworkTile);
        }
        SortTileColumns(rows_.data(), c, networks_.Get(c));
        ApplySortedTile(PlanFor(rule_, c), rows_.data(), c, result_.data());
        CopyTileRow(result_.data(), w, out + base);
      } else {
        GatheredTile(out, base, w);
      }
    }
  }

 private:
  void PartialTile(float* out, size_t base, size_t w) {
    size_t m = 0;  // inputs not absent from the tile
    for (const Presence p : presence_) m += p == Presence::kEmpty ? 0 : 1;
    if (rule_.kind == CoordinateRule::Kind::kMean || m > kMaxRuleNetworkInputs) {
      GatheredTile(out, base, w);
      return;
    }
    constexpr float kAbsent = std::numeric_limits<float>::infinity();
    size_t row = 0;
    size_t full = 0;
    counts_.fill(0);
    for (size_t i = 0; i < inputs_.size(); ++i) {
      if (presence_[i] == Presence::kEmpty) continue;
      float* dst = rows_.data() + row++ * kNetworkTile;
      const float* x = inputs_[i] + base;
      if (presence_[i] == Presence::kFull) {
        CopyTileRow(x, w, dst);
        ++full;
      } else {
        for (size_t j = 0; j < w; ++j) {
          const bool present = Present(masks_[i], base + j);
          dst[j] = present ? x[j] : kAbsent;
          counts_[j] += present ? 1 : 0;
        }
      }
    }
    SortTileColumns(rows_.data(), m, networks_.Get(m));
    for (size_t j = 0; j < w; ++j) {
      const size_t c = full + counts_[j];
      result_[j] = ApplySorted(PlanFor(rule_, c), rows_.data() + j, c, kNetworkTile);
    }
    CopyTileRow(result_.data(), w, out + base);
  }

  // Per coordinate: gather the present values in input order, then the mean, or sort
  // and apply the plan for their count.
  void GatheredTile(float* out, size_t base, size_t w) {
    const size_t k = inputs_.size();
    values_.resize(k * kNetworkTile);
    counts_.fill(0);
    for (size_t i = 0; i < k; ++i) {
      if (presence_[i] == Presence::kEmpty) continue;
      const float* x = inputs_[i] + base;
      if (presence_[i] == Presence::kFull) {
        for (size_t j = 0; j < w; ++j) values_[j * k + counts_[j]++] = x[j];
      } else {
        for (size_t j = 0; j < w; ++j) {
          if (Present(masks_[i], base + j)) values_[j * k + counts_[j]++] = x[j];
        }
      }
    }
    for (size_t j = 0; j < w; ++j) {
      float* v = values_.data() + j * k;
      const size_t c = counts_[j];
      if (rule_.kind == CoordinateRule::Kind::kMean) {
        float sum = c == 0 ? 0.0f : v[0];
        for (size_t i = 1; i < c; ++i) sum += v[i];
        out[base + j] = c == 0 ? 0.0f : sum / static_cast<float>(c);
      } else {
        std::sort(v, v + c);
        out[base + j] = ApplySorted(PlanFor(rule_, c), v, c, 1);
      }
    }
  }

  const CoordinateRule& rule_;
  std::span<const float* const> inputs_;
  std::span<const uint8_t* const> masks_;
  std::vector<Presence> presence_;
  std::vector<const float*> full_;  // the complete inputs, offset to the tile
  std::vector<float> rows_;         // network tile
  std::vector<float> values_;       // gathered tile: coordinate j at j * k
  std::array<size_t, kNetworkTile> counts_;
  std::array<float, kNetworkTile> result_;
  NetworkCache networks_;
};

}  // namespace


namespace {

void SignVote(std::span<const float* const> inputs, std::span<const uint8_t* const> masks,
              std::span<float> out, core::ThreadPool* pool) {
  const size_t d = out.size();
  std::vector<double> means;
  means.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const uint8_t* mask = masks.empty() ? nullptr : masks[i];
    double sum = 0;
    size_t count = 0;
    if (mask == nullptr) {
      for (size_t c = 0; c < d; ++c) sum += std::fabs(double{inputs[i][c]});
      count = d;
    } else {
      for (size_t c = 0; c < d; ++c) {
        if (!Present(mask, c)) continue;  // mask is not null here
        sum += std::fabs(double{inputs[i][c]});
        ++count;
      }
    }
    if (count > 0) means.push_back(sum / static_cast<double>(count));
  }
  const auto step = static_cast<float>(SignVoteScale(std::move(means)));
  ForEachCoordinateBlock(d, pool, [&](size_t begin, size_t end) {
    std::vector<int32_t> votes(end - begin, 0);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const uint8_t* mask = masks.empty() ? nullptr : masks[i];
      const float* x = inputs[i];
      for (size_t c = begin; c < end; ++c) {
        const int32_t v = (x[c] > 0) - (x[c] < 0);
        votes[c - begin] += (mask == nullptr || Present(mask, c)) ? v : 0;
      }
    }
    for (size_t c = begin; c < end; ++c) {
      const int32_t v = votes[c - begin];
      out[c] = v > 0 ? step : v < 0 ? -step : 0.0f;
    }
  });
}

}  // namespace

void ApplyCoordinateRule(const CoordinateRule& rule, std::span<const float* const> inputs,
                         std::span<const uint8_t* const> masks, std::span<float> out,
                         core::ThreadPool* pool) {
  if (out.empty()) return;
  if (rule.kind == CoordinateRule::Kind::kSignVote) {
    // Whole call at once: the scale spans every coordinate passed in.
    SignVote(inputs, masks, out, pool);
    return;
  }
  const size_t k = inputs.size();
  if (masks.empty()) {
    // The shared kernels where they are at least as fast: AverageInputs is the mean's
    // definition; MeanOfRanks gives RuleBlock's bits up to kMaxNetworkInputs (the same
    // network and sums), and beats gathering and sorting past kMaxRuleNetworkInputs.
    if (rule.kind == CoordinateRule::Kind::kMean) {
      AverageInputs(inputs, out, pool);
      return;
    }
    const SortedPlan plan = PlanFor(rule, k);
    if (plan.op == SortedPlan::Op::kRanks &&
        (k <= kMaxNetworkInputs || k > kMaxRuleNetworkInputs)) {
      MeanOfRanks(inputs, plan.lo, plan.hi, out, pool);
      return;
    }
  }
  ForEachCoordinateBlock(out.size(), pool, [&](size_t begin, size_t end) {
    RuleBlock(rule, inputs, masks).Run(out.data(), begin, end);
  });
}

}  // namespace ps::aggregators::internal
