// CAF, SMEA and MoNNA: the k x k eigen solver, the papers' (and ByzFL's) small examples,
// and the rules against plain references that work in coordinate space (an explicit
// d x d covariance matrix whose top eigenpair comes from power iteration run to
// convergence), on seeded inputs with attackers among them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "aggregators/spectral_internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators {
namespace {

using internal::LargestEigen;
using internal::SquareMatrix;
using test::Options;
using test::Vectors;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Matrix = std::vector<std::vector<double>>;

// ---- LargestEigen ---------------------------------------------------------------------

TEST(LargestEigenTest, SmallHandComputedMatrices) {
  SquareMatrix a(2);
  a.values = {2, 1, 1, 2};  // eigenvalues 3 (1, 1) and 1 (1, -1)
  internal::TopEigen top = LargestEigen(a, true);
  EXPECT_NEAR(top.value, 3.0, 1e-14);
  EXPECT_NEAR(std::abs(top.vector[0]), std::sqrt(0.5), 1e-14);
  EXPECT_NEAR(top.vector[0], top.vector[1], 1e-14);
  SquareMatrix diag(3);
  diag.values = {1, 0, 0, 0, -5, 0, 0, 0, 4};
  EXPECT_EQ(LargestEigen(diag, false).value, 4.0);
  EXPECT_EQ(LargestEigen(SquareMatrix(0), true).value, 0.0);
  EXPECT_EQ(LargestEigen(SquareMatrix(3), false).value, 0.0);  // all zero
  EXPECT_NEAR(internal::LargestEigenvalue(a), 3.0, 1e-14);
  EXPECT_NEAR(internal::LargestEigenvalue(diag), 4.0, 1e-14);
  EXPECT_EQ(internal::LargestEigenvalue(SquareMatrix(0)), 0.0);
  EXPECT_EQ(internal::LargestEigenvalue(SquareMatrix(3)), 0.0);
}

TEST(LargestEigenTest, EigenpairOfRandomSymmetricMatrices) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal;
  for (size_t k : {1u, 2u, 5u, 12u, 30u}) {
    SquareMatrix a(k);
    for (size_t i = 0; i < k; ++i) {
      for (size_t j = i; j < k; ++j) a.at(i, j) = a.at(j, i) = normal(rng);
    }
    const internal::TopEigen top = LargestEigen(a, true);
    // A v = lambda v, |v| = 1, and no unit vector has a larger Rayleigh quotient.
    double norm = 0.0;
    for (size_t i = 0; i < k; ++i) {
      double av = 0.0;
      for (size_t j = 0; j < k; ++j) av += a.at(i, j) * top.vector[j];
      EXPECT_NEAR(av, top.value * top.vector[i], 1e-10) << "k " << k;
      norm += top.vector[i] * top.vector[i];
    }
    EXPECT_NEAR(norm, 1.0, 1e-12);
    // The eigenvalue-only solver (tridiagonal + bisection) agrees.
    EXPECT_NEAR(internal::LargestEigenvalue(a), top.value, 1e-12 * (1 + std::abs(top.value)))
        << "k " << k;
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<double> x(k);
      double xx = 0.0, xax = 0.0;
      for (double& v : x) v = normal(rng), xx += v * v;
      for (size_t i = 0; i < k; ++i) {
        for (size_t j = 0; j < k; ++j) xax += x[i] * a.at(i, j) * x[j];
      }
      EXPECT_LE(xax / xx, top.value + 1e-10) << "k " << k;
    }
  }
}

// ---- Plain references, in coordinate space --------------------------------------------

