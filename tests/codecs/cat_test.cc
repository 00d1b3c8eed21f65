// CAT's level choice for top-k (docs/adaptive.md, "CAT"): internal::TopkCat against a
// brute force of its objective, the payload-size estimate against real payloads, and
// topk(level=cat) as a codec (its spec, its bounds, the cost it reads from the context);
// 3lc(level=cat) against a brute force over its multipliers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "codecs/3lc_internal.h"
#include "codecs/codec.h"
#include "codecs/sparse_internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::Gaussian;
using ::testing::HasSubstr;

// Gaussian values with a heavy tail: one in 50 scaled by 20, as gradients often are.
std::vector<float> HeavyTailed(size_t n, uint32_t seed) {
  std::vector<float> x = Gaussian(n, seed);
  for (size_t i = 0; i < n; i += 50) x[i] *= 20.0f;
  return x;
}

// The k in [k_min, k_max] maximizing |top_k(x)|^2 / (fixed + bytes(k)), from a full
// sort of the magnitudes; ties to the smaller k.
size_t BruteForceK(const std::vector<float>& x, size_t k_min, size_t k_max, double fixed,
                   const std::function<double(size_t)>& bytes) {
  std::vector<double> sq;
  for (float v : x) sq.push_back(static_cast<double>(v) * v);
  std::sort(sq.begin(), sq.end(), std::greater<>());
  double prefix = 0, best = -1;
  size_t best_k = 0;
  for (size_t k = 1; k <= k_max; ++k) {
    prefix += sq[k - 1];
    if (k < k_min) continue;
    const double score = prefix / (fixed + bytes(k));
    if (score > best) {
      best = score;
      best_k = k;
    }
  }
  return best_k;
}

TEST(TopkCatTest, ChoosesTheArgmaxOfKeptEnergyPerCost) {
  const std::vector<float> x = HeavyTailed(5000, 1);
  const auto bytes = [](size_t k) { return 10.0 + 6.0 * static_cast<double>(k); };
  for (double fixed : {0.0, 50.0, 300.0, 2000.0, 20000.0, 1e7}) {
    const internal::CatChoice c = internal::TopkCat(x, 5, 800, fixed, bytes);
    const size_t want = BruteForceK(x, 5, 800, fixed, bytes);
    ASSERT_EQ(c.kept.size(), want) << "fixed " << fixed;
    EXPECT_EQ(c.kept, internal::TopkExact(x, want)) << "fixed " << fixed;
    double energy = 0;
    for (uint32_t i : c.kept) energy += static_cast<double>(x[i]) * x[i];
    EXPECT_NEAR(c.kept_energy, energy, 1e-9 * energy);
  }
}

TEST(TopkCatTest, AFixedCostBuysMoreCoordinates) {
  const std::vector<float> x = HeavyTailed(10000, 2);
  // Cost proportional to k: the mean of the top k squares falls with k, so the
  // smallest level wins; a fixed cost that dwarfs every payload makes the largest win.
  const auto per_value = [](size_t k) { return 6.0 * static_cast<double>(k); };
  EXPECT_EQ(internal::TopkCat(x, 10, 1000, 0, per_value).kept.size(), 10u);
  EXPECT_EQ(internal::TopkCat(x, 10, 1000, 1e12, per_value).kept.size(), 1000u);
  size_t last = 0;
  for (double fixed : {0.0, 100.0, 1000.0, 3000.0, 10000.0, 1e5, 1e6}) {
    const size_t k = internal::TopkCat(x, 10, 1000, fixed, per_value).kept.size();
    EXPECT_GE(k, last) << "fixed " << fixed;
    last = k;
  }
  EXPECT_GT(last, 10u);
}

TEST(TopkCatTest, TiesGoToLowerIndicesAsInTopkExact) {
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0 ? -2.0f : 1.0f);
  const auto bytes = [](size_t k) { return 8.0 * static_cast<double>(k); };
  for (double fixed : {0.0, 40.0, 1e9}) {
    const internal::CatChoice c = internal::TopkCat(x, 1, 40, fixed, bytes);
    EXPECT_EQ(c.kept, internal::TopkExact(x, c.kept.size())) << "fixed " << fixed;
  }
}

