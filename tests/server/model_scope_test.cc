// Model scope across shards, without the network: 1, 2 and 3 Shard objects over one
// layout, each handing its round share straight to the others' AcceptShare(). The
// published aggregate must equal the rule applied to the whole gradients at once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/synchronization/notification.h"
#include "codecs/codec.h"
#include "core/fp32_bytes.h"
#include "server/shard.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kScopeWorkers = 7;
constexpr uint32_t kByzantine = 1;

class ModelScopeShardTest : public ::testing::Test {
 protected:
  // Makes `shards` shards in aggregate-only mode (the published values are the
  // aggregate) over a model of three tensors cut into slices of 8.
  void Make(uint32_t shards, const std::string& rule,
            AggregationScope scope = AggregationScope::kModel) {
    auto layout = core::ModelLayout::Create({{"a", 20, 0}, {"b", 9, 1}, {"c", 13, 2}}, 8, shards);
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_ = std::make_unique<core::ModelLayout>(*layout);
    aggregators::AggregatorOptions a;
    a.num_workers = kScopeWorkers;
    a.num_byzantine = kByzantine;
    for (uint32_t i = 0; i < shards; ++i) {
      ServerOptions o;
      o.num_workers = kScopeWorkers;
      o.num_byzantine = kByzantine;
      o.num_shards = shards;
      o.shard_id = static_cast<int>(i);
      o.aggregate_only = true;
      o.aggregator = rule;
      o.aggregation_scope = scope;
      o.round_deadline = std::chrono::milliseconds(100);
      o.peer_timeout = std::chrono::milliseconds(1000);
      auto agg = aggregators::MakeAggregator(rule, a);
      ASSERT_TRUE(agg.ok()) << agg.status();
      shards_.push_back(std::make_unique<Shard>(o, i, *std::move(agg), &clock_, &pool_));
    }
    for (uint32_t i = 0; i < shards; ++i) {
      shards_[i]->SetShareSender([this, i](std::shared_ptr<const RoundShare> share) {
        if (!deliver_) return;
        for (uint32_t j = 0; j < shards_.size(); ++j) {
          if (j != i) {
            EXPECT_TRUE(shards_[j]->AcceptShare(*share).ok());
          }
        }
      });
      for (uint32_t w = 0; w < kScopeWorkers; ++w) ASSERT_TRUE(shards_[i]->Join(w, layout_->hash()).ok());
      ASSERT_TRUE(shards_[i]->RegisterLayout(0, *layout_).ok());
    }
  }

  // Pushes worker w's whole gradient `g` for `round` to every slice (skipping `skip`).
  void PushAll(uint32_t w, uint64_t round, const std::vector<float>& g, int skip = -1) {
    auto codec = codecs::MakeCodec("fp32");
    for (const core::SliceInfo& s : layout_->slices()) {
      if (static_cast<int>(s.id) == skip) continue;
      const uint64_t begin = Offset(s);
      std::string payload;
      ASSERT_TRUE((*codec)->Encode(std::span<const float>(g.data() + begin, s.numel), &payload).ok());
      ASSERT_TRUE(shards_[s.shard]->Push(w, layout_->hash(), round, s.id, "fp32", payload).ok())
          << "worker " << w << " slice " << s.id;
    }
  }

  uint64_t Offset(const core::SliceInfo& s) const {
    uint64_t base = 0;
    for (uint32_t t = 0; t < s.tensor; ++t) base += layout_->tensors()[t].numel;
    return base + s.offset;
  }

  // Waits (bounded) for every slice to publish `version` and returns the whole vector.
  std::vector<float> Await(uint64_t version) {
    std::vector<float> out(layout_->total_elems());
    for (const core::SliceInfo& s : layout_->slices()) {
      auto done = std::make_shared<absl::Notification>();
      shards_[s.shard]->Watch(s.id, version, [done](bool) { done->Notify(); });
      EXPECT_TRUE(done->WaitForNotificationWithTimeout(absl::Seconds(10))) << "slice " << s.id;
      const SliceSnapshot snap = shards_[s.shard]->Snapshot(s.id);
      EXPECT_EQ(snap.version, version);
      std::memcpy(out.data() + Offset(s), snap.values->data(), snap.values->size());
    }
    return out;
  }

