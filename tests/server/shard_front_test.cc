// The transport-free front every data plane talks to (server/shard_front.h), against a
// real shard with a manual clock, without gRPC: sessions, pushes, pulls and their places,
// answers through the tarpit.
#include "server/shard_front.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "aggregators/aggregator.h"
#include "codecs/codec.h"
#include "core/clock.h"
#include "core/thread_pool.h"
#include "server/auth_internal.h"
#include "server/tarpit.h"
#include "tests/server/two_worker_shard.h"

namespace ps::server {
namespace {

// What a pull wrote, and how it ended.
class RecordingSink final : public PullSink {
 public:
  void Write(PullItem item) override {
    absl::MutexLock lock(&mu_);
    slices_.push_back(item.header.slice_id);
  }
  void Finish(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
  }
  std::vector<uint32_t> slices() const {
    absl::MutexLock lock(&mu_);
    return slices_;
  }
  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<uint32_t> slices_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("not finished");
};

uint64_t Refusals(const Shard& shard, Refusal r) {
  return shard.stats().refusals[static_cast<size_t>(r)];
}

Caller WorkerCaller(uint32_t id) {
  return Caller{.identity = core::Identity{core::Identity::Kind::kWorker, id},
                .address = "ipv4:127.0.0.1:4000"};
}

class ShardFrontTest : public ::testing::Test {
 protected:
  // The shared two-worker shard (tests/server/two_worker_shard.h); 2 requests a second
  // per caller with a burst of 4.
  void SetUp() override {
    ServerOptions o;
    o.round_deadline = std::chrono::milliseconds(100);
    ps::testing::TwoWorkerShard made;
    ASSERT_NO_FATAL_FAILURE(ps::testing::MakeTwoWorkerShard(o, &clock_, &pool_, &made));
    shard_ = std::move(made.shard);
    hash_ = made.hash;
    for (const JoinResult& joined : made.joins) sessions_.push_back(joined.session);
    // Aggregate-only: the slices start at zero, ready without InitSlice.
    front_ = std::make_unique<ShardFront>(shard_.get(), &limiter_, nullptr);
  }

  DataPeer Peer(uint32_t worker) {
    absl::StatusOr<DataPeer> peer = front_->AdmitSession(WorkerCaller(worker), sessions_[worker]);
    EXPECT_TRUE(peer.ok()) << peer.status();
    return peer.value_or(DataPeer{});
  }

  absl::Status Push(const DataPeer& peer, uint32_t slice, uint64_t round) {
    std::string payload;
    EXPECT_TRUE((*codecs::MakeCodec("fp32"))->Encode(std::vector<float>{1, 1, 1, 1}, &payload).ok());
    const std::string_view piece = payload;
    return front_->Push(peer, PushHead{.layout_hash = hash_, .round = round, .slice_id = slice,
                                       .codec = "fp32"},
                        std::span<const std::string_view>(&piece, 1));
  }

