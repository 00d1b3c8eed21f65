// CAF and SMEA on a Gram matrix (spectral_internal.h). Only k x k arithmetic here.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "aggregators/gram_rules_internal.h"
#include "aggregators/spectral_internal.h"
#include "core/status.h"

namespace ps::aggregators::internal {
SquareMatrix CentredProducts(const SquareMatrix& gram, const std::vector<size_t>& rows,
                             const std::vector<double>& beta) {
  const size_t k = rows.size();
  std::vector<double> g_beta(k, 0.0);
  for (size_t i = 0; i < k; ++i) {
    double sum = 0.0;
    for (size_t j = 0; j < k; ++j) sum += gram.at(rows[i], rows[j]) * beta[j];
    g_beta[i] = sum;
  }
  double bgb = 0.0;
  for (size_t i = 0; i < k; ++i) bgb += beta[i] * g_beta[i];
  SquareMatrix c(k);
  for (size_t i = 0; i < k; ++i) {
    for (size_t j = 0; j < k; ++j) {
      c.at(i, j) = gram.at(rows[i], rows[j]) - g_beta[i] - g_beta[j] + bgb;
    }
  }
  return c;
}


namespace {

// The projections <x_i, v> of every input i on the unit vector v = D' u / |D' u|, D's
// rows x_r - mu for the `rows` that `centred` (CentredProducts(gram, rows, beta)) is of:
// <x_i, x_r - mu> = G_ir - (G beta)_i, and |D' u|^2 = u' C u. Empty when |D' u|^2 is at
// most `floor` (the direction is rounding).
std::vector<double> Projections(const SquareMatrix& gram, const std::vector<size_t>& rows,
                                const std::vector<double>& beta, const SquareMatrix& centred,
                                const std::vector<double>& u, double floor) {
  const size_t k = gram.k, m = rows.size();
  double norm2 = 0.0;
  for (size_t r = 0; r < m; ++r) {
    double cu = 0.0;
    for (size_t l = 0; l < m; ++l) cu += centred.at(r, l) * u[l];
    norm2 += u[r] * cu;
  }
  if (!(norm2 > floor)) return {};
  const double scale = 1.0 / std::sqrt(norm2);
  std::vector<double> p(k);
  for (size_t i = 0; i < k; ++i) {
    double g_beta = 0.0;
    for (size_t l = 0; l < m; ++l) g_beta += gram.at(i, rows[l]) * beta[l];
    double sum = 0.0;
    for (size_t r = 0; r < m; ++r) sum += u[r] * (gram.at(i, rows[r]) - g_beta);
    p[i] = sum * scale;
  }
  return p;
}

// The largest eigenvalue's eigenvector of `rows`' scatter, as Projections.
std::vector<double> TopDirection(const SquareMatrix& gram, const std::vector<size_t>& rows,
                                 double floor) {
  const std::vector<double> beta(rows.size(), 1.0 / static_cast<double>(rows.size()));
  const SquareMatrix centred = CentredProducts(gram, rows, beta);
  const TopEigen top = LargestEigen(centred, /*want_vector=*/true);
  return Projections(gram, rows, beta, centred, top.vector, floor);
}

}  // namespace

TopEigen LargestEigen(SquareMatrix a, bool want_vector) {
  const size_t k = a.k;
  TopEigen out;
  if (k == 0) return out;
  std::vector<double> v;
  if (want_vector) {
    v.assign(k * k, 0.0);
    for (size_t i = 0; i < k; ++i) v[i * k + i] = 1.0;
  }
  // Cyclic Jacobi (Golub and Van Loan, section 8.5): rotate away every off-diagonal
  // entry in turn; the off-diagonal mass falls quadratically once small. A sweep count
  // cap guards against rounding that never settles.
  for (int sweep = 0; sweep < 64; ++sweep) {
    double off = 0.0, diag = 0.0;
    for (size_t i = 0; i < k; ++i) {
      diag += a.at(i, i) * a.at(i, i);
      for (size_t j = i + 1; j < k; ++j) off += a.at(i, j) * a.at(i, j);
    }
    if (off == 0.0 || off <= 1e-32 * diag) break;
    for (size_t p = 0; p + 1 < k; ++p) {
      for (size_t q = p + 1; q < k; ++q) {
        const double apq = a.at(p, q);
        if (apq == 0.0) continue;
        const double theta = (a.at(q, q) - a.at(p, p)) / (2.0 * apq);
        const double t =
            std::abs(theta) > 1e150
                ? 0.5 / theta
                : std::copysign(1.0, theta) / (std::abs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0);
        const double s = t * c;
        for (size_t r = 0; r < k; ++r) {
          if (r == p || r == q) continue;
          const double arp = a.at(r, p), arq = a.at(r, q);
          a.at(r, p) = a.at(p, r) = c * arp - s * arq;
          a.at(r, q) = a.at(q, r) = s * arp + c * arq;
        }
        a.at(p, p) -= t * apq;
        a.at(q, q) += t * apq;
        a.at(p, q) = a.at(q, p) = 0.0;
        if (want_vector) {
          for (size_t r = 0; r < k; ++r) {
            const double vrp = v[r * k + p], vrq = v[r * k + q];
            v[r * k + p] = c * vrp - s * vrq;
            v[r * k + q] = s * vrp + c * vrq;
          }
        }
      }
    }
  }
  size_t best = 0;
  for (size_t i = 1; i < k; ++i) {
    if (a.at(i, i) > a.at(best, best)) best = i;
  }
  out.value = a.at(best, best);
  if (want_vector) {
    out.vector.resize(k);
    for (size_t r = 0; r < k; ++r) out.vector[r] = v[r * k + best];
  }
  return out;
}

double LargestEigenvalue(SquareMatrix a) {
  const size_t m = a.k;
  if (m == 0) return 0.0;
  // Householder reduction to tridiagonal form (Golub and Van Loan, section 8.3.1):
  // column j below the subdiagonal is reflected away by H = I - 2 v v' on the trailing
  // block B, B <- B - v q' - q v' with p = B v, q = 2 (p - (v' p) v).
  std::vector<double> v(m), p(m);
  for (size_t j = 0; j + 2 < m; ++j) {
    double norm = 0.0;
    for (size_t i = j + 1; i < m; ++i) norm += a.at(i, j) * a.at(i, j);
    norm = std::sqrt(norm);
    if (norm == 0.0) continue;
    const double alpha = a.at(j + 1, j) > 0 ? -norm : norm;
    double vnorm = 0.0;
    for (size_t i = j + 1; i < m; ++i) {
      v[i] = a.at(i, j) - (i == j + 1 ? alpha : 0.0);
      vnorm += v[i] * v[i];
    }
    vnorm = std::sqrt(vnorm);
    if (vnorm == 0.0) continue;
    for (size_t i = j + 1; i < m; ++i) v[i] /= vnorm;
    double vp = 0.0;
    for (size_t i = j + 1; i < m; ++i) {
      double sum = 0.0;
      for (size_t l = j + 1; l < m; ++l) sum += a.at(i, l) * v[l];
      p[i] = sum;
      vp += v[i] * sum;
    }
    for (size_t i = j + 1; i < m; ++i) p[i] = 2.0 * (p[i] - vp * v[i]);
    for (size_t i = j + 1; i < m; ++i) {
      for (size_t l = j + 1; l < m; ++l) a.at(i, l) -= v[i] * p[l] + p[i] * v[l];
    }
    a.at(j + 1, j) = a.at(j, j + 1) = alpha;
    for (size_t i = j + 2; i < m; ++i) a.at(i, j) = a.at(j, i) = 0.0;
  }
  // The tridiagonal matrix's largest eigenvalue by bisection on Sturm counts (the
  // number of eigenvalues below x), between Gershgorin bounds.
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  for (size_t i = 0; i < m; ++i) {
    const double r =
        (i > 0 ? std::abs(a.at(i, i - 1)) : 0.0) + (i + 1 < m ? std::abs(a.at(i + 1, i)) : 0.0);
    lo = std::min(lo, a.at(i, i) - r);
    hi = std::max(hi, a.at(i, i) + r);
  }
  const auto below = [&](double x) {
    size_t count = 0;
    double q = 1.0;
    for (size_t i = 0; i < m; ++i) {
      const double e = i > 0 ? a.at(i, i - 1) : 0.0;
      q = a.at(i, i) - x - (i > 0 ? e * e / q : 0.0);
      if (q == 0.0) q = -std::numeric_limits<double>::min();
      if (q < 0.0) ++count;
    }
    return count;
  };
  const double scale = std::max(std::abs(lo), std::abs(hi));
  for (int it = 0; it < 200 && hi - lo > 4 * std::numeric_limits<double>::epsilon() * scale; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (mid <= lo || mid >= hi) break;
    (below(mid) == m ? hi : lo) = mid;
  }
  return 0.5 * (lo + hi);
}

std::vector<double> CafWeights(const SquareMatrix& gram, size_t f) {
  const size_t k = gram.k;
  if (k == 0) return {};
  std::vector<size_t> all(k);
  for (size_t i = 0; i < k; ++i) all[i] = i;
  std::vector<double> c(k, 1.0);
  std::vector<double> beta(k, 1.0 / static_cast<double>(k));
  std::vector<double> best = beta;  // f = 0: the loop below does not run
  double best_lambda = std::numeric_limits<double>::infinity();
  const double floor = static_cast<double>(k) - 2.0 * static_cast<double>(f);
  for (double total = static_cast<double>(k); total > floor;) {
    for (size_t i = 0; i < k; ++i) beta[i] = c[i] / total;
    const SquareMatrix centred = CentredProducts(gram, all, beta);
    // Sigma's top eigenpair from the k x k matrix A = S C S, S = diag(sqrt(c_i / total)):
    // Sigma = D' D and A = D D' with D's rows sqrt(c_i / total) (x_i - mu).
    std::vector<double> root(k);
    for (size_t i = 0; i < k; ++i) root[i] = std::sqrt(c[i] / total);
    SquareMatrix a(k);
    for (size_t i = 0; i < k; ++i) {
      for (size_t j = 0; j < k; ++j) a.at(i, j) = root[i] * centred.at(i, j) * root[j];
    }
    const TopEigen top = LargestEigen(std::move(a), /*want_vector=*/true);
    const double lambda = std::max(0.0, top.value);
    if (lambda < best_lambda) {
      best_lambda = lambda;
      best = beta;
    }
    if (lambda == 0.0) break;
    // v = D' u / sqrt(lambda), so <x_i - mu, v> = sum_j C_ij root_j u_j / sqrt(lambda).
    std::vector<double> tau(k);
    double tau_max = 0.0;
    for (size_t i = 0; i < k; ++i) {
      double p = 0.0;
      for (size_t j = 0; j < k; ++j) p += centred.at(i, j) * root[j] * top.vector[j];
      tau[i] = p * p / lambda;
      if (c[i] > 0.0) tau_max = std::max(tau_max, tau[i]);
    }
    if (!(tau_max > 0.0)) break;
    total = 0.0;
    for (size_t i = 0; i < k; ++i) {
      if (c[i] > 0.0) c[i] *= std::max(0.0, 1.0 - tau[i] / tau_max);
      total += c[i];
    }
  }
  return best;
}

absl::StatusOr<std::vector<size_t>> SmeaSubset(const SquareMatrix& gram, size_t f,
                                               uint64_t max_subsets) {
  const size_t k = gram.k;
  PS_RETURN_IF_ERROR(CheckSubsetSearch("smea", k, f, max_subsets, "max_subsets"));
  const size_t m = k - f;
  const std::vector<double> beta(m, 1.0 / static_cast<double>(m));
  // A subset's largest eigenvalue is at least the spread of its inputs along any unit
  // vector v: sum_S (p_i - mean_S p)^2, p_i = <x_i, v>, O(m) from the projections. A
  // subset whose spread along the full set's top direction, or along the best subset's,
  // exceeds the best eigenvalue found by more than rounding (`margin`: relative to the
  // Gram entries and the trace) cannot be the minimum and is not solved: the result is
  // the exhaustive search's, bit for bit, while outliers (which make these directions)
  // leave few subsets to solve.
  std::vector<size_t> all(k);
  std::iota(all.begin(), all.end(), 0);
  double margin = 0.0, trace = 0.0;
  {
    const std::vector<double> uniform(k, 1.0 / static_cast<double>(k));
    const SquareMatrix centred = CentredProducts(gram, all, uniform);
    for (size_t i = 0; i < k; ++i) {
      margin = std::max(margin, std::abs(gram.at(i, i)));
      trace += std::max(0.0, centred.at(i, i));
    }
    margin = 1e-9 * std::max(margin, trace);
  }
  std::vector<std::vector<double>> directions(2);
  directions[0] = TopDirection(gram, all, margin);
  const auto spread_exceeds = [&](const std::vector<size_t>& subset, double bound) {
    for (const std::vector<double>& p : directions) {
      if (p.empty()) continue;
      double sum = 0.0, squares = 0.0;
      for (size_t i : subset) sum += p[i], squares += p[i] * p[i];
      if (squares - sum * sum / static_cast<double>(m) > bound) return true;
    }
    return false;
  };
  std::vector<size_t> subset(m);
  std::iota(subset.begin(), subset.end(), 0);
  std::vector<size_t> best = subset;
  double best_lambda = std::numeric_limits<double>::infinity();
  while (true) {
    if (!(best_lambda < std::numeric_limits<double>::infinity()) ||
        !spread_exceeds(subset, best_lambda + margin)) {
      // The same |S| for every subset: the unnormalized scatter's eigenvalue orders them.
      const double lambda = LargestEigenvalue(CentredProducts(gram, subset, beta));
      if (lambda < best_lambda) {
        best_lambda = lambda;
        best = subset;
        directions[1] = TopDirection(gram, best, margin);
      }
    }
    // The next subset in lexicographic order.
    size_t i = m;
    while (i > 0 && subset[i - 1] == k - m + (i - 1)) --i;
    if (i == 0) break;
    ++subset[i - 1];
    for (size_t j = i; j < m; ++j) subset[j] = subset[j - 1] + 1;
  }
  return best;
}

}  // namespace ps::aggregators::internal
