// Stochastic-rounding codecs are unbiased: over many rounds (each with its own random
// stream) the mean of the decoded values approaches the input, to within the
// variance each codec's definition gives.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"
#include "tests/codecs/example_specs.h"

namespace ps::codecs {
namespace {

class UnbiasedCodecTest : public ::testing::TestWithParam<const char*> {};

TEST_P(UnbiasedCodecTest, MeanOverRoundsApproachesTheInput) {
  auto codec = *MakeCodec(GetParam(), CodecOptions{99});
  const size_t n = 200;
  const int rounds = 2000;
  const std::vector<float> x = testing::Gaussian(n, 4);
  std::vector<double> sum(n), sum_sq(n);
  std::vector<float> out(n);
  std::string bytes;
  for (int t = 0; t < rounds; ++t) {
    EncodeContext ctx;
    ctx.round = static_cast<uint64_t>(t);
    ASSERT_TRUE(codec->Encode(x, ctx, &bytes).ok());
    ASSERT_TRUE(codec->Decode(bytes, out).ok());
    for (size_t i = 0; i < n; ++i) {
      sum[i] += out[i];
      sum_sq[i] += double{out[i]} * out[i];
    }
  }
  size_t biased = 0;
  for (size_t i = 0; i < n; ++i) {
    const double mean = sum[i] / rounds;
    const double var = std::max(sum_sq[i] / rounds - mean * mean, 0.0);
    // 5 standard errors (plus a float-rounding floor): a true bias of a few percent of
    // the step fails on many coordinates at once.
    const double bound = 5 * std::sqrt(var / rounds) + 1e-5;
    if (std::fabs(mean - x[i]) > bound) ++biased;
  }
  EXPECT_LE(biased, 1u) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Codecs, UnbiasedCodecTest,
                         ::testing::Values("int8", "int8(bucket=7)", "terngrad", "terngrad(bucket=9)",
                                           "qsgd", "qsgd(s=1, bucket=64)", "qsgd(s=3, bucket=10)"),
                         [](const auto& info) { return testing::SpecName(info.param); });

// Deterministic codecs are biased; the test above would catch a codec that rounds to
// nearest (here 3lc's ternary rounding on values between the levels).
TEST(UnbiasedCodecTest, DetectsARoundToNearestCodec) {
  auto codec = *MakeCodec("3lc");
  const std::vector<float> x = {1.0f, 0.3f, -0.3f, 0.7f};
  std::string bytes;
  std::vector<float> out(x.size());
  ASSERT_TRUE(codec->Encode(x, &bytes).ok());
  ASSERT_TRUE(codec->Decode(bytes, out).ok());
  EXPECT_EQ(out[1], 0.0f);  // the same every round: mean 0, not 0.3
}

}  // namespace
}  // namespace ps::codecs
