// The shard's model-scope coordinator (ModelCoordinator) over real parts (a SliceTable,
// RoundAggregation with Krum, AggregationJobs on a pool), without a Shard; and its
// counters (ShardCounters), whose log lines a client must not be able to flood.
#include "server/model_coordinator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "aggregators/aggregator.h"
#include "codecs/codec.h"
#include "core/clock.h"
#include "core/fp32_bytes.h"
#include "core/refusal.h"
#include "core/thread_pool.h"
#include "server/shard_counters.h"
#include "tests/server/captured_log.h"

namespace ps::server {
namespace {

using std::chrono::milliseconds;

constexpr uint32_t kCoordinatorWorkers = 3;

struct Published {
  uint32_t slice = 0;
  uint64_t round = 0;
  std::vector<float> out;
  absl::Status status;
};

// Shard 0 of 2 with 3 workers under Krum (f = 0), a layout of four 2-element slices.
class ModelCoordinatorTest : public ::testing::Test {
 protected:
  ModelCoordinatorTest() {
    rules_.num_workers = kCoordinatorWorkers;
    rules_.quorum = kCoordinatorWorkers;
    rules_.round_deadline = milliseconds(100);
    rules_.clock = &clock_;
    rules_.deadlines = &deadlines_;
    aggregators::AggregatorOptions opts;
    opts.num_workers = kCoordinatorWorkers;
    krum_ = aggregators::MakeAggregator("krum", opts).value();
    aggregation_ = std::make_unique<RoundAggregation>(krum_.get(), &pool_, SgdOptions{1.0f, 0, 0},
                                                      /*aggregate_only=*/false,
                                                      /*quorum=*/kCoordinatorWorkers);
    coordinator_ = std::make_unique<ModelCoordinator>(
        ModelRounds::Config{/*shard_id=*/0, /*num_shards=*/2, kCoordinatorWorkers, /*state_rows=*/0,
                            milliseconds(50)},
        &clock_, &deadlines_,
        ModelCoordinator::Parts{&table_, aggregation_.get(), krum_.get(), &jobs_, &counters_,
                                &suspicion_, [this](ClosedRound round, std::span<const float> out,
                                       absl::Status st) { Publish(std::move(round), out, st); }},
        /*enabled=*/true);
    coordinator_->SetSender([this](std::shared_ptr<const RoundShare> share) {
      absl::MutexLock lock(&mu_);
      sent_.push_back(std::move(share));
    });
    codec_ = std::shared_ptr<const codecs::Codec>(codecs::MakeCodec("fp32").value());
  }

  ~ModelCoordinatorTest() override { jobs_.WaitIdle(); }

  // Registers the layout and gives every owned slice its initial value.
  void Register() {
    absl::StatusOr<std::vector<uint32_t>> owned = table_.Register(0, {{"w", 8, 0}}, 2, 2);
    ASSERT_TRUE(owned.ok()) << owned.status();
    owned_ = *owned;
    ASSERT_FALSE(owned_.empty());
    for (uint32_t id : owned_) {
      Wakeups wake;
      std::string init;
      core::AppendFp32(std::vector<float>{0, 0}, &init);
      ASSERT_TRUE(table_.slice(id)->Initialize(init, &wake).ok());
      table_.SliceInitialized();
    }
  }

  // Every worker pushes `rows[worker]` to every owned slice for `round`; each slice
  // closes with the last push and tells the coordinator, as the shard does.
  void PushAll(uint64_t round, const std::vector<std::vector<float>>& rows) {
    for (uint32_t id : owned_) {
      for (uint32_t w = 0; w < kCoordinatorWorkers; ++w) {
        std::string payload;
        ASSERT_TRUE(encoder_->Encode(rows[w], &payload).ok());
        absl::StatusOr<SliceRound::Progress> p =
            table_.slice(id)->AcceptPush(w, round, "fp32", decode_, payload);
        ASSERT_TRUE(p.ok()) << p.status();
        ASSERT_EQ(p->closed, w + 1 == kCoordinatorWorkers);
      }
      coordinator_->SliceClosed(id, round);
    }
  }

