// Every rule against a deliberately plain reference (a full sort per coordinate, pairwise
// distance loops, everything in double) on seeded random inputs, over a sweep of rule x n
// x f x d; and the same bits with no pool, a 1-thread pool and a 3-thread pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "aggregators/coordinate_internal.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators {
namespace {

std::vector<double> ReferenceMean(const test::Vectors& x, const std::vector<size_t>& which) {
  const size_t d = x[0].size();
  std::vector<double> out(d, 0.0);
  for (size_t i : which) {
    for (size_t c = 0; c < d; ++c) out[c] += x[i][c];
  }
  for (double& v : out) v /= static_cast<double>(which.size());
  return out;
}

std::vector<double> ReferenceSorted(const test::Vectors& x, const AggregatorOptions& options,
                                    bool median) {
  const size_t n = x.size();
  const size_t f = static_cast<size_t>(options.num_byzantine);
  std::vector<double> out(x[0].size());
  std::vector<double> column(n);
  for (size_t c = 0; c < out.size(); ++c) {
    for (size_t i = 0; i < n; ++i) column[i] = x[i][c];
    std::sort(column.begin(), column.end());
    if (!median) {
      double sum = 0.0;
      for (size_t r = f; r < n - f; ++r) sum += column[r];
      out[c] = sum / static_cast<double>(n - 2 * f);
    } else if (n % 2 == 1) {
      out[c] = column[n / 2];
    } else if (options.even_median == EvenMedian::kLower) {
      out[c] = column[n / 2 - 1];
    } else if (options.even_median == EvenMedian::kUpper) {
      out[c] = column[n / 2];
    } else {
      out[c] = (column[n / 2 - 1] + column[n / 2]) / 2;
    }
  }
  return out;
}

std::vector<double> ReferenceKrum(const test::Vectors& x, const AggregatorOptions& options,
                                  bool multi) {
  const size_t n = x.size();
  const size_t f = static_cast<size_t>(options.num_byzantine);
  const size_t neighbours =
      options.krum_neighbours == KrumNeighbours::kByzFL ? n - f - 1 : n - f - 2;
  std::vector<std::vector<double>> dist(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      double sum = 0.0;
      for (size_t c = 0; c < x[i].size(); ++c) {
        const double diff = static_cast<double>(x[i][c]) - x[j][c];
        sum += diff * diff;
      }
      dist[i][j] = dist[j][i] = sum;
    }
  }
  std::vector<double> scores(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> others;
    for (size_t j = 0; j < n; ++j) {
      if (j != i) others.push_back(dist[i][j]);
    }
    std::sort(others.begin(), others.end());
    scores[i] =
        std::accumulate(others.begin(), others.begin() + static_cast<ptrdiff_t>(neighbours), 0.0);
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  size_t m = 1;
  if (multi) m = options.multi_krum_m == 0 ? n - f : static_cast<size_t>(options.multi_krum_m);
  order.resize(m);
  return ReferenceMean(x, order);
}

std::vector<double> Reference(const std::string& name, const AggregatorOptions& options,
                              const test::Vectors& x) {
  if (name == "mean") {
    std::vector<size_t> all(x.size());
    std::iota(all.begin(), all.end(), size_t{0});
    return ReferenceMean(x, all);
  }
  if (name == "median") return ReferenceSorted(x, options, /*median=*/true);
  if (name == "trimmed_mean") return ReferenceSorted(x, options, /*median=*/false);
  if (name == "krum") return ReferenceKrum(x, options, /*multi=*/false);
  if (name == "multi_krum") return ReferenceKrum(x, options, /*multi=*/true);
  ADD_FAILURE() << "no reference for " << name;
  return {};
}

// n seeded random inputs of d values in [-1, 1); the first f (but fewer than half) are
// scaled and shifted away, like Byzantine ones, so selection matters.
test::Vectors SweepInputs(size_t n, size_t f, size_t d, uint64_t seed) {
  test::Vectors x = test::RandomVectors(n, d, seed);
  for (size_t i = 0; i < std::min(f, (n - 1) / 2); ++i) {
    for (float& v : x[i]) v = 30.0f * v + 5.0f;
  }
  return x;
}

// Runs the rule with no pool, a 1-thread and a 3-thread pool: the three results must be
// the same bits, and within 1e-5 of the reference relative to the largest input
// magnitude at each coordinate.
void CheckRule(const std::string& name, const AggregatorOptions& options, size_t n, size_t d,
               uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << name << " n=" << n << " f=" << options.num_byzantine
                                    << " d=" << d << " m=" << options.multi_krum_m);
  absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(name, options);
  ASSERT_TRUE(rule.ok()) << rule.status();
  const test::Vectors x = SweepInputs(n, static_cast<size_t>(options.num_byzantine), d, seed);

