// Workers that come and go (server/membership.h): the states alone, and a shard's rounds
// that stop waiting for a worker that left or expired, with a manual clock.
#include "server/membership.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "absl/synchronization/notification.h"
#include "codecs/codec.h"
#include "core/fp32_bytes.h"
#include "server/checkpoint.h"
#include "server/shard.h"
#include "tests/server/captured_log.h"

namespace ps::server {
namespace {

using std::chrono::milliseconds;
using State = Membership::State;

TEST(MembershipTest, LeavingExpiringAndComingBack) {
  core::ManualClock clock;
  Membership m(3, 3, milliseconds(1000));
  EXPECT_EQ(m.state(0), State::kNeverJoined);
  EXPECT_FALSE(m.Absent(0)) << "a worker still starting is waited for";
  EXPECT_FALSE(m.Joined(0, clock.Now()));
  EXPECT_FALSE(m.Joined(1, clock.Now()));
  EXPECT_FALSE(m.Joined(2, clock.Now()));
  EXPECT_TRUE(m.Leave(2));
  EXPECT_FALSE(m.Leave(2)) << "once";
  EXPECT_TRUE(m.Absent(2));
  EXPECT_EQ(m.absent_count(), 1u);
  clock.Advance(milliseconds(600));
  EXPECT_FALSE(m.Active(0, clock.Now()));
  clock.Advance(milliseconds(600));
  // Worker 1 has been silent for 1.2 s, worker 0 for 0.6 s; worker 2 left already.
  EXPECT_EQ(m.Expire(clock.Now()), std::vector<uint32_t>{1});
  EXPECT_TRUE(m.Expire(clock.Now()).empty()) << "each expiry is reported once";
  EXPECT_EQ(m.state(1), State::kExpired);
  EXPECT_EQ(m.absent_count(), 2u);
  EXPECT_TRUE(m.AnyAbsent());
  // Back with a push (or a join): waited for again.
  EXPECT_TRUE(m.Active(1, clock.Now()));
  EXPECT_TRUE(m.Joined(2, clock.Now()));
  EXPECT_EQ(m.absent_count(), 0u);
  EXPECT_FALSE(m.AnyAbsent());
  EXPECT_EQ(MembershipStateName(m.state(2)), "present");
  EXPECT_FALSE(m.Leave(7)) << "an id out of range changes nothing";
}

TEST(MembershipTest, NoExpiryWithoutATimeout) {
  core::ManualClock clock;
  Membership m(2, 2, core::Duration::zero());
  m.Joined(0, clock.Now());
  clock.Advance(std::chrono::hours(24));
  EXPECT_TRUE(m.Expire(clock.Now()).empty());
  EXPECT_EQ(m.state(0), State::kPresent);
}

TEST(MembershipTest, SparesAreWaitedForOnlyOnceTheyJoined) {
  core::ManualClock clock;
  Membership m(2, 4, milliseconds(1000));  // workers 2 and 3 are spares
  EXPECT_EQ(m.state(2), State::kSpare);
  EXPECT_TRUE(m.Absent(2)) << "a spare that never joined is not waited for";
  EXPECT_TRUE(m.AnyAbsent());
  EXPECT_EQ(m.absent_count(), 0u) << "nor counted as having left";
  EXPECT_EQ(m.waited_count(), 2u);
  EXPECT_FALSE(m.Joined(2, clock.Now())) << "a first join, not a return";
  EXPECT_EQ(m.state(2), State::kPresent);
  EXPECT_EQ(m.waited_count(), 3u);
  EXPECT_FALSE(m.Leave(3)) << "a spare that leaves stays a spare";
  EXPECT_EQ(m.state(3), State::kSpare);
  EXPECT_TRUE(m.Leave(2));
  EXPECT_EQ(m.absent_count(), 1u);
  EXPECT_EQ(m.waited_count(), 2u);
  EXPECT_TRUE(m.Joined(2, clock.Now())) << "back";
  clock.Advance(milliseconds(1500));
  EXPECT_EQ(m.Expire(clock.Now()), std::vector<uint32_t>{2}) << "spares never expire";
  EXPECT_EQ(m.state(9), State::kSpare) << "an id out of range";
  EXPECT_EQ(MembershipStateName(m.state(3)), "spare");
}

class ShardMembershipTest : public ::testing::Test {
 protected:
  // Three workers, f = 1 (quorum 2), a round deadline of 1 s, workers expiring after 5 s;
  // one slice of 2 values. Everyone joined.
  void SetUp() override {
    ServerOptions o;
    o.num_workers = 3;
    o.num_byzantine = 1;
    Start(o, 3);
  }

