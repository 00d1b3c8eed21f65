#include "worker_lib/adacomm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>

#include "worker_lib/pull_streams_internal.h"

namespace ps {
namespace {

PublishedLoss Loss(double loss, double first) { return PublishedLoss{1, loss, first}; }

TEST(AdaCommTest, ThePeriodFollowsTheSquareRootOfTheLossRatio) {
  const AdaCommOptions o{.tau0 = 8, .tau_min = 1, .tau_max = 32};
  EXPECT_EQ(AdaCommPeriod(o, std::nullopt), 8u) << "tau0 until a loss is published";
  EXPECT_EQ(AdaCommPeriod(o, Loss(2.0, 2.0)), 8u);
  // ceil(sqrt(1/4) * 8) = 4; ceil(sqrt(0.3) * 8) = ceil(4.38) = 5.
  EXPECT_EQ(AdaCommPeriod(o, Loss(0.5, 2.0)), 4u);
  EXPECT_EQ(AdaCommPeriod(o, Loss(0.6, 2.0)), 5u);
  // A decaying step size (eta_0 / eta_l = 4) keeps the period longer: sqrt(4 / 4) * 8.
  EXPECT_EQ(AdaCommPeriod(o, Loss(0.5, 2.0), /*lr_ratio=*/4), 8u);
  // Falls monotonically with the loss.
  uint32_t previous = 32;
  for (double loss = 2.0; loss > 1e-4; loss *= 0.8) {
    const uint32_t tau = AdaCommPeriod(o, Loss(loss, 2.0));
    EXPECT_LE(tau, previous) << "loss " << loss;
    previous = tau;
  }
  EXPECT_EQ(previous, 1u);
}

TEST(AdaCommTest, BoundsHoldWhateverIsPublished) {
  const AdaCommOptions o{.tau0 = 4, .tau_min = 2, .tau_max = 6};
  EXPECT_EQ(AdaCommPeriod(o, Loss(1e30, 1.0)), 6u) << "a huge ratio does not wrap";
  EXPECT_EQ(AdaCommPeriod(o, Loss(1e-30, 1.0)), 2u);
  // Losses that make no ratio leave tau0.
  EXPECT_EQ(AdaCommPeriod(o, Loss(0, 1.0)), 4u);
  EXPECT_EQ(AdaCommPeriod(o, Loss(1.0, -1.0)), 4u);
  EXPECT_EQ(AdaCommPeriod(o, Loss(1.0, 1.0), std::numeric_limits<double>::infinity()), 4u);
  EXPECT_EQ(AdaCommPeriod(o, Loss(std::nan(""), 1.0)), 4u);
}

TEST(AdaCommTest, OptionsAreValidated) {
  EXPECT_TRUE(ValidateAdaComm({}).ok());
  EXPECT_FALSE(ValidateAdaComm({.tau0 = 0, .tau_min = 0, .tau_max = 4}).ok());
  EXPECT_FALSE(ValidateAdaComm({.tau0 = 8, .tau_min = 1, .tau_max = 4}).ok());
  EXPECT_FALSE(ValidateAdaComm({.tau0 = 2, .tau_min = 3, .tau_max = 4}).ok());
}

net::PullHeader Frame(uint32_t slice, uint64_t version, std::optional<float> loss,
                      std::optional<float> first) {
  net::PullHeader f;
  f.slice_id = slice;
  f.version = version;
  f.loss = loss;
  f.first_loss = first;
  return f;
}

TEST(PublishedLossesTest, MediansOverTheSlicesOfTheNewestVersion) {
  internal::PublishedLosses losses;
  EXPECT_EQ(losses.Latest(), std::nullopt);
  losses.Record(Frame(0, 3, std::nullopt, std::nullopt));  // a shard without reports
  EXPECT_EQ(losses.Latest(), std::nullopt);
  losses.Record(Frame(0, 3, 1.0f, 4.0f));
  losses.Record(Frame(1, 3, 3.0f, 4.0f));
  losses.Record(Frame(2, 3, 100.0f, 5.0f));
  std::optional<PublishedLoss> got = losses.Latest();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->version, 3u);
  EXPECT_EQ(got->loss, 3.0);
  EXPECT_EQ(got->first_loss, 4.0);
  // Slice 1 moves on: only the newest version counts; an older one arriving late is
  // ignored.
  losses.Record(Frame(1, 4, 2.0f, 4.0f));
  losses.Record(Frame(1, 2, 9.0f, 9.0f));
  got = losses.Latest();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->version, 4u);
  EXPECT_EQ(got->loss, 2.0);
  losses.Record(Frame(0, 4, 1.0f, 4.0f));
  EXPECT_EQ(losses.Latest()->loss, 1.5) << "the mean of the two middle values";
}

}  // namespace
}  // namespace ps
