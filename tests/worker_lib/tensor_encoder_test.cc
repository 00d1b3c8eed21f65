// Worker momentum and error feedback (worker_lib/tensor_encoder_internal.h).
#include "worker_lib/tensor_encoder_internal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "core/device.h"
#include "gmock/gmock.h"
#include "gpu/cuda_device.h"
#include "gtest/gtest.h"

namespace ps::internal {
namespace {

using ::testing::HasSubstr;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Decodes one round's payloads back into a whole tensor.
std::vector<float> DecodeAll(std::string_view spec, const std::vector<SliceRange>& slices,
                             const std::vector<std::string>& payloads, size_t numel) {
  auto codec = codecs::MakeCodec(spec);
  EXPECT_TRUE(codec.ok());
  std::vector<float> out(numel);
  for (size_t k = 0; k < slices.size(); ++k) {
    std::span<float> dst(out.data() + slices[k].offset, slices[k].numel);
    EXPECT_TRUE((*codec)->Decode(payloads[k], dst).ok());
  }
  return out;
}

const std::vector<SliceRange> kSlices = {{0, 0, 40}, {1, 40, 40}, {2, 80, 20}};
constexpr size_t kNumel = 100;

// Error feedback's invariant over rounds: what the payloads delivered plus the last
// residual equals what was given, whatever the codec did in between.
class FeedbackLedger {
 public:
  // One round: the gradient given and what its payloads decoded to.
  void Add(std::span<const float> given, std::span<const float> delivered) {
    for (size_t i = 0; i < kNumel; ++i) {
      given_[i] += given[i];
      delivered_[i] += delivered[i];
    }
  }
  // max_i |delivered + residual - given|.
  double WorstGap(std::span<const float> residual) const {
    double worst = 0;
    for (size_t i = 0; i < kNumel; ++i) {
      worst = std::max(worst, std::abs(delivered_[i] + residual[i] - given_[i]));
    }
    return worst;
  }

 private:
  std::vector<double> given_ = std::vector<double>(kNumel, 0);
  std::vector<double> delivered_ = std::vector<double>(kNumel, 0);
};

TEST(TensorEncoderTest, WithoutOptionsPushesTheGradientThroughTheCodec) {
  PushOptions options;
  options.codec = "fp32";
  auto enc = TensorEncoder::Make(options, 0, kNumel);
  ASSERT_TRUE(enc.ok()) << enc.status();
  const std::vector<float> g = Random(kNumel, 1);
  std::vector<std::string> payloads;
  ASSERT_TRUE((*enc)->Encode(g, 0, 0, kSlices, &payloads).ok());
  ASSERT_EQ(payloads.size(), 3u);
  EXPECT_EQ(DecodeAll("fp32", kSlices, payloads, kNumel), g);
  EXPECT_TRUE((*enc)->residual().empty());
}

// Borrow gives, per slice, the payload's head and the values where they lie: together
// the bytes Encode writes.
TEST(TensorEncoderTest, BorrowGivesTheBytesEncodeWrites) {
  auto enc = TensorEncoder::Make(PushOptions{}, 0, kNumel);
  ASSERT_TRUE(enc.ok()) << enc.status();
  ASSERT_TRUE((*enc)->CanBorrow());
  const std::vector<float> g = Random(kNumel, 2);
  std::vector<std::string> encoded;
  std::string head;
  std::vector<std::span<const char>> borrowed;
  ASSERT_TRUE((*enc)->Encode(g, 0, 0, kSlices, &encoded).ok());
  ASSERT_TRUE((*enc)->Borrow(g, kSlices, &head, &borrowed).ok());
  ASSERT_EQ(borrowed.size(), kSlices.size());
  for (size_t k = 0; k < kSlices.size(); ++k) {
    EXPECT_EQ(borrowed[k].data(), reinterpret_cast<const char*>(g.data() + kSlices[k].offset));
    EXPECT_EQ(head + std::string(borrowed[k].begin(), borrowed[k].end()), encoded[k]);
  }
  std::vector<float> bad = g;
  bad[kSlices[1].offset] = std::numeric_limits<float>::infinity();
  const absl::Status refused = (*enc)->Borrow(bad, kSlices, &head, &borrowed);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused, (*enc)->Encode(bad, 0, 0, kSlices, &encoded));  // the codec's refusal
}

TEST(TensorEncoderTest, NoBorrowingWhereTheBytesAreNotTheValues) {
  for (const char* codec : {"fp16", "topk(0.5)"}) {
    PushOptions o;
    o.codec = codec;
    auto enc = TensorEncoder::Make(o, 0, kNumel);
    EXPECT_FALSE((*enc)->CanBorrow()) << codec;
    std::string head;
    std::vector<std::span<const char>> borrowed;
    const absl::Status st = (*enc)->Borrow(Random(kNumel, 3), kSlices, &head, &borrowed);
    EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << codec;
    EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("cannot borrow")) << codec;
  }
  PushOptions momentum;
  momentum.momentum = 0.9;
  EXPECT_FALSE((*TensorEncoder::Make(momentum, 0, kNumel))->CanBorrow());
  PushOptions feedback;
  feedback.error_feedback = true;
  EXPECT_FALSE((*TensorEncoder::Make(feedback, 0, kNumel))->CanBorrow());
}

