#include "examples/fashion_mnist/partition.h"

#include <limits>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ps::fashion_mnist {

uint64_t DeriveSeed(uint64_t seed, uint64_t stream) {
  // SplitMix64 (Steele, Lea, Flood 2014) over seed and stream, mixed twice so that
  // nearby (seed, stream) pairs give unrelated outputs.
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(seed) ^ stream);
}

uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  // Largest multiple of bound representable, so every residue is equally likely.
  const uint64_t limit =
      std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
  uint64_t x = rng();
  while (x >= limit) x = rng();
  return x % bound;
}

void SeededShuffle(std::span<uint32_t> values, std::mt19937_64& rng) {
  for (size_t i = values.size(); i > 1; --i) {
    const size_t j = UniformBelow(rng, i);
    std::swap(values[i - 1], values[j]);
  }
}

absl::StatusOr<std::vector<uint32_t>> IidPartition(uint64_t num_examples, uint32_t num_workers,
                                                   uint32_t worker_id, uint64_t seed) {
  if (num_workers == 0) return absl::InvalidArgumentError("partition: zero workers");
  if (worker_id >= num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: worker id ", worker_id, " not below ", num_workers, " workers"));
  }
  if (num_examples < num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition: ", num_examples, " examples cannot feed ", num_workers, " workers"));
  }
  if (num_examples > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: ", num_examples, " examples exceed 32-bit indices"));
  }
  std::vector<uint32_t> all(num_examples);
  std::iota(all.begin(), all.end(), 0u);
  std::mt19937_64 rng(DeriveSeed(seed, 0x70617274));  // "part": shared by all workers
  SeededShuffle(all, rng);
  const uint64_t begin = num_examples * worker_id / num_workers;
  const uint64_t end = num_examples * (uint64_t{worker_id} + 1) / num_workers;
  return std::vector<uint32_t>(all.begin() + static_cast<ptrdiff_t>(begin),
                               all.begin() + static_cast<ptrdiff_t>(end));
}

BatchSampler::BatchSampler(std::vector<uint32_t> indices, uint64_t seed)
    : order_(std::move(indices)), rng_(seed) {
  SeededShuffle(order_, rng_);
}

void BatchSampler::Next(size_t size, std::vector<uint32_t>& out) {
  out.clear();
  out.reserve(size);
  if (order_.empty()) return;
  while (out.size() < size) {
    if (position_ == order_.size()) {
      SeededShuffle(order_, rng_);
      position_ = 0;
      ++epoch_;
    }
    out.push_back(order_[position_++]);
  }
}

}  // namespace ps::fashion_mnist
