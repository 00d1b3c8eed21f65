// The share protocol of model rounds (ModelRounds) and the sum of the agreed shares
// (CombineShares), on their own: no Shard, no thread pool.
#include "server/model_rounds.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "core/refusal.h"
#include "server/deadline_queue.h"

namespace ps::server {
namespace {

using std::chrono::milliseconds;

TEST(ModelRoundsTest, ARoundCompletesOnceWithEveryShareAndAdvances) {
  core::ManualClock clock;
  DeadlineQueue deadlines;
  ModelRounds m(
      {/*shard_id=*/0, /*num_shards=*/2, /*num_workers=*/3, /*state_rows=*/0, milliseconds(50)},
      &clock, &deadlines);
  EXPECT_FALSE(m.SliceClosed(2));
  EXPECT_TRUE(m.SliceClosed(2)) << "the last owned slice starts the round";
  EXPECT_FALSE(m.SliceClosed(2)) << "and the count starts again";
  auto share = [](uint32_t shard, uint64_t round) {
    auto s = std::make_shared<RoundShare>();
    s->shard_id = shard;
    s->round = round;
    s->participants = {0, 2};
    s->gram = {1, 2, 2, 4};
    return s;
  };
  // A peer's share for the next round may come early.
  ASSERT_TRUE(m.Store(share(1, 1)).ok());
  EXPECT_EQ(m.Store(share(1, 2)).status().code(), absl::StatusCode::kOutOfRange);
  absl::StatusOr<std::optional<ModelRounds::Complete>> own = m.Store(share(0, 0));
  ASSERT_TRUE(own.ok());
  EXPECT_FALSE(own->has_value());
  ASSERT_TRUE(m.due().has_value()) << "the peers' shares are awaited";
  EXPECT_EQ(m.Store(share(0, 0)).status().code(), absl::StatusCode::kAlreadyExists);
  absl::StatusOr<std::optional<ModelRounds::Complete>> done = m.Store(share(1, 0));
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(done->has_value());
  EXPECT_EQ((*done)->round, 0u);
  EXPECT_EQ((*done)->shares.size(), 2u);
  EXPECT_FALSE(m.due().has_value());
  EXPECT_FALSE(m.Overdue(clock.Now() + milliseconds(100)).has_value())
      << "a round being finished is not overdue";
  EXPECT_FALSE(m.Advance(0).has_value()) << "round 1 lacks this shard's share";
  EXPECT_EQ(m.Store(share(1, 0)).status().code(), absl::StatusCode::kOutOfRange) << "done";
  ASSERT_TRUE(m.Store(share(0, 1)).ok());
  EXPECT_FALSE(m.Overdue(clock.Now()).has_value());
  // Round 1 had both shares the moment its own came: it was claimed by that Store.
  EXPECT_FALSE(m.due().has_value());
}

TEST(ModelRoundsTest, MissingPeerSharesMakeTheRoundOverdueOnce) {
  core::ManualClock clock;
  DeadlineQueue deadlines;
  int told = 0;
  deadlines.SetListener([&] { ++told; });
  ModelRounds m({0, 2, 3, 0, milliseconds(50)}, &clock, &deadlines);
  auto own = std::make_shared<RoundShare>();
  own->participants = {0};
  own->gram = {1};
  ASSERT_TRUE(m.Store(own).ok());
  EXPECT_EQ(told, 1) << "the ticker learns of the peers' deadline";
  EXPECT_FALSE(m.Overdue(clock.Now()).has_value());
  clock.Advance(milliseconds(60));
  EXPECT_EQ(m.Overdue(clock.Now()), 0u);
  EXPECT_FALSE(m.Overdue(clock.Now()).has_value()) << "claimed once";
  m.FastForward(5);
  own = std::make_shared<RoundShare>(*own);
  EXPECT_EQ(m.Store(own).status().code(), absl::StatusCode::kOutOfRange) << "round 0 is gone";
}

TEST(ModelRoundsTest, ChecksTheShapeOfAPeersShare) {
  core::ManualClock clock;
  DeadlineQueue deadlines;
  ModelRounds m({0, 2, 3, 1, milliseconds(50)}, &clock, &deadlines);
  RoundShare s;
  s.shard_id = 1;
  s.participants = {0, 2};
  s.gram.assign(9, 1.0);
  EXPECT_TRUE(m.CheckShare(s).ok());
  RoundShare own = s;
  own.shard_id = 0;
  EXPECT_EQ(core::RefusalOf(m.CheckShare(own)), core::Refusal::kMalformed);
  RoundShare unordered = s;
  unordered.participants = {2, 0};
  EXPECT_EQ(core::RefusalOf(m.CheckShare(unordered)), core::Refusal::kMalformed);
  RoundShare beyond = s;
  beyond.participants = {0, 3};
  EXPECT_EQ(core::RefusalOf(m.CheckShare(beyond)), core::Refusal::kMalformed);
  RoundShare small = s;
  small.gram.resize(4);
  EXPECT_EQ(core::RefusalOf(m.CheckShare(small)), core::Refusal::kMalformed);
  RoundShare nan = s;
  nan.gram[4] = NAN;
  EXPECT_EQ(core::RefusalOf(m.CheckShare(nan)), core::Refusal::kMalformed);
}

TEST(CombineSharesTest, SumsOnlyTheAgreedParticipantsAndTheStateRows) {
  auto a = std::make_shared<RoundShare>();
  a->participants = {0, 1, 2};
  // 3 participants + 1 state row: 4 x 4, entry (i, j) = 10 * i + j.
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) a->gram.push_back(10 * i + j);
  }
  auto b = std::make_shared<RoundShare>();
  b->participants = {0, 2};
  b->gram.assign(9, 1.0);
  const CombinedShares c = CombineShares({a, b}, /*state_rows=*/1);
  EXPECT_EQ(c.agreed, (std::vector<uint32_t>{0, 2}));
  // Rows of a: worker 0 -> 0, worker 2 -> 2, state -> 3.
  const std::vector<double> expected = {0 + 1,  2 + 1,  3 + 1,   //
                                        20 + 1, 22 + 1, 23 + 1,  //
                                        30 + 1, 32 + 1, 33 + 1};
  EXPECT_EQ(c.gram, expected);
}

// A closed round of `numel` values per worker, each row given.

}  // namespace
}  // namespace ps::server
