#include "server/optimizer.h"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <numbers>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/simd.h"
#include "core/spec.h"
#include "core/status.h"

namespace ps::server {

absl::StatusOr<LrSchedule> LrSchedule::Parse(std::string_view spec) {
  PS_ASSIGN_OR_RETURN(std::vector<core::StageSpec> stages, core::ParseSpec(spec, "lr schedule"));
  const auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr schedule '", core::AsAbsl(spec), "': ", why,
                     " (constant, step(every=N, gamma=G), inv_sqrt(t0=T) or "
                     "cosine(steps=N, min=M))"));
  };
  if (stages.size() != 1) return invalid("one schedule expected");
  const core::StageSpec& s = stages[0];
  LrSchedule out;
  if (s.name == "constant") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(s, {}));
    out.spec_ = args.Canonical();
    return out;
  }
  if (s.name == "step") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(s, {"every", "gamma"}));
    if (!args.Has("every")) return invalid("step needs every=N");
    PS_ASSIGN_OR_RETURN(int64_t every, args.Int("every", 1, 1, int64_t{1} << 40));
    PS_ASSIGN_OR_RETURN(double gamma, args.Double("gamma", 0.1, 0.0));
    if (gamma > 1.0) return invalid("gamma must be in (0, 1]");
    out.kind_ = Kind::kStep;
    out.a_ = static_cast<double>(every);
    out.b_ = gamma;
    out.spec_ = absl::StrCat("step(every=", every, ", gamma=", core::FormatNumber(gamma), ")");
    return out;
  }
  if (s.name == "inv_sqrt") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(s, {"t0"}));
    PS_ASSIGN_OR_RETURN(int64_t t0, args.Int("t0", 100, 1, int64_t{1} << 40));
    out.kind_ = Kind::kInvSqrt;
    out.a_ = static_cast<double>(t0);
    out.spec_ = absl::StrCat("inv_sqrt(t0=", t0, ")");
    return out;
  }
  if (s.name == "cosine") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(s, {"steps", "min"}));
    if (!args.Has("steps")) return invalid("cosine needs steps=N");
    PS_ASSIGN_OR_RETURN(int64_t steps, args.Int("steps", 1, 1, int64_t{1} << 40));
    PS_ASSIGN_OR_RETURN(double min, args.Double("min", 0.0, -1.0));
    if (min < 0.0 || min > 1.0) return invalid("min must be in [0, 1]");
    out.kind_ = Kind::kCosine;
    out.a_ = static_cast<double>(steps);
    out.b_ = min;
    out.spec_ = absl::StrCat("cosine(steps=", steps, ", min=", core::FormatNumber(min), ")");
    return out;
  }
  return invalid(absl::StrCat("unknown schedule '", s.name, "'"));
}

double LrSchedule::Factor(uint64_t round) const {
  const double t = static_cast<double>(round);
  switch (kind_) {
    case Kind::kConstant:
      return 1.0;
    case Kind::kStep:
      return std::pow(b_, std::floor(t / a_));
    case Kind::kInvSqrt:
      return std::sqrt(a_ / (a_ + t));
    case Kind::kCosine:
      return b_ + (1.0 - b_) * 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(t, a_) / a_));
  }
  return 1.0;
}