  void Publish(ClosedRound round, std::span<const float> out, absl::Status st) {
    if (on_publish_) on_publish_(round.info.id);
    {
      absl::MutexLock lock(&mu_);
      published_.push_back({round.info.id, round.round, std::vector<float>(out.begin(), out.end()), st});
    }
    std::shared_ptr<const std::string> values = aggregation_->Step(round, out, st).values;
    Wakeups wake;
    table_.slice(round.info.id)->Publish(std::move(round), std::move(values), nullptr, &wake);
    RunWakeups(wake, true);
  }

  RoundShare PeerShare(uint64_t round) const {
    RoundShare s;
    s.layout_hash = table_.hash();
    s.shard_id = 1;
    s.round = round;
    s.participants = {0, 1, 2};
    s.gram = {2, 2, 6, 2, 2, 6, 6, 6, 18};
    return s;
  }

  std::vector<Published> published() {
    absl::MutexLock lock(&mu_);
    return published_;
  }

  core::ManualClock clock_;
  DeadlineQueue deadlines_;
  RoundRules rules_;
  SliceTable table_{{/*shard_id=*/0, /*num_shards=*/2, kCoordinatorWorkers, /*max_message_bytes=*/1 << 20,
                     /*max_shard_bytes=*/1 << 30, /*state_rows=*/0,
                     /*keep_published_model=*/false, /*aggregate_only=*/false,
                     /*priority_order=*/false},
                    &rules_};
  core::ThreadPool pool_{2};
  std::unique_ptr<aggregators::Aggregator> krum_;
  std::unique_ptr<RoundAggregation> aggregation_;
  ShardCounters counters_{0, kCoordinatorWorkers};
  Suspicion suspicion_{Suspicion::Config{0, kCoordinatorWorkers, /*window_rounds=*/1, 0.5}};
  std::unique_ptr<ModelCoordinator> coordinator_;
  // Last: waits for the jobs that use everything above.
  AggregationJobs jobs_{&pool_};

  std::shared_ptr<const codecs::Codec> codec_;
  std::unique_ptr<codecs::Codec> encoder_ = codecs::MakeCodec("fp32").value();
  std::function<absl::StatusOr<std::shared_ptr<const codecs::Codec>>()> decode_ = [this] {
    return absl::StatusOr<std::shared_ptr<const codecs::Codec>>(codec_);
  };
  std::vector<uint32_t> owned_;
  // Called first as each slice is published (on the thread that publishes it).
  std::function<void(uint32_t)> on_publish_;

