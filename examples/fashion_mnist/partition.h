// Splitting a training set among workers and drawing mini-batches, deterministically.
//
// Every worker runs the same code with the same seed, so every worker computes the same
// split and takes its own part: the parts are disjoint and cover the set. Three splits
// (docs/evaluation.md): IID (a seeded permutation cut in equal parts), Dirichlet(alpha)
// (each class divided among the workers in proportions drawn from Dir(alpha)) and
// gamma-similarity (a gamma fraction IID, the rest sorted by label and cut in order).
// Batches come from a per-worker seed derived from the shared one.
// The random draws use std::mt19937_64 (specified bit for bit by the standard) and our
// own bounded draw and shuffle, so results do not depend on the standard library.
//
// Free functions are thread-safe; a BatchSampler belongs to one thread.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ps::fashion_mnist {

// An independent seed for stream `stream` of `seed` (SplitMix64 of both).
uint64_t DeriveSeed(uint64_t seed, uint64_t stream);

// Uniform integer in [0, bound) by rejection (no modulo bias); bound > 0.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound);

// Fisher-Yates shuffle driven by `rng`.
void SeededShuffle(std::span<uint32_t> values, std::mt19937_64& rng);

// Indices of the examples worker `worker_id` of `num_workers` trains on: part
// `worker_id` of a permutation of [0, num_examples) seeded by `seed`. Part sizes differ
// by at most one. Needs 0 < num_workers <= num_examples < 2^32 and worker_id < num_workers.
absl::StatusOr<std::vector<uint32_t>> IidPartition(uint64_t num_examples, uint32_t num_workers,
                                                   uint32_t worker_id, uint64_t seed);

// A split of the training set, from a spec string: "iid", "dirichlet(alpha=0.5)",
// "gamma(0.3)" (the grammar of core/spec.h).
struct SplitSpec {
  enum class Kind { kIid, kDirichlet, kGamma };
  Kind kind = Kind::kIid;
  double alpha = 1.0;  // Dirichlet concentration, > 0: small is skewed, large is IID-like
  double gamma = 1.0;  // gamma-similarity: the IID fraction, in [0, 1]
  std::string spec;    // canonical: "dirichlet(alpha=0.5)"
};
absl::StatusOr<SplitSpec> ParseSplit(std::string_view spec);

// Indices (ascending) of the examples worker `worker_id` of `num_workers` trains on,
// for `labels` (one per example, each below num_classes). The same arguments give the
// same parts on every worker; the parts are disjoint and cover every example, and none
// is empty (Dirichlet draws can leave a worker without examples: such a worker takes
// one from the largest part, deterministically). Needs 0 < num_workers <= examples.
absl::StatusOr<std::vector<uint32_t>> Partition(const SplitSpec& split,
                                                std::span<const uint8_t> labels,
                                                uint32_t num_classes, uint32_t num_workers,
                                                uint32_t worker_id, uint64_t seed);

// A Gamma(shape, 1) draw (Marsaglia and Tsang, with Box-Muller normals), from rng only,
// so the same on every platform. shape > 0.
double GammaDraw(std::mt19937_64& rng, double shape);

// Draws batches from a fixed set of indices: a fresh seeded permutation per epoch,
// taken in order; a batch that reaches the end of an epoch continues in the next.
class BatchSampler {
 public:
  // `indices` must not be empty.
  BatchSampler(std::vector<uint32_t> indices, uint64_t seed);

  // Replaces `out` with the next `size` indices.
  void Next(size_t size, std::vector<uint32_t>& out);

  // Completed passes over the indices.
  uint64_t epoch() const { return epoch_; }

 private:
  std::vector<uint32_t> order_;
  std::mt19937_64 rng_;
  size_t position_ = 0;
  uint64_t epoch_ = 0;
};

}  // namespace ps::fashion_mnist
