#include "server/optimizer.h"

#include <gtest/gtest.h>

#include <vector>

namespace ps::server {
namespace {

TEST(SgdStepTest, PlainSgdWithoutMomentum) {
  std::vector<float> w = {1, 2}, v = {0, 0};
  SgdStep({0.5f, 0.0f, 0.0f}, std::vector<float>{2, -2}, v, w);
  EXPECT_FLOAT_EQ(w[0], 0.0f);
  EXPECT_FLOAT_EQ(w[1], 3.0f);
}

TEST(SgdStepTest, MomentumAccumulatesVelocity) {
  std::vector<float> w = {0}, v = {0};
  const SgdOptions opt{1.0f, 0.5f, 0.0f};
  SgdStep(opt, std::vector<float>{1}, v, w);  // v = 1, w = -1
  SgdStep(opt, std::vector<float>{1}, v, w);  // v = 1.5, w = -2.5
  EXPECT_FLOAT_EQ(v[0], 1.5f);
  EXPECT_FLOAT_EQ(w[0], -2.5f);
}

TEST(SgdStepTest, WeightDecayPullsTowardZero) {
  std::vector<float> w = {10}, v = {0};
  SgdStep({0.1f, 0.0f, 0.5f}, std::vector<float>{0}, v, w);  // w -= 0.1 * 5
  EXPECT_FLOAT_EQ(w[0], 9.5f);
}

}  // namespace
}  // namespace ps::server
