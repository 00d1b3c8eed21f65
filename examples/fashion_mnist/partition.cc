#include "examples/fashion_mnist/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/spec.h"
#include "core/status.h"

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

namespace {

// The arguments every split needs: workers to feed, a worker among them, 32-bit indices.
absl::Status CheckPartitionArgs(uint64_t num_examples, uint32_t num_workers, uint32_t worker_id) {
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
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> IidPartition(uint64_t num_examples, uint32_t num_workers,
                                                   uint32_t worker_id, uint64_t seed) {
  PS_RETURN_IF_ERROR(CheckPartitionArgs(num_examples, num_workers, worker_id));
  std::vector<uint32_t> all(num_examples);
  std::iota(all.begin(), all.end(), 0u);
  std::mt19937_64 rng(DeriveSeed(seed, 0x70617274));  // "part": shared by all workers
  SeededShuffle(all, rng);
  const uint64_t begin = num_examples * worker_id / num_workers;
  const uint64_t end = num_examples * (uint64_t{worker_id} + 1) / num_workers;
  return std::vector<uint32_t>(all.begin() + static_cast<ptrdiff_t>(begin),
                               all.begin() + static_cast<ptrdiff_t>(end));
}

absl::StatusOr<SplitSpec> ParseSplit(std::string_view text) {
  PS_ASSIGN_OR_RETURN(std::vector<core::StageSpec> stages, core::ParseSpec(text, "split"));
  if (stages.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("split '", core::AsAbsl(text), "': one split, not ",
                                                   stages.size(), " stages"));
  }
  const core::StageSpec& stage = stages[0];
  SplitSpec split;
  if (stage.name == "iid") {
    PS_RETURN_IF_ERROR(core::StageArgs::Bind(stage, {}).status());
    split.spec = "iid";
  } else if (stage.name == "dirichlet") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(stage, {"alpha"}));
    split.kind = SplitSpec::Kind::kDirichlet;
    PS_ASSIGN_OR_RETURN(split.alpha, args.Double("alpha", 1.0, 0.0));
    split.spec = absl::StrCat("dirichlet(alpha=", split.alpha, ")");
  } else if (stage.name == "gamma") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(stage, {"gamma"}));
    split.kind = SplitSpec::Kind::kGamma;
    PS_ASSIGN_OR_RETURN(split.gamma, args.Double("gamma", 0.5, -1.0));
    if (split.gamma > 1.0 || split.gamma < 0.0) {
      return absl::InvalidArgumentError(absl::StrCat("gamma: gamma must lie in [0, 1], got ", split.gamma));
    }
    split.spec = absl::StrCat("gamma(gamma=", split.gamma, ")");
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown split '", stage.name, "'; known: iid, dirichlet, gamma"));
  }
  return split;
}

namespace {

// A uniform draw in (0, 1].
double UniformOpen(std::mt19937_64& rng) { return (static_cast<double>(rng() >> 11) + 1.0) * 0x1p-53; }

double NormalDraw(std::mt19937_64& rng) {
  constexpr double kTwoPi = 6.283185307179586;
  const double r = std::sqrt(-2.0 * std::log(UniformOpen(rng)));
  return r * std::cos(kTwoPi * UniformOpen(rng));
}

// Cuts `items` (in order) into num_workers near-equal consecutive chunks; chunk w goes
// to worker w.
void DealInOrder(std::span<const uint32_t> items, uint32_t num_workers, std::vector<uint32_t>* owner) {
  const uint64_t n = items.size();
  for (uint32_t w = 0; w < num_workers; ++w) {
    for (uint64_t i = n * w / num_workers; i < n * (uint64_t{w} + 1) / num_workers; ++i) {
      (*owner)[items[i]] = w;
    }
  }
}

}  // namespace

