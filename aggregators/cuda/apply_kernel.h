// What one thread of the CUDA Apply kernels computes for one coordinate (docs/gpu.md,
// "Aggregation on the device"): PS_HD functions, so the CPU tests run the very code the
// GPU runs (tests/aggregators/cuda_kernels_test.cc compares it bit for bit with
// Aggregator::Apply) and the kernels in apply.cu are thin loops around it.
//
// Every float and double operation below is one the CPU does, in the CPU's order, with
// fused multiply-adds ruled out on the device (core::MulRn/AddRn): the results are
// the CPU's bits. No abseil and no CUDA runtime here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "aggregators/mask_internal.h"
#include "aggregators/sorted_plan_internal.h"
#include "core/hd.h"

namespace ps::aggregators::cuda {

using core::AddRn;
using core::MulRn;
using internal::SortedPlan;

// How one row the rule reads is formed from the inputs (Aggregator::Apply's cases).
struct RowSpec {
  enum class Kind : uint32_t {
    kUnit,      // input terms[first].input as it is (a weight of exactly 1)
    kAverage,   // the float sum of the `count` inputs in order, divided by count
    kWeighted,  // sum of weight x input in float, four terms per group (MixBlock)
  };
  Kind kind = Kind::kUnit;
  uint32_t first = 0;  // into the term list
  uint32_t count = 0;
};
struct RowTerm {
  uint32_t input = 0;
  float weight = 0.0f;
};

// What becomes of the rows at each coordinate.
enum class CoordinateOp : uint32_t {
  kRow0,    // no coordinate rule: row 0 is the output
  kMean,    // the rows' float sum in order divided by their count (AverageInputs)
  kSorted,  // `plan` on the rows sorted ascending
};

struct ApplyArgs {
  const float* const* inputs = nullptr;  // the plan's k inputs, then its state rows
  // When every row is a unit row: row r is unit_rows[r] (the kernels then load the rows
  // straight into registers); else null.
  const float* const* unit_rows = nullptr;
  const RowSpec* rows = nullptr;
  const RowTerm* terms = nullptr;
  uint32_t num_rows = 0;
  CoordinateOp op = CoordinateOp::kRow0;
  SortedPlan plan;  // for kSorted
  float* out = nullptr;
  size_t d = 0;
  // Native masks (docs/aggregators.md, "Masks"): when every row is an input as it is
  // (unit rows) and some inputs miss coordinates, masks[r] is row r's bitmap (bit c =
  // byte c / 8, bit c % 8; null for a complete row) and plans[c] the rule's plan for c
  // present values, c = 0 .. num_rows. Null otherwise: every value is present and kSorted
  // reads `plan`.
  const uint8_t* const* masks = nullptr;
  const SortedPlan* plans = nullptr;
};

// Whether coordinate c is present in a row with bitmap `mask` (null: complete).
PS_HD inline bool PresentIn(const uint8_t* mask, size_t c) {
  return mask == nullptr || internal::Present(mask, c);
}

// Whether row r has a value at coordinate c.
PS_HD inline bool RowPresent(const ApplyArgs& a, uint32_t r, size_t c) {
  return a.masks == nullptr || PresentIn(a.masks[r], c);
}

// The plan for `count` values present at a coordinate (count = num_rows without masks).
PS_HD inline SortedPlan PlanAt(const ApplyArgs& a, uint32_t count) {
  return a.masks == nullptr ? a.plan : a.plans[count];
}

// Row `r`'s value at coordinate c.
PS_HD inline float RowValue(const ApplyArgs& a, uint32_t r, size_t c) {
  const RowSpec row = a.rows[r];
  const RowTerm* t = a.terms + row.first;
  switch (row.kind) {
    case RowSpec::Kind::kUnit:
      return a.inputs[t[0].input][c];
    case RowSpec::Kind::kAverage: {
      float acc = a.inputs[t[0].input][c];
      for (uint32_t j = 1; j < row.count; ++j) acc = AddRn(acc, a.inputs[t[j].input][c]);
      return acc / static_cast<float>(row.count);
    }
    case RowSpec::Kind::kWeighted:
      break;
  }
  float acc = 0.0f;
  uint32_t j = 0;
  for (; j + 4 <= row.count; j += 4) {
    const float p0 = MulRn(t[j].weight, a.inputs[t[j].input][c]);
    const float p1 = MulRn(t[j + 1].weight, a.inputs[t[j + 1].input][c]);
    const float p2 = MulRn(t[j + 2].weight, a.inputs[t[j + 2].input][c]);
    const float p3 = MulRn(t[j + 3].weight, a.inputs[t[j + 3].input][c]);
    acc = AddRn(acc, AddRn(AddRn(p0, p1), AddRn(p2, p3)));
  }
  for (; j < row.count; ++j) acc = AddRn(acc, MulRn(t[j].weight, a.inputs[t[j].input][c]));
  return acc;
}

// kRow0 and kMean at coordinate c. With masks, the mean of the values present (their
// float sum in row order, starting from the first, over their count), 0 where none is.
PS_HD inline float LinearAt(const ApplyArgs& a, size_t c) {
  if (a.op == CoordinateOp::kRow0) return RowValue(a, 0, c);
  if (a.masks != nullptr) {
    float acc = 0.0f;
    uint32_t count = 0;
    for (uint32_t r = 0; r < a.num_rows; ++r) {
      if (!RowPresent(a, r, c)) continue;
      const float x = RowValue(a, r, c);
      acc = count == 0 ? x : AddRn(acc, x);
      ++count;
    }
    return count == 0 ? 0.0f : acc / static_cast<float>(count);
  }
  float acc = RowValue(a, 0, c);
  for (uint32_t r = 1; r < a.num_rows; ++r) acc = AddRn(acc, RowValue(a, r, c));
  return acc / static_cast<float>(a.num_rows);
}

// std::min / std::max as the CPU's networks apply them (the same ternaries).
PS_HD inline void CompareExchange(float& a, float& b) {
  const float x = a;
  const float y = b;
  a = (y < x) ? y : x;
  b = (x < y) ? y : x;
}

// Sorts K values (a power of two) ascending with a bitonic network. Every loop has a
// trip count fixed at compile time, so nvcc unrolls them all and v stays in registers
// (ptxas: no stack up to K = 64). The sorted values are those of any other sort (inputs
// are never NaN).
template <int K>
PS_HD inline void SortRegisters(float (&v)[K]) {
  static_assert(K >= 2 && (K & (K - 1)) == 0, "K must be a power of two");
  PS_UNROLL
  for (int size = 2; size <= K; size <<= 1) {
    PS_UNROLL
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      PS_UNROLL
      for (int i = 0; i < K; ++i) {
        const int partner = i ^ stride;
        if (partner > i) {
          if ((i & size) == 0) {
            CompareExchange(v[i], v[partner]);
          } else {
            CompareExchange(v[partner], v[i]);
          }
        }
      }
    }
  }
}

