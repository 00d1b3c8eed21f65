// The rules that look at the spread of the inputs along their worst direction: CAF and
// SMEA (docs/aggregators.md). Both need the largest eigenvalue of an empirical
// covariance matrix, d x d; its non-zero eigenvalues are those of the k x k matrix of
// the centred rows' inner products, which the Gram matrix gives:
//   <x_i - mu, x_j - mu> = G_ij - (G beta)_i - (G beta)_j + beta' G beta,
// mu = sum_l beta_l x_l. So, like the rules of gram_rules_internal.h, they are functions
// of the Gram matrix (O(k^3) or so, no coordinates) and exact in model scope on a
// sharded model. Eigenvalues are computed exactly (to rounding), not by ByzFL's single
// power-method step from a random vector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "aggregators/gram_internal.h"

namespace ps::aggregators::internal {

// The largest eigenvalue of a symmetric matrix and a unit eigenvector of it (cyclic
// Jacobi rotations until the off-diagonal part is negligible against the diagonal).
// With want_vector false the vector is left empty. k = 0: value 0.
struct TopEigen {
  double value = 0.0;
  std::vector<double> vector;
};
TopEigen LargestEigen(SquareMatrix a, bool want_vector);

// The largest eigenvalue alone: Householder reduction to a tridiagonal matrix, then
// bisection on Sturm counts to the last bits (about 4 m^3 / 3 flops; several times
// faster than Jacobi). k = 0: 0.
double LargestEigenvalue(SquareMatrix a);

// CAF, the covariance-bound agnostic filter (Allouah, Guerraoui and Stephan, ICML 2025;
// as ByzFL documents it): weights c_i = 1; while sum c > k - 2f: mu = sum c_i x_i / sum c,
// (lambda, v) the top eigenpair of Sigma = sum c_i (x_i - mu)(x_i - mu)' / sum c,
// tau_i = <x_i - mu, v>^2, c_i <- c_i (1 - tau_i / max tau) with the maximum over the
// rows still weighted (so each step drops at least one row and the loop ends within k
// steps). Returns the weights (summing to 1) of the mu whose lambda was smallest (the
// first on ties); with f = 0 the plain mean. Stops early when lambda or max tau is 0
// (the weighted rows coincide). Requires 2f < k.
std::vector<double> CafWeights(const SquareMatrix& gram, size_t f);

// C_ij = <x_i - mu, x_j - mu> for i, j over `rows` (indices into gram), mu = sum_l
// beta_l x_l with beta over the same rows (|rows| x |rows|).
SquareMatrix CentredProducts(const SquareMatrix& gram, const std::vector<size_t>& rows,
                             const std::vector<double>& beta);

// SMEA, smallest maximum eigenvalue averaging (Allouah et al., ICML 2023): the
// (k - f)-subset whose empirical covariance has the smallest largest eigenvalue (the
// lexicographically first on ties), over every subset: the eigenvalue is solved for
// each subset in lexicographic order whose spread along two directions (the top
// eigenvectors of all inputs and of the best subset so far) does not already exceed the
// best one, so the result is exactly what solving every subset gives, at a fraction of
// the cost when outliers are among the inputs. Refuses with
// INVALID_ARGUMENT when f >= k, and (naming C(k, f) and the limit) when
// SubsetCount(k, f) > max_subsets. Returns the subset's indices in increasing order.
absl::StatusOr<std::vector<size_t>> SmeaSubset(const SquareMatrix& gram, size_t f,
                                               uint64_t max_subsets);

}  // namespace ps::aggregators::internal
