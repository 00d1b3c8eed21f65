// Mid-run adoption of one worker's values (server/adoption.h): the votes alone, and the
// shard's Adopt / AdoptSlice with a manual clock (no network).
#include "server/adoption.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/synchronization/notification.h"
#include "codecs/codec.h"
#include "core/fp32_bytes.h"
#include "core/refusal.h"
#include "server/shard.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(AdoptionVotesTest, PassesAtTheQuorumOfTheSameRoundAndRoot) {
  Adoption a(/*num_workers=*/4, /*quorum=*/3);
  EXPECT_FALSE(a.Vote(3, 5, /*root=*/3).passed);  // a lone worker naming itself
  EXPECT_FALSE(a.Vote(0, 5, 0).passed);
  EXPECT_FALSE(a.Vote(1, 5, 0).passed);
  EXPECT_FALSE(a.Vote(2, 4, 0).passed) << "another round is another question";
  EXPECT_FALSE(a.passed().has_value());
  const Adoption::Tally t = a.Vote(2, 5, 0);  // its later vote replaces the earlier
  EXPECT_TRUE(t.passed && t.now);
  EXPECT_EQ(t.votes, 3u);
  EXPECT_EQ(t.quorum, 3u);
  ASSERT_TRUE(a.passed().has_value());
  EXPECT_EQ(a.passed()->round, 5u);
  EXPECT_EQ(a.passed()->root, 0u);
  // Repeating a vote of the passed adoption says so without passing it again.
  const Adoption::Tally again = a.Vote(0, 5, 0);
  EXPECT_TRUE(again.passed);
  EXPECT_FALSE(again.now);
  EXPECT_FALSE(a.Done(4)) << "an earlier round is not the passed one";
  EXPECT_TRUE(a.Done(5));
  EXPECT_FALSE(a.Done(5)) << "only the first caller forgets it";
  EXPECT_FALSE(a.passed().has_value());
  // The votes of round 5 went with it: one more vote is one vote.
  EXPECT_EQ(a.Vote(1, 5, 0).votes, 1u);
}

TEST(AdoptionVotesTest, TheQuorumIsNeverBelowNMinusFOrFPlusOne) {
  EXPECT_EQ(Adoption::QuorumFor(4, 1, 3), 3u);
  EXPECT_EQ(Adoption::QuorumFor(4, 1, 1), 3u) << "a --quorum of 1 does not lower it";
  EXPECT_EQ(Adoption::QuorumFor(7, 2, 6), 6u) << "a higher round quorum (the rule's) holds";
  EXPECT_EQ(Adoption::QuorumFor(3, 2, 1), 3u) << "f + 1 when n - f is less";
  EXPECT_EQ(Adoption::QuorumFor(1, 0, 1), 1u);
}

TEST(AdoptionVotesTest, AWorkerCountsOnceHoweverOftenItVotes) {
  Adoption a(3, 2);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(a.Vote(1, 0, 1).passed);
  EXPECT_EQ(a.Vote(1, 0, 1).votes, 1u);
}

class ShardAdoptionTest : public ::testing::Test {
 protected:
  // n workers, f Byzantine, SGD with lr 1 and `momentum`; slices "w" (4 values, slice 0)
  // and "b" (2 values, slice 1); every worker joined.
  void Make(uint32_t n, uint32_t f, float momentum, bool aggregate_only = false,
            std::string pull_codec = "") {
    ServerOptions o;
    o.num_workers = n;
    o.num_byzantine = f;
    o.learning_rate = 1.0f;
    o.momentum = momentum;
    o.aggregate_only = aggregate_only;
    o.pull_codec = std::move(pull_codec);
    o.round_deadline = std::chrono::milliseconds(100);
    aggregators::AggregatorOptions a;
    a.num_workers = static_cast<int>(n);
    a.num_byzantine = static_cast<int>(f);
    auto rule = aggregators::MakeAggregator("mean", a);
    ASSERT_TRUE(rule.ok()) << rule.status();
    shard_ = std::make_unique<Shard>(o, 0, *std::move(rule), &clock_, &pool_);
    auto layout = core::ModelLayout::Create({{"w", 4, 0}, {"b", 2, 1}}, 4, 1);
    ASSERT_TRUE(layout.ok());
    hash_ = layout->hash();
    for (uint32_t w = 0; w < n; ++w) ASSERT_TRUE(shard_->Join(w, hash_).ok());
    ASSERT_TRUE(shard_->RegisterLayout(0, *layout).ok());
    if (!aggregate_only) {
      ASSERT_TRUE(shard_->InitSlice(0, hash_, 0, Bytes({1, 1, 1, 1})).ok());
      ASSERT_TRUE(shard_->InitSlice(0, hash_, 1, Bytes({0, 0})).ok());
    }
  }

