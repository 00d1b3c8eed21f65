#include "examples/fashion_mnist/partition.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::fashion_mnist {
namespace {

class IidPartitionTest
    : public ::testing::TestWithParam<std::tuple<uint64_t /*examples*/, uint32_t /*workers*/>> {};

TEST_P(IidPartitionTest, PartsAreDisjointAndCoverTheSet) {
  const auto [examples, workers] = GetParam();
  std::vector<uint32_t> seen;
  size_t smallest = SIZE_MAX, largest = 0;
  for (uint32_t w = 0; w < workers; ++w) {
    auto part = IidPartition(examples, workers, w, /*seed=*/42);
    ASSERT_TRUE(part.ok()) << part.status();
    smallest = std::min(smallest, part->size());
    largest = std::max(largest, part->size());
    seen.insert(seen.end(), part->begin(), part->end());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<uint32_t> all(examples);
  std::iota(all.begin(), all.end(), 0u);
  EXPECT_EQ(seen, all);  // every index exactly once
  EXPECT_LE(largest - smallest, 1u);
}

INSTANTIATE_TEST_SUITE_P(Sizes, IidPartitionTest,
                         ::testing::Combine(::testing::Values(7u, 10u, 1000u, 60000u),
                                            ::testing::Values(1u, 2u, 3u, 6u, 7u)));

TEST(IidPartition, SameSeedSamePartDifferentSeedDifferentPart) {
  auto a = IidPartition(60000, 6, 2, 1);
  auto b = IidPartition(60000, 6, 2, 1);
  auto c = IidPartition(60000, 6, 2, 2);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
}

TEST(IidPartition, IsAShuffleNotABlock) {
  auto part = IidPartition(60000, 6, 0, 1);
  ASSERT_TRUE(part.ok());
  // A contiguous block [0, 10000) would be the non-IID split by file order.
  EXPECT_GT(*std::max_element(part->begin(), part->end()), 50000u);
}

TEST(IidPartition, DoesNotDependOnTheStandardLibrary) {
  // Pinned output: the shuffle uses mt19937_64 (fully specified) and our own draws, so
  // this holds on every platform. A change here changes every experiment's data split.
  auto part = IidPartition(10, 2, 0, 1);
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(*part, (std::vector<uint32_t>{1, 7, 3, 9, 8}));
  EXPECT_EQ(DeriveSeed(1, 0), 6791897765849424158ULL);
  EXPECT_NE(DeriveSeed(1, 0), DeriveSeed(1, 1));
  EXPECT_NE(DeriveSeed(1, 0), DeriveSeed(2, 0));
}

TEST(IidPartition, RejectsBadArguments) {
  EXPECT_EQ(IidPartition(10, 0, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IidPartition(10, 2, 2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IidPartition(3, 4, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IidPartition(uint64_t{1} << 33, 2, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(UniformBelow, StaysInRangeAndHitsEveryValue) {
  std::mt19937_64 rng(7);
  std::vector<int> counts(6, 0);
  for (int i = 0; i < 6000; ++i) {
    const uint64_t v = UniformBelow(rng, 6);
    ASSERT_LT(v, 6u);
    ++counts[v];
  }
  for (int c : counts) EXPECT_GT(c, 800);
}

TEST(BatchSampler, EachEpochVisitsEveryIndexOnce) {
  std::vector<uint32_t> indices = {3, 8, 13, 21, 34, 55, 89};
  BatchSampler sampler(indices, 5);
  std::vector<uint32_t> batch, epoch;
  // 7 indices in batches of 3: the third batch crosses into the second epoch.
  sampler.Next(3, batch);
  epoch.insert(epoch.end(), batch.begin(), batch.end());
  sampler.Next(3, batch);
  epoch.insert(epoch.end(), batch.begin(), batch.end());
  EXPECT_EQ(sampler.epoch(), 0u);
  sampler.Next(3, batch);
  epoch.push_back(batch[0]);
  EXPECT_EQ(sampler.epoch(), 1u);
  std::sort(epoch.begin(), epoch.end());
  EXPECT_EQ(epoch, indices);
}

TEST(BatchSampler, SameSeedSameBatches) {
  std::vector<uint32_t> indices(100);
  std::iota(indices.begin(), indices.end(), 0u);
  BatchSampler a(indices, 9), b(indices, 9), c(indices, 10);
  std::vector<uint32_t> ba, bb, bc;
  bool any_differs = false;
  for (int i = 0; i < 10; ++i) {
    a.Next(32, ba);
    b.Next(32, bb);
    c.Next(32, bc);
    EXPECT_EQ(ba, bb);
    any_differs = any_differs || ba != bc;
  }
  EXPECT_TRUE(any_differs);
}


// ---- non-IID splits ----

// 10 balanced classes of 300 examples each, interleaved (label = index % 10).
std::vector<uint8_t> BalancedLabels(size_t n = 3000) {
  std::vector<uint8_t> labels(n);
  for (size_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % 10);
  return labels;
}

std::vector<std::vector<uint32_t>> AllParts(std::string_view spec, const std::vector<uint8_t>& labels,
                                            uint32_t workers, uint64_t seed = 9) {
  auto split = ParseSplit(spec);
  EXPECT_TRUE(split.ok()) << split.status();
  std::vector<std::vector<uint32_t>> parts;
  for (uint32_t w = 0; w < workers; ++w) {
    auto part = Partition(*split, labels, 10, workers, w, seed);
    EXPECT_TRUE(part.ok()) << part.status();
    parts.push_back(*std::move(part));
  }
  return parts;
}

// Fraction of a part's examples that carry its most common label.
double TopClassShare(const std::vector<uint32_t>& part, const std::vector<uint8_t>& labels) {
  std::vector<size_t> count(10);
  for (uint32_t i : part) ++count[labels[i]];
  return static_cast<double>(*std::max_element(count.begin(), count.end())) / part.size();
}

class SplitTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SplitTest, PartsAreDisjointNonEmptyCoverTheSetAndRepeat) {
  const std::vector<uint8_t> labels = BalancedLabels();
  for (uint32_t workers : {1u, 3u, 12u}) {
    const auto parts = AllParts(GetParam(), labels, workers);
    std::vector<int> seen(labels.size());
    for (const auto& part : parts) {
      EXPECT_FALSE(part.empty());
      for (uint32_t i : part) ++seen[i];
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<ptrdiff_t>(labels.size()))
        << GetParam() << " with " << workers << " workers";
    EXPECT_EQ(parts, AllParts(GetParam(), labels, workers));
  }
}

INSTANTIATE_TEST_SUITE_P(Splits, SplitTest,
                         ::testing::Values("iid", "dirichlet(alpha=0.1)", "dirichlet(alpha=100)",
                                           "dirichlet(0.001)", "gamma(0)", "gamma(0.5)", "gamma(1)"));

TEST(SplitTest, DirichletAlphaControlsTheSkew) {
  const std::vector<uint8_t> labels = BalancedLabels();
  double skewed = 0, flat = 0;
  for (const auto& part : AllParts("dirichlet(alpha=0.1)", labels, 10)) skewed += TopClassShare(part, labels) / 10;
  for (const auto& part : AllParts("dirichlet(alpha=1000)", labels, 10)) flat += TopClassShare(part, labels) / 10;
  EXPECT_GT(skewed, 0.5);  // most of a worker's data is one class
  EXPECT_LT(flat, 0.15);   // near the 0.1 of a uniform mix
  EXPECT_NE(AllParts("dirichlet(alpha=0.1)", labels, 10, 1), AllParts("dirichlet(alpha=0.1)", labels, 10, 2));
}

TEST(SplitTest, GammaZeroSortsByLabelAndGammaOneIsIidLike) {
  const std::vector<uint8_t> labels = BalancedLabels();
  for (const auto& part : AllParts("gamma(0)", labels, 10)) EXPECT_EQ(TopClassShare(part, labels), 1.0);
  for (const auto& part : AllParts("gamma(1)", labels, 10)) EXPECT_LT(TopClassShare(part, labels), 0.2);
  // Half IID: the sorted half holds one or two classes (its cut need not fall on a
  // class boundary), the IID half a tenth of each: well between the two extremes.
  for (const auto& part : AllParts("gamma(0.5)", labels, 10)) {
    EXPECT_GT(TopClassShare(part, labels), 0.3);
    EXPECT_LT(TopClassShare(part, labels), 0.6);
  }
}

TEST(SplitTest, IidSplitIsTheIidPartition) {
  const std::vector<uint8_t> labels = BalancedLabels();
  auto split = *ParseSplit("iid");
  EXPECT_EQ(*Partition(split, labels, 10, 4, 2, 5), *IidPartition(labels.size(), 4, 2, 5));
}

TEST(SplitTest, RefusesBadSpecsAndLabels) {
  EXPECT_THAT(std::string(ParseSplit("zipf").status().message()),
              ::testing::HasSubstr("unknown split 'zipf'; known: iid, dirichlet, gamma"));
  EXPECT_THAT(std::string(ParseSplit("gamma(1.5)").status().message()),
              ::testing::HasSubstr("gamma must lie in [0, 1]"));
  EXPECT_THAT(std::string(ParseSplit("dirichlet(alpha=0)").status().message()), ::testing::HasSubstr("alpha"));
  EXPECT_EQ(ParseSplit("dirichlet(0.5)")->spec, "dirichlet(alpha=0.5)");
  const std::vector<uint8_t> bad = {1, 2, 10};
  EXPECT_THAT(std::string(Partition(*ParseSplit("gamma(0)"), bad, 10, 1, 0, 1).status().message()),
              ::testing::HasSubstr("label 10 of example 2 is not below 10"));
  EXPECT_FALSE(Partition(*ParseSplit("gamma(0)"), BalancedLabels(5), 10, 6, 0, 1).ok());
}

TEST(GammaDrawTest, MeanAndVarianceMatchTheShape) {
  std::mt19937_64 rng(4);
  for (double shape : {0.1, 1.0, 5.0}) {
    double sum = 0, sq = 0;
    const int draws = 40000;
    for (int i = 0; i < draws; ++i) {
      const double x = GammaDraw(rng, shape);
      ASSERT_GE(x, 0.0);
      sum += x;
      sq += x * x;
    }
    const double mean = sum / draws;
    EXPECT_NEAR(mean, shape, 6 * std::sqrt(shape / draws)) << shape;  // Gamma(k): mean k, var k
    EXPECT_NEAR(sq / draws - mean * mean, shape, 0.1 * shape + 0.01) << shape;
  }
}

}  // namespace
}  // namespace ps::fashion_mnist
