#include "server/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace ps::server {
namespace {

TEST(SgdStepTest, PlainSgdWithoutMomentum) {
  std::vector<float> w = {1, 2}, v = {0, 0};
  SgdStep({0.5f, 0.0f, 0.0f}, 0, std::vector<float>{2, -2}, v, w);
  EXPECT_FLOAT_EQ(w[0], 0.0f);
  EXPECT_FLOAT_EQ(w[1], 3.0f);
}

TEST(SgdStepTest, MomentumAccumulatesVelocity) {
  std::vector<float> w = {0}, v = {0};
  const SgdOptions opt{1.0f, 0.5f, 0.0f};
  SgdStep(opt, 0, std::vector<float>{1}, v, w);  // v = 1, w = -1
  SgdStep(opt, 0, std::vector<float>{1}, v, w);  // v = 1.5, w = -2.5
  EXPECT_FLOAT_EQ(v[0], 1.5f);
  EXPECT_FLOAT_EQ(w[0], -2.5f);
}

TEST(SgdStepTest, WeightDecayPullsTowardZero) {
  std::vector<float> w = {10}, v = {0};
  SgdStep({0.1f, 0.0f, 0.5f}, 0, std::vector<float>{0}, v, w);  // w -= 0.1 * 5
  EXPECT_FLOAT_EQ(w[0], 9.5f);
}

TEST(SgdStepTest, TheCopyHoldsTheSameBitsAsTheParametersAcrossBlocksAndTheTail) {
  // 2500 values: two whole blocks of the vectorized step and a scalar tail.
  const size_t n = 2500;
  std::vector<float> g(n), w(n), v(n, 0.25f);
  for (size_t i = 0; i < n; ++i) {
    g[i] = 0.001f * static_cast<float>(i % 97) - 0.03f;
    w[i] = 1.0f / static_cast<float>(i + 3);
  }
  std::vector<float> w_alone = w, v_alone = v;
  std::vector<float> copy(n, -1.0f);
  const SgdOptions opt{0.1f, 0.9f, 0.01f};
  SgdStep(opt, 3, g, v_alone, w_alone);
  SgdStep(opt, 3, g, v, w, copy);
  EXPECT_EQ(0, std::memcmp(w.data(), w_alone.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(v.data(), v_alone.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(copy.data(), w.data(), n * sizeof(float)));
}

// Without momentum a step keeps no velocity: the parameters (and their copy) have the
// bits of the step with a zero velocity, over whole blocks and the tail, with and without
// weight decay (values away from zero: only a zero's sign may differ).
TEST(SgdStepTest, WithoutMomentumNoVelocityGivesTheBitsOfAZeroOne) {
  const size_t n = 2500;
  std::vector<float> g(n), w0(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = 0.001f * static_cast<float>(i % 97) - 0.0305f;
    w0[i] = 1.0f / static_cast<float>(i + 3);
  }
  for (const float wd : {0.0f, 0.01f}) {
    const SgdOptions opt{0.1f, 0.0f, wd};
    std::vector<float> w_with = w0, v(n, 0.0f), w_without = w0, copy(n, -1.0f);
    for (uint64_t step = 0; step < 3; ++step) {
      SgdStep(opt, step, g, v, w_with);
      SgdStep(opt, step, g, {}, w_without, copy);
    }
    EXPECT_EQ(0, std::memcmp(w_with.data(), w_without.data(), n * sizeof(float))) << wd;
    EXPECT_EQ(0, std::memcmp(copy.data(), w_without.data(), n * sizeof(float))) << wd;
    EXPECT_NE(w_without, w0);
  }
}

TEST(OptimizerTest, OnlySgdWithoutMomentumKeepsNoFirstMoment) {
  EXPECT_FALSE(Optimizer::Parse("sgd(lr=0.1)")->has_first_moment());
  EXPECT_FALSE(Optimizer::Parse("sgd(lr=0.1, weight_decay=0.5)")->has_first_moment());
  EXPECT_TRUE(Optimizer::Parse("sgd(lr=0.1, momentum=0.9)")->has_first_moment());
  EXPECT_TRUE(Optimizer::Parse("adam(lr=0.1)")->has_first_moment());
  EXPECT_TRUE(Optimizer::Parse("adamw(lr=0.1)")->has_first_moment());
}

TEST(LrScheduleTest, FactorsPerRound) {
  const auto factor = [](const char* spec, uint64_t round) {
    absl::StatusOr<LrSchedule> s = LrSchedule::Parse(spec);
    EXPECT_TRUE(s.ok()) << spec << ": " << s.status();
    return s.ok() ? s->Factor(round) : -1.0;
  };
  EXPECT_EQ(factor("constant", 12345), 1.0);
  EXPECT_EQ(factor("step(every=100, gamma=0.5)", 99), 1.0);
  EXPECT_EQ(factor("step(every=100, gamma=0.5)", 100), 0.5);
  EXPECT_EQ(factor("step(100, 0.5)", 250), 0.25);
  EXPECT_DOUBLE_EQ(factor("inv_sqrt(t0=100)", 300), 0.5);
  EXPECT_EQ(factor("inv_sqrt", 0), 1.0);
  EXPECT_DOUBLE_EQ(factor("cosine(steps=1000)", 500), 0.5);
  EXPECT_DOUBLE_EQ(factor("cosine(steps=1000, min=0.1)", 1000), 0.1);
  EXPECT_DOUBLE_EQ(factor("cosine(steps=1000, min=0.1)", 5000), 0.1);
  EXPECT_EQ(LrSchedule::Parse("step(every=100, gamma=0.5)")->spec(), "step(every=100, gamma=0.5)");
  EXPECT_EQ(LrSchedule::Parse("inv_sqrt")->spec(), "inv_sqrt(t0=100)");
}

TEST(LrScheduleTest, BadSpecsAreRefusedWithTheReason) {
  for (const auto& [spec, why] : std::vector<std::pair<std::string, std::string>>{
           {"linear", "unknown schedule 'linear'"},
           {"step", "step needs every=N"},
           {"step(every=0)", "every"},
           {"step(every=10, gamma=2)", "gamma must be in (0, 1]"},
           {"cosine", "cosine needs steps=N"},
           {"cosine(steps=10, min=1.5)", "min must be in [0, 1]"},
           {"constant+step(every=1)", "one schedule expected"},
           {"inv_sqrt(t0=5, x=1)", "x"},
           {"", "lr schedule"}}) {
    absl::StatusOr<LrSchedule> s = LrSchedule::Parse(spec);
    ASSERT_FALSE(s.ok()) << spec;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(std::string(s.status().message()).find(why), std::string::npos)
        << spec << ": " << s.status().message();
  }
}

TEST(SgdStepTest, TheScheduleScalesTheStepOfItsRound) {
  SgdOptions opt{1.0f, 0.0f, 0.0f};
  opt.schedule = *LrSchedule::Parse("step(every=2, gamma=0.5)");
  std::vector<float> w = {0}, v = {0};
  SgdStep(opt, 1, std::vector<float>{1}, v, w);  // factor 1
  SgdStep(opt, 2, std::vector<float>{1}, v, w);  // factor 0.5
  EXPECT_FLOAT_EQ(w[0], -1.5f);
}

TEST(SgdStepTest, TheRoundsLearningRateReplacesTheScheduledOne) {
  SgdOptions opt{1.0f, 0.0f, 0.0f};
  opt.schedule = *LrSchedule::Parse("step(every=1, gamma=0.5)");
  std::vector<float> w = {0}, v = {0};
  SgdStep(opt, 3, std::vector<float>{2}, v, w, {}, 0.25f);  // 0.25, not 1 x 0.125
  EXPECT_FLOAT_EQ(w[0], -0.5f);
}

TEST(OptimizerTest, SpecsParseToTheirCanonicalFormWithTorchsDefaults) {
  const auto canonical = [](const char* spec) {
    absl::StatusOr<Optimizer> o = Optimizer::Parse(spec);
    EXPECT_TRUE(o.ok()) << spec << ": " << o.status();
    return o.ok() ? o->spec() : std::string();
  };
  EXPECT_EQ(canonical("sgd(lr=0.1)"),
            "sgd(lr=0.1, momentum=0, dampening=0, nesterov=0, weight_decay=0)");
  EXPECT_EQ(canonical("sgd(nesterov=1, momentum=0.9, lr=0.01)"),
            "sgd(lr=0.01, momentum=0.9, dampening=0, nesterov=1, weight_decay=0)");
  EXPECT_EQ(canonical("adam(lr=1e-03)"),
            "adam(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0)");
  EXPECT_EQ(canonical("adamw(lr=0.001)"),
            "adamw(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.01)");
  // The canonical form parses to itself.
  const std::string c = canonical("adam(lr=3e-4, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1)");
  EXPECT_EQ(canonical(c.c_str()), c);
  // Every digit a value needs is kept: six would print this beta2 as 1, which the
  // parser refuses (found by the aggregator_spec fuzz target).
  const std::string fine = canonical("adam(lr=0.0012345678, beta2=0.9999999999999999)");
  EXPECT_EQ(fine, "adam(lr=0.0012345678, beta1=0.9, beta2=0.9999999999999999, eps=1e-08, "
                  "weight_decay=0)");
  EXPECT_EQ(canonical(fine.c_str()), fine);
  EXPECT_EQ(LrSchedule::Parse("step(every=10, gamma=0.123456789)")->spec(),
            "step(every=10, gamma=0.123456789)");
  EXPECT_TRUE(Optimizer::Parse("adam(lr=0.001)")->has_second_moment());
  EXPECT_FALSE(Optimizer::Parse("sgd(lr=0.1, momentum=0.9)")->has_second_moment());
}

TEST(OptimizerTest, BadSpecsAreRefusedWithTheReasonAndWhatTheShardsMirror) {
  for (const auto& [spec, why] : std::vector<std::pair<std::string, std::string>>{
           {"rmsprop(lr=0.01)", "unknown optimizer 'rmsprop'"},
           {"sgd(momentum=0.9)", "lr is required"},
           {"sgd(lr=0.1, nesterov=1)", "Nesterov momentum requires a momentum and zero dampening"},
           {"sgd(lr=0.1, momentum=0.9, dampening=0.1, nesterov=1)", "Nesterov"},
           {"sgd(lr=0.1, nesterov=2)", "nesterov"},
           {"sgd(lr=-0.1)", "lr must be >= 0"},
           {"adam(lr=0.1, beta1=1)", "betas must be in [0, 1)"},
           {"adam(lr=0.1, amsgrad=1)", "amsgrad"},
           {"adam(lr=nan)", "not a finite number"},
           {"sgd(lr=0.1)+adam(lr=0.1)", "one optimizer expected"},
           {"sgd(lr=0.1", "optimizer"},
           {"", "optimizer"}}) {
    absl::StatusOr<Optimizer> o = Optimizer::Parse(spec);
    ASSERT_FALSE(o.ok()) << spec;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    const std::string message(o.status().message());
    EXPECT_NE(message.find(why), std::string::npos) << spec << ": " << message;
    EXPECT_NE(message.find("adamw"), std::string::npos) << spec << ": " << message;
  }
}

// torch.optim's algorithms (torch 1.13's single-tensor loops), in double: what the
// shard's float steps must match to float precision.
struct Reference {
  std::string kind;
  double momentum = 0, dampening = 0, weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  bool nesterov = false;
  std::vector<double> w, m, v;
  uint64_t step = 0;

  void Step(double lr, const std::vector<float>& g) {
    ++step;
    for (size_t i = 0; i < w.size(); ++i) {
      double d = g[i];
      if (kind == "sgd") {
        d += weight_decay * w[i];
        if (momentum != 0) {
          m[i] = step == 1 ? d : momentum * m[i] + (1 - dampening) * d;
          d = nesterov ? d + momentum * m[i] : m[i];
        }
        w[i] -= lr * d;
        continue;
      }
      if (kind == "adamw") {
        w[i] *= 1 - lr * weight_decay;
      } else {
        d += weight_decay * w[i];
      }
      m[i] = beta1 * m[i] + (1 - beta1) * d;
      v[i] = beta2 * v[i] + (1 - beta2) * d * d;
      const double bias1 = 1 - std::pow(beta1, step), bias2 = 1 - std::pow(beta2, step);
      w[i] -= lr / bias1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bias2) + eps);
    }
  }
};

void ExpectStepsMatch(const std::string& spec, Reference ref) {
  SCOPED_TRACE(spec);
  absl::StatusOr<Optimizer> opt = Optimizer::Parse(spec);
  ASSERT_TRUE(opt.ok()) << opt.status();
  const size_t n = 1500;  // more than a block
  std::vector<float> w(n), m(n, 0.0f), v(opt->has_second_moment() ? n : 0, 0.0f), copy(n);
  ref.w.resize(n);
  ref.m.assign(n, 0);
  ref.v.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    w[i] = std::sin(0.37f * static_cast<float>(i));
    ref.w[i] = w[i];
  }
  for (uint64_t t = 1; t <= 12; ++t) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) {
      g[i] = std::cos(0.11f * static_cast<float>(i * t)) + 0.05f * static_cast<float>(t);
    }
    const float lr = 0.01f * static_cast<float>(13 - t) / 12.0f;  // a decaying schedule
    opt->Step(lr, t, g, m, v, w, copy);
    ref.Step(lr, g);
    ASSERT_EQ(copy, w) << "step " << t;
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(w[i], ref.w[i], 2e-6 + 2e-6 * std::abs(ref.w[i])) << "value " << i;
  }
  // The step moved the values (a reference that stood still would match anything).
  EXPECT_GT(std::abs(ref.w[1] - std::sin(0.37)), 1e-3);
}