double GammaDraw(std::mt19937_64& rng, double shape) {
  if (shape < 1.0) return GammaDraw(rng, shape + 1.0) * std::pow(UniformOpen(rng), 1.0 / shape);
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  while (true) {
    const double x = NormalDraw(rng);
    double v = 1.0 + c * x;
    if (v <= 0) continue;
    v = v * v * v;
    const double u = UniformOpen(rng);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

absl::StatusOr<std::vector<uint32_t>> Partition(const SplitSpec& split,
                                                std::span<const uint8_t> labels,
                                                uint32_t num_classes, uint32_t num_workers,
                                                uint32_t worker_id, uint64_t seed) {
  if (split.kind == SplitSpec::Kind::kIid) {
    return IidPartition(labels.size(), num_workers, worker_id, seed);
  }
  PS_RETURN_IF_ERROR(CheckPartitionArgs(labels.size(), num_workers, worker_id));
  const size_t n = labels.size();
  for (size_t i = 0; i < n; ++i) {
    if (labels[i] >= num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition: label ", int{labels[i]}, " of example ", i, " is not below ", num_classes));
    }
  }
  std::vector<uint32_t> owner(n);
  if (split.kind == SplitSpec::Kind::kDirichlet) {
    std::mt19937_64 rng(DeriveSeed(seed, 0x6469726963686c74));  // "dirichlt"
    std::vector<double> share(num_workers);
    for (uint32_t c = 0; c < num_classes; ++c) {
      std::vector<uint32_t> members;
      for (size_t i = 0; i < n; ++i) {
        if (labels[i] == c) members.push_back(static_cast<uint32_t>(i));
      }
      SeededShuffle(members, rng);
      double total = 0;
      for (double& p : share) total += (p = GammaDraw(rng, split.alpha));
      if (!(total > 0) || !std::isfinite(total)) {  // every draw underflowed (alpha tiny)
        std::fill(share.begin(), share.end(), 0.0);
        share[UniformBelow(rng, num_workers)] = total = 1.0;
      }
      // Worker w gets members [round(m * S_w), round(m * S_{w+1})), S the partial sums.
      const auto m = static_cast<double>(members.size());
      double partial = 0;
      size_t begin = 0;
      for (uint32_t w = 0; w < num_workers; ++w) {
        partial += share[w] / total;
        const size_t end = w + 1 == num_workers ? members.size()
                                                : std::min(members.size(), static_cast<size_t>(std::llround(m * partial)));
        for (size_t i = begin; i < end; ++i) owner[members[i]] = w;
        begin = std::max(begin, end);
      }
    }
  } else {
    std::mt19937_64 rng(DeriveSeed(seed, 0x67616d6d61));  // "gamma"
    std::vector<uint32_t> all(n);
    std::iota(all.begin(), all.end(), 0u);
    SeededShuffle(all, rng);
    const auto iid = static_cast<size_t>(std::floor(split.gamma * static_cast<double>(n)));
    DealInOrder(std::span<const uint32_t>(all).first(iid), num_workers, &owner);
    std::vector<uint32_t> rest(all.begin() + static_cast<ptrdiff_t>(iid), all.end());
    std::sort(rest.begin(), rest.end(), [&](uint32_t a, uint32_t b) {
      return labels[a] != labels[b] ? labels[a] < labels[b] : a < b;
    });
    DealInOrder(rest, num_workers, &owner);
  }
  // No empty part: an empty worker takes the highest-index example of the largest part.
  std::vector<size_t> count(num_workers);
  for (uint32_t o : owner) ++count[o];
  for (uint32_t w = 0; w < num_workers; ++w) {
    if (count[w] > 0) continue;
    const auto donor = static_cast<uint32_t>(std::max_element(count.begin(), count.end()) - count.begin());
    for (size_t i = n; i-- > 0;) {
      if (owner[i] == donor) {
        owner[i] = w;
        break;
      }
    }
    --count[donor];
    ++count[w];
  }
  std::vector<uint32_t> part;
  for (size_t i = 0; i < n; ++i) {
    if (owner[i] == worker_id) part.push_back(static_cast<uint32_t>(i));
  }
  return part;
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