  absl::Mutex mu_;
  std::vector<std::shared_ptr<const RoundShare>> sent_ ABSL_GUARDED_BY(mu_);
  std::vector<Published> published_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ModelCoordinatorTest, ARoundGoesFromTheClosedSlicesThroughTheSharesToPublication) {
  Register();
  // Workers 0 and 1 agree; worker 2 is far off: Krum picks 0 or 1, both {1, 1}.
  PushAll(0, {{1, 1}, {1, 1}, {3, 3}});
  ASSERT_TRUE(jobs_.WaitIdle(milliseconds(10000)));
  {
    absl::MutexLock lock(&mu_);
    ASSERT_EQ(sent_.size(), 1u) << "this shard's share went to the peers";
    const RoundShare& share = *sent_[0];
    EXPECT_EQ(share.shard_id, 0u);
    EXPECT_EQ(share.round, 0u);
    EXPECT_EQ(share.layout_hash, table_.hash());
    EXPECT_EQ(share.participants, (std::vector<uint32_t>{0, 1, 2}));
    // Dot products of the pushes, summed over the owned slices.
    const double o = static_cast<double>(owned_.size());
    EXPECT_EQ(share.gram, (std::vector<double>{2 * o, 2 * o, 6 * o, 2 * o, 2 * o, 6 * o, 6 * o,
                                               6 * o, 18 * o}));
  }
  EXPECT_TRUE(published().empty()) << "the peer's share is still awaited";
  ASSERT_TRUE(coordinator_->due().has_value());

  ASSERT_TRUE(coordinator_->AcceptShare(PeerShare(0)).ok());
  ASSERT_TRUE(jobs_.WaitIdle(milliseconds(10000)));
  const std::vector<Published> got = published();
  ASSERT_EQ(got.size(), owned_.size()) << "every held slice is published once";
  std::vector<uint32_t> order;
  for (const Published& p : got) {
    EXPECT_TRUE(p.status.ok()) << p.status;
    EXPECT_EQ(p.round, 0u);
    EXPECT_EQ(p.out, (std::vector<float>{1, 1}));
    order.push_back(p.slice);
  }
  // Claimed in publish order by two threads: each once, finished in either order.
  std::vector<uint32_t> expected = table_.publish_order();
  std::sort(order.begin(), order.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(order, expected);
  const ShardStats stats = counters_.Get();
  EXPECT_EQ(stats.model_rounds, 1u);
  EXPECT_EQ(stats.model_rounds_dropped, 0u);
  for (uint32_t id : owned_) EXPECT_EQ(table_.slice(id)->version(), 1u);
  {
    // Krum's choice weighed on every owned slice: one of 0 and 1 at 3 equal shares, the
    // others at none; worker 2 never.
    const std::vector<WorkerSuspicion> s = suspicion_.Get();
    const double o = static_cast<double>(owned_.size());
    EXPECT_EQ(s[2].share_sum, 0.0);
    EXPECT_EQ(s[0].share_sum + s[1].share_sum, 3 * o);
    for (const WorkerSuspicion& w : s) EXPECT_EQ(w.slice_rounds_weighed, owned_.size());
  }

  // The next round starts from the published slices; a share for it may come early.
  ASSERT_TRUE(coordinator_->AcceptShare(PeerShare(1)).ok());
  EXPECT_EQ(coordinator_->AcceptShare(PeerShare(1)).code(), absl::StatusCode::kAlreadyExists);
  PushAll(1, {{1, 1}, {1, 1}, {3, 3}});
  ASSERT_TRUE(jobs_.WaitIdle(milliseconds(10000)));
  EXPECT_EQ(published().size(), 2 * owned_.size());
  EXPECT_EQ(counters_.Get().model_rounds, 2u);
  EXPECT_EQ(counters_.Get().shares_refused, 1u);
}

// The plan is applied to the held slices on several threads at once: the first slice's
// publication waits for another slice's to start, which could not happen one slice
// after the other. The round advances (and the next one publishes) after all of them.
TEST_F(ModelCoordinatorTest, TheHeldSlicesArePublishedOnSeveralThreadsAtOnce) {
  Register();
  ASSERT_GE(owned_.size(), 2u);
  absl::Mutex m;
  int started = 0;
  bool overlapped = false;
  on_publish_ = [&](uint32_t) {
    absl::MutexLock lock(&m);
    if (++started == 1) {
      overlapped = m.AwaitWithTimeout(
          absl::Condition(+[](int* n) { return *n > 1; }, &started), absl::Seconds(10));
    }
  };
  ASSERT_TRUE(coordinator_->AcceptShare(PeerShare(0)).ok());
  PushAll(0, {{1, 1}, {1, 1}, {3, 3}});
  ASSERT_TRUE(jobs_.WaitIdle(milliseconds(20000)));
  {
    absl::MutexLock lock(&m);
    EXPECT_TRUE(overlapped) << "a second slice was published while the first waited";
  }
  ASSERT_EQ(published().size(), owned_.size());
  for (uint32_t id : owned_) EXPECT_EQ(table_.slice(id)->version(), 1u);
  on_publish_ = nullptr;
  ASSERT_TRUE(coordinator_->AcceptShare(PeerShare(1)).ok());
  PushAll(1, {{1, 1}, {1, 1}, {3, 3}});
  ASSERT_TRUE(jobs_.WaitIdle(milliseconds(20000)));
  EXPECT_EQ(published().size(), 2 * owned_.size());
  EXPECT_EQ(counters_.Get().model_rounds, 2u);
  for (uint32_t id : owned_) EXPECT_EQ(table_.slice(id)->version(), 2u);
}

// Krum (a rule that measures distances, on the CPU, without state rows) takes each
// slice's part of the Gram matrix as the slice closes: the share then sums the parts.
TEST_F(ModelCoordinatorTest, EachSliceTakesItsGramPartAsItCloses) {
  ASSERT_TRUE(aggregation_->GramPerSlice());
  absl::Mutex seen_mu;
  std::vector<AggregationStage> seen;
  counters_.SetObserver([&](AggregationStage stage, core::Duration) {
    absl::MutexLock lock(&seen_mu);
    seen.push_back(stage);
  });
  Register();
  PushAll(0, {{1, 1}, {1, 1}, {3, 3}});
  ASSERT_TRUE(jobs_.WaitIdle(milliseconds(10000)));
  {
    absl::MutexLock lock(&seen_mu);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), AggregationStage::kModelSliceGram),
              static_cast<long>(owned_.size()));
    EXPECT_EQ(std::count(seen.begin(), seen.end(), AggregationStage::kModelGram), 1);
  }
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(sent_.size(), 1u);
  const double o = static_cast<double>(owned_.size());
  EXPECT_EQ(sent_[0]->gram,
            (std::vector<double>{2 * o, 2 * o, 6 * o, 2 * o, 2 * o, 6 * o, 6 * o, 6 * o, 18 * o}));
}