// f(std::integral_constant<int, I>()) for I = 0 .. N-1 in order: a loop whose index is
// a compile-time constant in every step, whatever nvcc's unroller decides. (The
// read-off below written as `#pragma unroll` loops kept v in local memory at K = 32
// and 64, and for formed rows at 16: ptxas showed 128/256/64 bytes of stack.)
template <typename F, int... I>
PS_HD inline void StaticForEach(F&& f, std::integer_sequence<int, I...> /*indices*/) {
  (f(std::integral_constant<int, I>()), ...);
}
template <int N, typename F>
PS_HD inline void StaticFor(F&& f) {
  StaticForEach(f, std::make_integer_sequence<int, N>());
}

// s[l] = s[l + keep] for every l + keep < K, in log2(K) steps of fixed shifts (the bits
// of keep), so no register is indexed at run time.
template <int K, int Bit = 1>
PS_HD inline void ShiftDown(float (&s)[K], size_t keep) {
  if constexpr (Bit < K) {
    if ((keep & static_cast<size_t>(Bit)) != 0) {
      StaticFor<K - Bit>([&](auto l) { s[l.value] = s[l.value + Bit]; });  // ascending
    }
    ShiftDown<K, Bit * 2>(s, keep);
  }
}

// lo <= x <= hi (a function, so that x = 0 is no "pointless comparison").
PS_HD inline bool Within(size_t x, size_t lo, size_t hi) { return x >= lo && x <= hi; }

// ApplySorted (sorted_plan_internal.h) on the c smallest of K sorted registers, with
// only compile-time indices (a runtime index would move v to local memory): ranks are
// summed under a predicate, and v_(l + keep) comes from a copy of v shifted by keep.
// The same operations in the same order as ApplySorted.
template <int K>
PS_HD inline float ApplySortedRegisters(const SortedPlan& plan, const float (&v)[K], size_t c) {
  // The sum of v_(r) for r in [lo, hi] (empty above K), in rank order.
  auto sum_ranks = [&v](size_t lo, size_t hi) {
    double sum = 0.0;
    StaticFor<K>([&](auto r) {
      if (Within(r.value, lo, hi)) sum = AddRn(sum, static_cast<double>(v[r.value]));
    });
    return sum;
  };
  const double mean = sum_ranks(plan.lo, plan.hi) / static_cast<double>(plan.hi - plan.lo + 1);
  if (plan.op != SortedPlan::Op::kNearest) {
    return plan.op == SortedPlan::Op::kRanks ? static_cast<float>(mean) : 0.0f;
  }
  const double twice = 2.0 * mean;
  const size_t keep = c - plan.drop;
  float shifted[K];
  StaticFor<K>([&](auto i) { shifted[i.value] = v[i.value]; });
  ShiftDown<K>(shifted, keep);  // shifted[l] = v[l + keep] for l + keep < K
  size_t first = 0;
  StaticFor<K>([&](auto l) {
    if (static_cast<size_t>(l.value) < plan.drop) {
      first += AddRn(static_cast<double>(v[l.value]), static_cast<double>(shifted[l.value])) < twice ? 1 : 0;
    }
  });
  return static_cast<float>(sum_ranks(first, first + keep - 1) / static_cast<double>(keep));
}