  std::vector<std::vector<float>> Gradients(uint64_t seed) const {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> noise(0.0f, 0.3f);
    std::vector<std::vector<float>> g(kScopeWorkers, std::vector<float>(layout_->total_elems()));
    for (auto& v : g) {
      for (size_t c = 0; c < v.size(); ++c) v[c] = 1.0f + 0.01f * static_cast<float>(c) + noise(rng);
    }
    // Worker 2 attacks on the first tensor only: per slice it can look honest elsewhere.
    for (size_t c = 0; c < 20; ++c) g[2][c] = -8.0f;
    return g;
  }

  static std::vector<float> Reference(const std::string& rule, const std::vector<std::vector<float>>& g,
                                      std::vector<float>* state) {
    aggregators::AggregatorOptions a;
    a.num_workers = kScopeWorkers;
    a.num_byzantine = kByzantine;
    auto agg = aggregators::MakeAggregator(rule, a);
    EXPECT_TRUE(agg.ok());
    std::vector<const float*> p;
    for (const auto& v : g) p.push_back(v.data());
    std::vector<float> out(g[0].size());
    aggregators::AggregationContext ctx;
    if ((*agg)->StateRows() > 0) ctx.state = *state;
    EXPECT_TRUE((*agg)->Aggregate(p, out, ctx).ok());
    return out;
  }

  core::ManualClock clock_;
  core::ThreadPool pool_{2};
  std::unique_ptr<core::ModelLayout> layout_;
  std::vector<std::unique_ptr<Shard>> shards_;
  bool deliver_ = true;
};

TEST_F(ModelScopeShardTest, ShardedRoundsEqualTheRuleOnWholeGradients) {
  for (const std::string rule : {"krum", "multi_krum", "bulyan(neighbours=byzfl)", "geometric_median",
                                 "centered_clipping(tau=1)", "nnm+trimmed_mean", "mda"}) {
    for (uint32_t shards = 1; shards <= 3; ++shards) {
      shards_.clear();
      Make(shards, rule);
      ASSERT_TRUE(shards_[0]->model_scope()) << rule;
      std::vector<float> state(layout_->total_elems(), 0.0f);
      for (uint64_t round = 0; round < 3; ++round) {
        const auto g = Gradients(round + 10);
        for (uint32_t w = 0; w < kScopeWorkers; ++w) PushAll(w, round, g[w]);
        const std::vector<float> got = Await(round + 1);
        const std::vector<float> want = Reference(rule, g, &state);
        for (size_t c = 0; c < got.size(); ++c) {
          ASSERT_NEAR(got[c], want[c], 1e-5 * std::max(1.0f, std::abs(want[c])))
              << rule << " shards " << shards << " round " << round << " at " << c;
        }
      }
      for (const auto& s : shards_) EXPECT_EQ(s->stats().model_rounds, 3u) << rule;
    }
  }
}

TEST_F(ModelScopeShardTest, DefaultQuorumIsRaisedToTheRulesBound) {
  Make(1, "bulyan");  // n = 7, f = 1: n - f = 6 is below 4f + 3 = 7
  EXPECT_EQ(shards_[0]->quorum(), 7u);
  shards_.clear();
  Make(1, "krum");  // 2f + 3 = 5 <= n - f = 6
  EXPECT_EQ(shards_[0]->quorum(), 6u);
}

TEST_F(ModelScopeShardTest, BulyanAcrossThreeShards) {
  // n = 7 = 4f + 3 with f = 1.
  Make(3, "bulyan");
  const auto g = Gradients(3);
  for (uint32_t w = 0; w < kScopeWorkers; ++w) PushAll(w, 0, g[w]);
  const std::vector<float> got = Await(1);
  std::vector<float> none;
  const std::vector<float> want = Reference("bulyan", g, &none);
  for (size_t c = 0; c < got.size(); ++c) ASSERT_NEAR(got[c], want[c], 1e-5) << c;
}

TEST_F(ModelScopeShardTest, SliceScopeLetsAPartialAttackerThrough) {
  // Per slice, worker 2 is an outlier only on tensor "a"; Krum in slice scope picks a
  // different worker per slice, in model scope one worker for the whole model.
  Make(2, "krum", AggregationScope::kSlice);
  EXPECT_FALSE(shards_[0]->model_scope());
  const auto g = Gradients(5);
  for (uint32_t w = 0; w < kScopeWorkers; ++w) PushAll(w, 0, g[w]);
  const std::vector<float> slice_scope = Await(1);
  std::vector<float> none;
  const std::vector<float> model = Reference("krum", g, &none);
  EXPECT_NE(slice_scope, model);
}

