// Codec::EncodeChange and Codec::EncodeResidual (codec.h) against their definitions:
// - EncodeChange: the change x - held encoded as Encode encodes it, and held advanced by
//   what a worker's decode then addition gives (Decode, then core::AddInto);
// - EncodeResidual: v encoded as Encode encodes it, and v left as v - Decode(payload).
// The same payload bytes and the same bits, for every codec (the default and 3lc's fused
// overrides), on slice sizes on both sides of 3lc's blocks, dense and sparse values with
// zeros and -0; and values that are not finite refused with nothing changed.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "core/fp32_bytes.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"
#include "tests/codecs/example_specs.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::Gaussian;
using ::ps::codecs::testing::HeldValues;
using ::ps::codecs::testing::MakeOk;

// x = held + change, in fp32.
std::vector<float> Plus(const std::vector<float>& held, const std::vector<float>& change) {
  std::vector<float> x(held.size());
  for (size_t i = 0; i < held.size(); ++i) x[i] = held[i] + change[i];
  return x;
}

// EncodeChange of x onto a copy of held, by `fused`, against Encode, Decode and AddInto
// by `reference` (a second codec of the same spec and seed, so stateful codecs see the
// same calls).
void ExpectSameAsDefinition(Codec& fused, Codec& reference, const std::vector<float>& x,
                            std::vector<float>* held, uint64_t round) {
  EncodeContext ctx;
  ctx.round = round;
  ctx.slice_id = 3;
  ctx.worker_id = UINT32_MAX;
  std::vector<float> change(x.size());
  core::Subtract(x, *held, change);
  std::string want;
  ASSERT_TRUE(reference.Encode(change, ctx, &want).ok());
  ASSERT_TRUE(reference.Decode(want, change).ok());
  std::vector<float> want_held = *held;
  core::AddInto(want_held, change);

  // Odd rounds also write the new held values to a copy (a shard's snapshot).
  std::vector<float> copy(x.size(), 7.0f);
  const bool with_copy = round % 2 == 1;
  std::string got = "stale";
  const absl::Status st =
      fused.EncodeChange(x, *held, ctx, &got, with_copy ? std::span<float>(copy) : std::span<float>());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(got, want) << "payloads differ";
  ASSERT_EQ(std::memcmp(held->data(), want_held.data(), held->size() * sizeof(float)), 0)
      << "what is held is not decode then add";
  if (with_copy) {
    ASSERT_EQ(std::memcmp(copy.data(), want_held.data(), copy.size() * sizeof(float)), 0)
        << "the copy is not what is held";
  }
}

// EncodeResidual of v by `fused` against Encode, Decode and the subtraction by
// `reference` (a second codec of the same spec and seed, so stateful codecs see the same
// calls).
void ExpectResidualAsDefinition(Codec& fused, Codec& reference, const std::vector<float>& v,
                            uint64_t round) {
  EncodeContext ctx;
  ctx.round = round;
  ctx.slice_id = 3;
  ctx.worker_id = 1;
  std::string want;
  ASSERT_TRUE(reference.Encode(v, ctx, &want).ok());
  std::vector<float> decoded(v.size());
  ASSERT_TRUE(reference.Decode(want, decoded).ok());
  std::vector<float> want_v = v;
  for (size_t i = 0; i < v.size(); ++i) want_v[i] = v[i] - decoded[i];

  std::vector<float> got_v = v;
  std::string got = "stale";
  const absl::Status st = fused.EncodeResidual(got_v, ctx, &got);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(got, want) << "payloads differ";
  ASSERT_EQ(std::memcmp(got_v.data(), want_v.data(), v.size() * sizeof(float)), 0)
      << "the residual is not v - decode(payload)";
}

// Values with zeros and -0 among them.
std::vector<float> WithZeros(std::vector<float> v) {
  for (size_t i = 0; i < v.size(); i += 13) v[i] = (i / 13) % 2 == 0 ? 0.0f : -0.0f;
  return v;
}

// Two codecs of the example spec with the same seed (so stateful codecs see the same
// calls), the slice size, and sparse values of it (3lc's zero runs).
class EncodeChangeTest
    : public ::testing::TestWithParam<std::tuple<testing::ExampleSpec, size_t>> {
 protected:
  void SetUp() override {
    fused_ = MakeOk(std::get<0>(GetParam()).spec, /*seed=*/5);
    reference_ = MakeOk(std::get<0>(GetParam()).spec, /*seed=*/5);
    ASSERT_NE(fused_, nullptr);
    ASSERT_NE(reference_, nullptr);
    sparse_.assign(n_, 0.0f);
    const std::vector<float> g = Gaussian(n_, 77);
    for (size_t i = 0; i < n_; i += 97) sparse_[i] = g[i];
  }

  const size_t n_ = std::get<1>(GetParam());
  std::unique_ptr<Codec> fused_, reference_;
  std::vector<float> sparse_;
};