absl::StatusOr<Optimizer> Optimizer::Parse(std::string_view spec) {
  const auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer '", core::AsAbsl(spec), "': ", why,
        " (the shards mirror sgd(lr, momentum, dampening, nesterov, weight_decay), "
        "adam(lr, beta1, beta2, eps, weight_decay) and adamw(...the same))"));
  };
  absl::StatusOr<std::vector<core::StageSpec>> stages = core::ParseSpec(spec, "optimizer");
  if (!stages.ok()) return invalid(stages.status().message());
  if (stages->size() != 1) return invalid("one optimizer expected");
  const core::StageSpec& s = (*stages)[0];
  Optimizer out;
  const auto bind = [&](std::vector<std::string> keys) -> absl::StatusOr<core::StageArgs> {
    absl::StatusOr<core::StageArgs> args = core::StageArgs::Bind(s, std::move(keys));
    if (!args.ok()) return invalid(args.status().message());
    if (!args->Has("lr")) return invalid("lr is required");
    return args;
  };
  // A value >= 0 (StageArgs::Double takes > a bound).
  const auto at_least_zero = [&](const core::StageArgs& args, std::string_view key,
                                 double fallback) -> absl::StatusOr<double> {
    absl::StatusOr<double> v = args.Double(key, fallback, -HUGE_VAL);
    if (!v.ok()) return invalid(v.status().message());
    if (*v < 0) return invalid(absl::StrCat(core::AsAbsl(key), " must be >= 0"));
    return *v;
  };
  if (s.name == "sgd") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args,
                        bind({"lr", "momentum", "dampening", "nesterov", "weight_decay"}));
    PS_ASSIGN_OR_RETURN(out.lr_, at_least_zero(args, "lr", 0));
    PS_ASSIGN_OR_RETURN(out.momentum_, at_least_zero(args, "momentum", 0));
    PS_ASSIGN_OR_RETURN(out.dampening_, at_least_zero(args, "dampening", 0));
    PS_ASSIGN_OR_RETURN(out.weight_decay_, at_least_zero(args, "weight_decay", 0));
    absl::StatusOr<int64_t> nesterov = args.Int("nesterov", 0, 0, 1);
    if (!nesterov.ok()) return invalid(nesterov.status().message());
    out.nesterov_ = *nesterov == 1;
    if (out.nesterov_ && (out.momentum_ <= 0 || out.dampening_ != 0)) {
      return invalid("Nesterov momentum requires a momentum and zero dampening");
    }
    out.kind_ = Kind::kSgd;
    out.spec_ = absl::StrCat("sgd(lr=", core::FormatNumber(out.lr_), ", momentum=", core::FormatNumber(out.momentum_),
                             ", dampening=", core::FormatNumber(out.dampening_), ", nesterov=", *nesterov,
                             ", weight_decay=", core::FormatNumber(out.weight_decay_), ")");
    return out;
  }
  if (s.name == "adam" || s.name == "adamw") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args,
                        bind({"lr", "beta1", "beta2", "eps", "weight_decay"}));
    const bool w = s.name == "adamw";
    PS_ASSIGN_OR_RETURN(out.lr_, at_least_zero(args, "lr", 0));
    PS_ASSIGN_OR_RETURN(out.beta1_, at_least_zero(args, "beta1", 0.9));
    PS_ASSIGN_OR_RETURN(out.beta2_, at_least_zero(args, "beta2", 0.999));
    PS_ASSIGN_OR_RETURN(out.eps_, at_least_zero(args, "eps", 1e-8));
    PS_ASSIGN_OR_RETURN(out.weight_decay_, at_least_zero(args, "weight_decay", w ? 0.01 : 0));
    if (out.beta1_ >= 1 || out.beta2_ >= 1) return invalid("betas must be in [0, 1)");
    out.kind_ = w ? Kind::kAdamW : Kind::kAdam;
    out.spec_ = absl::StrCat(s.name, "(lr=", core::FormatNumber(out.lr_), ", beta1=", core::FormatNumber(out.beta1_),
                             ", beta2=", core::FormatNumber(out.beta2_), ", eps=", core::FormatNumber(out.eps_),
                             ", weight_decay=", core::FormatNumber(out.weight_decay_), ")");
    return out;
  }
  return invalid(absl::StrCat("unknown optimizer '", s.name, "'"));
}

namespace {

constexpr size_t kSgdBlock = 1024;

// One step of `count` values; the three arrays never overlap (the aggregate, the
// velocity and the parameters are separate buffers).
inline void SgdValues(float lr, float mu, float wd, const float* __restrict g,
                      float* __restrict v, float* __restrict w, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const float d = g[i] + wd * w[i];
    v[i] = mu * v[i] + d;
    w[i] -= lr * v[i];
  }
}

// A fixed count, which GCC vectorizes at -O2 (no epilogue, no alias check), in an AVX2
// clone too; the same operations in the same order as the scalar tail, and no fused
// multiply-add (the clone does not enable FMA), so every clone gives the same bits.
PS_VECTOR_CLONES void SgdBlock(float lr, float mu, float wd, const float* __restrict g,
                               float* __restrict v, float* __restrict w) {
  SgdValues(lr, mu, wd, g, v, w, kSgdBlock);
}

// SgdBlock that also stores each new parameter in c, in the same pass: a separate
// memcpy of the block, a constant 4 KiB, was expanded by GCC into `rep movsq`, slow on
// the 2-core AMD EPYC (docs/bench.md, "Small copies GCC made rep movsq").
PS_VECTOR_CLONES void SgdBlockCopy(float lr, float mu, float wd, const float* __restrict g,
                                   float* __restrict v, float* __restrict w,
                                   float* __restrict c) {
  for (size_t i = 0; i < kSgdBlock; ++i) {
    const float d = g[i] + wd * w[i];
    v[i] = mu * v[i] + d;
    w[i] -= lr * v[i];
    c[i] = w[i];
  }
}

// Without momentum (no velocity): w <- w - lr (g + wd w). SgdValues, SgdBlock and
// SgdBlockCopy's counterparts: two streams read and two written where the step with a
// velocity reads three and writes three.
inline void SgdPlainValues(float lr, float wd, const float* __restrict g, float* __restrict w,
                           size_t count) {
  for (size_t i = 0; i < count; ++i) w[i] -= lr * (g[i] + wd * w[i]);
}

PS_VECTOR_CLONES void SgdPlainBlock(float lr, float wd, const float* __restrict g,
                                    float* __restrict w) {
  SgdPlainValues(lr, wd, g, w, kSgdBlock);
}

