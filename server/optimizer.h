// The update a shard applies to the slices it owns. By default its flags' SGD with
// momentum and weight decay, in PyTorch's convention:
//   v <- momentum * v + (g + weight_decay * w);  w <- w - lr_t * v,
// where lr_t = lr x the schedule's factor at round t (the version the step starts from).
// A tensor whose layout entry names an optimizer (Optimizer below: SGD with dampening
// and Nesterov, Adam, AdamW) is updated by that instead. Stateless apart from the
// buffers the caller owns per slice.
#pragma once

#include <cstdint>
#include <optional>
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

// The update a tensor's layout entry asks for (core::TensorSpec::optimizer), PyTorch's
// optimizers as torch.optim computes them (docs/optimizers.md), a spec string:
//   sgd(lr=L, momentum=M, dampening=D, nesterov=0|1, weight_decay=W)
//   adam(lr=L, beta1=B1, beta2=B2, eps=E, weight_decay=W)      L2 decay in the gradient
//   adamw(lr=L, beta1=B1, beta2=B2, eps=E, weight_decay=W)     decoupled decay
// Keys in any order; omitted ones take torch.optim's defaults (sgd: momentum 0,
// dampening 0, nesterov 0, weight decay 0; adam: 0.9, 0.999, 1e-08, 0; adamw: the same
// with weight decay 0.01); lr is required. The step's learning rate is the one the
// round's pushes carried (their median), else lr (times --lr-schedule's factor).
class Optimizer {
 public:
  enum class Kind { kSgd, kAdam, kAdamW };
  // INVALID_ARGUMENT naming the spec (escaped) and what is wrong with it, and listing
  // the optimizers above. Nesterov needs momentum > 0 and dampening 0, as in PyTorch.
  static absl::StatusOr<Optimizer> Parse(std::string_view spec);

  Kind kind() const { return kind_; }
  double lr() const { return lr_; }
  // A first buffer per value (SGD's momentum buffer, Adam's exp_avg): SGD without
  // momentum keeps none, as torch.optim's does not.
  bool has_first_moment() const { return kind_ != Kind::kSgd || momentum_ != 0; }
  // A second buffer per value (Adam's exp_avg_sq) besides the first.
  bool has_second_moment() const { return kind_ != Kind::kSgd; }
  // Every argument spelled out.
  const std::string& spec() const { return spec_; }

  // Step number `step` (1 for the first) with learning rate `lr`: `first` is SGD's
  // momentum buffer or Adam's exp_avg, `second` Adam's exp_avg_sq (empty for SGD), each
  // params.size() values (zero before the first step); `copy_to` as in SgdStep.
  void Step(float lr, uint64_t step, std::span<const float> grad, std::span<float> first,
            std::span<float> second, std::span<float> params, std::span<float> copy_to = {}) const;

 private:
  Kind kind_ = Kind::kSgd;
  double lr_ = 0, momentum_ = 0, dampening_ = 0, weight_decay_ = 0;
  bool nesterov_ = false;
  double beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8;
  std::string spec_;
};

// Applies the step of round `round` to params in place; velocity has params.size()
// elements (zero at first), or none when opt.momentum is 0 (the step is then
// w <- w - lr_t (g + weight_decay w), torch.optim.SGD's without momentum, with the bits
// a zero velocity would give but for the sign of a zero). grad has the same size. With
// `copy_to` (params.size() elements, apart from the others) the new parameters are also written there, each block
// while it is in cache: one pass where a step and a copy after it would make two.
// `lr`: the round's learning rate when its pushes carried one (else opt's, scheduled).
void SgdStep(const SgdOptions& opt, uint64_t round, std::span<const float> grad,
             std::span<float> velocity, std::span<float> params,
             std::span<float> copy_to = {}, std::optional<float> lr = std::nullopt);

}  // namespace ps::server