// The top eigenpair of a symmetric PSD matrix by power iteration until the Rayleigh
// quotient settles (deliberately not the Jacobi code under test).
std::pair<double, std::vector<double>> PowerTop(const Matrix& s) {
  const size_t d = s.size();
  std::vector<double> v(d);
  for (size_t i = 0; i < d; ++i) v[i] = 1.0 + 0.01 * static_cast<double>(i * i % 7);
  double lambda = 0.0;
  for (int it = 0; it < 100000; ++it) {
    std::vector<double> w(d, 0.0);
    for (size_t i = 0; i < d; ++i) {
      for (size_t j = 0; j < d; ++j) w[i] += s[i][j] * v[j];
    }
    double norm = 0.0;
    for (double x : w) norm += x * x;
    norm = std::sqrt(norm);
    if (norm == 0.0) return {0.0, v};
    double next = 0.0;
    for (size_t i = 0; i < d; ++i) next += v[i] * w[i];
    for (size_t i = 0; i < d; ++i) v[i] = w[i] / norm;
    if (std::abs(next - lambda) <= 1e-15 * std::abs(next)) return {next, v};
    lambda = next;
  }
  return {lambda, v};
}

// sum_i w_i (x_i - mu)(x_i - mu)' / sum w, mu the w-weighted mean; also returns mu.
Matrix Covariance(const Vectors& x, const std::vector<double>& w, std::vector<double>* mu) {
  const size_t d = x[0].size();
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  mu->assign(d, 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t c = 0; c < d; ++c) (*mu)[c] += w[i] * x[i][c] / total;
  }
  Matrix s(d, std::vector<double>(d, 0.0));
  for (size_t i = 0; i < x.size(); ++i) {
    if (w[i] == 0.0) continue;
    for (size_t a = 0; a < d; ++a) {
      for (size_t b = 0; b < d; ++b) {
        s[a][b] += w[i] * (x[i][a] - (*mu)[a]) * (x[i][b] - (*mu)[b]) / total;
      }
    }
  }
  return s;
}

std::vector<double> ReferenceCaf(const Vectors& x, size_t f) {
  const size_t n = x.size();
  std::vector<double> c(n, 1.0), mu, best;
  double best_lambda = std::numeric_limits<double>::infinity();
  Covariance(x, c, &best);  // f = 0: the mean
  while (std::accumulate(c.begin(), c.end(), 0.0) > static_cast<double>(n - 2 * f)) {
    const auto [lambda, v] = PowerTop(Covariance(x, c, &mu));
    if (lambda < best_lambda) best_lambda = lambda, best = mu;
    std::vector<double> tau(n, 0.0);
    double tau_max = 0.0;
    for (size_t i = 0; i < n; ++i) {
      double p = 0.0;
      for (size_t a = 0; a < v.size(); ++a) p += (x[i][a] - mu[a]) * v[a];
      tau[i] = p * p;
      if (c[i] > 0.0) tau_max = std::max(tau_max, tau[i]);
    }
    if (lambda <= 0.0 || tau_max <= 0.0) break;
    for (size_t i = 0; i < n; ++i) {
      if (c[i] > 0.0) c[i] *= std::max(0.0, 1.0 - tau[i] / tau_max);
    }
  }
  return best;
}

std::vector<size_t> ReferenceSmea(const Vectors& x, size_t f) {
  const size_t n = x.size();
  std::vector<size_t> best;
  double best_lambda = std::numeric_limits<double>::infinity();
  // Every (n - f)-subset, as a bitmask, in lexicographic order of the index lists.
  std::vector<std::vector<size_t>> subsets;
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    if (static_cast<size_t>(__builtin_popcount(mask)) != n - f) continue;
    std::vector<size_t> s;
    for (size_t i = 0; i < n; ++i) {
      if (mask & (1u << i)) s.push_back(i);
    }
    subsets.push_back(s);
  }
  std::sort(subsets.begin(), subsets.end());
  for (const auto& s : subsets) {
    std::vector<double> w(n, 0.0), mu;
    for (size_t i : s) w[i] = 1.0;
    const double lambda = PowerTop(Covariance(x, w, &mu)).first;
    if (lambda < best_lambda * (1 - 1e-9)) best_lambda = lambda, best = s;
  }
  return best;
}

