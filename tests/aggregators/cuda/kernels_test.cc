// The CUDA Apply kernels' per-coordinate code (aggregators/cuda/apply_kernel.h, PS_HD)
// run on the CPU: for every rule and pre-aggregator chain, the plan turned into kernel
// arguments by PlanRows and evaluated coordinate by coordinate, by the register path
// and by the general path, must give Aggregator::Apply's result bit for bit. This is
// what the GPU computes, checked on machines without one (docs/gpu.md).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "aggregators/aggregator.h"
#include "aggregators/coordinate_rules_internal.h"
#include "aggregators/cuda/apply_kernel.h"
#include "aggregators/cuda/kernels.h"
#include "aggregators/cuda/plan_rows.h"
#include "aggregators/stage_internal.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators::cuda {
namespace {

using test::Pointers;
using test::Vectors;

// k inputs of d values: honest ones near a common centre, the last f far away, and a
// few exact ties (equal values) to exercise the ordering.
Vectors Inputs(size_t k, size_t f, size_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> centre(d);
  for (float& x : centre) x = noise(rng);
  Vectors v(k, std::vector<float>(d));
  for (size_t i = 0; i < k; ++i) {
    for (size_t c = 0; c < d; ++c) {
      v[i][c] = i + f >= k ? 50.0f + 10.0f * noise(rng) : centre[c] + 0.3f * noise(rng);
      if (c % 7 == 3 && i % 3 == 1) v[i][c] = centre[c];  // ties across inputs
    }
  }
  return v;
}

// The plan on the CPU (Gram matrix, Plan), as the backend gets it.
RoundPlan PlanOf(const Aggregator& rule, const std::vector<const float*>& rows, size_t d) {
  const size_t n = rows.size() + rule.StateRows();
  std::vector<double> gram(n * n, 0.0);
  std::vector<float> state(rule.StateRows() * d, 0.0f);
  AggregationContext ctx;
  ctx.state = state;
  if (rule.NeedsGram()) {
    EXPECT_TRUE(rule.AccumulateGram(rows, d, ctx, gram).ok());
  }
  absl::StatusOr<RoundPlan> plan = rule.Plan(rows.size(), rule.NeedsGram() ? gram : std::vector<double>{}, 7);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// What the kernels compute at every coordinate, on the host. `general` forces the path
// used beyond 64 rows. With masks (one per row; empty: none), plans[c] is the plan for c
// present values, as the backend uploads them.
std::vector<float> KernelResult(const RowPlan& rp, const std::vector<const float*>& rows, size_t d,
                                bool general, const std::vector<const uint8_t*>& masks = {},
                                const std::vector<internal::SortedPlan>& plans = {}) {
  ApplyArgs a;
  if (!masks.empty()) {
    a.masks = masks.data();
    a.plans = plans.data();
  }
  a.inputs = rows.data();
  a.rows = rp.rows.data();
  a.terms = rp.terms.data();
  a.num_rows = static_cast<uint32_t>(rp.rows.size());
  a.op = rp.op;
  a.plan = rp.sorted;
  std::vector<float> out(d);
  a.out = out.data();
  a.d = d;
  if (rp.op != CoordinateOp::kSorted) {
    for (size_t c = 0; c < d; ++c) out[c] = LinearAt(a, c);
    return out;
  }
  if (general || a.num_rows > kMaxRegisterRows) {
    // One chunk of all coordinates, as LaunchSortedGeneral's three kernels.
    std::vector<float> formed(a.num_rows * d), sorted(a.num_rows * d);
    for (size_t j = 0; j < d; ++j) FormRowsAt(a, 0, d, j, formed.data());
    for (size_t j = 0; j < d; ++j) PlaceByRankAt(formed.data(), a.num_rows, d, j, sorted.data());
    for (size_t j = 0; j < d; ++j) out[j] = SortedColumnAt(a, sorted.data(), 0, d, j);
    return out;
  }
  for (size_t c = 0; c < d; ++c) {
    if (a.num_rows <= 8) {
      out[c] = SortedAt<8>(a, c);
    } else if (a.num_rows <= 16) {
      out[c] = SortedAt<16>(a, c);
    } else if (a.num_rows <= 32) {
      out[c] = SortedAt<32>(a, c);
    } else {
      out[c] = SortedAt<64>(a, c);
    }
  }
  return out;
}

void ExpectBits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t mismatches = 0;
  for (size_t c = 0; c < got.size(); ++c) {
    if (std::bit_cast<uint32_t>(got[c]) != std::bit_cast<uint32_t>(want[c])) {
      if (++mismatches <= 3) {
        ADD_FAILURE() << what << ": coordinate " << c << " kernel " << got[c] << " cpu " << want[c];
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << what;
}

struct Case {
  std::string spec;
  int n;
  int f;
};

class KernelsMatchCpu : public ::testing::TestWithParam<Case> {};

TEST_P(KernelsMatchCpu, BitForBit) {
  const Case& tc = GetParam();
  AggregatorOptions options = test::Options(tc.n, tc.f);
  options.clipping_tau = 2.0;
  absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(tc.spec, options);
  ASSERT_TRUE(rule.ok()) << rule.status();
  constexpr size_t d = 333;  // not a multiple of any tile
  for (uint32_t seed : {1u, 2u}) {
    const Vectors inputs = Inputs(static_cast<size_t>(tc.n), static_cast<size_t>(tc.f), d, seed);
    std::vector<const float*> rows = Pointers(inputs);
    const RoundPlan plan = PlanOf(**rule, rows, d);
    std::vector<float> want(d);
    std::vector<float> state((*rule)->StateRows() * d, 0.0f);
    AggregationContext ctx;
    ctx.state = state;
    ASSERT_TRUE((*rule)->Apply(plan, rows, want, ctx).ok());

    const RowPlan rp = PlanRows(internal::Pipeline::Data(plan));
    ASSERT_FALSE(rp.sign_vote);
    std::vector<float> zeros((*rule)->StateRows() * d, 0.0f);
    for (size_t s = 0; s < (*rule)->StateRows(); ++s) rows.push_back(zeros.data() + s * d);
    const std::string what = tc.spec + " n=" + std::to_string(tc.n) + " seed " + std::to_string(seed);
    ExpectBits(KernelResult(rp, rows, d, /*general=*/false), want, what + " (registers)");
    if (rp.op == CoordinateOp::kSorted) {
      ExpectBits(KernelResult(rp, rows, d, /*general=*/true), want, what + " (general)");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rules, KernelsMatchCpu,
    ::testing::Values(Case{"mean", 5, 0}, Case{"median", 16, 3}, Case{"median", 7, 2},
                      Case{"median(even=lower)", 10, 2}, Case{"trimmed_mean", 16, 3},
                      Case{"trimmed_mean", 33, 8}, Case{"trimmed_mean", 64, 10},
                      Case{"meamed", 16, 3}, Case{"meamed", 31, 7}, Case{"phocas", 16, 3},
                      Case{"phocas", 12, 2}, Case{"krum", 16, 3}, Case{"multi_krum", 16, 3},
                      Case{"bulyan", 15, 3}, Case{"bulyan", 64, 15},
                      Case{"geometric_median", 9, 2}, Case{"centered_clipping", 9, 2},
                      Case{"mda", 8, 2}, Case{"nnm+trimmed_mean", 12, 2},
                      Case{"nnm+median", 40, 5}, Case{"bucketing(s=2)+krum", 20, 2},
                      Case{"clip(3)+mean", 6, 1}, Case{"arc+meamed", 11, 2},
                      Case{"nnm+krum", 11, 2}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.spec + "_n" + std::to_string(info.param.n);
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

// The register sort and the register read-off against the scalar definitions, for
// every size up to 64 and every plan shape.
TEST(SortRegisters, SortsEverySizeWithPadding) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-3, 3);  // many ties
  for (uint32_t c = 1; c <= 64; ++c) {
    float v[64];
    std::vector<float> want(c);
    for (uint32_t i = 0; i < 64; ++i) v[i] = i < c ? static_cast<float>(small(rng)) : kPadding;
    for (uint32_t i = 0; i < c; ++i) want[i] = v[i];
    std::sort(want.begin(), want.end());
    SortRegisters<64>(v);
    for (uint32_t i = 0; i < c; ++i) ASSERT_EQ(v[i], want[i]) << "c=" << c << " i=" << i;
  }
}

TEST(ApplySortedRegisters, MatchesTheScalarReadOffForEveryWindow) {
  std::mt19937 rng(9);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (uint32_t c = 1; c <= 32; ++c) {
    float v[32];
    for (uint32_t i = 0; i < 32; ++i) v[i] = i < c ? noise(rng) : kPadding;
    SortRegisters<32>(v);
    for (size_t lo = 0; lo < c; ++lo) {
      for (size_t hi = lo; hi < c; ++hi) {
        for (size_t drop = 0; drop < c; ++drop) {
          const SortedPlan plan{drop == 0 ? SortedPlan::Op::kRanks : SortedPlan::Op::kNearest, lo, hi, drop};
          const float got = ApplySortedRegisters<32>(plan, v, c);
          const float want = internal::ApplySorted(plan, v, c, 1);
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
              << "c=" << c << " lo=" << lo << " hi=" << hi << " drop=" << drop;
        }
      }
    }
  }
}


// Masks (lossy UDP rounds, docs/aggregators.md "Masks"): the backend's steps replayed on
// the CPU with the kernels' per-coordinate code: a coordinate rule on the inputs as they
// are reads the masks natively (plans by present count); every other plan, and every
// Gram matrix, runs on rows whose missing coordinates were filled with the median of
// those present (FillAt, the median by the masked register or general path). The result
// must be Aggregator::Aggregate's with the same masks, bit for bit.

// Bitmaps over d coordinates: input i is complete (null) when i % 3 == 0 and
// `some_complete`, else each coordinate is present with probability 0.7, except that
// coordinates c % 11 == 5 keep only input 1 (fewer than most rules need) and, without
// complete inputs, coordinates c % 13 == 0 have no value at all.
std::vector<std::vector<uint8_t>> MaskBits(size_t k, size_t d, bool some_complete, uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution present(0.7);
  std::vector<std::vector<uint8_t>> bits(k);
  for (size_t i = 0; i < k; ++i) {
    if (some_complete && i % 3 == 0) continue;
    bits[i].assign((d + 7) / 8, 0);
    for (size_t c = 0; c < d; ++c) {
      bool on = present(rng);
      if (c % 11 == 5) on = i == 1;
      if (!some_complete && c % 13 == 0) on = false;
      if (on) bits[i][c / 8] |= static_cast<uint8_t>(1u << (c % 8));
    }
  }
  return bits;
}

std::vector<const uint8_t*> MaskPointers(const std::vector<std::vector<uint8_t>>& bits) {
  std::vector<const uint8_t*> out;
  for (const std::vector<uint8_t>& b : bits) out.push_back(b.empty() ? nullptr : b.data());
  return out;
}

// CudaBackend::Aggregate's steps (backend.cc) on the host.
std::vector<float> DeviceReplay(const Aggregator& rule, const Vectors& inputs,
                                std::vector<const uint8_t*> masks, size_t d, bool general) {
  std::vector<const float*> rows = Pointers(inputs);
  const size_t k = rows.size();
  Vectors copies;
  copies.reserve(k);
  auto fill = [&] {  // FillLocked
    if (masks.empty()) return;
    RowPlan median;
    for (uint32_t i = 0; i < k; ++i) {
      median.rows.push_back({RowSpec::Kind::kUnit, i, 1});
      median.terms.push_back({i, 1.0f});
    }
    median.unit = true;
    median.op = CoordinateOp::kSorted;
    std::vector<internal::SortedPlan> plans(k + 1);
    for (size_t c = 1; c <= k; ++c) plans[c] = internal::MidpointPlan(c);
    const std::vector<float> m = KernelResult(median, rows, d, general, masks, plans);
    for (size_t i = 0; i < k; ++i) {
      if (masks[i] == nullptr) continue;
      std::vector<float>& copy = copies.emplace_back(rows[i], rows[i] + d);
      for (size_t c = 0; c < d; ++c) FillAt(copy.data(), masks[i], m.data(), c);
      rows[i] = copy.data();
    }
    masks.clear();
  };
  if (rule.NeedsGram()) fill();
  const RoundPlan plan = PlanOf(rule, rows, d);
  const internal::PlanData& data = internal::Pipeline::Data(plan);
  if (data.mixing.rows != 0 || !data.coordinate.has_value()) fill();
  std::vector<internal::SortedPlan> plans;
  if (!masks.empty()) {
    plans.resize(k + 1);
    for (size_t c = 1; c <= k; ++c) plans[c] = internal::PlanFor(*data.coordinate, c);
  }
  const RowPlan rp = PlanRows(data);
  std::vector<float> zeros(rule.StateRows() * d, 0.0f);
  for (size_t s = 0; s < rule.StateRows(); ++s) rows.push_back(zeros.data() + s * d);
  if (!rp.sign_vote) return KernelResult(rp, rows, d, general, masks, plans);
  // sign_majority: the scale as the CPU sums it (the device's sum order may differ in
  // the last bit, see OnCuda), the vote by SignVoteAt.
  std::vector<double> means;
  for (size_t i = 0; i < k; ++i) {
    double sum = 0;
    size_t count = 0;
    for (size_t c = 0; c < d; ++c) {
      if (!masks.empty() && !PresentIn(masks[i], c)) continue;
      sum += std::fabs(double{rows[i][c]});
      ++count;
    }
    if (count > 0) means.push_back(sum / static_cast<double>(count));
  }
  std::sort(means.begin(), means.end());
  const size_t m = means.size();
  const double scale = m == 0 ? 0.0 : m % 2 == 1 ? means[m / 2] : (means[m / 2 - 1] + means[m / 2]) / 2;
  std::vector<float> out(d);
  for (size_t c = 0; c < d; ++c) {
    out[c] = SignVoteAt(rows.data(), masks.empty() ? nullptr : masks.data(),
                        static_cast<uint32_t>(k), static_cast<float>(scale), c);
  }
  return out;
}

class MaskedKernelsMatchCpu : public ::testing::TestWithParam<Case> {};

TEST_P(MaskedKernelsMatchCpu, BitForBit) {
  const Case& tc = GetParam();
  AggregatorOptions options = test::Options(tc.n, tc.f);
  absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(tc.spec, options);
  ASSERT_TRUE(rule.ok()) << rule.status();
  constexpr size_t d = 333;
  for (const bool some_complete : {true, false}) {
    const Vectors inputs = Inputs(static_cast<size_t>(tc.n), static_cast<size_t>(tc.f), d, 3);
    const std::vector<std::vector<uint8_t>> bits = MaskBits(inputs.size(), d, some_complete, 4);
    const std::vector<const uint8_t*> masks = MaskPointers(bits);
    std::vector<float> want(d);
    std::vector<float> state((*rule)->StateRows() * d, 0.0f);
    AggregationContext ctx;
    ctx.masks = masks;
    ctx.state = state;
    ctx.round = 7;  // as PlanOf (bucketing shuffles by round)
    ASSERT_TRUE((*rule)->Aggregate(Pointers(inputs), want, ctx).ok());
    const std::string what = tc.spec + " n=" + std::to_string(tc.n) +
                             (some_complete ? " (some inputs complete)" : " (every input masked)");
    ExpectBits(DeviceReplay(**rule, inputs, masks, d, /*general=*/false), want, what + " (registers)");
    ExpectBits(DeviceReplay(**rule, inputs, masks, d, /*general=*/true), want, what + " (general)");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rules, MaskedKernelsMatchCpu,
    ::testing::Values(Case{"mean", 6, 0}, Case{"median", 16, 3}, Case{"median(even=lower)", 10, 2},
                      Case{"trimmed_mean", 16, 3}, Case{"trimmed_mean", 70, 10},
                      Case{"meamed", 31, 7}, Case{"phocas", 12, 2}, Case{"sign_majority", 9, 2},
                      Case{"krum", 16, 3}, Case{"bulyan", 15, 3}, Case{"nnm+median", 12, 2},
                      Case{"bucketing(s=2)+trimmed_mean", 12, 2}, Case{"centered_clipping", 9, 2}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.spec + "_n" + std::to_string(info.param.n);
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

}  // namespace
}  // namespace ps::aggregators::cuda