  static std::string Bytes(std::vector<float> v) {
    std::string s;
    core::AppendFp32(v, &s);
    return s;
  }

  absl::Status Push(uint32_t worker, uint64_t round, uint32_t slice, std::vector<float> g) {
    auto codec = codecs::MakeCodec("fp32");
    std::string payload;
    EXPECT_TRUE((*codec)->Encode(g, &payload).ok());
    return shard_->Push(worker, hash_, round, slice, "fp32", payload);
  }

  // Every worker pushes `g` (scaled to the slice) to both slices of `round`.
  void Round(uint64_t round, uint32_t n, float g) {
    for (uint32_t w = 0; w < n; ++w) {
      ASSERT_TRUE(Push(w, round, 0, {g, g, g, g}).ok());
      ASSERT_TRUE(Push(w, round, 1, {g, g}).ok());
    }
    Await(round + 1, 0);
    Await(round + 1, 1);
  }

  std::vector<float> Await(uint64_t version, uint32_t slice) {
    auto done = std::make_shared<absl::Notification>();
    shard_->Watch(slice, version, [done](bool) { done->Notify(); });
    EXPECT_TRUE(done->WaitForNotificationWithTimeout(absl::Seconds(10)));
    const SliceSnapshot snap = shard_->Snapshot(slice);
    EXPECT_EQ(snap.version, version);
    std::vector<float> v(snap.values->size() / 4);
    std::memcpy(v.data(), snap.values->data(), snap.values->size());
    return v;
  }

  static std::optional<core::Refusal> Kind(const absl::Status& st) { return core::RefusalOf(st); }

  core::ManualClock clock_;
  core::ThreadPool pool_{2};
  std::unique_ptr<Shard> shard_;
  uint64_t hash_ = 0;
};

TEST_F(ShardAdoptionTest, TheQuorumAdoptsTheRootsValuesAndTheOptimizerStartsAfresh) {
  Make(/*n=*/4, /*f=*/1, /*momentum=*/0.5f);  // quorum 3
  ASSERT_EQ(shard_->adoption_quorum(), 3u);
  Round(0, 4, 1.0f);  // w = 1 - 1 = 0, momentum buffer 1
  // The Byzantine worker pushes into the open round, votes for itself, tries to upload.
  ASSERT_TRUE(Push(3, 1, 0, {9, 9, 9, 9}).ok());
  absl::StatusOr<Adoption::Tally> lone = shard_->Adopt(3, hash_, 1, 3);
  ASSERT_TRUE(lone.ok()) << lone.status();
  EXPECT_FALSE(lone->passed);
  EXPECT_EQ(lone->votes, 1u);
  absl::Status forged = shard_->AdoptSlice(3, hash_, 1, 0, Bytes({7, 7, 7, 7}));
  EXPECT_EQ(Kind(forged), core::Refusal::kPermissionDenied);
  EXPECT_THAT(forged.message(), HasSubstr("no adoption passed (it takes 3 workers' votes)"));
  // The root alone, before its vote passed, may not either.
  ASSERT_TRUE(shard_->Adopt(0, hash_, 1, 0).ok());
  EXPECT_EQ(Kind(shard_->AdoptSlice(0, hash_, 1, 0, Bytes({7, 7, 7, 7}))),
            core::Refusal::kPermissionDenied);
  ASSERT_FALSE(shard_->Adopt(1, hash_, 1, 0)->passed);
  const absl::StatusOr<Adoption::Tally> third = shard_->Adopt(2, hash_, 1, 0);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->passed);
  // Passed for worker 0: the Byzantine worker still may not upload.
  forged = shard_->AdoptSlice(3, hash_, 1, 0, Bytes({7, 7, 7, 7}));
  EXPECT_EQ(Kind(forged), core::Refusal::kPermissionDenied);
  EXPECT_THAT(forged.message(), HasSubstr("the adoption that passed is worker 0's at round 1"));
  // The root's values: checked like an initial value.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Kind(shard_->AdoptSlice(0, hash_, 1, 0, Bytes({5, nan, 5, 5}))),
            core::Refusal::kMalformed);
  EXPECT_EQ(Kind(shard_->AdoptSlice(0, hash_, 1, 0, Bytes({5, 5}))), core::Refusal::kMalformed);
  ASSERT_TRUE(shard_->AdoptSlice(0, hash_, 1, 0, Bytes({5, 5, 5, 5})).ok());
  EXPECT_THAT(Await(2, 0), ElementsAre(5, 5, 5, 5));
  EXPECT_EQ(shard_->Snapshot(0).delta, nullptr);
  // That slice is past round 1 now: a second upload, or a push of round 1, is late.
  EXPECT_EQ(Kind(shard_->AdoptSlice(0, hash_, 1, 0, Bytes({6, 6, 6, 6}))), core::Refusal::kLate);
  EXPECT_EQ(Kind(Push(1, 1, 0, {1, 1, 1, 1})), core::Refusal::kLate);
  ASSERT_TRUE(shard_->AdoptSlice(0, hash_, 1, 1, Bytes({-2, 3})).ok());
  EXPECT_THAT(Await(2, 1), ElementsAre(-2, 3));
  // Done: the votes are gone, and a late vote for round 1 is refused as late.
  EXPECT_EQ(Kind(shard_->AdoptSlice(0, hash_, 1, 1, Bytes({0, 0}))), core::Refusal::kPermissionDenied);
  EXPECT_EQ(Kind(shard_->Adopt(3, hash_, 1, 0).status()), core::Refusal::kLate);
  // Round 2 steps from the adopted values with a fresh momentum buffer (v = g), and the
  // Byzantine push of the discarded round 1 is not in it.
  Round(2, 4, 2.0f);
  EXPECT_THAT(Await(3, 0), ElementsAre(3, 3, 3, 3));
  EXPECT_THAT(Await(3, 1), ElementsAre(-4, 1));
}