  // A shard with `o`'s workers and rule bound (its clock and pool are the fixture's).
  std::unique_ptr<Shard> Make(ServerOptions o) {
    o.learning_rate = 1.0f;
    o.momentum = 0.0f;
    o.round_deadline = milliseconds(1000);
    o.worker_timeout = milliseconds(5000);
    aggregators::AggregatorOptions a;
    a.num_workers = static_cast<int>(o.num_workers);
    a.num_byzantine = static_cast<int>(o.num_byzantine);
    auto rule = aggregators::MakeAggregator("mean", a);
    EXPECT_TRUE(rule.ok()) << rule.status();
    return std::make_unique<Shard>(o, 0, *std::move(rule), &clock_, &pool_);
  }

  // Make(o), of which `joined` workers joined, the layout registered and initialized.
  void Start(ServerOptions o, uint32_t joined) {
    shard_ = Make(o);
    auto layout = core::ModelLayout::Create({{"w", 2, 0}}, 4, 1);
    ASSERT_TRUE(layout.ok());
    hash_ = layout->hash();
    for (uint32_t w = 0; w < joined; ++w) ASSERT_TRUE(shard_->Join(w, hash_).ok());
    ASSERT_TRUE(shard_->RegisterLayout(0, *layout).ok());
    std::string init;
    core::AppendFp32(std::vector<float>{0, 0}, &init);
    ASSERT_TRUE(shard_->InitSlice(0, hash_, 0, init).ok());
  }

  absl::Status Push(uint32_t worker, uint64_t round, float g) {
    auto codec = codecs::MakeCodec("fp32");
    std::string payload;
    EXPECT_TRUE((*codec)->Encode(std::vector<float>{g, g}, &payload).ok());
    return shard_->Push(worker, hash_, round, 0, "fp32", payload);
  }

  uint64_t Version() { return shard_->Snapshot(0).version; }

  bool AwaitVersion(uint64_t version) {
    auto done = std::make_shared<absl::Notification>();
    shard_->Watch(0, version, [done](bool) { done->Notify(); });
    return done->WaitForNotificationWithTimeout(absl::Seconds(10));
  }