// A slice's part, over every worker that pushed it, gives the round's start the bits it
// computes from the participants' rows alone: a worker missing from one slice is left
// out of every part's sum, and the slices are summed in the same order.
TEST_F(ModelCoordinatorTest, SlicePartsGiveTheParticipantsGramMatrixBitForBit) {
  constexpr uint32_t kN = 4;
  aggregators::AggregatorOptions opts;
  opts.num_workers = kN;
  std::unique_ptr<aggregators::Aggregator> krum = aggregators::MakeAggregator("krum", opts).value();
  RoundAggregation aggregation(krum.get(), &pool_, SgdOptions{1.0f, 0, 0},
                               /*aggregate_only=*/false, /*quorum=*/3);
  constexpr uint32_t kNumel = 3 * 4096 + 77;
  // Slice 1 lacks worker 3's push: the participants are 0, 1 and 2.
  auto make = [&](uint32_t id, std::vector<uint32_t> pushers) {
    std::mt19937 rng(11 + id);
    std::normal_distribution<float> normal;
    ClosedRound r;
    r.info.id = id;
    r.info.numel = kNumel;
    r.round = 4;
    r.inputs.rows.resize(kN);
    r.inputs.supports.resize(kN);
    r.inputs.chunked.resize(kN);
    r.inputs.pushed.assign(kN, 0);
    for (uint32_t w : pushers) {
      r.inputs.rows[w] = std::make_unique<float[]>(kNumel);
      for (uint32_t i = 0; i < kNumel; ++i) r.inputs.rows[w][i] = normal(rng);
      r.inputs.pushed[w] = 1;
    }
    return r;
  };
  std::vector<ClosedRound> plain, parted;
  for (uint32_t id = 0; id < 3; ++id) {
    const std::vector<uint32_t> pushers =
        id == 1 ? std::vector<uint32_t>{0, 1, 2} : std::vector<uint32_t>{0, 1, 2, 3};
    plain.push_back(make(id, pushers));
    parted.push_back(make(id, pushers));
    aggregation.SliceGram(parted.back());
    ASSERT_TRUE(parted.back().gram_part.has_value()) << "slice " << id;
    EXPECT_EQ(parted.back().gram_part->workers, pushers);
  }
  const std::vector<uint32_t> participants = aggregation.Participants(plain, kN);
  ASSERT_EQ(participants, (std::vector<uint32_t>{0, 1, 2}));
  std::vector<double> want(9, 0.0), got(9, 0.0);
  AggregationCounts counts;
  ASSERT_TRUE(aggregation.AccumulateGram(plain, participants, want, &counts).ok());
  ASSERT_TRUE(aggregation.AccumulateGram(parted, participants, got, &counts).ok());
  EXPECT_GT(want[0], 0.0);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(double)), 0)
      << ::testing::PrintToString(got) << " against " << ::testing::PrintToString(want);
  // Two workers left: below Krum's 3 inputs, so no part; the round's start reports it.
  ClosedRound few = make(7, {0, 2});
  aggregation.SliceGram(few);
  EXPECT_FALSE(few.gram_part.has_value());
}