// PushOptions::device reaches the codec: the same payloads and residual as on the CPU,
// and a note for the log where no device encodes.
TEST(TensorEncoderTest, DeviceCudaEncodesTheCpuBytesAndSaysWhereItRuns) {
  PushOptions options;
  options.codec = "3lc(s=1.5)";
  options.error_feedback = true;
  auto cpu = TensorEncoder::Make(options, 7, kNumel);
  options.device = core::Device::kCuda;
  auto cuda = TensorEncoder::Make(options, 7, kNumel);
  ASSERT_TRUE(cpu.ok() && cuda.ok());
  for (uint64_t round = 0; round < 3; ++round) {
    const std::vector<float> g = Random(kNumel, static_cast<uint32_t>(round));
    std::vector<std::string> a, b;
    ASSERT_TRUE((*cpu)->Encode(g, round, 0, kSlices, &a).ok());
    ASSERT_TRUE((*cuda)->Encode(g, round, 0, kSlices, &b).ok());
    EXPECT_EQ(a, b);
  }
  EXPECT_TRUE(std::equal((*cpu)->residual().begin(), (*cpu)->residual().end(),
                         (*cuda)->residual().begin(), (*cuda)->residual().end()));
  EXPECT_TRUE((*cpu)->device_note().empty());
  if (gpu::CudaDevice().ok()) {
    EXPECT_TRUE((*cuda)->device_note().empty()) << (*cuda)->device_note();
  } else {
    EXPECT_THAT(std::string((*cuda)->device_note()),
                HasSubstr("device=cuda requested but unavailable"));
  }
}

// Error feedback telescopes: sum of what was pushed + the last residual equals the sum
// of the gradients, for any codec.
TEST(TensorEncoderTest, ErrorFeedbackLosesNothingOverRounds) {
  PushOptions options;
  options.codec = "bf16";
  options.error_feedback = true;
  auto enc = TensorEncoder::Make(options, 0, kNumel);
  ASSERT_TRUE(enc.ok()) << enc.status();
  FeedbackLedger ledger;
  for (uint64_t round = 0; round < 20; ++round) {
    const std::vector<float> g = Random(kNumel, static_cast<uint32_t>(round) + 10);
    std::vector<std::string> payloads;
    ASSERT_TRUE((*enc)->Encode(g, round, 0, kSlices, &payloads).ok());
    ledger.Add(g, DecodeAll("bf16", kSlices, payloads, kNumel));
  }
  double residual_norm = 0;
  for (float r : (*enc)->residual()) residual_norm += std::abs(r);
  EXPECT_LT(ledger.WorstGap((*enc)->residual()), 1e-4);
  EXPECT_GT(residual_norm, 0) << "bf16 rounding must leave a residual";
}

// topk(level=cat) keeps a different number of coordinates as the link's fixed cost
// changes from round to round; the residual is what the payload actually sent lost,
// so nothing is lost over the rounds.
TEST(TensorEncoderTest, ErrorFeedbackStaysExactWhenCatChangesTheLevel) {
  PushOptions options;
  options.codec = "topk(0.5, level=cat, min=0.05)+raw+raw";
  options.error_feedback = true;
  auto enc = TensorEncoder::Make(options, 0, kNumel);
  ASSERT_TRUE(enc.ok()) << enc.status();
  FeedbackLedger ledger;
  std::set<size_t> levels;
  for (uint64_t round = 0; round < 20; ++round) {
    const std::vector<float> g = Random(kNumel, static_cast<uint32_t>(round) + 30);
    std::vector<SliceRange> slices = kSlices;
    for (SliceRange& s : slices) s.fixed_cost_bytes = round % 2 == 0 ? 0.0 : 1e9;
    std::vector<std::string> payloads;
    ASSERT_TRUE((*enc)->Encode(g, round, 0, slices, &payloads).ok());
    const std::vector<float> d = DecodeAll((*enc)->spec(), slices, payloads, kNumel);
    levels.insert(
        static_cast<size_t>(std::count_if(d.begin(), d.end(), [](float v) { return v != 0; })));
    ledger.Add(g, d);
  }
  EXPECT_GE(levels.size(), 2u) << "the fixed cost did not change the level";
  EXPECT_LT(ledger.WorstGap((*enc)->residual()), 1e-4);
}

