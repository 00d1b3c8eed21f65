// The order and the end of one pull (server/pull_scheduler.h), against a real shard with
// a manual clock and a sink that records what it is given.
#include "server/pull_scheduler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "aggregators/aggregator.h"
#include "codecs/codec.h"
#include "core/clock.h"
#include "core/fp32_bytes.h"
#include "core/thread_pool.h"
#include "server/shard.h"

namespace ps::server {
namespace {

// What a pull wrote: each slice with its `queued` flag, and how it ended.
class RecordingSink final : public PullSink {
 public:
  // `window`: the writes it takes before the first WriteDone (writes_in_flight).
  explicit RecordingSink(size_t window = 1) : window_(window) {}

  struct Written {
    uint32_t slice;
    uint64_t version;
    bool queued;
    std::string codec;  // empty: dense values
    uint64_t base_version;
  };

  void Write(PullItem item) override {
    absl::MutexLock lock(&mu_);
    written_.push_back({item.header.slice_id, item.header.version, item.header.queued,
                        std::string(item.header.codec), item.header.base_version});
  }
  void Finish(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    ++finishes_;
    status_ = status;
  }
  size_t writes_in_flight() const override { return window_; }

  // Waits (at most 10 s) until `n` slices were written.
  std::vector<Written> AwaitWritten(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return written_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return written_;
  }
  int finishes() const {
    absl::MutexLock lock(&mu_);
    return finishes_;
  }
  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  const size_t window_;
  mutable absl::Mutex mu_;
  std::vector<Written> written_ ABSL_GUARDED_BY(mu_);
  int finishes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("not finished");
};

class PullSchedulerTest : public ::testing::Test {
 protected:
  // One worker; tensors "late" (priority 2), "first" (0) and "middle" (1), one slice
  // each: slices 0, 1 and 2.
  void Make(Schedule schedule, std::string pull_codec = "") {
    ServerOptions o;
    o.pull_codec = std::move(pull_codec);
    o.num_workers = 1;
    o.learning_rate = 1.0f;
    o.momentum = 0.0f;
    o.round_deadline = std::chrono::milliseconds(100);
    o.schedule = schedule;
    aggregators::AggregatorOptions a;
    a.num_workers = 1;
    shard_ = std::make_unique<Shard>(o, 0, *aggregators::MakeAggregator("mean", a), &clock_, &pool_);
    auto layout =
        core::ModelLayout::Create({{"late", 4, 2}, {"first", 4, 0}, {"middle", 4, 1}}, 4, 1);
    ASSERT_TRUE(layout.ok()) << layout.status();
    hash_ = layout->hash();
    ASSERT_TRUE(shard_->Join(0, hash_).ok());
    ASSERT_TRUE(shard_->RegisterLayout(0, *layout).ok());
    for (uint32_t s = 0; s < 3; ++s) {
      std::string values;
      core::AppendFp32(std::vector<float>{1, 2, 3, 4}, &values);
      ASSERT_TRUE(shard_->InitSlice(0, hash_, s, values).ok());
    }
  }

  absl::Status Push(uint32_t slice, uint64_t round) {
    std::string payload;
    EXPECT_TRUE((*codecs::MakeCodec("fp32"))->Encode(std::vector<float>{1, 1, 1, 1}, &payload).ok());
    return shard_->Push(0, hash_, round, slice, "fp32", payload);
  }

  std::unique_ptr<PullScheduler> Scheduler(std::vector<uint32_t> slices, uint64_t min_version,
                                           uint64_t held_epoch = 0,
                                           std::vector<uint64_t> held_versions = {}) {
    return std::make_unique<PullScheduler>(shard_.get(), std::move(slices), min_version,
                                           held_epoch, held_versions, nullptr);
  }

  core::ManualClock clock_;
  core::ThreadPool pool_{2};
  std::unique_ptr<Shard> shard_;
  uint64_t hash_ = 0;
};

TEST_F(PullSchedulerTest, ReadySlicesGoOutMostUrgentFirstAndQueuedBehindTheFirst) {
  Make(Schedule::kPriority);
  RecordingSink sink;
  auto scheduler = Scheduler({0, 1, 2}, 0);
  scheduler->Start(&sink);
  // Everything was ready at the start, but one write at a time: the most urgent first.
  std::vector<RecordingSink::Written> w = sink.AwaitWritten(1);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].slice, 1u);  // "first", priority 0
  EXPECT_FALSE(w[0].queued);
  scheduler->WriteDone(true);
  scheduler->WriteDone(true);
  w = sink.AwaitWritten(3);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[1].slice, 2u);  // "middle", priority 1
  EXPECT_EQ(w[2].slice, 0u);  // "late", priority 2
  EXPECT_TRUE(w[1].queued);   // each waited for the write before it
  EXPECT_TRUE(w[2].queued);
  EXPECT_EQ(sink.finishes(), 0);  // the last write is still in flight
  scheduler->WriteDone(true);
  EXPECT_EQ(sink.finishes(), 1);
  EXPECT_TRUE(sink.status().ok()) << sink.status();
}

