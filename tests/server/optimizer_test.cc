#include "server/optimizer.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ps::server
