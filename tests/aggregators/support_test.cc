// Compressed-domain aggregation on a shared support (AggregationContext::support): the
// same result as the dense inputs, which are zero off the support.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "aggregators/aggregator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators {
namespace {

using test::Options;

struct Sparse {
  test::Vectors dense;            // n x d, zero off the support
  std::vector<uint32_t> support;  // sorted
};

Sparse MakeSparse(size_t n, size_t d, size_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> all(d);
  for (uint32_t i = 0; i < d; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  Sparse s;
  s.support.assign(all.begin(), all.begin() + static_cast<ptrdiff_t>(k));
  std::sort(s.support.begin(), s.support.end());
  s.dense = test::Vectors(n, std::vector<float>(d, 0.0f));
  std::normal_distribution<float> normal;
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t c : s.support) s.dense[i][c] = normal(rng) + (i == n - 1 ? 30.0f : 0.0f);
  }
  return s;
}

class SupportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SupportTest, EqualsTheDensePathInSliceAndModelScope) {
  const std::string spec = GetParam();
  auto rule = MakeAggregator(spec, Options(11, 2));
  ASSERT_TRUE(rule.ok()) << rule.status();
  const Sparse s = MakeSparse(11, 500, 37, 9);
  const auto ptrs = test::Pointers(s.dense);

  std::vector<float> dense(500), sparse(500, 7.0f);
  AggregationContext ctx;
  ctx.round = 4;
  ASSERT_TRUE((*rule)->Aggregate(ptrs, dense, ctx).ok());
  AggregationContext with = ctx;
  with.support = s.support;
  ASSERT_TRUE((*rule)->Aggregate(ptrs, sparse, with).ok());
  for (size_t c = 0; c < 500; ++c) {
    // Coordinate rules and selections are exact; Gram-weighted averages may differ in
    // the last bits (the Gram sums in another grouping).
    ASSERT_NEAR(sparse[c], dense[c], 1e-5 * (1 + std::fabs(dense[c]))) << spec << " at " << c;
  }

  // Model scope: AccumulateGram -> Plan -> Apply.
  if ((*rule)->NeedsGram()) {
    const size_t k = ptrs.size();
    const size_t rows = k + (*rule)->StateRows();
    std::vector<double> g_dense(rows * rows, 0.0), g_sparse(rows * rows, 0.0);
    ASSERT_TRUE((*rule)->AccumulateGram(ptrs, 500, ctx, g_dense).ok());
    ASSERT_TRUE((*rule)->AccumulateGram(ptrs, 500, with, g_sparse).ok());
    for (size_t i = 0; i < rows * rows; ++i) {
      ASSERT_NEAR(g_sparse[i], g_dense[i], 1e-9 * (1 + std::fabs(g_dense[i])));
    }
    auto plan = (*rule)->Plan(k, g_sparse, ctx.round);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<float> applied(500, 7.0f);
    ASSERT_TRUE((*rule)->Apply(*plan, ptrs, applied, with).ok());
    for (size_t c = 0; c < 500; ++c) {
      ASSERT_NEAR(applied[c], dense[c], 1e-5 * (1 + std::fabs(dense[c]))) << spec << " at " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rules, SupportTest,
    ::testing::Values("mean", "median", "trimmed_mean", "meamed", "phocas", "krum", "multi_krum",
                      "bulyan", "geometric_median", "mda", "nnm+trimmed_mean", "clip(2)+krum",
                      "arc+median", "bucketing(s=2)+mean", "centered_clipping", "sign_majority"),
    [](const auto& info) {
      std::string name;
      for (char c : info.param) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name;
    });

TEST(SupportTest, RefusesASupportThatIsNotIncreasingOrOutOfRange) {
  auto rule = MakeAggregator("median", Options(3, 0));
  ASSERT_TRUE(rule.ok());
  const test::Vectors x = test::RandomVectors(3, 10, 1);
  std::vector<float> out(10);
  for (std::vector<uint32_t> bad : {std::vector<uint32_t>{3, 3}, {5, 2}, {1, 10}}) {
    AggregationContext ctx;
    ctx.support = bad;
    const absl::Status st = (*rule)->Aggregate(test::Pointers(x), out, ctx);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("support coordinate"));
  }
}

}  // namespace
}  // namespace ps::aggregators