TEST(TopkCatTest, PayloadEstimateMatchesRealPayloads) {
  const std::vector<float> x = Gaussian(20000, 3);
  for (const auto& [spec, tolerance] :
       std::vector<std::pair<std::string, double>>{{"topk(0.3)+raw+raw", 0.0},
                                                   {"topk(0.3)+bitmap+fp16", 0.0},
                                                   {"topk(0.3)+varint+fp16", 0.2},
                                                   {"topk(0.3)+rle+raw", 0.35}}) {
    auto config = internal::ParseSparseSpec(spec);
    ASSERT_TRUE(config.ok()) << config.status();
    auto codec = MakeCodec(spec);
    ASSERT_TRUE(codec.ok()) << codec.status();
    for (size_t k : {20, 200, 2000, 6000}) {
      const std::vector<uint32_t> kept = internal::TopkExact(x, k);
      std::string payload;
      const auto gather = [&x](std::span<const uint32_t> sent, std::span<float> values) {
        for (size_t j = 0; j < sent.size(); ++j) values[j] = x[sent[j]];
        return absl::OkStatus();
      };
      ASSERT_TRUE(
          internal::EncodeSelected(*config, kept, x.size(), 0, gather, &payload, nullptr, nullptr)
              .ok());
      const double estimate = internal::EstimatedPayloadBytes(*config, x.size(), k);
      const double actual = static_cast<double>(payload.size());
      EXPECT_NEAR(estimate, actual, tolerance * actual + 2) << spec << " k=" << k;
    }
  }
}

TEST(TopkCatCodecTest, TheContextsFixedCostSetsTheLevelWithinTheSpecsBounds) {
  auto codec = MakeCodec("topk(0.2, level=cat, min=0.01)+varint+fp16");
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ((*codec)->spec(),
            "topk(ratio=0.2, method=exact, level=cat, min=0.01, overhead=16384)+varint+fp16");
  // The shard decodes with a codec made from the spec the push carries.
  auto shard = MakeCodec((*codec)->spec());
  ASSERT_TRUE(shard.ok()) << shard.status();
  const std::vector<float> x = HeavyTailed(8000, 4);
  const auto kept = [&](double fixed) {
    EncodeContext ctx;
    ctx.fixed_cost_bytes = fixed;
    std::string payload;
    EXPECT_TRUE((*codec)->Encode(x, ctx, &payload).ok());
    EXPECT_LE(payload.size(), (*codec)->MaxEncodedBytes(x.size()));
    std::vector<float> out(x.size());
    EXPECT_TRUE((*shard)->Decode(payload, out).ok());
    return static_cast<size_t>(
        std::count_if(out.begin(), out.end(), [](float v) { return v != 0; }));
  };
  EXPECT_EQ(kept(0), 80u);       // min: 1 % of 8000
  EXPECT_EQ(kept(1e12), 1600u);  // ratio: 20 %
  const size_t middle = kept(2000);
  EXPECT_GT(middle, 80u);
  EXPECT_LT(middle, 1600u);
  // Without a measured cost the spec's overhead stands in.
  EncodeContext unknown, overhead;
  overhead.fixed_cost_bytes = 16384;
  std::string a, b;
  ASSERT_TRUE((*codec)->Encode(x, unknown, &a).ok());
  ASSERT_TRUE((*codec)->Encode(x, overhead, &b).ok());
  EXPECT_EQ(a, b);
}

