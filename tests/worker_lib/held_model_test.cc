#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "codecs/codec.h"
#include "core/fp32_bytes.h"
#include "worker_lib/held_model_internal.h"

namespace ps::internal {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kEpoch = 0x1234;

class HeldModelTest : public ::testing::Test {
 protected:
  HeldModelTest() : layout_(*core::ModelLayout::Create({{"w", 6, 0}}, 3, 1)), held_(layout_) {}

  // A PullFrame over `bytes`, which must outlive it.
  static net::PullFrame Frame(uint32_t id, uint64_t version, const std::string& bytes,
                              const std::string& codec = "", uint64_t base = 0,
                              uint64_t epoch = kEpoch) {
    net::PullFrame f;
    f.slice_id = id;
    f.version = version;
    f.values.Append(std::string_view(bytes).substr(0, bytes.size() / 2));
    f.values.Append(std::string_view(bytes).substr(bytes.size() / 2));
    f.codec.Append(codec);
    f.base_version = base;
    f.epoch = epoch;
    return f;
  }
  static std::string Dense(std::vector<float> v) {
    std::string out;
    core::AppendFp32(v, &out);
    return out;
  }
  static std::string Fp32Change(std::vector<float> v) { return "\x01" + Dense(v); }

  core::ModelLayout layout_;
  HeldModel held_;
};

TEST_F(HeldModelTest, DenseValuesGoToTheCallerAndAreKeptOnlyWithAnEpoch) {
  float dst[3];
  const std::string bytes = Dense({1, 2, 3});
  ASSERT_TRUE(held_.Apply(Frame(0, 4, bytes, "", 0, /*epoch=*/0), dst).ok());
  EXPECT_EQ(dst[2], 3.0f);
  PullAsk ask;
  ask.slice_ids.push_back(0);
  held_.Describe(ask);
  EXPECT_EQ(ask.held_versions.size(), 0u) << "nothing kept without an epoch";
  ASSERT_TRUE(held_.Apply(Frame(0, 4, bytes), dst).ok());
  ask.slice_ids.push_back(1);
  held_.Describe(ask);
  EXPECT_EQ(ask.held_epoch, kEpoch);
  ASSERT_EQ(ask.held_versions.size(), 2u);
  EXPECT_EQ(ask.held_versions[0], 4u);
  EXPECT_EQ(ask.held_versions[1], 0u);
}

TEST_F(HeldModelTest, AChangeIsAddedToWhatIsHeldOnce) {
  float dst[3];
  const std::string base = Dense({1, 2, 3});
  ASSERT_TRUE(held_.Apply(Frame(0, 4, base), dst).ok());
  const std::string change = Fp32Change({0.5f, -1, 0.25f});
  ASSERT_TRUE(held_.Apply(Frame(0, 5, change, "fp32", 4), dst).ok());
  EXPECT_EQ(dst[0], 1.5f);
  EXPECT_EQ(dst[1], 1.0f);
  EXPECT_EQ(dst[2], 3.25f);
  // The same change again (a second pull of version 5): what is held, not applied twice.
  float again[3];
  ASSERT_TRUE(held_.Apply(Frame(0, 5, change, "fp32", 4), again).ok());
  EXPECT_EQ(std::memcmp(dst, again, sizeof(dst)), 0);
}

// Refusals before the change is decoded (another version or epoch, a codec spec that
// names none) keep what is held; a change decoded and refused (malformed, or a sum that
// is not finite) drops it, so the next pull asks for the slice's values whole.
TEST_F(HeldModelTest, ChangesThatCannotApplyAreRefusedWithTheirReason) {
  float dst[3] = {7, 7, 7};
  const auto held_version = [this] {
    PullAsk ask;
    ask.slice_ids.push_back(0);
    held_.Describe(ask);
    return ask.held_versions.empty() ? uint64_t{0} : ask.held_versions[0];
  };
  const std::string change = Fp32Change({1, 1, 1});
  absl::Status s = held_.Apply(Frame(0, 5, change, "fp32", 4), dst);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("does not hold"));
  ASSERT_TRUE(held_.Apply(Frame(0, 4, Dense({1, 2, 3})), dst).ok());
  s = held_.Apply(Frame(0, 7, change, "fp32", 6), dst);
  EXPECT_THAT(s.message(), HasSubstr("applies to version 6; held: 4"));
  s = held_.Apply(Frame(0, 5, change, "fp32", 4, kEpoch + 1), dst);
  EXPECT_THAT(s.message(), HasSubstr("another epoch"));
  s = held_.Apply(Frame(0, 5, change, "nonsense(", 4), dst);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(held_version(), 4u) << "nothing was decoded: what is held stays";

  s = held_.Apply(Frame(0, 5, "\x01\x02", "fp32", 4), dst);
  EXPECT_THAT(s.message(), HasSubstr("compressed slice 0 (version 5 from 4, codec fp32)"));
  EXPECT_THAT(s.message(), HasSubstr("fp32: payload is 2 bytes"));
  EXPECT_EQ(held_version(), 0u) << "a refused change drops what is held";
  s = held_.Apply(Frame(0, 5, change, "fp32", 4), dst);
  EXPECT_THAT(s.message(), HasSubstr("does not hold"));

