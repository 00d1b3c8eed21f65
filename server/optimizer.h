// SGD with momentum and weight decay, applied by a shard to the slices it owns, in
// PyTorch's convention:  v <- momentum * v + (g + weight_decay * w);  w <- w - lr_t * v,
// where lr_t = lr x the schedule's factor at round t (the version the step starts from).
// Stateless apart from the velocity buffer the caller owns per slice.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ps::server {

// A step-size schedule (--lr-schedule, docs/configuration.md), a spec string:
//   constant                       factor 1
//   step(every=N, gamma=G)         G^floor(t / N)             (G in (0, 1], N >= 1)
//   inv_sqrt(t0=T)                 sqrt(T / (T + t))          (T >= 1)
//   cosine(steps=N, min=M)         M + (1 - M) (1 + cos(pi min(t, N) / N)) / 2
// t is the round. A function of the round only, so a shard restored from a checkpoint
// (or any shard of the cluster) applies the same step.
class LrSchedule {
 public:
  LrSchedule() = default;  // constant
  // INVALID_ARGUMENT naming the spec and what is wrong with it.
  static absl::StatusOr<LrSchedule> Parse(std::string_view spec);
  double Factor(uint64_t round) const;
  // The spec with every argument spelled out: "step(every=100, gamma=0.5)".
  const std::string& spec() const { return spec_; }

 private:
  enum class Kind { kConstant, kStep, kInvSqrt, kCosine };
  Kind kind_ = Kind::kConstant;
  double a_ = 0, b_ = 0;  // step: every, gamma; inv_sqrt: t0; cosine: steps, min
  std::string spec_ = "constant";
};

struct SgdOptions {
  float learning_rate = 0.1f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  LrSchedule schedule;
};

// Applies the step of round `round` to params in place; velocity has params.size()
// elements (zero at first). grad has the same size. With `copy_to` (params.size()
// elements, apart from the others) the new parameters are also written there, each block
// while it is in cache: one pass where a step and a copy after it would make two.
void SgdStep(const SgdOptions& opt, uint64_t round, std::span<const float> grad,
             std::span<float> velocity, std::span<float> params,
             std::span<float> copy_to = {});

}  // namespace ps::server