PS_VECTOR_CLONES void SgdPlainBlockCopy(float lr, float wd, const float* __restrict g,
                                        float* __restrict w, float* __restrict c) {
  for (size_t i = 0; i < kSgdBlock; ++i) {
    w[i] -= lr * (g[i] + wd * w[i]);
    c[i] = w[i];
  }
}

// v <- mu v + (g + wd w); w <- w - lr v (and c <- w), vectorized by blocks; without a
// velocity (mu 0), w <- w - lr (g + wd w).
void SgdKernel(float lr, float mu, float wd, std::span<const float> grad,
               std::span<float> velocity, std::span<float> params, std::span<float> copy_to) {
  const float* g = grad.data();
  float* v = velocity.data();
  float* w = params.data();
  float* c = copy_to.empty() ? nullptr : copy_to.data();
  const size_t n = params.size();
  size_t b = 0;
  if (velocity.empty()) {
    for (; b + kSgdBlock <= n; b += kSgdBlock) {
      if (c != nullptr) {
        SgdPlainBlockCopy(lr, wd, g + b, w + b, c + b);
      } else {
        SgdPlainBlock(lr, wd, g + b, w + b);
      }
    }
    SgdPlainValues(lr, wd, g + b, w + b, n - b);
  } else {
    for (; b + kSgdBlock <= n; b += kSgdBlock) {
      if (c != nullptr) {
        SgdBlockCopy(lr, mu, wd, g + b, v + b, w + b, c + b);
      } else {
        SgdBlock(lr, mu, wd, g + b, v + b, w + b);
      }
    }
    SgdValues(lr, mu, wd, g + b, v + b, w + b, n - b);
  }
  if (c != nullptr && n > b) std::memcpy(c + b, w + b, (n - b) * sizeof(float));
}

}  // namespace

void Optimizer::Step(float lr, uint64_t step, std::span<const float> grad, std::span<float> first,
                     std::span<float> second, std::span<float> params,
                     std::span<float> copy_to) const {
  const size_t n = params.size();
  const float* g = grad.data();
  float* m = first.data();
  float* w = params.data();
  const float wd = static_cast<float>(weight_decay_);
  // The operations of torch.optim's single-tensor loops (torch 1.13), in float; they
  // may differ from torch's in the last bits, where its kernels fuse multiply-adds.
  if (kind_ == Kind::kSgd && dampening_ == 0 && !nesterov_) {
    // The shard's own SGD: the buffer starting at zero makes its first value d_p, as
    // torch's first step does.
    SgdKernel(lr, static_cast<float>(momentum_), wd, grad, first, params, copy_to);
    return;
  }
  if (kind_ == Kind::kSgd) {
    const float mu = static_cast<float>(momentum_);
    const float keep = static_cast<float>(1.0 - dampening_);
    const bool first_step = step <= 1;
    for (size_t i = 0; i < n; ++i) {
      float d = g[i] + wd * w[i];
      if (mu != 0) {
        // The buffer starts as the first step's d_p, undamped.
        m[i] = first_step ? d : mu * m[i] + keep * d;
        d = nesterov_ ? d + mu * m[i] : m[i];
      }
      w[i] -= lr * d;
    }
  } else {
    const double t = static_cast<double>(step);
    const float b1 = static_cast<float>(beta1_), b2 = static_cast<float>(beta2_);
    const float one_b1 = static_cast<float>(1.0 - beta1_), one_b2 = static_cast<float>(1.0 - beta2_);
    const double bias1 = 1.0 - std::pow(beta1_, t), bias2 = 1.0 - std::pow(beta2_, t);
    const float step_size = static_cast<float>(static_cast<double>(lr) / bias1);
    const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
    const float eps = static_cast<float>(eps_);
    const bool decoupled = kind_ == Kind::kAdamW;
    const float shrink = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay_);
    float* v = second.data();
    for (size_t i = 0; i < n; ++i) {
      float d = g[i];
      if (decoupled) {
        w[i] *= shrink;
      } else {
        d += wd * w[i];
      }
      m[i] = m[i] * b1 + one_b1 * d;
      v[i] = v[i] * b2 + one_b2 * d * d;
      const float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
      w[i] -= step_size * (m[i] / denom);
    }
  }
  if (!copy_to.empty()) std::memcpy(copy_to.data(), w, n * sizeof(float));
}

void SgdStep(const SgdOptions& opt, uint64_t round, std::span<const float> grad,
             std::span<float> velocity, std::span<float> params, std::span<float> copy_to,
             std::optional<float> round_lr) {
  const float lr = round_lr.has_value()
                       ? *round_lr
                       : static_cast<float>(opt.learning_rate * opt.schedule.Factor(round));
  SgdKernel(lr, opt.momentum, opt.weight_decay, grad, velocity, params, copy_to);
}

}  // namespace ps::server