TEST_F(ModelCoordinatorTest, AnOverduePeerShareDropsTheRoundAndPublishesItUnchanged) {
  Register();
  PushAll(0, {{1, 1}, {1, 1}, {3, 3}});
  ASSERT_TRUE(jobs_.WaitIdle(milliseconds(10000)));
  coordinator_->Tick(clock_.Now());
  ASSERT_TRUE(jobs_.WaitIdle(milliseconds(10000)));
  EXPECT_TRUE(published().empty()) << "not due yet";
  clock_.Advance(milliseconds(60));
  coordinator_->Tick(clock_.Now());
  ASSERT_TRUE(jobs_.WaitIdle(milliseconds(10000)));
  const std::vector<Published> got = published();
  ASSERT_EQ(got.size(), owned_.size());
  for (const Published& p : got) {
    EXPECT_EQ(p.status.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(p.status.message().find("--peer-timeout-ms=50"), std::string::npos) << p.status;
  }
  EXPECT_EQ(counters_.Get().model_rounds_dropped, 1u);
  EXPECT_EQ(counters_.Get().model_rounds, 0u);
  // The late share of the dropped round is refused, and counted.
  EXPECT_EQ(coordinator_->AcceptShare(PeerShare(0)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(counters_.Get().shares_refused, 1u);
}

TEST_F(ModelCoordinatorTest, RefusesSharesBeforeRegistrationForAnotherLayoutOrMalformed) {
  EXPECT_EQ(core::RefusalOf(coordinator_->AcceptShare(PeerShare(0))), core::Refusal::kNoLayout);
  Register();
  RoundShare other = PeerShare(0);
  other.layout_hash += 1;
  EXPECT_EQ(core::RefusalOf(coordinator_->AcceptShare(other)), core::Refusal::kLayoutMismatch);
  RoundShare own = PeerShare(0);
  own.shard_id = 0;
  EXPECT_EQ(core::RefusalOf(coordinator_->AcceptShare(own)), core::Refusal::kMalformed)
      << "a peer cannot send this shard's own share";
  EXPECT_EQ(counters_.Get().shares_refused, 3u);
  ASSERT_TRUE(jobs_.WaitIdle(milliseconds(10000)));
  EXPECT_TRUE(published().empty());
}

TEST(ShardCountersTest, RefusalsAreCountedByKindAndLoggedLogarithmically) {
  CapturedLog log;
  ShardCounters c(/*shard_id=*/7, /*num_workers=*/2);
  const std::string flood(1000, 'x');
  for (int i = 0; i < 100; ++i) {
    absl::Status st = c.Counted(core::Refused(core::Refusal::kLate, "stale push"));
    EXPECT_EQ(core::RefusalOf(st), core::Refusal::kLate) << "returned unchanged";
  }
  absl::Status plain = c.Counted(absl::InternalError("not a refusal"));
  EXPECT_EQ(plain.code(), absl::StatusCode::kInternal);
  const ShardStats s = c.Get();
  EXPECT_EQ(s.refusals[static_cast<size_t>(core::Refusal::kLate)], 100u);
  uint64_t total = 0;
  for (uint64_t n : s.refusals) total += n;
  EXPECT_EQ(total, 100u) << "a plain error is no refusal";
  // 1, 2, 4, ..., 64: seven warnings for a hundred refusals, the rest at debug.
  EXPECT_EQ(log.Count("warning", "stale push"), 7);
  EXPECT_EQ(log.Count("debug", "stale push"), 93);
}

TEST(ShardCountersTest, PushesAndRefusalsAreCountedPerWorker) {
  CapturedLog log;
  ShardCounters c(0, 3);
  Membership members(2, 3, core::Duration::zero());  // worker 2 is a spare
  for (int i = 0; i < 4; ++i) {
    (void)c.RefusedPush(1, core::Refused(core::Refusal::kMalformed, "bad payload"));
  }
  (void)c.RefusedPush(0, core::Refused(core::Refusal::kLate, "stale"));
  (void)c.RefusedPush(9, core::Refused(core::Refusal::kMalformed, "no such worker"));
  (void)c.RefusedPush(0, absl::OkStatus());  // nothing refused: nothing counted
  c.PushAccepted(0, 10, 40, std::chrono::milliseconds(250));
  c.PushAccepted(0, 10, 40, std::chrono::milliseconds(500));
  c.ChunkAccepted(1, 5, 8);
  c.Quarantined(1, std::chrono::seconds(1));
  c.Quarantined(7, std::chrono::seconds(1));  // out of range: the shard's count only
  const uint8_t only_worker_0[] = {1, 0, 0};
  c.Published(0, 3, absl::OkStatus(), only_worker_0, members);
  c.Published(0, 4, absl::OkStatus(), {}, members);  // nobody pushed (dropped below quorum)
  const ShardStats s = c.Get();
  ASSERT_EQ(s.workers.size(), 3u);
  EXPECT_DOUBLE_EQ(s.workers[0].push_latency_seconds, 0.75);
  EXPECT_EQ(s.workers[1].push_latency_seconds, 0.0) << "a chunk has no push latency";
  EXPECT_EQ(s.workers[0].refused(core::Refusal::kMalformed), 0u);
  EXPECT_EQ(s.workers[0].refused(core::Refusal::kLate), 1u);
  EXPECT_EQ(s.workers[1].refused(core::Refusal::kMalformed), 4u);
  EXPECT_EQ(s.workers[0].pushes_accepted, 2u);
  EXPECT_EQ(s.workers[1].pushes_accepted, 0u);
  EXPECT_EQ(s.workers[1].chunks_accepted, 1u);
  EXPECT_EQ(s.workers[0].quarantines, 0u);
  EXPECT_EQ(s.workers[1].quarantines, 1u);
  EXPECT_EQ(s.quarantines, 2u);
  EXPECT_EQ(s.workers[0].slice_rounds_missed, 1u);
  EXPECT_EQ(s.workers[1].slice_rounds_missed, 2u);
  EXPECT_EQ(s.workers[2].slice_rounds_missed, 0u) << "a spare that never joined missed nothing";
  EXPECT_EQ(s.refusals[static_cast<size_t>(core::Refusal::kMalformed)], 5u);
  EXPECT_EQ(log.Count("warning", "worker 1 sent"), 3) << "the 1st, 2nd and 4th";
}

TEST(ShardCountersTest, PublicationsAndTheObserver) {
  CapturedLog log;
  ShardCounters c(0, 1);
  Membership members(1, 1, core::Duration::zero());
  c.Published(3, 1, absl::OkStatus(), {}, members);
  c.Published(4, 1, absl::InternalError("non-finite aggregate"), {}, members);
  c.ClosedAtDeadline();
  SliceRound::DeadlineOutcome out;
  out.due = true;
  out.round = 9;
  out.pushed = 2;
  out.quorum = 3;
  c.DeadlinePassed(5, out, 4);  // below the quorum: a warning, not counted
  out.closed = true;
  out.pushed = out.complete = 3;
  for (int i = 0; i < 3; ++i) c.DeadlinePassed(5, out, 4);
  EXPECT_EQ(log.Count("warning", "round 9 of slice 5 passed its deadline with 2 of 4 pushes, "
                                 "below the quorum of 3; closing as soon as the quorum is reached"),
            1);
  // The 2nd, 3rd and 4th closed at a deadline: info for the 2nd and 4th.
  EXPECT_EQ(log.Count("info", "round 9 of slice 5 closed at its deadline with 3 of 4"), 2);
  c.PushAccepted(0, 10, 40, core::Duration::zero());
  c.ChunkAccepted(0, 5, 8);
  c.Aggregated({.on_support = 1, .sign_votes = 2, .masked = 3, .means_of_digits = 5}, 4);
  const ShardStats s = c.Get();
  EXPECT_EQ(s.rounds_closed, 2u);
  EXPECT_EQ(s.aggregation_errors, 1u);
  EXPECT_EQ(s.rounds_closed_at_deadline, 4u);
  EXPECT_EQ(s.deadlines_below_quorum, 1u);
  EXPECT_EQ(s.pushes_accepted, 1u);
  EXPECT_EQ(s.udp_chunks_accepted, 1u);
  EXPECT_EQ(s.push_bytes, 15u);
  EXPECT_EQ(s.push_decoded_bytes, 48u);
  EXPECT_EQ(s.aggregations_on_support, 1u);
  EXPECT_EQ(s.sign_votes, 2u);
  EXPECT_EQ(s.masked_aggregations, 3u);
  EXPECT_EQ(s.means_of_digits, 5u);
  EXPECT_EQ(s.udp_chunks_lost, 4u);
  EXPECT_EQ(log.Count("error", "round 4 of slice 1 dropped"), 1);

  std::vector<AggregationStage> seen;
  c.Observe(AggregationStage::kSlice, std::chrono::steady_clock::now());  // no observer: no-op
  c.SetObserver([&](AggregationStage stage, core::Duration d) {
    EXPECT_GE(d.count(), 0);
    seen.push_back(stage);
  });
  c.Observe(AggregationStage::kModelGram, std::chrono::steady_clock::now());
  EXPECT_EQ(seen, (std::vector<AggregationStage>{AggregationStage::kModelGram}));
  EXPECT_EQ(AggregationStageName(AggregationStage::kModelApply), "model_apply");
}

}  // namespace
}  // namespace ps::server