TEST_F(ModelScopeShardTest, AWorkerMissingFromOneSliceIsLeftOutEverywhere) {
  Make(2, "multi_krum");
  const auto g = Gradients(7);
  for (uint32_t w = 0; w < kScopeWorkers; ++w) PushAll(w, 0, g[w], w == 6 ? 3 : -1);
  // Slice 3 waits for worker 6 until its deadline, then closes with the quorum of 6.
  clock_.Advance(std::chrono::milliseconds(200));
  for (const auto& s : shards_) s->Tick(clock_.Now());
  const std::vector<float> got = Await(1);
  std::vector<std::vector<float>> six(g.begin(), g.begin() + 6);
  aggregators::AggregatorOptions a;
  a.num_workers = kScopeWorkers;
  a.num_byzantine = kByzantine;
  auto agg = aggregators::MakeAggregator("multi_krum", a);
  std::vector<const float*> p;
  for (const auto& v : six) p.push_back(v.data());
  std::vector<float> want(got.size());
  ASSERT_TRUE((*agg)->Aggregate(p, want, {}).ok());
  for (size_t c = 0; c < got.size(); ++c) ASSERT_NEAR(got[c], want[c], 1e-5) << c;
}

TEST_F(ModelScopeShardTest, AMissingPeerShareDropsTheRoundAfterThePeerTimeout) {
  Make(2, "krum");
  deliver_ = false;
  const auto g = Gradients(9);
  for (uint32_t w = 0; w < kScopeWorkers; ++w) PushAll(w, 0, g[w]);
  // Nothing is published while the shares are missing.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (const auto& s : shards_) EXPECT_EQ(s->MinVersion(), 0u);
  ASSERT_TRUE(shards_[0]->NextDeadline().has_value());
  clock_.Advance(std::chrono::milliseconds(1001));
  for (const auto& s : shards_) s->Tick(clock_.Now());
  // Dropped: version 1 is published with a zero aggregate, and the next round works.
  const std::vector<float> dropped = Await(1);
  EXPECT_THAT(dropped, ::testing::Each(0.0f));
  for (const auto& s : shards_) EXPECT_EQ(s->stats().model_rounds_dropped, 1u);
  deliver_ = true;
  for (uint32_t w = 0; w < kScopeWorkers; ++w) PushAll(w, 1, g[w]);
  std::vector<float> none;
  const std::vector<float> want = Reference("krum", g, &none);
  const std::vector<float> got = Await(2);
  for (size_t c = 0; c < got.size(); ++c) ASSERT_NEAR(got[c], want[c], 1e-5) << c;
}

TEST_F(ModelScopeShardTest, HostileSharesAreRefused) {
  Make(2, "krum");
  Shard& s = *shards_[0];
  RoundShare good;
  good.layout_hash = layout_->hash();
  good.shard_id = 1;
  good.round = 0;
  good.participants = {0, 1, 2};
  good.gram.assign(9, 1.0);
  auto refused = [&](RoundShare share, const std::string& why) {
    absl::Status st = s.AcceptShare(share);
    EXPECT_FALSE(st.ok()) << why;
    EXPECT_THAT(std::string(st.message()), HasSubstr(why));
  };
  RoundShare bad = good;
  bad.layout_hash ^= 1;
  refused(bad, "share for layout");
  bad = good;
  bad.shard_id = 0;
  refused(bad, "share from shard 0");
  bad.shard_id = 7;
  refused(bad, "share from shard 7");
  bad = good;
  bad.participants = {0, 2, 1};
  refused(bad, "increasing");
  bad.participants = {0, 1, 99};
  refused(bad, "increasing");
  bad = good;
  bad.gram.resize(8);
  refused(bad, "Gram matrix of 8 values for 3 rows");
  bad = good;
  bad.gram[4] = std::numeric_limits<double>::quiet_NaN();
  refused(bad, "not finite");
  bad = good;
  bad.round = 5;
  refused(bad, "share of round 5");
  EXPECT_TRUE(s.AcceptShare(good).ok());
  refused(good, "second share");
  EXPECT_EQ(s.stats().shares_refused, 9u);
}

}  // namespace
}  // namespace ps::server