std::vector<double> MeanOf(const Vectors& x, const std::vector<size_t>& rows) {
  std::vector<double> out(x[0].size(), 0.0);
  for (size_t i : rows) {
    for (size_t c = 0; c < out.size(); ++c) out[c] += x[i][c] / static_cast<double>(rows.size());
  }
  return out;
}

std::vector<double> ReferenceMonna(const Vectors& x, size_t f, size_t idx) {
  std::vector<std::pair<double, size_t>> by_distance;
  for (size_t i = 0; i < x.size(); ++i) {
    double d2 = 0.0;
    for (size_t c = 0; c < x[i].size(); ++c) d2 += (x[i][c] - x[idx][c]) * (x[i][c] - x[idx][c]);
    by_distance.push_back({i == idx ? -1.0 : d2, i});
  }
  std::sort(by_distance.begin(), by_distance.end());
  std::vector<size_t> chosen;
  for (size_t r = 0; r < x.size() - f; ++r) chosen.push_back(by_distance[r].second);
  return MeanOf(x, chosen);
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t c = 0; c < got.size(); ++c) {
    ASSERT_NEAR(got[c], want[c], 1e-5 * (1.0 + std::abs(want[c]))) << what << " at " << c;
  }
}

// n honest inputs around a common point with per-coordinate noise, the last f replaced
// by an attack: "far" (a shifted copy), "aligned" (all on one side along one direction,
// which per coordinate looks harmless), or "spread" (scattered widely).
Vectors Attacked(size_t n, size_t f, size_t d, uint64_t seed, const std::string& attack) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  Vectors x(n, std::vector<float>(d));
  std::vector<float> centre(d);
  for (float& v : centre) v = normal(rng);
  for (auto& row : x) {
    for (size_t c = 0; c < d; ++c) row[c] = centre[c] + 0.3f * normal(rng);
  }
  for (size_t b = n - f; b < n; ++b) {
    for (size_t c = 0; c < d; ++c) {
      if (attack == "far") x[b][c] = centre[c] + 5.0f + 0.1f * normal(rng);
      if (attack == "aligned") x[b][c] = centre[c] + (c % 2 == 0 ? 1.2f : -1.2f);
      if (attack == "spread") x[b][c] = centre[c] + 4.0f * normal(rng);
    }
  }
  return x;
}

// ---- The rules against the references ---------------------------------------------------

TEST(SpectralRulesTest, ByzFLDocumentationExamples) {
  const Vectors x = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}};
  EXPECT_THAT(test::Aggregate("caf", Options(3, 1), x), ElementsAre(4, 5, 6));
  EXPECT_THAT(test::Aggregate("smea", Options(3, 1), x), ElementsAre(2.5, 3.5, 4.5));
  EXPECT_THAT(test::Aggregate("monna(idx=1)", Options(3, 1), x), ElementsAre(2.5, 3.5, 4.5));
}

TEST(SpectralRulesTest, CafMatchesTheReference) {
  for (const std::string attack : {"far", "aligned", "spread"}) {
    for (size_t f : {size_t{0}, size_t{1}, size_t{2}, size_t{3}}) {
      for (size_t n : {2 * f + 1, 2 * f + 4, size_t{11}}) {
        if (n < 2 * f + 1) continue;
        const Vectors x = Attacked(n, f, 6, 100 * n + 10 * f + attack.size(), attack);
        ExpectNear(test::Aggregate("caf", Options(static_cast<int>(n), static_cast<int>(f)), x),
                   ReferenceCaf(x, f),
                   "caf " + attack + " n " + std::to_string(n) + " f " + std::to_string(f));
      }
    }
  }
}