  absl::StatusOr<std::vector<float>> serial = test::Run(**rule, x, nullptr);
  ASSERT_TRUE(serial.ok()) << serial.status();
  static core::ThreadPool* const kOneThread = new core::ThreadPool(1);
  static core::ThreadPool* const kThreeThreads = new core::ThreadPool(3);
  for (core::ThreadPool* pool : {kOneThread, kThreeThreads}) {
    absl::StatusOr<std::vector<float>> pooled = test::Run(**rule, x, pool);
    ASSERT_TRUE(pooled.ok()) << pooled.status();
    ASSERT_EQ(std::memcmp(pooled->data(), serial->data(), d * sizeof(float)), 0)
        << pool->num_threads() << "-thread pool differs from no pool";
  }

  const std::vector<double> want = Reference(name, options, x);
  ASSERT_EQ(want.size(), d);
  int reported = 0;
  for (size_t c = 0; c < d; ++c) {
    float scale = 0.0f;
    for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(x[i][c]));
    const double error = std::abs((*serial)[c] - want[c]);
    if (error > 1e-5 * scale && reported++ < 5) {
      ADD_FAILURE() << "coordinate " << c << ": got " << (*serial)[c] << ", want " << want[c];
    }
  }
}

using SweepParam = std::tuple<std::string, int, int, size_t>;

// n = the rule's MinInputs() for f, plus `extra`: every combination is valid.
class ReferenceSweepTest : public ::testing::TestWithParam<SweepParam> {};

std::string SweepName(const ::testing::TestParamInfo<SweepParam>& info) {
  const auto& [name, f, extra, d] = info.param;
  return name + "_f" + std::to_string(f) + "_extra" + std::to_string(extra) + "_d" +
         std::to_string(d);
}

TEST_P(ReferenceSweepTest, MatchesReferenceAndIgnoresThePool) {
  const auto& [name, f, extra, d] = GetParam();
  const absl::StatusOr<std::unique_ptr<Aggregator>> probe =
      MakeAggregator(name, test::Options(1000, f));
  ASSERT_TRUE(probe.ok()) << probe.status();
  const int n = (*probe)->MinInputs() + extra;
  CheckRule(name, test::Options(n, f), static_cast<size_t>(n), d,
            static_cast<uint64_t>(n * 1000 + f * 100) + d);
}

INSTANTIATE_TEST_SUITE_P(
    Rules, ReferenceSweepTest,
    ::testing::Combine(::testing::Values("mean", "median", "trimmed_mean", "krum", "multi_krum"),
                       ::testing::Values(0, 1, 3), ::testing::Values(0, 1, 4, 9),
                       ::testing::Values(size_t{1}, size_t{7}, size_t{4099}, size_t{70000})),
    SweepName);

// Around the sorting-network limit and past it, where the coordinate rules switch to
// nth_element.
constexpr int kNetworkLimit = static_cast<int>(internal::kMaxNetworkInputs);

using ManyParam = std::tuple<std::string, int, int, size_t>;

class ManyInputsSweepTest : public ::testing::TestWithParam<ManyParam> {};