  ASSERT_TRUE(held_.Apply(Frame(0, 4, Dense({1, 2, 3})), dst).ok());
  const std::string huge = Fp32Change({3e38f, 3e38f, 3e38f});
  ASSERT_TRUE(held_.Apply(Frame(0, 5, huge, "fp32", 4), dst).ok());
  s = held_.Apply(Frame(0, 6, huge, "fp32", 5), dst);
  EXPECT_THAT(s.message(), HasSubstr("not finite once the change is applied"));
  EXPECT_EQ(held_version(), 0u);
  // The values whole again, then changes on top of them.
  ASSERT_TRUE(held_.Apply(Frame(0, 5, Dense({1, 2 + 3e38f, 3})), dst).ok());
  ASSERT_TRUE(held_.Apply(Frame(0, 6, Fp32Change({-3e38f, -3e38f, -3e38f}), "fp32", 5), dst).ok());
  volatile float expected = 2.0f;  // the held value's path, in fp32
  expected = expected + 3e38f;
  expected = expected + -3e38f;
  EXPECT_EQ(dst[1], expected);
  s = held_.Apply(Frame(0, 8, Dense({1, 2}), "", 0), dst);
  EXPECT_THAT(s.message(), HasSubstr("8 bytes of values for 3 elements"));
}

// 3lc changes on a slice long enough for the codec's fused branch-free path: each
// applied change gives, bit for bit, what the shard holds (decode, then AddInto), in the
// caller's buffer and in what is held (the next change applies on top of it); a change
// that overflows is refused with the first such value's index and drops what is held,
// and the values whole take up again from there.
TEST(HeldModel3lcTest, ChangesApplyAsOnTheShardAndARefusalDropsWhatIsHeld) {
  constexpr size_t kN = 5003;
  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", kN, 0}}, 8192, 1);
  HeldModel held(layout);
  auto codec = *codecs::MakeCodec("3lc");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto frame = [](uint64_t version, const std::string& bytes, const std::string& codec,
                  uint64_t base) {
    net::PullFrame f;
    f.slice_id = 0;
    f.version = version;
    f.values.Append(std::string_view(bytes).substr(0, 7));  // a cut inside the header
    f.values.Append(std::string_view(bytes).substr(7));
    f.codec.Append(codec);
    f.base_version = base;
    f.epoch = kEpoch;
    return f;
  };

  std::vector<float> shard(kN);  // what the shard holds
  for (size_t i = 0; i < kN; ++i) shard[i] = i % 5 == 0 ? -0.0f : normal(rng);
  shard[100] = 3e38f;
  std::string bytes;
  core::AppendFp32(shard, &bytes);
  std::vector<float> dst(kN);
  ASSERT_TRUE(held.Apply(frame(1, bytes, "", 0), dst.data()).ok());

  // The next change, as the shard makes it: encoded, decoded and added.
  auto next_change = [&](float largest) {
    std::vector<float> x(kN);
    for (float& v : x) v = normal(rng);
    x[rng() % kN] = largest;
    std::string payload;
    EXPECT_TRUE(codec->Encode(x, &payload).ok());
    std::vector<float> change(kN);
    EXPECT_TRUE(codec->Decode(payload, change).ok());
    return std::make_pair(payload, change);
  };
  for (uint64_t v = 2; v <= 4; ++v) {
    auto [payload, change] = next_change(5.0f);
    core::AddInto(shard, change);
    ASSERT_TRUE(held.Apply(frame(v, payload, "3lc", v - 1), dst.data()).ok());
    ASSERT_EQ(std::memcmp(dst.data(), shard.data(), kN * sizeof(float)), 0) << "version " << v;
  }

  // A change whose scale carries value 100 (3e38) past FLT_MAX: value 100 is the first
  // non-finite sum (the change is +scale there: x[100] is the largest).
  std::vector<float> x(kN, 0.0f);
  x[100] = 1e38f;
  x[4000] = -1e38f;
  std::string huge;
  ASSERT_TRUE(codec->Encode(x, &huge).ok());
  const absl::Status refused = held.Apply(frame(5, huge, "3lc", 4), dst.data());
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              HasSubstr("compressed slice 0 (version 5 from 4, codec 3lc): value 100 is "
                        "not finite once the change is applied"));
  PullAsk ask;
  ask.slice_ids.push_back(0);
  held.Describe(ask);
  EXPECT_TRUE(ask.held_versions.empty()) << "nothing is held any more";

  // Version 5 from what the shard holds (unchanged by the refusal) is refused; the
  // shard's values whole are held again, and the next change applies on top of them.
  auto [payload, change] = next_change(-2.0f);
  core::AddInto(shard, change);
  EXPECT_THAT(held.Apply(frame(5, payload, "3lc", 4), dst.data()).message(),
              HasSubstr("does not hold"));
  bytes.clear();
  core::AppendFp32(shard, &bytes);
  ASSERT_TRUE(held.Apply(frame(5, bytes, "", 0), dst.data()).ok());
  auto [payload6, change6] = next_change(3.0f);
  core::AddInto(shard, change6);
  ASSERT_TRUE(held.Apply(frame(6, payload6, "3lc", 5), dst.data()).ok());
  EXPECT_EQ(std::memcmp(dst.data(), shard.data(), kN * sizeof(float)), 0);
}

}  // namespace
}  // namespace ps::internal