TEST(SpectralRulesTest, SmeaMatchesTheReference) {
  for (const std::string attack : {"far", "aligned", "spread"}) {
    for (size_t f : {size_t{0}, size_t{1}, size_t{2}, size_t{3}}) {
      for (size_t n : {2 * f + 1, 2 * f + 4, size_t{11}}) {
        if (n < 2 * f + 1) continue;
        const Vectors x = Attacked(n, f, 6, 200 * n + 10 * f + attack.size(), attack);
        const std::vector<size_t> want = ReferenceSmea(x, f);
        ExpectNear(test::Aggregate("smea", Options(static_cast<int>(n), static_cast<int>(f)), x),
                   MeanOf(x, want),
                   "smea " + attack + " n " + std::to_string(n) + " f " + std::to_string(f));
      }
    }
  }
}

// Every (k - f)-subset in lexicographic order, each eigenvalue solved as SmeaSubset
// solves a subset's, the first of the smallest kept: what SmeaSubset, which skips the
// subsets it can bound, must return, bit for bit.
std::vector<size_t> ExhaustiveSmea(const SquareMatrix& gram, size_t f) {
  const size_t k = gram.k, m = k - f;
  const std::vector<double> beta(m, 1.0 / static_cast<double>(m));
  std::vector<size_t> subset(m), best;
  std::iota(subset.begin(), subset.end(), 0);
  double best_lambda = std::numeric_limits<double>::infinity();
  while (true) {
    const double lambda = internal::LargestEigenvalue(internal::CentredProducts(gram, subset, beta));
    if (lambda < best_lambda) best_lambda = lambda, best = subset;
    size_t i = m;
    while (i > 0 && subset[i - 1] == k - m + (i - 1)) --i;
    if (i == 0) break;
    ++subset[i - 1];
    for (size_t j = i; j < m; ++j) subset[j] = subset[j - 1] + 1;
  }
  return best;
}

SquareMatrix GramOf(const Vectors& x) {
  SquareMatrix g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t j = 0; j < x.size(); ++j) {
      double sum = 0.0;
      for (size_t c = 0; c < x[i].size(); ++c) sum += double{x[i][c]} * x[j][c];
      g.at(i, j) = sum;
    }
  }
  return g;
}

TEST(SpectralRulesTest, SmeaSearchEqualsTheExhaustiveOne) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal;
  std::vector<std::pair<std::string, Vectors>> cases;
  for (const std::string attack : {"far", "aligned", "spread"}) {
    for (size_t k : {3u, 5u, 8u, 12u, 15u}) {
      const size_t f = (k - 1) / 2;  // attackers among the inputs; every f is searched
      cases.push_back({attack + " k " + std::to_string(k) + " attackers " + std::to_string(f),
                       Attacked(k, f, 7, 31 * k + f + attack.size(), attack)});
    }
  }
  // Ties: identical inputs (every subset's eigenvalue is rounding), duplicated pairs,
  // two mirror-image clusters, collinear points, and a large common offset.
  cases.push_back({"identical", Vectors(9, std::vector<float>{3.0f, -1.0f, 2.5f})});
  Vectors pairs, mirror, line, offset;
  for (size_t i = 0; i < 5; ++i) {
    std::vector<float> v = {normal(rng), normal(rng), normal(rng)};
    pairs.push_back(v);
    pairs.push_back(v);
  }
  for (size_t i = 0; i < 10; ++i) {
    const float s = i < 5 ? 1.0f : -1.0f;
    mirror.push_back({s * (1.0f + 0.25f * static_cast<float>(i % 5)), 0.5f, -0.5f});
    line.push_back({static_cast<float>(i), 2.0f * static_cast<float>(i), -static_cast<float>(i)});
    offset.push_back({1e4f + 0.01f * normal(rng), -1e4f + 0.01f * normal(rng), 1e4f});
  }
  cases.push_back({"pairs", pairs});
  cases.push_back({"mirror", mirror});
  cases.push_back({"line", line});
  cases.push_back({"offset", offset});
  size_t compared = 0;
  for (const auto& [what, x] : cases) {
    const SquareMatrix gram = GramOf(x);
    for (size_t f = 0; 2 * f < x.size(); ++f) {
      absl::StatusOr<std::vector<size_t>> got = internal::SmeaSubset(gram, f, 1000000);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      EXPECT_EQ(*got, ExhaustiveSmea(gram, f)) << what << " f " << f;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 3 * (2 + 3 + 4 + 6 + 8) + 5 * 5u);  // every case, every f
}