std::string ManyName(const ::testing::TestParamInfo<ManyParam>& info) {
  const auto& [name, n, f, d] = info.param;
  return name + "_n" + std::to_string(n) + "_f" + std::to_string(f) + "_d" + std::to_string(d);
}

TEST_P(ManyInputsSweepTest, MatchesReferenceAndIgnoresThePool) {
  const auto& [name, n, f, d] = GetParam();
  CheckRule(name, test::Options(n, f), static_cast<size_t>(n), d,
            static_cast<uint64_t>(n * 1000 + f * 100) + d);
}

INSTANTIATE_TEST_SUITE_P(
    Rules, ManyInputsSweepTest,
    ::testing::Combine(::testing::Values("mean", "median", "trimmed_mean", "krum", "multi_krum"),
                       ::testing::Values(kNetworkLimit - 1, kNetworkLimit, kNetworkLimit + 1,
                                         kNetworkLimit + 16),
                       ::testing::Values(0, 5), ::testing::Values(size_t{1}, size_t{4099})),
    ManyName);

using MedianParam = std::tuple<EvenMedian, int, size_t>;

class MedianSweepTest : public ::testing::TestWithParam<MedianParam> {};

std::string MedianName(const ::testing::TestParamInfo<MedianParam>& info) {
  const auto& [even, n, d] = info.param;
  const char* names[] = {"midpoint", "lower", "upper"};
  return std::string(names[static_cast<int>(even)]) + "_n" + std::to_string(n) + "_d" +
         std::to_string(d);
}

TEST_P(MedianSweepTest, MatchesReferenceAndIgnoresThePool) {
  const auto& [even, n, d] = GetParam();
  AggregatorOptions options = test::Options(n, 0);
  options.even_median = even;
  CheckRule("median", options, static_cast<size_t>(n), d, static_cast<uint64_t>(n) * 7 + d);
}

INSTANTIATE_TEST_SUITE_P(
    EvenVariants, MedianSweepTest,
    ::testing::Combine(::testing::Values(EvenMedian::kMidpoint, EvenMedian::kLower,
                                         EvenMedian::kUpper),
                       ::testing::Values(1, 2, 3, 4, 5, 16, 17, kNetworkLimit - 1, kNetworkLimit,
                                         kNetworkLimit + 1, kNetworkLimit + 2),
                       ::testing::Values(size_t{7}, size_t{4099})),
    MedianName);

// Krum and Multi-Krum with both neighbour counts and m in {default, 1, n}.
using KrumParam = std::tuple<std::string, KrumNeighbours, int, int, int>;

class KrumSweepTest : public ::testing::TestWithParam<KrumParam> {};

std::string KrumName(const ::testing::TestParamInfo<KrumParam>& info) {
  const auto& [name, neighbours, f, extra, m] = info.param;
  return name + (neighbours == KrumNeighbours::kPaper ? "_paper" : "_byzfl") + "_f" +
         std::to_string(f) + "_extra" + std::to_string(extra) + "_m" +
         (m < 0 ? std::string("n") : std::to_string(m));
}

TEST_P(KrumSweepTest, MatchesReferenceAndIgnoresThePool) {
  const auto& [name, neighbours, f, extra, m] = GetParam();
  const int n = 2 * f + 3 + extra;
  AggregatorOptions options = test::Options(n, f);
  options.krum_neighbours = neighbours;
  options.multi_krum_m = m < 0 ? n : m;
  CheckRule(name, options, static_cast<size_t>(n), 4099, static_cast<uint64_t>(n * 31 + f));
}

INSTANTIATE_TEST_SUITE_P(Variants, KrumSweepTest,
                         ::testing::Combine(::testing::Values("krum", "multi_krum"),
                                            ::testing::Values(KrumNeighbours::kPaper,
                                                              KrumNeighbours::kByzFL),
                                            ::testing::Values(0, 1, 2), ::testing::Values(0, 5),
                                            ::testing::Values(0, 1, -1)),
                         KrumName);

}  // namespace
}  // namespace ps::aggregators