TEST(TopkCatCodecTest, SpecsAndRefusals) {
  auto spec = [](std::string_view s) {
    auto codec = MakeCodec(s);
    return codec.ok() ? std::string((*codec)->spec()) : std::string(codec.status().message());
  };
  EXPECT_EQ(spec("topk(0.05, level=cat)"),
            "topk(ratio=0.05, method=exact, level=cat, min=0.001, overhead=16384)+raw+raw");
  EXPECT_EQ(spec("topk(level=cat, min=0.002, overhead=0)+fp16"),
            "topk(ratio=0.01, method=exact, level=cat, min=0.002, overhead=0)+raw+fp16");
  // A fixed level keeps its spec as before.
  EXPECT_EQ(spec("topk(0.01, level=fixed)"), "topk(ratio=0.01, method=exact)+raw+raw");
  EXPECT_THAT(spec("topk(0.01, level=cat, min=0.1)"),
              HasSubstr("level=cat needs min <= ratio (the most a payload keeps), got min=0.1 and "
                        "ratio=0.01"));
  EXPECT_THAT(spec("topk(0.1, method=sampled, level=cat)"), HasSubstr("needs method=exact"));
  EXPECT_THAT(spec("topk(0.1, min=0.01)"),
              HasSubstr("min and overhead are arguments of level=cat"));
  EXPECT_THAT(spec("topk(0.1, level=cat, overhead=-5)"), HasSubstr("overhead"));
  EXPECT_THAT(spec("topk(0.1, level=auto)"), HasSubstr("is not one of fixed, cat"));
}

// 3lc(level=cat): the multiplier s of each payload is the best of the five candidates by
// CAT's objective, found here by brute force: encode with each fixed s, decode, measure
// the energy kept (|x|^2 - |x - decoded|^2) and the payload's size.
// The payload 3lc(s=1.8, level=cat) writes for `x` at fixed cost `fixed`, and the one
// a brute force picks: encode with each candidate s, decode, and keep the payload with
// the most energy kept (|x|^2 - |x - decoded|^2) per byte of (fixed + payload).
std::pair<std::string, std::string> CatAndBruteForce3lc(const std::vector<float>& x, double fixed) {
  auto cat = MakeCodec("3lc(s=1.8, level=cat)");
  EXPECT_TRUE(cat.ok()) << cat.status();
  double energy = 0;
  for (float v : x) energy += double{v} * v;
  double best = -1;
  std::string best_payload;
  for (double s : {1.0, 1.2, 1.4, 1.6, 1.8}) {
    auto fixed_s = MakeCodec("3lc(s=" + std::to_string(s) + ")");
    EXPECT_TRUE(fixed_s.ok());
    std::string payload;
    EXPECT_TRUE((*fixed_s)->Encode(x, {}, &payload).ok());
    std::vector<float> d(x.size());
    EXPECT_TRUE((*fixed_s)->Decode(payload, d).ok());
    double err = 0;
    for (size_t i = 0; i < x.size(); ++i) err += (double{x[i]} - d[i]) * (double{x[i]} - d[i]);
    const double score = (energy - err) / (fixed + static_cast<double>(payload.size()));
    if (score > best * (1 + 1e-9)) {
      best = score;
      best_payload = payload;
    }
  }
  EncodeContext ctx;
  ctx.fixed_cost_bytes = fixed;
  std::string payload;
  EXPECT_TRUE((*cat)->Encode(x, ctx, &payload).ok());
  // Shards decode it as any 3lc payload, with the spec the push names.
  auto shard = MakeCodec((*cat)->spec());
  std::vector<float> d(x.size());
  EXPECT_TRUE(shard.ok() && (*shard)->Decode(payload, d).ok());
  return {payload, best_payload};
}

// 3lc(level=cat): the multiplier s of each payload is the best of the five candidates by
// CAT's objective.
TEST(ThreeLcCatTest, ChoosesTheBestMultiplierByKeptEnergyPerByte) {
  auto cat = MakeCodec("3lc(s=1.8, level=cat)");
  ASSERT_TRUE(cat.ok()) << cat.status();
  EXPECT_EQ((*cat)->spec(), "3lc(s=1.8, level=cat, overhead=16384)");
  // Gaussian and heavy-tailed values: s = 1 keeps the most energy per byte there (a
  // value quantized to +-M keeps 2|x|M - M^2, which falls fast as s grows M).
  for (const std::vector<float>& x : {Gaussian(20000, 9), HeavyTailed(20000, 9)}) {
    for (double fixed : {0.0, 300.0, 30000.0, 1e9}) {
      const auto [got, want] = CatAndBruteForce3lc(x, fixed);
      EXPECT_EQ(got, want) << "fixed cost " << fixed;
    }
  }
  // Values at max / 2, one per group: at s = 1 each becomes +-max and keeps no energy
  // (2 |x| M - M^2 = 0) for a byte of its own; a larger s zeroes them into run bytes.
  // Without fixed cost CAT takes the sparse payload, with a large one the accurate one.
  std::vector<float> x(20000, 0.001f);
  x[0] = 1.0f;
  for (size_t i = 5; i < x.size(); i += 5) x[i] = 0.5f;
  const auto [sparse, sparse_want] = CatAndBruteForce3lc(x, 0);
  const auto [dense, dense_want] = CatAndBruteForce3lc(x, 1e9);
  EXPECT_EQ(sparse, sparse_want);
  EXPECT_EQ(dense, dense_want);
  EXPECT_LT(10 * sparse.size(), dense.size());
}

