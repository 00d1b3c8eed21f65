// Splitting a training set among workers and drawing mini-batches, deterministically.
//
// Every worker runs the same code with the same seed, so every worker computes the same
// permutation and takes its own contiguous part of it: the parts are disjoint and cover
// the set (IID split). Batches come from a per-worker seed derived from the shared one.
// The random draws use std::mt19937_64 (specified bit for bit by the standard) and our
// own bounded draw and shuffle, so results do not depend on the standard library.
//
// Free functions are thread-safe; a BatchSampler belongs to one thread.
#pragma once

#include <cstdint>
#include <random>
#include <span>
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