TEST_F(ShardAdoptionTest, VotesAreRefusedWithTheirReasons) {
  Make(3, 1, 0.0f);
  Round(0, 3, 1.0f);  // every slice at version 1
  const auto refusal = [&](uint32_t worker, uint64_t hash, uint64_t round, uint32_t root) {
    return Kind(shard_->Adopt(worker, hash, round, root).status());
  };
  EXPECT_EQ(refusal(0, hash_, 0, 0), core::Refusal::kLate);
  EXPECT_EQ(refusal(0, hash_, 2, 0), core::Refusal::kFutureRound);
  EXPECT_EQ(refusal(0, hash_, 1, 3), core::Refusal::kBadWorkerId);
  EXPECT_EQ(refusal(0, hash_ + 1, 1, 0), core::Refusal::kLayoutMismatch);
  EXPECT_EQ(Kind(shard_->AdoptSlice(0, hash_ + 1, 1, 0, Bytes({1, 1, 1, 1}))),
            core::Refusal::kPermissionDenied);
  // A passed vote does not open another slice id or layout.
  ASSERT_TRUE(shard_->Adopt(0, hash_, 1, 0).ok());
  ASSERT_TRUE(shard_->Adopt(1, hash_, 1, 0)->passed);
  EXPECT_EQ(Kind(shard_->AdoptSlice(0, hash_, 1, 7, Bytes({1}))), core::Refusal::kUnknownSlice);
  EXPECT_EQ(Kind(shard_->AdoptSlice(0, hash_ + 1, 1, 0, Bytes({1, 1, 1, 1}))),
            core::Refusal::kLayoutMismatch);
}

TEST_F(ShardAdoptionTest, AnAggregateOnlyShardHasNoParametersToAdopt) {
  Make(2, 0, 0.0f, /*aggregate_only=*/true);
  const absl::Status st = shard_->Adopt(0, hash_, 0, 0).status();
  EXPECT_EQ(Kind(st), core::Refusal::kPermissionDenied);
  EXPECT_THAT(st.message(), HasSubstr("--aggregate-only"));
}

TEST_F(ShardAdoptionTest, WithAPullCodecTheAdoptedVersionIsDenseAndTheNextADelta) {
  Make(2, 0, 0.0f, false, "fp16");
  Round(0, 2, 1.0f);
  ASSERT_TRUE(shard_->Adopt(0, hash_, 1, 1).ok());
  ASSERT_TRUE(shard_->Adopt(1, hash_, 1, 1)->passed);
  ASSERT_TRUE(shard_->AdoptSlice(1, hash_, 1, 0, Bytes({4, 4, 4, 4})).ok());
  ASSERT_TRUE(shard_->AdoptSlice(1, hash_, 1, 1, Bytes({4, 4})).ok());
  EXPECT_THAT(Await(2, 0), ElementsAre(4, 4, 4, 4));
  EXPECT_EQ(shard_->Snapshot(0).delta, nullptr);
  // The held values are the adopted ones: the next change is a delta from them.
  Round(2, 2, 1.0f);
  EXPECT_THAT(Await(3, 0), ElementsAre(3, 3, 3, 3));
  ASSERT_NE(shard_->Snapshot(0).delta, nullptr);
  EXPECT_EQ(shard_->Snapshot(0).delta->base_version, 2u);
}

}  // namespace
}  // namespace ps::server