// Each candidate's kept energy and payload size (internal::ThreeLcCatCandidates, what
// the choice compares) against the payload the fixed-s codec writes and what its decode
// keeps: on Gaussian and heavy-tailed values, on non-zero groups side by side and runs of
// every length around 14, and on all zeros.
TEST(ThreeLcCatTest, CandidatesCountTheKeptEnergyAndTheExactPayloadSize) {
  std::vector<float> runs(5 * 600, 0.001f);
  runs[0] = 1.0f;
  size_t g = 0;
  for (size_t gap : {0, 0, 1, 2, 13, 14, 15, 27, 28, 29, 0, 3, 42, 0}) {
    g += gap + 1;
    runs[5 * g + gap % 5] = gap % 2 == 0 ? 0.9f : -0.6f;
  }
  const std::vector<std::vector<float>> cases = {Gaussian(20003, 4), HeavyTailed(20000, 5), runs,
                                                 std::vector<float>(4099, 0.0f)};
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::vector<float>& x = cases[c];
    float max_abs = 0;
    double energy = 0;
    for (float v : x) {
      max_abs = std::max(max_abs, std::abs(v));
      energy += double{v} * v;
    }
    const auto candidates = internal::ThreeLcCatCandidates(x, max_abs, 1.8);
    for (size_t j = 0; j < candidates.size(); ++j) {
      SCOPED_TRACE(::testing::Message() << "case " << c << ", candidate " << j);
      EXPECT_NEAR(candidates[j].multiplier, 1.0 + 0.2 * static_cast<double>(j), 1e-12);
      auto fixed_s = MakeCodec("3lc(s=" + std::to_string(candidates[j].multiplier) + ")");
      ASSERT_TRUE(fixed_s.ok()) << fixed_s.status();
      std::string payload;
      ASSERT_TRUE((*fixed_s)->Encode(x, {}, &payload).ok());
      EXPECT_EQ(candidates[j].bytes, static_cast<double>(payload.size()));
      std::vector<float> d(x.size());
      ASSERT_TRUE((*fixed_s)->Decode(payload, d).ok());
      double err = 0;
      for (size_t i = 0; i < x.size(); ++i) err += (double{x[i]} - d[i]) * (double{x[i]} - d[i]);
      EXPECT_NEAR(candidates[j].kept, energy - err, 1e-9 * std::max(energy, 1.0));
    }
  }
}

TEST(ThreeLcCatTest, SpecsAndRefusals) {
  auto spec = [](std::string_view s) {
    auto codec = MakeCodec(s);
    return codec.ok() ? std::string((*codec)->spec()) : std::string(codec.status().message());
  };
  EXPECT_EQ(spec("3lc(s=1.5, level=cat, overhead=0)"), "3lc(s=1.5, level=cat, overhead=0)");
  EXPECT_EQ(spec("3lc(s=1.5, level=fixed)"), "3lc(s=1.5)");
  EXPECT_THAT(spec("3lc(s=1.5, overhead=10)"), HasSubstr("overhead is an argument of level=cat"));
  EXPECT_THAT(spec("3lc(level=cat, overhead=-1)"), HasSubstr("overhead"));
  EXPECT_THAT(spec("3lc(s=2, level=cat)"), HasSubstr("s must lie in [1, 2)"));
}

}  // namespace
}  // namespace ps::codecs