TEST_F(PullSchedulerTest, ASinkTakingTwoWritesGetsTheNextSliceBehindTheOneInFlight) {
  Make(Schedule::kPriority);
  {
    RecordingSink sink(/*window=*/2);
    auto scheduler = Scheduler({0, 1, 2}, 0);
    scheduler->Start(&sink);
    // Start hands over the two most urgent at once, the second queued behind the first.
    std::vector<RecordingSink::Written> w = sink.AwaitWritten(0);
    ASSERT_EQ(w.size(), 2u);
    EXPECT_EQ(w[0].slice, 1u);
    EXPECT_FALSE(w[0].queued);
    EXPECT_EQ(w[1].slice, 2u);
    EXPECT_TRUE(w[1].queued);
    scheduler->WriteDone(true);
    w = sink.AwaitWritten(0);
    ASSERT_EQ(w.size(), 3u);
    EXPECT_EQ(w[2].slice, 0u);
    EXPECT_TRUE(w[2].queued);
    scheduler->WriteDone(true);
    EXPECT_EQ(sink.finishes(), 0);  // slice 0's write is still in flight
    scheduler->WriteDone(true);
    EXPECT_EQ(sink.finishes(), 1);
    EXPECT_TRUE(sink.status().ok()) << sink.status();
  }
  // A slice that becomes ready while two are in flight waits for a write to complete;
  // a cancel then ends the pull once both are done.
  RecordingSink sink(/*window=*/2);
  auto scheduler = Scheduler({0, 1, 2}, 1);
  scheduler->Start(&sink);
  ASSERT_TRUE(Push(0, 0).ok());
  ASSERT_TRUE(Push(2, 0).ok());
  ASSERT_EQ(sink.AwaitWritten(2).size(), 2u);
  ASSERT_TRUE(Push(1, 0).ok());
  // Slice 1 is published (its aggregation runs on the pool) but not handed over, now or
  // later: both writes are in flight.
  for (int i = 0; i < 1000 && shard_->MinVersion() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(shard_->MinVersion(), 1u);
  EXPECT_EQ(sink.AwaitWritten(0).size(), 2u);
  scheduler->WriteDone(true);
  std::vector<RecordingSink::Written> w = sink.AwaitWritten(3);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[2].slice, 1u);
  EXPECT_TRUE(w[2].queued);
  scheduler->Cancel();
  EXPECT_EQ(sink.finishes(), 0);
  scheduler->WriteDone(true);
  EXPECT_EQ(sink.finishes(), 0);  // the third write is in flight still
  scheduler->WriteDone(true);
  EXPECT_EQ(sink.finishes(), 1);
  EXPECT_EQ(sink.status().code(), absl::StatusCode::kCancelled);
}

TEST_F(PullSchedulerTest, FifoSendsInTheOrderTheSlicesBecameReady) {
  Make(Schedule::kFifo);
  RecordingSink sink;
  auto scheduler = Scheduler({0, 1, 2}, 0);
  scheduler->Start(&sink);
  for (int i = 0; i < 3; ++i) {
    sink.AwaitWritten(static_cast<size_t>(i) + 1);
    scheduler->WriteDone(true);
  }
  const std::vector<RecordingSink::Written> w = sink.AwaitWritten(3);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].slice, 0u);
  EXPECT_EQ(w[1].slice, 1u);
  EXPECT_EQ(w[2].slice, 2u);
  EXPECT_TRUE(sink.status().ok()) << sink.status();
}