  core::ManualClock clock_;
  core::ThreadPool pool_{2};
  std::unique_ptr<Shard> shard_;
  uint64_t hash_ = 0;
};

TEST_F(ShardMembershipTest, ARoundStopsWaitingForAWorkerThatLeaves) {
  ASSERT_TRUE(Push(0, 0, 1).ok());
  ASSERT_TRUE(Push(1, 0, 3).ok());
  shard_->Tick(clock_.Now());
  EXPECT_EQ(Version(), 0u) << "waits for worker 2 until its deadline";
  shard_->Leave(2);
  ASSERT_TRUE(AwaitVersion(1));  // closed at once, with the two pushes (mean 2)
  EXPECT_EQ(shard_->stats().rounds_closed_at_deadline, 0u);
  EXPECT_EQ(shard_->membership(2), State::kLeft);
  EXPECT_EQ(shard_->workers_absent(), 1u);
  // The next round closes as soon as the two present workers pushed.
  ASSERT_TRUE(Push(0, 1, 1).ok());
  ASSERT_TRUE(Push(1, 1, 1).ok());
  ASSERT_TRUE(AwaitVersion(2));
  // Worker 2 comes back with a push: round 2 waits for it again.
  ASSERT_TRUE(Push(2, 2, 1).ok());
  EXPECT_EQ(shard_->membership(2), State::kPresent);
  ASSERT_TRUE(Push(0, 2, 1).ok());
  EXPECT_EQ(Version(), 2u) << "round 2 waits for worker 1, present";
  ASSERT_TRUE(Push(1, 2, 1).ok());
  ASSERT_TRUE(AwaitVersion(3));
}

TEST_F(ShardMembershipTest, AWorkerSilentForTheTimeoutExpiresAndTheQuorumStillHolds) {
  // Worker 2 pushes nothing. Round 0 closes at its deadline without it.
  ASSERT_TRUE(Push(0, 0, 1).ok());
  ASSERT_TRUE(Push(1, 0, 1).ok());
  clock_.Advance(milliseconds(1000));
  shard_->Tick(clock_.Now());
  ASSERT_TRUE(AwaitVersion(1));
  EXPECT_EQ(shard_->stats().rounds_closed_at_deadline, 1u);
  EXPECT_EQ(shard_->membership(2), State::kPresent) << "not yet: 1 s of 5";
  // Five seconds after its join it expires at the next tick; round 1 (two pushes) closes.
  ASSERT_TRUE(Push(0, 1, 1).ok());
  clock_.Advance(milliseconds(4100));
  ASSERT_TRUE(Push(1, 1, 1).ok());
  shard_->Tick(clock_.Now());
  EXPECT_EQ(shard_->membership(2), State::kExpired);
  ASSERT_TRUE(AwaitVersion(2));
  EXPECT_EQ(shard_->stats().rounds_closed_at_deadline, 1u) << "not at a deadline";
  // The quorum stays 2: with worker 1 gone too, one push never closes a round. Below the
  // quorum after an expiry is an error; after a worker's own Leave (the end of a job),
  // news.
  {
    CapturedLog log;
    shard_->Leave(1);
    EXPECT_EQ(log.Count("error", "only 1 workers are present"), 0);
    EXPECT_EQ(log.Count("info", "only 1 workers are present") +
                  log.Count("debug", "only 1 workers are present"),
              1);
  }
  ASSERT_TRUE(Push(0, 2, 1).ok());
  clock_.Advance(milliseconds(1000));
  shard_->Tick(clock_.Now());
  EXPECT_EQ(Version(), 2u);
  // Worker 1 is back: its push closes round 2.
  ASSERT_TRUE(Push(1, 2, 1).ok());
  ASSERT_TRUE(AwaitVersion(3));
  EXPECT_EQ(shard_->membership(1), State::kPresent);
}

TEST_F(ShardMembershipTest, APushsLatencyRunsFromItsRoundsOpening) {
  clock_.Advance(milliseconds(100));  // since the initial value: round 0 opened then
  ASSERT_TRUE(Push(0, 0, 1).ok());
  clock_.Advance(milliseconds(300));
  ASSERT_TRUE(Push(1, 0, 1).ok());
  ASSERT_TRUE(Push(2, 0, 1).ok());
  ASSERT_TRUE(AwaitVersion(1));
  clock_.Advance(milliseconds(50));  // round 1 opened at 400 ms
  ASSERT_TRUE(Push(2, 1, 1).ok());
  const ShardStats st = shard_->stats();
  EXPECT_NEAR(st.workers[0].push_latency_seconds, 0.1, 1e-9);
  EXPECT_NEAR(st.workers[1].push_latency_seconds, 0.4, 1e-9);
  EXPECT_NEAR(st.workers[2].push_latency_seconds, 0.4 + 0.05, 1e-9);
}

TEST_F(ShardMembershipTest, AWorkerThatJoinsAndLeavesInALoopCostsNoHonestRound) {
  // Worker 2 joins and leaves 5000 times between the honest workers' pushes: every round
  // closes with the honest pushes as they come (never at a deadline), the shard's
  // per-worker state stays what it was (one session, one state), and worker 2 ends up
  // absent, not waited for.
  for (uint64_t round = 0; round < 5; ++round) {
    for (int i = 0; i < 1000; ++i) {
      ASSERT_TRUE(shard_->Join(2, hash_).ok());
      shard_->Leave(2);
    }
    ASSERT_TRUE(Push(0, round, 1).ok());
    ASSERT_TRUE(Push(1, round, 3).ok());
    ASSERT_TRUE(AwaitVersion(round + 1)) << round;
  }
  const ShardStats st = shard_->stats();
  EXPECT_EQ(st.rounds_closed, 5u);
  EXPECT_EQ(st.rounds_closed_at_deadline, 0u);
  EXPECT_EQ(shard_->membership(2), State::kLeft);
  EXPECT_EQ(shard_->workers_absent(), 1u);
  EXPECT_EQ(shard_->WatcherCount(), 0u);
  EXPECT_EQ(st.workers[2].pushes_accepted, 0u);
  // Its session is the last one issued: the 5001st join is join 5001 of the same entry.
  auto again = shard_->Join(2, hash_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(shard_->Authenticate(again->session).value_or(99), 2u);
}

TEST_F(ShardMembershipTest, AWorkerWaitingForSlowerOnesIsNotIdle) {
  // Worker 0 pushes at once; the others take 4 s. Its time without a push counts from the
  // round's close, not from its push: 7 s after it, it is still waited for.
  ASSERT_TRUE(Push(0, 0, 1).ok());
  clock_.Advance(milliseconds(4000));
  ASSERT_TRUE(Push(1, 0, 1).ok());
  ASSERT_TRUE(Push(2, 0, 1).ok());
  ASSERT_TRUE(AwaitVersion(1));
  clock_.Advance(milliseconds(3000));
  shard_->Tick(clock_.Now());
  EXPECT_EQ(shard_->membership(0), State::kPresent);
  EXPECT_EQ(shard_->workers_absent(), 0u);
  // Silent for 5 s after that close, it expires.
  clock_.Advance(milliseconds(2100));
  shard_->Tick(clock_.Now());
  EXPECT_EQ(shard_->membership(0), State::kExpired);
}

TEST_F(ShardMembershipTest, WorkersBeyondTheStartingOnesJoinAndAreWaitedFor) {
  // Two workers from the start, ids up to 4 (--max-workers 4), f = 0: the spares are not
  // waited for until they join; one that joined is, and its push is in the mean.
  ServerOptions o;
  o.num_workers = 2;
  o.max_workers = 4;
  Start(o, 2);
  EXPECT_EQ(shard_->quorum(), 2u) << "n - f of the starting workers";
  ASSERT_TRUE(Push(0, 0, 1).ok());
  ASSERT_TRUE(Push(1, 0, 1).ok());
  ASSERT_TRUE(AwaitVersion(1)) << "closed without the spares";
  ASSERT_TRUE(shard_->Join(2, hash_).ok());
  EXPECT_EQ(shard_->workers_waited(), 3u);
  ASSERT_TRUE(Push(0, 1, 1).ok());
  ASSERT_TRUE(Push(1, 1, 1).ok());
  EXPECT_EQ(Version(), 1u) << "round 1 waits for worker 2, which joined";
  ASSERT_TRUE(Push(2, 1, 7).ok());
  ASSERT_TRUE(AwaitVersion(2));
  // lr 1: w = -(1 + 1) / 2 - (1 + 1 + 7) / 3.
  std::vector<float> w(2);
  ASSERT_TRUE(core::ParseFp32(*shard_->Snapshot(0).values, w, "values").ok());
  EXPECT_FLOAT_EQ(w[0], -1.0f - 3.0f);
  absl::StatusOr<JoinResult> beyond = shard_->Join(4, hash_);
  ASSERT_FALSE(beyond.ok());
  EXPECT_THAT(std::string(beyond.status().message()), ::testing::HasSubstr("--max-workers 4"));
  const ShardStats st = shard_->stats();
  EXPECT_EQ(st.rounds_closed_at_deadline, 0u);
  EXPECT_EQ(st.workers[2].slice_rounds_missed, 0u) << "round 0 closed before it joined";
  EXPECT_EQ(st.workers[3].slice_rounds_missed, 0u);
  EXPECT_EQ(shard_->MembershipStates(),
            (std::vector<State>{State::kPresent, State::kPresent, State::kPresent,
                                State::kSpare}));
}

TEST_F(ShardMembershipTest, ACheckpointKeepsWhoLeftAndTheSuspicionHistory) {
  // Three workers and a spare, suspicion windows of one round. Worker 2 leaves after two
  // rounds. A shard restored from the checkpoint file does not wait for worker 2 (the
  // spare that joined is waited for once it joins again) and shows the same scores.
  ServerOptions o;
  o.num_workers = 3;
  o.max_workers = 4;
  o.num_byzantine = 1;
  o.suspicion_window = 1;
  o.checkpoint_dir = "unused";  // keeps the published model for Capture; nothing written
  Start(o, 3);
  ASSERT_TRUE(shard_->Join(3, hash_).ok());
  for (uint64_t round = 0; round < 2; ++round) {
    for (uint32_t w = 0; w < 4; ++w) ASSERT_TRUE(Push(w, round, w == 3 ? -5.0f : 1.0f).ok());
    ASSERT_TRUE(AwaitVersion(round + 1));
  }
  shard_->Leave(2);
  for (uint32_t w : {0u, 1u, 3u}) ASSERT_TRUE(Push(w, 2, 1).ok());
  ASSERT_TRUE(AwaitVersion(3));
  absl::StatusOr<ShardCheckpoint> captured = shard_->Capture();
  ASSERT_TRUE(captured.ok()) << captured.status();
  absl::StatusOr<ShardCheckpoint> file = DecodeCheckpoint(EncodeCheckpoint(*captured));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->workers.size(), 4u);
  EXPECT_EQ(file->workers[2].state, State::kLeft);
  ASSERT_EQ(file->suspicion_history.size(), 2u) << "windows 0 and 1 closed";

  // A shard of another run (--run-id) refuses the checkpoint; one of no run takes it.
  ServerOptions other_run = o;
  other_run.run_id = "run-b";
  absl::Status refused = Make(other_run)->Restore(*file);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("belongs to no run"));
  std::unique_ptr<Shard> restored = Make(o);
  ASSERT_TRUE(restored->Restore(*file).ok());
  EXPECT_EQ(restored->MembershipStates(),
            (std::vector<State>{State::kPresent, State::kPresent, State::kLeft, State::kPresent}));
  const ShardStats before = shard_->stats(), after = restored->stats();
  for (uint32_t w = 0; w < 4; ++w) {
    EXPECT_THAT(after.workers[w].suspicion.score,
                ::testing::NanSensitiveDoubleEq(before.workers[w].suspicion.score)) << w;
    EXPECT_EQ(after.workers[w].suspicion.slice_rounds_weighed,
              before.workers[w].suspicion.slice_rounds_weighed) << w;
  }
  // The mean is no robust rule: worker 3's -5 outweighs the others' 1s, so the aggregate
  // points its way and the others point exactly against it.
  EXPECT_DOUBLE_EQ(after.workers[0].suspicion.score, 1.0);
  EXPECT_DOUBLE_EQ(after.workers[3].suspicion.score, 0.0);
  EXPECT_EQ(restored->SuspicionHistory().size(), 2u);
  // The workers come back (new sessions); round 3 closes with 0, 1 and 3, not waiting
  // for worker 2, which left before the checkpoint.
  for (uint32_t w : {0u, 1u, 3u}) ASSERT_TRUE(restored->Join(w, hash_).ok());
  for (uint32_t w : {0u, 1u, 3u}) {
    auto codec = codecs::MakeCodec("fp32");
    std::string payload;
    ASSERT_TRUE((*codec)->Encode(std::vector<float>{1, 1}, &payload).ok());
    ASSERT_TRUE(restored->Push(w, hash_, 3, 0, "fp32", payload).ok());
  }
  auto done = std::make_shared<absl::Notification>();
  restored->Watch(0, 4, [done](bool) { done->Notify(); });
  EXPECT_TRUE(done->WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "the restored shard waited for the worker that had left";
  EXPECT_EQ(restored->stats().rounds_closed_at_deadline, 0u);
}

}  // namespace
}  // namespace ps::server