  core::ManualClock clock_;
  core::ThreadPool pool_{2};
  RateLimiter limiter_{2, 4, &clock_};
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ShardFront> front_;
  uint64_t hash_ = 0;
  std::vector<std::string> sessions_;
};

TEST_F(ShardFrontTest, ASessionAdmitsItsOwnWorkerOnly) {
  const DataPeer peer = Peer(1);
  EXPECT_EQ(peer.worker, 1u);
  EXPECT_EQ(peer.client, "worker-1");

  absl::StatusOr<DataPeer> unknown = front_->AdmitSession(WorkerCaller(1), "no such session");
  EXPECT_EQ(core::RefusalOf(unknown.status()), Refusal::kUnknownSession);

  // Worker 0 presenting worker 1's session: a session is not a credential.
  const uint64_t denied = Refusals(*shard_, Refusal::kPermissionDenied);
  absl::StatusOr<DataPeer> stolen = front_->AdmitSession(WorkerCaller(0), sessions_[1]);
  EXPECT_EQ(core::RefusalOf(stolen.status()), Refusal::kPermissionDenied);
  EXPECT_EQ(Refusals(*shard_, Refusal::kPermissionDenied), denied + 1);

  // Without client authentication (no identity) the session alone decides.
  absl::StatusOr<DataPeer> anonymous =
      front_->AdmitSession(Caller{.address = "ipv4:127.0.0.1:4001"}, sessions_[0]);
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  EXPECT_EQ(anonymous->worker, 0u);
  EXPECT_EQ(anonymous->client, "ipv4:127.0.0.1") << "the address without its port";
}

TEST_F(ShardFrontTest, CallersBeyondTheirRateAreRefusedAndCounted) {
  const Caller caller = WorkerCaller(0);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(front_->AdmitCaller(caller).ok()) << i;  // the burst
  const absl::Status over = front_->AdmitCaller(caller);
  EXPECT_EQ(core::RefusalOf(over), Refusal::kRateLimited);
  EXPECT_EQ(Refusals(*shard_, Refusal::kRateLimited), 1u);
  // Another caller has its own bucket; time refills this one.
  EXPECT_TRUE(front_->AdmitCaller(WorkerCaller(1)).ok());
  clock_.Advance(std::chrono::seconds(1));
  EXPECT_TRUE(front_->AdmitCaller(caller).ok());
}

TEST_F(ShardFrontTest, PushesReachTheRoundAndItsRefusalsKeepTheirKind) {
  const DataPeer w0 = Peer(0), w1 = Peer(1);
  ASSERT_TRUE(Push(w0, 0, 0).ok());
  EXPECT_EQ(core::RefusalOf(Push(w0, 0, 0)), Refusal::kDuplicate);
  EXPECT_EQ(core::RefusalOf(Push(w0, 7, 0)), Refusal::kUnknownSlice);
  ASSERT_TRUE(Push(w1, 0, 0).ok());
  // Both workers pushed: the round closes and slice 0 reaches version 1.
  RecordingSink sink;
  absl::StatusOr<std::unique_ptr<PullHandle>> pull =
      front_->OpenPull(w0, PullAsk{.layout_hash = hash_, .min_version = 1, .slice_ids = {0}});
  ASSERT_TRUE(pull.ok()) << pull.status();
  (*pull)->Start(&sink);
  for (int i = 0; i < 1000 && sink.slices().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(sink.slices(), std::vector<uint32_t>{0});
  EXPECT_EQ(core::RefusalOf(Push(w1, 1, 5)), Refusal::kFutureRound);
}

TEST_F(ShardFrontTest, ARawRowIsOfferedOnlyForAKnownRawCodecAndTheSlicesExactSize) {
  const DataPeer w0 = Peer(0), w1 = Peer(1);
  const PushHead head{.layout_hash = hash_, .round = 0, .slice_id = 0, .codec = "fp32"};
  const size_t exact = 1 + 4 * sizeof(float);
  EXPECT_EQ(front_->RawRowNumel(head, exact), 0u) << "no fp32 decoder made yet: nothing is made here";
  ASSERT_TRUE(Push(w0, 0, 0).ok());  // the first fp32 push makes its decoder
  EXPECT_EQ(front_->RawRowNumel(head, exact), 4u);
  EXPECT_EQ(front_->RawRowNumel(head, exact + 4), 0u) << "another size is decoded (and refused) as bytes";
  const uint64_t unknown = Refusals(*shard_, Refusal::kUnknownSlice);
  PushHead other = head;
  other.slice_id = 7;
  EXPECT_EQ(front_->RawRowNumel(other, exact), 0u) << "an unknown slice";
  EXPECT_EQ(Refusals(*shard_, Refusal::kUnknownSlice), unknown) << "asking refuses nothing";
  other = head;
  other.layout_hash = hash_ + 1;
  EXPECT_EQ(front_->RawRowNumel(other, exact), 0u) << "another layout";

  // A raw row pushed through the front counts as the push it is.
  RawRow raw{.version = codecs::FormatByte(codecs::PayloadFormat::kFp32), .values = std::make_unique<float[]>(4), .numel = 4};
  std::fill(raw.values.get(), raw.values.get() + 4, 3.0f);
  ASSERT_TRUE(front_->Push(w1, head, PushPayload(&raw)).ok());
  RawRow again{.version = codecs::FormatByte(codecs::PayloadFormat::kFp32), .values = std::make_unique<float[]>(4), .numel = 4};
  EXPECT_EQ(core::RefusalOf(front_->Push(w1, head, PushPayload(&again))), Refusal::kDuplicate)
      << "both pushed: the round closed with worker 1's first copy";
}

TEST_F(ShardFrontTest, PullsAreValidatedBoundedPerWorkerAndGiveEverythingBack) {
  const DataPeer w0 = Peer(0);
  const PullAsk waiting{.layout_hash = hash_, .min_version = 5, .slice_ids = {0, 1}};

  const uint64_t malformed = Refusals(*shard_, Refusal::kMalformed);
  absl::StatusOr<std::unique_ptr<PullHandle>> unpaired = front_->OpenPull(
      w0, PullAsk{.layout_hash = hash_, .slice_ids = {0, 1}, .held_versions = {3}});
  EXPECT_EQ(core::RefusalOf(unpaired.status()), Refusal::kMalformed);
  EXPECT_NE(unpaired.status().message().find("1 held versions for 2 slices"), std::string::npos)
      << unpaired.status();
  EXPECT_EQ(Refusals(*shard_, Refusal::kMalformed), malformed + 1);
  EXPECT_EQ(core::RefusalOf(
                front_->OpenPull(w0, PullAsk{.layout_hash = hash_, .slice_ids = {9}}).status()),
            Refusal::kUnknownSlice);
  EXPECT_EQ(core::RefusalOf(
                front_->OpenPull(w0, PullAsk{.layout_hash = hash_ + 1, .slice_ids = {0}}).status()),
            Refusal::kLayoutMismatch);

  // Two places per worker: the third pull is refused until one ends.
  RecordingSink first_sink, second_sink;
  absl::StatusOr<std::unique_ptr<PullHandle>> first = front_->OpenPull(w0, waiting);
  absl::StatusOr<std::unique_ptr<PullHandle>> second = front_->OpenPull(w0, waiting);
  ASSERT_TRUE(first.ok() && second.ok());
  (*first)->Start(&first_sink);
  (*second)->Start(&second_sink);
  EXPECT_EQ(shard_->WatcherCount(), 4u);
  absl::StatusOr<std::unique_ptr<PullHandle>> third = front_->OpenPull(w0, waiting);
  EXPECT_EQ(core::RefusalOf(third.status()), Refusal::kOverLimit);
  EXPECT_TRUE(front_->OpenPull(Peer(1), waiting).ok()) << "another worker has its own places";

  // Cancelled, then destroyed: its watches and its place are given back.
  (*first)->Cancel();
  EXPECT_EQ(first_sink.status().code(), absl::StatusCode::kCancelled);
  first->reset();
  EXPECT_EQ(shard_->WatcherCount(), 2u);
  // Destroyed while waiting, without a cancel: the same.
  second->reset();
  EXPECT_EQ(shard_->WatcherCount(), 0u);
  absl::StatusOr<std::unique_ptr<PullHandle>> again = front_->OpenPull(w0, waiting);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST_F(ShardFrontTest, RefusalsOverTheBudgetAreHeldButNotAPeerShardsNorAnAcceptance) {
  core::ManualClock tarpit_clock;
  Tarpit tarpit(TarpitOptions{.rate = 1, .burst = 1, .hold = std::chrono::milliseconds(200)},
                &tarpit_clock);
  ShardFront front(shard_.get(), nullptr, &tarpit);
  const absl::Status refused = core::Refused(Refusal::kMalformed, "bad");
  const auto answered_now = [&](std::string_view client, const absl::Status& status) {
    bool ran = false;
    front.Answer(client, status, 100, [&ran] { ran = true; });
    return ran;
  };
  EXPECT_TRUE(answered_now("worker-0", refused)) << "within the budget";
  EXPECT_TRUE(answered_now("worker-0", absl::OkStatus())) << "acceptances are never held";
  EXPECT_TRUE(answered_now("shard-1", refused)) << "peer shards are never held";
  EXPECT_TRUE(answered_now("worker-0", absl::UnavailableError("draining")))
      << "refusals of the shard's own state are not charged";
  absl::Notification held;
  front.Answer("worker-0", refused, 100, [&held] { held.Notify(); });
  EXPECT_FALSE(held.HasBeenNotified()) << "over the budget: held";
  EXPECT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(10)));
  tarpit.Stop();
}

}  // namespace
}  // namespace ps::server