// Espresso changes a tensor's codec between rounds: the residual carries over, so what
// was pushed plus what is left still adds up to what was given, across codecs.
TEST(TensorEncoderTest, ErrorFeedbackStaysExactAcrossCodecChanges) {
  PushOptions options;
  options.codec = "topk(0.1)+raw+raw";
  options.error_feedback = true;
  auto enc = TensorEncoder::Make(options, 0, kNumel);
  ASSERT_TRUE(enc.ok()) << enc.status();
  const std::vector<std::string> specs = {"topk(0.1)+raw+raw", "fp16", "3lc(s=1.9)", "fp32",
                                          "topk(0.01)+raw+raw"};
  FeedbackLedger ledger;
  for (uint64_t round = 0; round < 15; ++round) {
    ASSERT_TRUE((*enc)->SetCodec(specs[round % specs.size()], 0, core::Device::kCpu).ok());
    const std::vector<float> g = Random(kNumel, static_cast<uint32_t>(round) + 50);
    std::vector<std::string> payloads;
    ASSERT_TRUE((*enc)->Encode(g, round, 0, kSlices, &payloads).ok());
    ledger.Add(g, DecodeAll((*enc)->spec(), kSlices, payloads, kNumel));
  }
  double left = 0;
  for (float r : (*enc)->residual()) left = std::max(left, std::abs(double{r}));
  EXPECT_LT(ledger.WorstGap((*enc)->residual()), 1e-4);
  EXPECT_GT(left, 1e-3) << "the last codec (top-1 %) leaves a residual";
  // A bad spec changes nothing.
  EXPECT_FALSE((*enc)->SetCodec("nonsense", 0, core::Device::kCpu).ok());
  EXPECT_EQ((*enc)->spec(), "topk(ratio=0.01, method=exact)+raw+raw");
}

TEST(TensorEncoderTest, MomentumPushesTheMovingAverage) {
  PushOptions options;
  options.codec = "fp32";
  options.momentum = 0.5;
  auto enc = TensorEncoder::Make(options, 0, kNumel);
  ASSERT_TRUE(enc.ok()) << enc.status();
  std::vector<float> u;
  for (uint64_t round = 0; round < 4; ++round) {
    const std::vector<float> g = Random(kNumel, static_cast<uint32_t>(round) + 30);
    if (u.empty()) {
      u = g;  // the first push is the gradient itself
    } else {
      for (size_t i = 0; i < kNumel; ++i) u[i] = 0.5f * u[i] + 0.5f * g[i];
    }
    std::vector<std::string> payloads;
    ASSERT_TRUE((*enc)->Encode(g, round, 0, kSlices, &payloads).ok());
    EXPECT_EQ(DecodeAll("fp32", kSlices, payloads, kNumel), u) << "round " << round;
  }
}

TEST(TensorEncoderTest, AFailedEncodeChangesNoState) {
  PushOptions options;
  options.codec = "fp16";
  options.error_feedback = true;
  options.momentum = 0.9;
  auto enc = TensorEncoder::Make(options, 0, kNumel);
  ASSERT_TRUE(enc.ok());
  std::vector<std::string> payloads;
  ASSERT_TRUE((*enc)->Encode(Random(kNumel, 5), 0, 0, kSlices, &payloads).ok());
  const std::vector<float> residual((*enc)->residual().begin(), (*enc)->residual().end());
  std::vector<float> bad = Random(kNumel, 6);
  bad[90] = std::nanf("");
  const absl::Status s = (*enc)->Encode(bad, 1, 0, kSlices, &payloads);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not finite"));
  EXPECT_EQ(std::vector<float>((*enc)->residual().begin(), (*enc)->residual().end()), residual);
}

// Momentum and the residual are kept for the whole tensor, so a push encodes all of it:
// slices that leave values out (or count some twice) are refused, with nothing changed.
TEST(TensorEncoderTest, SlicesThatDoNotCoverTheTensorAreRefused) {
  PushOptions options;
  options.error_feedback = true;
  auto enc = TensorEncoder::Make(options, 0, kNumel);
  ASSERT_TRUE(enc.ok());
  std::vector<std::string> payloads;
  const std::vector<SliceRange> short_by_one = {{0, 0, 40}, {1, 40, 40}, {2, 80, 19}};
  const absl::Status s = (*enc)->Encode(Random(kNumel, 5), 0, 0, short_by_one, &payloads);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("slices of 99 values for a tensor of 100"));
  EXPECT_EQ(std::vector<float>((*enc)->residual().begin(), (*enc)->residual().end()),
            std::vector<float>(kNumel, 0.0f));
}

TEST(TensorEncoderTest, RefusesBadOptions) {
  PushOptions options;
  options.momentum = 1.0;
  EXPECT_THAT(std::string(TensorEncoder::Make(options, 0, 4).status().message()),
              HasSubstr("worker momentum must lie in [0, 1)"));
  options.momentum = 0;
  options.codec = "zip";
  EXPECT_THAT(std::string(TensorEncoder::Make(options, 0, 4).status().message()),
              HasSubstr("unknown codec 'zip'"));
}

}  // namespace
}  // namespace ps::internal