TEST_F(PullSchedulerTest, ASliceGoesOutWhenItReachesTheVersionNotQueuedWhenTheLinkWasIdle) {
  Make(Schedule::kPriority);
  RecordingSink sink;
  auto scheduler = Scheduler({0, 2}, 1);
  scheduler->Start(&sink);
  EXPECT_EQ(shard_->WatcherCount(), 2u);
  EXPECT_TRUE(sink.AwaitWritten(0).empty());
  ASSERT_TRUE(Push(0, 0).ok());  // one worker: the round of slice 0 closes, version 1
  std::vector<RecordingSink::Written> w = sink.AwaitWritten(1);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].slice, 0u);
  EXPECT_EQ(w[0].version, 1u);
  EXPECT_FALSE(w[0].queued);  // nothing was being written when it came
  scheduler->WriteDone(true);
  EXPECT_EQ(sink.finishes(), 0);  // slice 2 is still at version 0
  ASSERT_TRUE(Push(2, 0).ok());
  w = sink.AwaitWritten(2);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[1].slice, 2u);
  EXPECT_FALSE(w[1].queued);
  scheduler->WriteDone(true);
  EXPECT_TRUE(sink.status().ok()) << sink.status();
  EXPECT_EQ(sink.finishes(), 1);
}

TEST_F(PullSchedulerTest, ACancelledPullEndsCancelledAndLeavesNoWatchBehind) {
  Make(Schedule::kPriority);
  RecordingSink sink;
  auto scheduler = Scheduler({0, 1, 2}, 5);  // a version far ahead
  scheduler->Start(&sink);
  EXPECT_EQ(shard_->WatcherCount(), 3u);
  scheduler->Cancel();
  EXPECT_EQ(sink.finishes(), 1);
  EXPECT_EQ(sink.status().code(), absl::StatusCode::kCancelled);
  scheduler->Cancel();  // once only
  EXPECT_EQ(sink.finishes(), 1);
  scheduler.reset();
  EXPECT_EQ(shard_->WatcherCount(), 0u);
}

TEST_F(PullSchedulerTest, CancelDuringAWriteEndsTheCallAfterItAndAFailedWriteEndsIt) {
  Make(Schedule::kPriority);
  {
    RecordingSink sink;
    auto scheduler = Scheduler({0, 1}, 0);
    scheduler->Start(&sink);
    ASSERT_EQ(sink.AwaitWritten(1).size(), 1u);
    scheduler->Cancel();
    EXPECT_EQ(sink.finishes(), 0);  // not while the write is in flight
    scheduler->WriteDone(true);
    EXPECT_EQ(sink.finishes(), 1);
    EXPECT_EQ(sink.status().code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(sink.AwaitWritten(1).size(), 1u);  // nothing more was written
  }
  RecordingSink sink;
  auto scheduler = Scheduler({0, 1}, 0);
  scheduler->Start(&sink);
  ASSERT_EQ(sink.AwaitWritten(1).size(), 1u);
  scheduler->WriteDone(false);
  EXPECT_EQ(sink.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sink.finishes(), 1);
}

// Compressed pulls: a slice goes out as the change from the version the worker holds
// only when it holds the change's base version of this shard's epoch; dense otherwise.
TEST_F(PullSchedulerTest, AChangeGoesOnlyToAWorkerHoldingItsBaseVersionOfThisEpoch) {
  Make(Schedule::kPriority, "fp16");
  ASSERT_NE(shard_->pull_epoch(), 0u);
  ASSERT_TRUE(Push(0, 0).ok());  // version 1 of slice 0, a change from version 0
  struct Case {
    uint64_t epoch;
    uint64_t held;
    bool change;
  };
  for (const Case& c : {Case{shard_->pull_epoch(), 0, true}, Case{shard_->pull_epoch(), 7, false},
                        Case{shard_->pull_epoch() + 1, 0, false}}) {
    RecordingSink sink;
    auto scheduler = Scheduler({0}, 1, c.epoch, {c.held});
    scheduler->Start(&sink);
    const std::vector<RecordingSink::Written> w = sink.AwaitWritten(1);
    ASSERT_EQ(w.size(), 1u);
    EXPECT_EQ(w[0].version, 1u);
    EXPECT_EQ(w[0].codec, c.change ? "fp16" : "") << "held " << c.held << " of epoch " << c.epoch;
    if (c.change) {
      EXPECT_EQ(w[0].base_version, 0u);
    }
    scheduler->WriteDone(true);
    EXPECT_TRUE(sink.status().ok()) << sink.status();
  }
}

TEST_F(PullSchedulerTest, APullWaitingWhenTheShardDrainsEndsUnavailable) {
  Make(Schedule::kPriority);
  RecordingSink sink;
  auto scheduler = Scheduler({0, 1}, 5);
  scheduler->Start(&sink);
  shard_->Drain(std::chrono::milliseconds(0));
  EXPECT_EQ(sink.finishes(), 1);
  EXPECT_EQ(sink.status().code(), absl::StatusCode::kUnavailable) << sink.status();
  EXPECT_TRUE(sink.AwaitWritten(0).empty());
}

}  // namespace
}  // namespace ps::server