// The padding of the register arrays, and the value of a missing coordinate: sorts
// after every finite value.
inline constexpr float kPadding = __builtin_huge_valf();

// kSorted on the `count` values present among K registers (the rest kPadding).
template <int K>
PS_HD inline float SortAndApply(const SortedPlan& plan, float (&v)[K], uint32_t count) {
  SortRegisters<K>(v);
  return ApplySortedRegisters<K>(plan, v, count);
}

// kSorted at coordinate c for num_rows <= K: the reference form of what the kernel
// computes (the CPU tests call it). The kernel fills v without runtime indices, which
// would move v to local memory: straight loads when every row is a unit row, else
// through shared memory (apply.cu).
template <int K>
PS_HD inline float SortedAt(const ApplyArgs& a, size_t c) {
  float v[K];
  uint32_t count = 0;
  for (int r = 0; r < K; ++r) {
    const auto row = static_cast<uint32_t>(r);
    const bool present = row < a.num_rows && RowPresent(a, row, c);
    v[r] = present ? RowValue(a, row, c) : kPadding;
    count += present ? 1u : 0u;
  }
  return SortAndApply<K>(PlanAt(a, count), v, count);
}

// The general path (more than 64 rows), over a chunk of coordinates [begin, begin + w):
// the rows formed into scratch (row r of the chunk at rows + r * w; kPadding where a
// value is missing) ...
PS_HD inline void FormRowsAt(const ApplyArgs& a, size_t begin, size_t w, size_t j, float* rows) {
  const size_t c = begin + j;
  for (uint32_t r = 0; r < a.num_rows; ++r) {
    rows[r * w + j] = RowPresent(a, r, c) ? RowValue(a, r, c) : kPadding;
  }
}

// ... each value placed at its rank (the number of smaller values, ties by row index),
// which sorts the column into `sorted` (same layout) ...
PS_HD inline void PlaceByRankAt(const float* rows, uint32_t num_rows, size_t w, size_t j,
                                float* sorted) {
  for (uint32_t i = 0; i < num_rows; ++i) {
    const float x = rows[i * w + j];
    uint32_t rank = 0;
    for (uint32_t q = 0; q < num_rows; ++q) {
      const float y = rows[q * w + j];
      rank += (y < x || (y == x && q < i)) ? 1u : 0u;
    }
    sorted[rank * w + j] = x;
  }
}

// ... and the plan for the values present read off the sorted column (they come first).
PS_HD inline float SortedColumnAt(const ApplyArgs& a, const float* sorted, size_t begin, size_t w,
                                  size_t j) {
  uint32_t count = 0;
  for (uint32_t r = 0; r < a.num_rows; ++r) count += RowPresent(a, r, begin + j) ? 1u : 0u;
  return internal::ApplySorted(PlanAt(a, count), sorted + j, count, w);
}

// sign_majority at coordinate c: the scale times the sign of the vote of the values
// present (masks: null, or one bitmap per input as ApplyArgs::masks).
PS_HD inline float SignVoteAt(const float* const* inputs, const uint8_t* const* masks, uint32_t k,
                              float step, size_t c) {
  int32_t votes = 0;
  for (uint32_t i = 0; i < k; ++i) {
    if (masks != nullptr && !PresentIn(masks[i], c)) continue;
    const float x = inputs[i][c];
    votes += static_cast<int32_t>(x > 0) - static_cast<int32_t>(x < 0);
  }
  return votes > 0 ? step : votes < 0 ? -step : 0.0f;
}

// Filling for the rules that measure distances (docs/aggregators.md, "Masks"): a
// missing coordinate of a row takes the median of the values present there.
PS_HD inline void FillAt(float* row, const uint8_t* mask, const float* median, size_t c) {
  if (!PresentIn(mask, c)) row[c] = median[c];
}

}  // namespace ps::aggregators::cuda
