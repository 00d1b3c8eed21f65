#include "server/optimizer.h"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <numbers>

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
    out.spec_ = absl::StrCat("step(every=", every, ", gamma=", gamma, ")");
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
    out.spec_ = absl::StrCat("cosine(steps=", steps, ", min=", min, ")");
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

}  // namespace

void SgdStep(const SgdOptions& opt, uint64_t round, std::span<const float> grad,
             std::span<float> velocity, std::span<float> params, std::span<float> copy_to) {
  const float lr = static_cast<float>(opt.learning_rate * opt.schedule.Factor(round));
  const float mu = opt.momentum;
  const float wd = opt.weight_decay;
  const float* g = grad.data();
  float* v = velocity.data();
  float* w = params.data();
  float* c = copy_to.empty() ? nullptr : copy_to.data();
  const size_t n = params.size();
  size_t b = 0;
  for (; b + kSgdBlock <= n; b += kSgdBlock) {
    if (c != nullptr) {
      SgdBlockCopy(lr, mu, wd, g + b, v + b, w + b, c + b);
    } else {
      SgdBlock(lr, mu, wd, g + b, v + b, w + b);
    }
  }
  SgdValues(lr, mu, wd, g + b, v + b, w + b, n - b);
  if (c != nullptr && n > b) std::memcpy(c + b, w + b, (n - b) * sizeof(float));
}

}  // namespace ps::server