TEST(OptimizerTest, SgdStepsAreTorchs) {
  ExpectStepsMatch("sgd(lr=1)", {.kind = "sgd"});
  ExpectStepsMatch("sgd(lr=1, momentum=0.9, weight_decay=0.01)",
                   {.kind = "sgd", .momentum = 0.9, .weight_decay = 0.01});
  // Dampening spares the first step, which starts the buffer as the step's d_p.
  ExpectStepsMatch("sgd(lr=1, momentum=0.9, dampening=0.5)",
                   {.kind = "sgd", .momentum = 0.9, .dampening = 0.5});
  ExpectStepsMatch("sgd(lr=1, momentum=0.8, nesterov=1, weight_decay=0.001)",
                   {.kind = "sgd", .momentum = 0.8, .weight_decay = 0.001, .nesterov = true});
}

TEST(OptimizerTest, AdamAndAdamWStepsAreTorchs) {
  ExpectStepsMatch("adam(lr=1)", {.kind = "adam"});
  ExpectStepsMatch("adam(lr=1, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.05)",
                   {.kind = "adam", .weight_decay = 0.05, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6});
  ExpectStepsMatch("adamw(lr=1, weight_decay=0.1)",
                   {.kind = "adamw", .weight_decay = 0.1});
}

TEST(OptimizerTest, DampeningStartsAfterTheFirstStep) {
  // By hand: g = 1 twice, momentum 0.5, dampening 0.5: buf = 1, then 0.5 + 0.5 = 1.
  const Optimizer opt = *Optimizer::Parse("sgd(lr=1, momentum=0.5, dampening=0.5)");
  std::vector<float> w = {0}, m = {0};
  opt.Step(1.0f, 1, std::vector<float>{1}, m, {}, w);
  EXPECT_FLOAT_EQ(m[0], 1.0f);
  opt.Step(1.0f, 2, std::vector<float>{1}, m, {}, w);
  EXPECT_FLOAT_EQ(m[0], 1.0f);
  EXPECT_FLOAT_EQ(w[0], -2.0f);
}

}  // namespace
}  // namespace ps::server
