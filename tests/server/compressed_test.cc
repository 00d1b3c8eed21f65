// Compressed-domain aggregation in a shard: random-k pushes with one global seed are
// aggregated on their shared support, sign pushes by a vote on packed bits; both give
// what the same shard gives for the decoded pushes sent as fp32.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "absl/synchronization/notification.h"
#include "codecs/codec.h"
#include "server/shard.h"

namespace ps::server {
namespace {

constexpr uint32_t kCompressedNumel = 1000;
constexpr uint32_t kCompressedWorkers = 5;

class CompressedShard {
 public:
  explicit CompressedShard(const std::string& rule) {
    ServerOptions o;
    o.num_workers = kCompressedWorkers;
    o.num_byzantine = 1;
    o.aggregate_only = true;
    o.round_deadline = std::chrono::milliseconds(10000);
    aggregators::AggregatorOptions a;
    a.num_workers = kCompressedWorkers;
    a.num_byzantine = 1;
    auto agg = aggregators::MakeAggregator(rule, a);
    EXPECT_TRUE(agg.ok()) << agg.status();
    shard_ = std::make_unique<Shard>(o, 0, *std::move(agg), &clock_, &pool_);
    auto layout = core::ModelLayout::Create({{"w", kCompressedNumel, 0}}, kCompressedNumel, 1);
    EXPECT_TRUE(layout.ok());
    hash_ = layout->hash();
    for (uint32_t w = 0; w < kCompressedWorkers; ++w) EXPECT_TRUE(shard_->Join(w, hash_).ok());
    EXPECT_TRUE(shard_->RegisterLayout(0, *layout).ok());
  }

  // Pushes round 0 from every worker and returns the published aggregate.
  std::vector<float> Round(const std::vector<std::string>& codec,
                           const std::vector<std::string>& payload) {
    for (uint32_t w = 0; w < kCompressedWorkers; ++w) {
      const absl::Status st = shard_->Push(w, hash_, 0, 0, codec[w], payload[w]);
      EXPECT_TRUE(st.ok()) << st;
    }
    absl::Notification done;
    shard_->Watch(0, 1, [&](bool) { done.Notify(); });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    SliceSnapshot snap = shard_->Snapshot(0);
    std::vector<float> v(snap.values->size() / 4);
    std::memcpy(v.data(), snap.values->data(), snap.values->size());
    return v;
  }
  ShardStats stats() const { return shard_->stats(); }

 private:
  core::ManualClock clock_;
  core::ThreadPool pool_{2};
  std::unique_ptr<Shard> shard_;
  uint64_t hash_ = 0;
};

struct Pushes {
  std::vector<std::string> codec, payload;          // compressed
  std::vector<std::string> fp32_codec, fp32_payload;  // the same values, decoded, as fp32
};

Pushes Encode(const std::vector<std::string>& specs) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  Pushes p;
  auto fp32 = codecs::MakeCodec("fp32");
  for (uint32_t w = 0; w < kCompressedWorkers; ++w) {
    std::vector<float> g(kCompressedNumel);
    for (float& x : g) x = normal(rng) + (w == kCompressedWorkers - 1 ? -20.0f : 0.0f);
    auto codec = codecs::MakeCodec(specs[w]);
    EXPECT_TRUE(codec.ok()) << codec.status();
    codecs::EncodeContext ctx;
    ctx.worker_id = w;
    std::string bytes;
    EXPECT_TRUE((*codec)->Encode(g, ctx, &bytes).ok());
    std::vector<float> decoded(kCompressedNumel);
    EXPECT_TRUE((*codec)->Decode(bytes, decoded).ok());
    std::string dense;
    EXPECT_TRUE((*fp32)->Encode(decoded, &dense).ok());
    p.codec.emplace_back((*codec)->spec());
    p.payload.push_back(bytes);
    p.fp32_codec.emplace_back("fp32");
    p.fp32_payload.push_back(dense);
  }
  return p;
}

class SupportShardTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SupportShardTest, GlobalSeedRandomKAggregatesOnTheSupportLikeTheDensePath) {
  const Pushes p = Encode(std::vector<std::string>(kCompressedWorkers, "randk(0.1, seed=42)"));
  CompressedShard compressed(GetParam()), dense(GetParam());
  const std::vector<float> got = compressed.Round(p.codec, p.payload);
  const std::vector<float> want = dense.Round(p.fp32_codec, p.fp32_payload);
  ASSERT_EQ(got.size(), want.size());
  for (size_t c = 0; c < got.size(); ++c) ASSERT_EQ(got[c], want[c]) << c;
  // Model scope counts the Gram step and the apply step.
  EXPECT_GE(compressed.stats().aggregations_on_support, 1u);
  EXPECT_EQ(dense.stats().aggregations_on_support, 0u);
}

INSTANTIATE_TEST_SUITE_P(Rules, SupportShardTest,
                         ::testing::Values("median", "trimmed_mean", "krum", "nnm+mean"));

TEST(CompressedShardTest, OneWorkerWithAnotherSeedFallsBackToTheDensePath) {
  std::vector<std::string> specs(kCompressedWorkers, "randk(0.1, seed=42)");
  specs[2] = "randk(0.1, seed=43)";
  const Pushes p = Encode(specs);
  CompressedShard compressed("trimmed_mean"), dense("trimmed_mean");
  EXPECT_EQ(compressed.Round(p.codec, p.payload), dense.Round(p.fp32_codec, p.fp32_payload));
  EXPECT_EQ(compressed.stats().aggregations_on_support, 0u);
}

TEST(CompressedShardTest, SignPushesAreVotedOnPackedBitsLikeTheDenseRule) {
  const Pushes p = Encode(std::vector<std::string>(kCompressedWorkers, "sign"));
  CompressedShard compressed("sign_majority"), dense("sign_majority");
  const std::vector<float> got = compressed.Round(p.codec, p.payload);
  EXPECT_EQ(got, dense.Round(p.fp32_codec, p.fp32_payload));
  EXPECT_EQ(compressed.stats().sign_votes, 1u);
  EXPECT_EQ(dense.stats().sign_votes, 0u);
  size_t nonzero = 0;
  for (float v : got) nonzero += v != 0;
  EXPECT_GT(nonzero, kCompressedNumel / 2);
}

}  // namespace
}  // namespace ps::server