TEST(SpectralRulesTest, MonnaMatchesTheReference) {
  for (size_t f : {size_t{0}, size_t{1}, size_t{3}}) {
    const size_t n = 2 * f + 3;
    const Vectors x = Attacked(n, f, 9, 300 + f, "far");
    for (size_t idx : {size_t{0}, size_t{1}, n - 1}) {
      const std::string spec = "monna(idx=" + std::to_string(idx) + ")";
      ExpectNear(test::Aggregate(spec, Options(static_cast<int>(n), static_cast<int>(f)), x),
                 ReferenceMonna(x, f, idx), spec + " f " + std::to_string(f));
    }
  }
}

TEST(SpectralRulesTest, TheAttackersGetNoWeight) {
  // Far or aligned attackers: CAF's and SMEA's outputs are the honest inputs' mean.
  for (const std::string attack : {"far", "aligned"}) {
    const size_t n = 12, f = 2;
    const Vectors x = Attacked(n, f, 20, 7 + attack.size(), attack);
    std::vector<size_t> honest(n - f);
    std::iota(honest.begin(), honest.end(), 0);
    const std::vector<double> want = MeanOf(x, honest);
    ExpectNear(test::Aggregate("smea", Options(12, 2), x), want, "smea " + attack);
    const std::vector<float> caf = test::Aggregate("caf", Options(12, 2), x);
    const std::vector<float> mean = test::Aggregate("mean", Options(12, 2), x);
    double caf_err = 0.0, mean_err = 0.0;
    for (size_t c = 0; c < want.size(); ++c) {
      caf_err += (caf[c] - want[c]) * (caf[c] - want[c]);
      mean_err += (mean[c] - want[c]) * (mean[c] - want[c]);
    }
    EXPECT_LT(caf_err, 0.01 * mean_err) << attack;
  }
}

TEST(SpectralRulesTest, IdenticalInputsGiveThemBack) {
  const Vectors x(7, std::vector<float>{1.5f, -2.0f, 0.25f});
  for (const char* spec : {"caf", "smea", "monna"}) {
    EXPECT_THAT(test::Aggregate(spec, Options(7, 3), x), ElementsAre(1.5f, -2.0f, 0.25f)) << spec;
  }
}

TEST(SpectralRulesTest, BoundsAndArguments) {
  for (const char* spec : {"caf", "smea", "monna"}) {
    absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(spec, Options(6, 3));
    ASSERT_FALSE(rule.ok()) << spec;
    EXPECT_THAT(rule.status().message(), HasSubstr("n >= 2f + 1")) << spec;
    EXPECT_TRUE(MakeAggregator(spec, Options(7, 3)).ok()) << spec;
  }
  EXPECT_THAT(MakeAggregator("monna(idx=7)", Options(7, 3)).status().message(),
              HasSubstr("monna: idx = 7 must name one of the n = 7 inputs"));
  EXPECT_THAT(MakeAggregator("smea", Options(40, 10)).status().message(),
              HasSubstr("smea: C(40, 10) = 847660528 subsets exceeds the limit"));
  EXPECT_TRUE(MakeAggregator("smea(max_subsets=1000000000)", Options(40, 10)).ok());
  EXPECT_FALSE(MakeAggregator("caf(f=2)", Options(7, 1)).ok());
  // Fewer inputs than idx + 1 in a round: refused, naming the bound.
  std::unique_ptr<Aggregator> monna = *MakeAggregator("monna(idx=5)", Options(7, 1));
  const Vectors few = test::RandomVectors(4, 3, 1);
  absl::StatusOr<std::vector<float>> out = test::Run(*monna, few);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("needs n >= 2f + 1 and n > idx = 5"));
}

}  // namespace
}  // namespace ps::aggregators