TEST_P(EncodeChangeTest, MatchesEncodeDecodeThenAdd) {
  std::vector<float> held = HeldValues(n_, static_cast<uint32_t>(n_) + 1);
  for (uint64_t round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::vector<float> change = Gaussian(n_, static_cast<uint32_t>(n_ + 100 * round));
    ExpectSameAsDefinition(*fused_, *reference_, Plus(held, change), &held, round);
  }
  // A sparse change, then none at all.
  ExpectSameAsDefinition(*fused_, *reference_, Plus(held, sparse_), &held, 3);
  ExpectSameAsDefinition(*fused_, *reference_, held, &held, 4);
}

TEST_P(EncodeChangeTest, ResidualMatchesEncodeDecodeThenSubtract) {
  for (uint64_t round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::vector<float> v = WithZeros(Gaussian(n_, static_cast<uint32_t>(n_ + 100 * round)));
    ExpectResidualAsDefinition(*fused_, *reference_, v, round);
  }
  // Sparse values, then none at all.
  ExpectResidualAsDefinition(*fused_, *reference_, sparse_, 3);
  ExpectResidualAsDefinition(*fused_, *reference_, std::vector<float>(n_, -0.0f), 4);
}

INSTANTIATE_TEST_SUITE_P(
    Examples, EncodeChangeTest,
    ::testing::Combine(::testing::ValuesIn(testing::ExampleSpecs()),
                       ::testing::Values<size_t>(0, 1, 7, 4099, 12801)),
    [](const auto& info) { return testing::ExampleName(info); });

// 3lc's fused paths on a default slice and a bit, with CAT's choice of s too.
TEST(EncodeChangeFusedTest, ThreeLcOnLongSlicesMatchesItsDefinition) {
  for (const char* spec : {"3lc", "3lc(s=1.9)", "3lc(s=1.5, level=cat)"}) {
    auto fused = MakeOk(spec);
    auto reference = MakeOk(spec);
    ASSERT_NE(fused, nullptr);
    ASSERT_NE(reference, nullptr);
    for (size_t n : {65536, 65539}) {
      SCOPED_TRACE(absl::StrCat(spec, " n=", n));
      std::vector<float> held = HeldValues(n, 4);
      ExpectSameAsDefinition(*fused, *reference, Plus(held, Gaussian(n, 5)), &held, 0);
      ExpectSameAsDefinition(*fused, *reference, Plus(held, Gaussian(n, 6)), &held, 1);
      ExpectResidualAsDefinition(*fused, *reference, WithZeros(Gaussian(n, 5)), 2);
      ExpectResidualAsDefinition(*fused, *reference, Gaussian(n, 6), 3);
    }
  }
}

// A change that is not finite (x - held overflows, or x holds NaN) is refused as Encode
// refuses it, and neither what is held nor the output changes; so are values with a NaN
// or an Inf given to EncodeResidual, and neither they nor the output change.
TEST(EncodeChangeFusedTest, AChangeThatIsNotFiniteChangesNothing) {
  for (const char* spec : {"3lc", "fp32", "fp16", "int8", "topk(0.3)"}) {
    auto codec = MakeOk(spec);
    ASSERT_NE(codec, nullptr);
    for (size_t n : {64, 20000}) {
      SCOPED_TRACE(absl::StrCat(spec, " n=", n));
      const std::vector<float> held = HeldValues(n, 8);
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), 3e38f}) {
        std::vector<float> x = Plus(held, Gaussian(n, 9));
        x[n / 2] = bad;
        std::vector<float> kept = held;
        if (bad > 0) kept[n / 2] = -3e38f;  // 3e38 - (-3e38) overflows to Inf
        const std::vector<float> before = kept;
        std::string out = "untouched";
        const absl::Status st = codec->EncodeChange(x, kept, EncodeContext{}, &out);
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
        EXPECT_EQ(out, "untouched");
        EXPECT_EQ(std::memcmp(kept.data(), before.data(), n * sizeof(float)), 0);
        // A push with error feedback of NaN, or of Inf where the change overflowed.
        if (bad > 0) x[n / 2] = std::numeric_limits<float>::infinity();
        const std::vector<float> v = x;
        const absl::Status residual = codec->EncodeResidual(x, EncodeContext{}, &out);
        EXPECT_EQ(residual.code(), absl::StatusCode::kInvalidArgument) << residual;
        EXPECT_EQ(out, "untouched");
        EXPECT_EQ(std::memcmp(x.data(), v.data(), n * sizeof(float)), 0);
      }
    }
  }
  auto codec = MakeOk("3lc");
  std::vector<float> held(3);
  std::string out;
  EXPECT_EQ(codec->EncodeChange(std::vector<float>(4), held, EncodeContext{}, &out).code(),
            absl::StatusCode::kInvalidArgument);
  // A copy of another size than what is held.
  for (const char* spec : {"3lc", "fp16"}) {
    auto c = MakeOk(spec);
    std::vector<float> copy(2);
    EXPECT_EQ(c->EncodeChange(std::vector<float>(3), held, EncodeContext{}, &out, copy).code(),
              absl::StatusCode::kInvalidArgument)
        << spec;
  }
}

}  // namespace
}  // namespace ps::codecs
